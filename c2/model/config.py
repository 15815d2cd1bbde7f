"""Model configuration: one frozen (hashable, jit-static) dataclass for both families.

`family="deepseek_v3"` covers DeepSeek-V3 and Kimi-K2 (MLA, sigmoid group-limited router, shared
experts); `family="qwen3_moe"` covers Qwen3-MoE (GQA with q/k norm, softmax router).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

FAMILIES = ("deepseek_v3", "qwen3_moe")


@dataclasses.dataclass(frozen=True)
class YarnConfig:
    """YaRN RoPE scaling (arXiv:2309.00071) as DeepSeek-V3 and transformers define it."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    truncate: bool = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: Literal["deepseek_v3", "qwen3_moe"]
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    # Dense MLP (first_k_dense layers) and per-expert MLP widths.
    d_ff: int
    d_ff_expert: int
    n_experts: int
    n_experts_per_token: int
    first_k_dense: int = 0
    n_shared_experts: int = 0
    # MLA (deepseek_v3): q_lora_rank=0 means a full-rank q projection.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # GQA (qwen3_moe).
    n_kv_heads: int = 0
    head_dim: int = 0
    # Router.
    score_func: Literal["sigmoid", "softmax"] = "sigmoid"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    # Positions.
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    rope_scaling: YarnConfig | None = None
    max_seq_len: int = 4096
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # Multi-token prediction modules (DeepSeek-V3 style), 0 = none.
    mtp_depth: int = 0
    # Numerics and implementation choices.
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    quant: Literal["bf16", "mxfp8"] = "bf16"
    mxfp8_block_size: int = 32
    moe_impl: Literal["ragged", "dense"] = "ragged"
    # Kernels: "xla" (XLA ops) or "pallas" (pallas_kernels/: MXFP8 quantise and dense/grouped
    # block-scaled matmuls; router replay). Pallas runs interpreted on CPU: slow, for tests.
    mxfp8_impl: Literal["xla", "pallas"] = "xla"
    router_impl: Literal["xla", "pallas"] = "xla"
    # Expert-parallel token exchange capacity (multiple of the balanced load); None = dropless.
    expert_capacity_factor: float | None = None
    # Expert-parallel token exchange: ragged_all_to_all (GPU/TPU) or a padded all_to_all.
    expert_exchange: Literal["auto", "ragged", "padded"] = "auto"
    # Expert-parallel tokens per exchange, per device (0: all of them at once): a device's tokens
    # go through the exchange and the experts in chunks of this many, each rematerialised, so the
    # exchange's buffers (~1.25 x tokens x k rows of d_model) are one chunk's; the backward runs
    # each chunk's experts forward once more. Dropless, the result does not depend on it.
    moe_token_chunk: int = 0
    # The experts' FSDP all-gather in the compute dtype (`dtype`), not the masters' (`param_dtype`):
    # half the bytes gathered and held per layer when the masters are float32, the same forward
    # (the matmuls cast to `dtype` anyway; every MoE path casts first); their gradients leave
    # the layer and are summed over the FSDP shards in it too (bf16: a coarser sum than
    # float32's). A frozen copy (the RL reference) keeps the experts in `dtype` (`frozen_copy`).
    expert_gather_in_dtype: bool = False
    remat: bool = False
    # Training-path attention (c2/model/attention.py). "dense" materialises float32 scores
    # [B, heads, T, S]; "blockwise" is flash-style (c2/model/flash.py: online softmax over K/V
    # blocks, recompute backward, O(T) memory) and, with a context axis, ring attention
    # (c2/model/ring.py); "cudnn" is jax.nn.dot_product_attention(implementation="cudnn") on GPU
    # (blockwise elsewhere); "auto" is dense up to attention_dense_max_len tokens, blockwise beyond.
    attention_impl: Literal["auto", "dense", "blockwise", "cudnn"] = "auto"
    attention_block_q: int = 512
    attention_block_kv: int = 512
    attention_dense_max_len: int = 4096

    def __post_init__(self):
        _validate(self)

    # Derived sizes ---------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.family == "deepseek_v3"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def attn_v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.first_k_dense

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)


def _validate(c: ModelConfig) -> None:
    def need(cond: bool, field: str, value, expected: str):
        if not cond:
            raise ValueError(f"ModelConfig.{field}={value!r}: expected {expected}")

    need(c.family in FAMILIES, "family", c.family, f"one of {FAMILIES}")
    for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_experts", "n_experts_per_token"):
        need(getattr(c, f) > 0, f, getattr(c, f), "> 0")
    need(
        0 <= c.first_k_dense <= c.n_layers,
        "first_k_dense",
        c.first_k_dense,
        f"in [0, n_layers={c.n_layers}]",
    )
    need(
        c.n_experts_per_token <= c.n_experts,
        "n_experts_per_token",
        c.n_experts_per_token,
        f"<= n_experts={c.n_experts}",
    )
    need(c.score_func in ("sigmoid", "softmax"), "score_func", c.score_func, "sigmoid or softmax")
    need(
        c.n_experts % c.n_group == 0, "n_group", c.n_group, f"a divisor of n_experts={c.n_experts}"
    )
    need(1 <= c.topk_group <= c.n_group, "topk_group", c.topk_group, f"in [1, n_group={c.n_group}]")
    if c.n_group > 1:
        # Group scores sum each group's top-2 experts, and enough groups must hold k experts.
        need(c.n_experts // c.n_group >= 2, "n_group", c.n_group, "groups of at least 2 experts")
        need(
            c.topk_group * (c.n_experts // c.n_group) >= c.n_experts_per_token,
            "topk_group",
            c.topk_group,
            "enough groups to hold n_experts_per_token experts",
        )
    if c.is_mla:
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            need(getattr(c, f) > 0, f, getattr(c, f), "> 0 for MLA (family deepseek_v3)")
        need(c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", c.qk_rope_head_dim, "even")
    else:
        need(c.head_dim > 0 and c.head_dim % 2 == 0, "head_dim", c.head_dim, "even and > 0")
        need(
            c.n_kv_heads > 0 and c.n_heads % c.n_kv_heads == 0,
            "n_kv_heads",
            c.n_kv_heads,
            f"a divisor of n_heads={c.n_heads}",
        )
    need(c.quant in ("bf16", "mxfp8"), "quant", c.quant, "bf16 or mxfp8")
    need(c.mxfp8_block_size in (16, 32), "mxfp8_block_size", c.mxfp8_block_size, "16 or 32")
    need(c.moe_impl in ("ragged", "dense"), "moe_impl", c.moe_impl, "ragged or dense")
    need(c.mxfp8_impl in ("xla", "pallas"), "mxfp8_impl", c.mxfp8_impl, "xla or pallas")
    need(c.router_impl in ("xla", "pallas"), "router_impl", c.router_impl, "xla or pallas")
    need(c.dtype in ("bfloat16", "float32", "float16"), "dtype", c.dtype, "bf16/fp32/fp16")
    need(
        c.param_dtype in ("bfloat16", "float32"),
        "param_dtype",
        c.param_dtype,
        "bfloat16 or float32",
    )
    need(
        c.expert_exchange in ("auto", "ragged", "padded"),
        "expert_exchange",
        c.expert_exchange,
        "auto, ragged or padded",
    )
    if c.expert_exchange == "ragged":
        need(
            c.expert_capacity_factor is None,
            "expert_capacity_factor",
            c.expert_capacity_factor,
            "None with expert_exchange='ragged' (the ragged exchange is dropless)",
        )
    need(c.moe_token_chunk >= 0, "moe_token_chunk", c.moe_token_chunk, ">= 0 (0: no chunks)")
    need(c.mtp_depth >= 0, "mtp_depth", c.mtp_depth, ">= 0")
    need(
        c.attention_impl in ("auto", "dense", "blockwise", "cudnn"),
        "attention_impl",
        c.attention_impl,
        "auto, dense, blockwise or cudnn",
    )
    for f in ("attention_block_q", "attention_block_kv", "attention_dense_max_len"):
        need(getattr(c, f) > 0, f, getattr(c, f), "> 0")
    need(
        c.expert_capacity_factor is None or c.expert_capacity_factor > 0,
        "expert_capacity_factor",
        c.expert_capacity_factor,
        "None (dropless) or > 0",
    )
