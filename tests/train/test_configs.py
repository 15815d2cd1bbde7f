"""Every experiment config validates; the real-scale Kimi-K2 ones build abstractly (eval_shape,
nothing allocated) on their own 256-device layout and fit an H200's memory."""

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

from c2 import model as model_lib
from c2.train import lm
from c2.train.config import MESH_AXES, load_config, sharding_rules
from c2.train.loop import opt_state_shardings
from c2.train.optimizer import make_optimizer

EXPERIMENTS = Path(__file__).parents[2] / "experiments"
TINY = ["cpt_tiny", "cpt_deep_tiny", "long_context_tiny", "sft_tiny", "sft_copy_tiny"]
REAL = ["cpt_kimi_k2", "long_context_kimi_k2", "sft_kimi_k2"]
H200_BYTES = 141e9


@pytest.mark.parametrize("name", TINY + REAL + ["pipeline_tiny"])
def test_docstring_gives_command_runtime_and_expected_result(name):
    text = (EXPERIMENTS / f"{name}.py").read_text()
    doc = text.split('"""')[1]
    assert f"--config=experiments/{name}.py" in doc
    assert re.search(r"Runtime:", doc) and re.search(r"Expected:", doc)


@pytest.mark.parametrize("name", TINY)
def test_tiny_stage_configs_validate_on_the_reference_machine(name):
    config = load_config(EXPERIMENTS / f"{name}.py")
    mesh, cfg = lm.validate(config, num_devices=1)
    assert mesh["data"] == 1 and cfg.vocab_size >= 320


def test_pipeline_steps_follow_the_top_level_fields():
    from c2.pipeline import validate_pipeline

    config = load_config(EXPERIMENTS / "pipeline_tiny.py")
    config.train.steps = 80
    config.train.checkpoint_every = 40
    stages = validate_pipeline(config, Path("/tmp/unused"), num_devices=1)
    assert [s.train.steps for s in stages.values()] == [80, 16, 26, 150, 120]
    assert [s.train.checkpoint_every for s in stages.values()] == [40, 40, 40, 40, 6]
    assert stages["cpt"].init_from == "hf:experiments/policies/reader_tiny"  # the base
    assert stages["sft_agent"].init_from == "/tmp/unused/sft"
    assert stages["rl"].init_from == "/tmp/unused/sft_agent"
    # the agent SFT and RL stages keep the model the stages before them trained
    assert stages["rl"].model.yarn.to_dict() == stages["sft"].model.yarn.to_dict()
    assert stages["sft_agent"].model.yarn.to_dict() == stages["sft"].model.yarn.to_dict()
    assert stages["long_context"].init_from == "/tmp/unused/cpt"
    assert stages["sft"].init_from == "/tmp/unused/long_context"
    # CPT at the base's length, replaying its data; the extension 2x, YaRN over those positions
    cpt, lc = stages["cpt"], stages["long_context"]
    assert cpt.data.seq_len == 512 and cpt.data.replay and cpt.data.replay_fraction == 0.5
    assert lc.data.seq_len == 2 * cpt.data.seq_len
    assert lc.model.yarn.original_max_position_embeddings == cpt.data.seq_len
    assert lc.model.yarn.factor == 2.0


def _per_device_bytes(tree, mesh_sizes, shardings):
    total = 0
    for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
        total += math.prod(sh.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
    return total


@pytest.mark.parametrize("name", REAL)
def test_real_scale_configs_build_abstractly(name):
    config = load_config(EXPERIMENTS / f"{name}.py")
    n_devices = math.prod(config.mesh[a] for a in MESH_AXES)
    assert n_devices == 256
    mesh_sizes, cfg = lm.validate(config, num_devices=n_devices, load_files=False)
    if name.startswith("long_context"):
        assert mesh_sizes["context"] == 32 and mesh_sizes["expert"] == 8
        assert config.data.seq_len == 262144 and cfg.rope_scaling.factor == 64.0
    else:
        assert config.data.seq_len == 32768
    total, active = model_lib.count_params(cfg, include_mtp=True)
    assert 1.0e12 < total < 1.1e12 and 3.0e10 < active < 3.5e10  # 1.04T total, 33B active

    # The whole state, abstractly, with its shardings on an abstract 256-device mesh.
    mesh = AbstractMesh(tuple(mesh_sizes[a] for a in MESH_AXES), MESH_AXES)
    rules = sharding_rules(config)
    param_sh = model_lib.param_shardings(cfg, mesh, rules)
    params = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.key(0)))
    param_shapes = jax.tree.map(lambda a: a.shape, model_lib.abstract_params(cfg))
    assert jax.tree.map(lambda a: a.shape, params) == param_shapes
    tx, _ = make_optimizer(config.optimizer, config.train.steps, params)
    opt_state = jax.eval_shape(tx.init, params)
    abstract_params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, param_sh
    )
    opt_sh = opt_state_shardings(opt_state, abstract_params, mesh)
    state_bytes = _per_device_bytes(params, mesh_sizes, param_sh) + _per_device_bytes(
        opt_state, mesh_sizes, opt_sh
    )
    assert state_bytes < 0.5 * H200_BYTES, f"{state_bytes / 1e9:.0f} GB per device"

    # One train step's loss and gradient trace at the real sequence length (one sequence).
    tokens = jax.ShapeDtypeStruct((1, config.data.seq_len), jnp.int32)
    batch = {
        "inputs": tokens,
        "targets": tokens,
        "segment_ids": tokens,
        "positions": tokens,
        "loss_mask": jax.ShapeDtypeStruct(tokens.shape, jnp.float32),
        "target_bytes": tokens,
    }
    grad_fn = jax.value_and_grad(
        lambda p, b: lm.lm_loss(p, b, None, cfg=cfg, tc=config.train, mesh=None), has_aux=True
    )
    (loss, (metrics, _)), grads = jax.eval_shape(grad_fn, params, batch)
    assert loss.shape == () and "mtp1_acceptance" in metrics
    assert jax.tree.map(lambda g: g.shape, grads) == param_shapes


@pytest.mark.parametrize("name", ["cpt_tiny", "rl_tiny"])
def test_a_run_saved_before_a_config_field_existed_still_loads(tmp_path, name):
    """A run directory's config.json lacks the fields added to c2 after it was written: loading
    it for evaluation fills them at their defaults; the saved values stay."""
    import json

    from c2.eval.models import stage_config

    config = load_config(EXPERIMENTS / f"{name}.py")
    config.optimizer.lr = 1.234e-4
    saved = config.to_dict()
    del saved["train"]["seed"], saved["model"]["dtype"]  # as if added after the run
    (tmp_path / "config.json").write_text(json.dumps(saved))
    _, got = stage_config(tmp_path)
    assert got.train.seed == load_config(EXPERIMENTS / f"{name}.py").train.seed
    assert got.optimizer.lr == 1.234e-4 and "dtype" in got.model
    lm.validate(got, num_devices=1, load_files=False)
