"""The language-model task with the real model: config -> ModelConfig, checks naming fields, the
loss against its parts, the HF import with an added MTP module, and a sharded training stage."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model as model_lib
from c2.train import lm
from c2.train.config import ConfigError, stage_defaults
from c2.train.losses import mtp_distillation, next_token_loss
from c2.train.metrics import read_metrics

SMALL = dict(
    d_model=32, n_layers=2, n_heads=2, d_ff=64, d_ff_expert=16, n_experts=4,
    n_experts_per_token=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=8, v_head_dim=8,
)  # fmt: skip


def small_config(**data):
    c = stage_defaults()
    c.model.dtype = "float32"
    for k, v in SMALL.items():
        c.model.overrides[k] = v
    c.data.seq_len, c.data.batch_size = 32, 8
    for k, v in data.items():
        c.data[k] = v
    c.train.progress_bar, c.train.measure_peak = False, False
    return c


def test_model_config_applies_preset_overrides_dtype_and_yarn():
    c = small_config()
    c.model.yarn.factor = 4.0
    c.model.yarn.original_max_position_embeddings = 32
    cfg = lm.model_config(c)
    assert cfg.d_model == 32 and cfg.n_experts == 4 and cfg.dtype == "float32"
    assert cfg.rope_scaling == model_lib.YarnConfig(
        factor=4.0, original_max_position_embeddings=32, beta_fast=32.0, beta_slow=1.0,
        mscale=1.0, mscale_all_dim=0.0,
    )  # fmt: skip
    assert cfg.mtp_depth == model_lib.presets.get("tiny_kimi_k2").mtp_depth


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda c: c.model.overrides.update(d_modle=8),
            r"config\.model\.overrides\.d_modle: not a",
        ),
        (lambda c: c.model.overrides.update(n_group="two"), r"overrides\.n_group: expected int"),
        (lambda c: setattr(c.model, "preset", "gpt5"), r"config\.model\.preset='gpt5': unknown"),
        (
            lambda c: c.model.overrides.update(n_experts_per_token=8),
            r"config\.model: .*per_token=8",
        ),
        (lambda c: setattr(c.data, "seq_len", 4096), r"seq_len=4096 exceeds .*max_seq_len"),
        (lambda c: c.model.overrides.update(vocab_size=100), r"vocab_size=100 is smaller than"),
    ],
)
def test_model_errors_name_the_field(edit, pattern):
    c = small_config()
    edit(c)
    with pytest.raises(ConfigError, match=pattern):
        lm.validate(c, num_devices=8)


def test_mesh_must_divide_experts_and_batch():
    c = small_config()
    c.mesh.data, c.mesh.expert = 1, 8
    with pytest.raises(ConfigError, match=r"config\.mesh\.expert=8 does not divide .*n_experts=4"):
        lm.validate(c, num_devices=8)
    c = small_config(batch_size=4)
    c.mesh.data, c.mesh.fsdp, c.mesh.expert = 2, 1, 4
    c.model.overrides.n_experts = 8
    with pytest.raises(ConfigError, match=r"batch_size=4 is not divisible by the batch axes"):
        lm.validate(c, num_devices=8)


@pytest.fixture(scope="module")
def small():
    c = small_config()
    cfg = lm.model_config(c)
    params = model_lib.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    seg = np.repeat(np.array([[1] * 20 + [2] * 10 + [0] * 2]), 2, axis=0)
    pos = np.concatenate([np.arange(20), np.arange(10), [0, 0]])[None].repeat(2, 0)
    batch = {
        "inputs": rng.integers(0, 256, (2, 32)).astype(np.int32),
        "targets": rng.integers(0, 256, (2, 32)).astype(np.int32),
        "segment_ids": seg.astype(np.int32),
        "positions": pos.astype(np.int32),
        "loss_mask": (seg > 0).astype(np.float32),
        "target_bytes": (seg > 0).astype(np.int32),
    }
    return c, cfg, params, batch


def test_lm_loss_is_ce_plus_weighted_mtp_and_balance(small):
    c, cfg, params, batch = small
    c.train.mtp_weight, c.train.balance_weight = 0.5, 0.01
    loss_fn = jax.jit(functools.partial(lm.lm_loss, cfg=cfg, tc=c.train, mesh=None))
    loss, (metrics, aux) = loss_fn(params, batch, None)

    @jax.jit
    def parts(params, batch):
        logits, fwd_aux = model_lib.forward(
            params,
            batch["inputs"],
            cfg,
            positions=batch["positions"],
            segment_ids=batch["segment_ids"],
        )
        ce, nll, _ = next_token_loss(logits, batch["targets"], batch["loss_mask"])
        mtp_BTV = model_lib.mtp_logits(params, fwd_aux, cfg)
        mtp, _ = mtp_distillation(mtp_BTV, logits, batch["segment_ids"], batch["loss_mask"])
        return ce, nll, mtp, fwd_aux["balance_loss"]

    ce, nll, mtp, balance = parts(params, batch)
    want = ce + 0.5 * mtp + 0.01 * balance
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["bpb"], nll / (math.log(2) * 60), rtol=1e-5)
    assert float(metrics["target_tokens"]) == 60
    assert float(metrics["router_max_over_mean"]) >= 1.0 >= float(metrics["router_min_over_mean"])
    chex.assert_shape(aux["expert_load"], (cfg.n_moe_layers, cfg.n_experts))
    # per layer, the loads count every non-padding token k times
    np.testing.assert_array_equal(aux["expert_load"].sum(-1), 60 * cfg.n_experts_per_token)


def test_gradients_reach_every_trained_leaf(small):
    c, cfg, params, batch = small
    loss_fn = functools.partial(lm.lm_loss, cfg=cfg, tc=c.train, mesh=None)
    grads = jax.jit(jax.grad(lambda p: loss_fn(p, batch, None)[0]))(params)
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    for path, g in flat:
        name = jax.tree_util.keystr(path)
        if "router_bias" in name:  # moved by the balancing rule, not by gradients
            assert float(jnp.abs(g).max()) == 0.0, name
        else:
            assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0, name


def test_hf_import_adds_a_fresh_mtp_module(tmp_path, small):
    from c2.model.hf import export_hf_checkpoint

    c, cfg, _, _ = small
    base_cfg = cfg.replace(mtp_depth=0)  # a base model without MTP layers, as released
    base = model_lib.init_params(base_cfg, jax.random.key(7))
    export_hf_checkpoint(base, base_cfg, tmp_path / "hf")
    mesh = lm.make_mesh({"data": 8, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1})
    params = lm.import_hf_params(str(tmp_path / "hf"), cfg, mesh, seed=3)
    assert set(params) == set(base) | {"mtp"}
    chex.assert_trees_all_equal({k: params[k] for k in base}, base)
    chex.assert_trees_all_equal_shapes_and_dtypes(
        params["mtp"], model_lib.abstract_params(cfg)["mtp"]
    )
    norms = [float(jnp.std(x)) for x in jax.tree.leaves(params["mtp"]) if x.ndim >= 2]
    assert max(norms) > 0  # freshly initialised, not zeros
    with pytest.raises(ConfigError, match=r"init_from='hf:.*': checkpoint leaf .* has shape"):
        lm.import_hf_params(str(tmp_path / "hf"), cfg.replace(d_ff=48), mesh)


@pytest.mark.slow
def test_sharded_stage_trains_with_expert_parallelism(tmp_path):
    """Three steps of a real stage on data 2 x fsdp 2 x expert 2, then its held-out evaluation."""
    from c2.pipeline import run_stage

    c = small_config()
    c.mesh.data, c.mesh.fsdp, c.mesh.expert = 2, 2, 2
    c.train.steps, c.train.checkpoint_every = 3, 3
    c.optimizer.warmup_steps = 1
    c.data.eval_batches = 1
    last = run_stage(c, tmp_path)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[0]["cum_tokens"] == 8 * 32 and last["step"] == 3
    # untrained byte model: ~log2(320) bits per byte on held-out text
    assert 7.0 < last["eval_bpb"] < 9.0 and 0.0 <= last["eval_mtp1_acceptance"] <= 1.0
    assert (tmp_path / "checkpoints" / "3").is_dir()
