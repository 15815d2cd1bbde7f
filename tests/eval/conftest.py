"""Shared fixtures of the evaluation tests."""

import pytest


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
