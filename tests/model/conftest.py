"""Tiny random transformers models (the reference) and their c2 conversions, for the HF tests.

torch and transformers are imported inside the fixtures, so modules that do not use them (and
machines without them) are unaffected; the HF test modules skip with pytest.importorskip.
"""

from __future__ import annotations

import numpy as np
import pytest

# Small enough to compile in seconds, large enough that every feature is exercised: 3 experts of
# 8 chosen, 4 groups of 2 for group-limited routing, 4 heads (2 kv heads for GQA).
DEEPSEEK_BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    q_lora_rank=12,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=256,
    initializer_range=0.1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
QWEN_BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=8,
    num_experts_per_tok=3,
    norm_topk_prob=True,
    max_position_embeddings=256,
    initializer_range=0.1,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
)


def _randomise(model, torch, seed: int):
    """Norm weights around 1, decisive router logits, a non-zero DeepSeek score-correction bias."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g))


@pytest.fixture(scope="session")
def hf_model():
    """hf_model(family, seed=0, **config_overrides) -> a randomised transformers model in eval."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def make(family: str, seed: int = 0, **overrides):
        torch.manual_seed(seed)
        if family == "deepseek_v3":
            cfg = transformers.DeepseekV3Config(**{**DEEPSEEK_BASE, **overrides})
            model = transformers.DeepseekV3ForCausalLM(cfg)
        else:
            cfg = transformers.Qwen3MoeConfig(**{**QWEN_BASE, **overrides})
            model = transformers.Qwen3MoeForCausalLM(cfg)
        model.config._attn_implementation = "eager"
        _randomise(model, torch, seed)
        return model.eval()

    return make


@pytest.fixture(scope="session")
def to_c2():
    """to_c2(hf_model) -> (float32 ModelConfig, params) converted in memory (no files)."""
    from c2.model import hf

    def convert(model, **kw):
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        cfg, params = hf.from_hf_source(hf.DictSource(state), model.config.to_dict(), **kw)
        return cfg.replace(dtype="float32"), params

    return convert


def rel_err(ours, ref) -> float:
    """max |ours - ref| relative to max |ref| (the parity criterion, 1e-4)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="session")
def assert_parity():
    def check(ours, ref, tol: float = 1e-4):
        err = rel_err(ours, ref)
        assert err <= tol, f"max |diff| = {err:.3g} x max |ref| > {tol}"

    return check
