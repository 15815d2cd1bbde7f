"""c2's building blocks vs the transformers modules they reproduce, one component at a time.

RMSNorm, RoPE and YaRN (frequencies, attention factor, softmax scale, both rotary layouts),
MLA and GQA attention (including packed documents), the two routers, the MoE block (ragged and
dense dispatch) and whole decoder layers. float32 on CPU; tolerance 1e-4 relative to max |ref|.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf_qwen  # noqa: E402

from c2.model import layers, moe, transformer  # noqa: E402
from c2.model.attention import attention  # noqa: E402
from c2.model.hf_config import config_from_hf  # noqa: E402

B, T = 2, 12
RNG = np.random.RandomState(0)
X = RNG.standard_normal((B, T, 32)).astype(np.float32)  # hidden_size 32 in both tiny models
YARN_DS = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "mscale": 1.0,
    "mscale_all_dim": 0.7,
}
MODELS = {
    "mla_qlora_yarn_groups": (
        "deepseek_v3",
        dict(rope_parameters=YARN_DS, n_group=4, topk_group=2),
    ),
    "mla_full_q_rotate_half": ("deepseek_v3", dict(q_lora_rank=None, rope_interleave=False)),
    "gqa_norm_topk": ("qwen3_moe", dict(norm_topk_prob=True)),
    "gqa_no_norm_topk": ("qwen3_moe", dict(norm_topk_prob=False)),
}


@pytest.fixture(scope="module")
def models(hf_model, to_c2):
    """{name: (hf model, c2 config, c2 params)} built once for the module."""
    out = {}
    for name, (family, overrides) in MODELS.items():
        model = hf_model(family, seed=len(out), **overrides)
        out[name] = (model, *to_c2(model))
    return out


def t(x) -> torch.Tensor:
    return torch.as_tensor(np.array(x))


def layer_params(params, cfg, i: int) -> dict:
    """Parameters of decoder layer i (dense layers are stacked first, then MoE layers)."""
    group, j = (
        ("dense_layers", i) if i < cfg.first_k_dense else ("moe_layers", i - cfg.first_k_dense)
    )
    return jax.tree.map(lambda a: a[j], params[group])


def causal_mask(segment_ids: np.ndarray) -> torch.Tensor:
    """transformers' additive [B, 1, T, T] mask: causal within each packed document."""
    seg = t(segment_ids)
    idx = torch.arange(seg.shape[1])
    ok = (seg[:, :, None] == seg[:, None, :]) & (idx[None, None, :] <= idx[None, :, None])
    return torch.where(ok, 0.0, torch.finfo(torch.float32).min)[:, None]


def hf_rope(model, positions: np.ndarray):
    return model.model.rotary_emb(t(X), t(positions).long())


# Norm and positions -----------------------------------------------------------------------------


def test_rms_norm(assert_parity):
    norm = hf_ds.DeepseekV3RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
        ref = norm(t(X)).numpy()
    assert_parity(layers.rms_norm(jnp.asarray(X), jnp.asarray(norm.weight.detach()), 1e-6), ref)


ROPE_CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "deepseek_v3": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "kimi_k2": {
        "rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0, "beta_fast": 1.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "mscale_ratio": dict(YARN_DS, mscale=0.707, mscale_all_dim=1.0, factor=8.0),
    "mscale_all_dim_only": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 512,
    },
    "no_mscale_no_truncate": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "truncate": False,
        "original_max_position_embeddings": 512,
    },
}  # fmt: skip


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_frequencies_and_yarn_factors(case, family):
    """inv_freq, the cos/sin attention factor and the softmax scale, via config_from_hf."""
    if family == "deepseek_v3":
        hf_cfg = transformers.DeepseekV3Config(
            num_hidden_layers=2, first_k_dense_replace=1, qk_rope_head_dim=64,
            max_position_embeddings=256,
            rope_parameters=dict(ROPE_CASES[case]),
        )  # fmt: skip
        rotary, attn = hf_ds.DeepseekV3RotaryEmbedding(hf_cfg), hf_ds.DeepseekV3Attention
    else:
        hf_cfg = transformers.Qwen3MoeConfig(
            num_hidden_layers=2, head_dim=128, max_position_embeddings=256,
            rope_parameters=dict(ROPE_CASES[case]),
        )  # fmt: skip
        rotary, attn = hf_qwen.Qwen3MoeRotaryEmbedding(hf_cfg), hf_qwen.Qwen3MoeAttention
    cfg = config_from_hf(json.loads(hf_cfg.to_json_string()))
    inv_freq, factor = layers.rope_frequencies(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
    np.testing.assert_allclose(inv_freq, rotary.inv_freq.numpy(), rtol=1e-6)
    np.testing.assert_allclose(factor, rotary.attention_scaling, rtol=1e-6)
    np.testing.assert_allclose(layers.softmax_scale(cfg), attn(hf_cfg, 0).scaling, rtol=1e-6)
    if case == "mscale_ratio":  # the case is chosen so that every factor differs from 1
        assert abs(factor - 1) > 0.01 and cfg.rope_scaling.factor > 1


@pytest.mark.parametrize(
    "name", ["mla_qlora_yarn_groups", "mla_full_q_rotate_half", "gqa_norm_topk"]
)
def test_apply_rope_matches_both_layouts(name, models, assert_parity):
    model, cfg, _ = models[name]
    positions = np.stack([np.arange(T), np.arange(T) + 1000])  # long offsets exercise YaRN
    cos, sin = hf_rope(model, positions)
    x = RNG.standard_normal((B, 3, T, cfg.rope_dim)).astype(np.float32)  # HF layout [B, N, T, d]
    if cfg.rope_interleave:
        ref, _ = hf_ds.apply_rotary_pos_emb_interleave(t(x), t(x), cos, sin)
    else:
        ref, _ = hf_qwen.apply_rotary_pos_emb(t(x), t(x), cos, sin)
    c2_cos, c2_sin = layers.rope_cos_sin(jnp.asarray(positions), cfg)
    ours = layers.apply_rope(
        jnp.asarray(x.transpose(0, 2, 1, 3)), c2_cos, c2_sin, cfg.rope_interleave
    )
    assert_parity(np.asarray(ours).transpose(0, 2, 1, 3), ref.numpy())


# Attention ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["one_doc", "packed_docs"])
@pytest.mark.parametrize(
    "name", ["mla_qlora_yarn_groups", "mla_full_q_rotate_half", "gqa_norm_topk"]
)
def test_attention_matches(name, packed, models, assert_parity):
    """Packed rows: c2's segment ids and restarting positions vs an equivalent HF mask."""
    model, cfg, params = models[name]
    if packed:
        segment_ids = np.array([[1] * 5 + [2] * 7, [1] * 9 + [2] * 3])
        positions = np.array([list(range(5)) + list(range(7)), list(range(9)) + list(range(3))])
    else:
        segment_ids = np.ones((B, T), np.int32)
        positions = np.broadcast_to(np.arange(T), (B, T))
    module = model.model.layers[1].self_attn
    with torch.no_grad():
        ref = module(t(X), hf_rope(model, positions), causal_mask(segment_ids))[0].numpy()
    p = layer_params(params, cfg, 1)["attn"]
    ours, _ = attention(jnp.asarray(X), p, cfg, jnp.asarray(positions), jnp.asarray(segment_ids))
    assert_parity(ours, ref)


# Router and MoE ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_router_matches(name, models):
    """Same expert sets per token, same gate weight per expert."""
    model, cfg, params = models[name]
    x = X.reshape(B * T, -1)
    with torch.no_grad():
        _, ref_w, ref_idx = model.model.layers[1].mlp.gate(t(x))
    p = layer_params(params, cfg, 1)["mlp"]
    idx, gates, *_ = moe.route(jnp.asarray(x), p, cfg)
    idx, gates = np.asarray(idx), np.asarray(gates)
    ref_idx, ref_w = ref_idx.numpy(), ref_w.numpy()
    for tok in range(B * T):
        assert set(idx[tok]) == set(ref_idx[tok]), tok
        mine, theirs = np.argsort(idx[tok]), np.argsort(ref_idx[tok])
        np.testing.assert_allclose(gates[tok][mine], ref_w[tok][theirs], rtol=1e-5, atol=1e-7)
    if cfg.score_func == "sigmoid":
        # The score-correction bias and the group limit really decide some tokens.
        scores = moe.router_scores(jnp.asarray(x), p, cfg)
        unbiased = np.asarray(moe.select_experts(scores, None, cfg))
        assert any(set(a) != set(b) for a, b in zip(unbiased, idx))
        if cfg.n_group > 1:
            ungrouped = np.asarray(
                moe.select_experts(scores, p["router_bias"], cfg.replace(n_group=1, topk_group=1))
            )
            assert any(set(a) != set(b) for a, b in zip(ungrouped, idx))
    if cfg.score_func == "softmax" and not cfg.norm_topk_prob:
        assert np.all(gates.sum(-1) < 1.0)  # un-renormalised softmax mass


@pytest.mark.parametrize("impl", ["ragged", "dense"])
@pytest.mark.parametrize("name", ["mla_qlora_yarn_groups", "gqa_no_norm_topk"])
def test_moe_block_matches(name, impl, models, assert_parity):
    model, cfg, params = models[name]
    with torch.no_grad():
        ref = model.model.layers[1].mlp(t(X)).numpy()
    p = layer_params(params, cfg, 1)["mlp"]
    c = cfg.replace(moe_impl=impl)
    ours, stats = moe.moe_block(jnp.asarray(X), p, c, jnp.ones((B, T), jnp.int32))
    assert_parity(ours, ref)
    assert int(stats["expert_load"].sum()) == B * T * cfg.n_experts_per_token


# Decoder layers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,i",
    [("mla_qlora_yarn_groups", 0), ("mla_qlora_yarn_groups", 1), ("gqa_norm_topk", 1)],
    ids=["deepseek_dense", "deepseek_moe", "qwen3_moe"],
)
def test_decoder_layer_matches(name, i, models, assert_parity):
    model, cfg, params = models[name]
    positions = np.broadcast_to(np.arange(T), (B, T))
    segment_ids = np.ones((B, T), np.int32)
    with torch.no_grad():
        ref = model.model.layers[i](
            t(X),
            attention_mask=causal_mask(segment_ids),
            position_ids=t(positions).long(),
            position_embeddings=hf_rope(model, positions),
        ).numpy()
    ours, _, _ = transformer.block(
        jnp.asarray(X), layer_params(params, cfg, i), cfg, jnp.asarray(positions),
        jnp.asarray(segment_ids), None, moe=i >= cfg.first_k_dense,
    )  # fmt: skip
    assert_parity(ours, ref)
