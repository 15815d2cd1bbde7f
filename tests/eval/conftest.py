"""Shared fixtures of the evaluation tests.

Tests that play episodes need what their tasks run in (bubblewrap namespaces, a container
engine): without it they skip on a developer's machine but fail in CI (tests/_support.py's
skip_or_fail): there a missing backend must not quietly remove the tests that check the runner.
"""

import pytest
from _support import skip_or_fail as missing


@pytest.fixture(scope="session")
def missing_backend():
    """missing_backend(what): skip here, fail in CI."""
    return missing


@pytest.fixture(scope="session")
def sandbox_ok():
    """A namespace sandbox (bubblewrap): skipped here without one, failed in CI."""
    from c2.envs.sandbox import Sandbox

    sb = Sandbox()
    if not sb.isolated:
        missing(
            "episodes need a namespace sandbox (`make setup` installs bubblewrap as root); this "
            f"machine has {sb.isolation.describe()}"
        )
    return sb


@pytest.fixture(scope="session")
def podman_base():
    """The local base image container tasks build on (podman, and the base `.ci/run` builds):
    skipped here without them, failed in CI."""
    from c2.envs.container import BASE_IMAGES, engine_available, image_exists

    why = engine_available("podman")
    if why is not None:
        missing(f"the container backend: {why}")
    for base in (BASE_IMAGES["debian:bookworm-slim"], "localhost/c2-base:bookworm-min"):
        if image_exists(base):
            return base
    missing("no local base image (python -m c2.envs.container base localhost/c2-base:bookworm-min)")


def _untrained_workdir(path, **overrides):
    """A c2 stage workdir (config.json + a checkpoint) holding a tiny model's initial weights;
    `overrides` go to config.model.overrides."""
    import jax.numpy as jnp

    from c2.train import lm
    from c2.train.checkpoint import Checkpointer
    from c2.train.config import stage_defaults
    from c2.train.loop import init_key

    c = stage_defaults()
    c.name, c.model.dtype = "tiny", "float32"
    o = c.model.overrides
    o.d_model, o.n_layers, o.n_heads, o.d_ff, o.d_ff_expert = 32, 2, 2, 64, 16
    o.n_experts, o.n_experts_per_token, o.q_lora_rank, o.kv_lora_rank = 4, 2, 16, 16
    o.qk_nope_head_dim, o.qk_rope_head_dim, o.v_head_dim, o.mtp_depth = 8, 8, 8, 0
    o.update(overrides)
    c.data.seq_len, c.data.batch_size, c.optimizer.warmup_steps = 128, 8, 0
    params = lm.build_task(c).init_params(init_key(0))
    ckpt = Checkpointer(path / "checkpoints", async_save=False)
    ckpt.save(0, params, {"unused": jnp.zeros(1)}, {}, force=True)
    ckpt.close()
    (path / "config.json").write_text(c.to_json_best_effort())
    return path


@pytest.fixture
def untrained_workdir():
    """`untrained_workdir(path, **model_overrides)`: a c2 stage workdir at path with a tiny model's
    initial weights."""
    return _untrained_workdir
