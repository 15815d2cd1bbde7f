"""Named model configurations: the real models (abstract planning only) and tiny CPU variants."""

from __future__ import annotations

from c2.model.config import ModelConfig, YarnConfig


def kimi_k2() -> ModelConfig:
    """Kimi-K2 (moonshotai/Kimi-K2-Instruct config.json): ~1.03T total, ~32B active."""
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=163840,
        d_model=7168,
        n_layers=61,
        n_heads=64,
        d_ff=18432,
        d_ff_expert=2048,
        n_experts=384,
        n_experts_per_token=8,
        first_k_dense=1,
        n_shared_experts=1,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        score_func="sigmoid",
        n_group=1,
        topk_group=1,
        routed_scaling_factor=2.827,
        norm_topk_prob=True,
        rope_theta=50000.0,
        rope_scaling=YarnConfig(
            factor=32.0,
            original_max_position_embeddings=4096,
            beta_fast=1.0,
            beta_slow=1.0,
            mscale=1.0,
            mscale_all_dim=1.0,
        ),
        max_seq_len=131072,
        mtp_depth=0,
    )


def deepseek_v3() -> ModelConfig:
    """DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 671B total, 37B active, one MTP module."""
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=129280,
        d_model=7168,
        n_layers=61,
        n_heads=128,
        d_ff=18432,
        d_ff_expert=2048,
        n_experts=256,
        n_experts_per_token=8,
        first_k_dense=3,
        n_shared_experts=1,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        score_func="sigmoid",
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        rope_theta=10000.0,
        rope_scaling=YarnConfig(
            factor=40.0,
            original_max_position_embeddings=4096,
            beta_fast=32.0,
            beta_slow=1.0,
            mscale=1.0,
            mscale_all_dim=1.0,
        ),
        max_seq_len=163840,
        mtp_depth=1,
    )


def qwen3_30b_a3b() -> ModelConfig:
    """Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 30.5B total, 3.3B active."""
    return ModelConfig(
        family="qwen3_moe",
        vocab_size=151936,
        d_model=2048,
        n_layers=48,
        n_heads=32,
        n_kv_heads=4,
        head_dim=128,
        d_ff=6144,
        d_ff_expert=768,
        n_experts=128,
        n_experts_per_token=8,
        score_func="softmax",
        norm_topk_prob=True,
        rope_theta=1_000_000.0,
        rope_interleave=False,
        max_seq_len=40960,
    )


def tiny_kimi_k2() -> ModelConfig:
    """Kimi-K2's shape (MLA with q low-rank, 1 dense layer, shared expert, sigmoid router), tiny."""
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=320,
        d_model=128,
        n_layers=4,
        n_heads=4,
        d_ff=384,
        d_ff_expert=96,
        n_experts=16,
        n_experts_per_token=4,
        first_k_dense=1,
        n_shared_experts=1,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        score_func="sigmoid",
        routed_scaling_factor=2.827,
        norm_topk_prob=True,
        rope_theta=50000.0,
        max_seq_len=2048,
        mtp_depth=1,
    )


def tiny_deepseek_v3() -> ModelConfig:
    """DeepSeek-V3's shape (group-limited routing, 2 dense layers, YaRN), tiny."""
    return ModelConfig(
        family="deepseek_v3",
        vocab_size=320,
        d_model=128,
        n_layers=4,
        n_heads=4,
        d_ff=384,
        d_ff_expert=64,
        n_experts=16,
        n_experts_per_token=4,
        first_k_dense=2,
        n_shared_experts=1,
        q_lora_rank=0,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        score_func="sigmoid",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        rope_scaling=YarnConfig(
            factor=4.0, original_max_position_embeddings=256, mscale=1.0, mscale_all_dim=1.0
        ),
        max_seq_len=1024,
        mtp_depth=1,
    )


def tiny_qwen3_moe() -> ModelConfig:
    """Qwen3-MoE's shape (GQA + q/k norm, softmax router), tiny."""
    return ModelConfig(
        family="qwen3_moe",
        vocab_size=320,
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        d_ff=384,
        d_ff_expert=64,
        n_experts=16,
        n_experts_per_token=4,
        score_func="softmax",
        norm_topk_prob=True,
        rope_theta=1_000_000.0,
        rope_interleave=False,
        max_seq_len=2048,
    )


PRESETS = {
    f.__name__: f
    for f in (kimi_k2, deepseek_v3, qwen3_30b_a3b, tiny_kimi_k2, tiny_deepseek_v3, tiny_qwen3_moe)
}


def get(name: str, **overrides) -> ModelConfig:
    """A preset by name, with field overrides."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]().replace(**overrides)
