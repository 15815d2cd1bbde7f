"""Hugging Face config.json <-> c2 `ModelConfig`, field by field.

Every HF field either maps to a c2 field, is checked to hold the one value c2 computes (else a
ValueError naming the field and value), or is listed in `_NO_EFFECT` with the reason it cannot
change the forward pass. Unknown fields fail in strict mode: a field nobody read is a field that
may silently change the computation.
"""

from __future__ import annotations

import logging
import math

from c2.model.config import ModelConfig, YarnConfig

log = logging.getLogger(__name__)

DEEPSEEK_TYPES = ("deepseek_v3", "kimi_k2")
QWEN_TYPES = ("qwen3_moe",)

# Fields that cannot change the forward pass: metadata, generation and parallelism settings,
# training-only auxiliary losses of the original code, and values c2 derives itself (DeepSeek's
# head_dim/qk_head_dim; MLA's num_key_value_heads, which only GQA uses).
_NO_EFFECT = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "output_router_logits", "ep_size", "aux_loss_alpha", "seq_aux", "router_aux_loss_coef",
    "pretraining_tp", "id2label", "label2id", "return_dict", "output_hidden_states",
    "output_attentions", "chunk_size_feed_forward", "problem_type", "is_encoder_decoder",
    "quantization_config",  # read by the loader (block-FP8 dequantisation)
    "dtype", "torch_dtype",  # read by the loader (compute dtype): `checkpoint_dtype`
    "c2_tokenizer",  # read by c2.eval.models: a tokenizer without a tokenizer.json ("byte")
}  # fmt: skip
_READ = {
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_experts_per_tok", "norm_topk_prob",
    "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias", "num_local_experts",
    "attention_dropout", "tie_word_embeddings", "rope_parameters", "rope_scaling", "rope_theta",
    "partial_rotary_factor",
}  # fmt: skip
_DEEPSEEK = {
    "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_group",
    "topk_group", "routed_scaling_factor", "num_nextn_predict_layers", "num_mtp_layers",
    "topk_method", "scoring_func", "moe_layer_freq", "rope_interleave", "head_dim",
    "qk_head_dim", "num_key_value_heads",
}  # fmt: skip
_QWEN = {
    "num_experts", "decoder_sparse_step", "mlp_only_layers", "layer_types", "head_dim",
    "num_key_value_heads", "use_sliding_window", "sliding_window", "max_window_layers",
}  # fmt: skip


_YARN_KEYS = {
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "factor", "beta_fast",
    "beta_slow", "mscale", "mscale_all_dim", "original_max_position_embeddings", "truncate",
    "attention_factor",
}  # fmt: skip


def _unsupported(field: str, value, expected: str):
    return ValueError(f"HF config {field}={value!r} is not supported by c2: expected {expected}")


def _require(d: dict, field: str, ok, expected: str, default=None):
    value = d.get(field, default)
    if not ok(value):
        raise _unsupported(field, value, expected)
    return value


def _get(d: dict, *names, default=None):
    """The first present (non-None) of several aliases (transformers' attribute_map)."""
    for n in names:
        if d.get(n) is not None:
            return d[n]
    return default


def checkpoint_dtype(hf: dict) -> str | None:
    """config.json's `dtype` (transformers 5) or `torch_dtype` (4.x); None when absent.

    The loader computes in it by default, so a float32 checkpoint runs in float32 like transformers.
    """
    hf = {**hf, **hf.get("text_config", {})}  # multimodal wrappers: the language model's
    value = _get(hf, "dtype", "torch_dtype")
    if value is None:
        return None
    value = str(value).removeprefix("torch.")
    if value not in ("float32", "bfloat16", "float16"):
        raise _unsupported("dtype", value, "'float32', 'bfloat16' or 'float16'")
    return value


def _rope(d: dict, head_dim: int) -> tuple[float, YarnConfig | None]:
    """(rope_theta, YarnConfig | None) from `rope_parameters` (transformers 5) or `rope_scaling`."""
    rp = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0)))
    prf = rp.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if prf not in (None, 1, 1.0):
        raise _unsupported("partial_rotary_factor", prf, "1.0 (rotary over the whole rope dim)")
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise _unsupported("rope_parameters.rope_type", rope_type, "'default' or 'yarn'")
    unknown = sorted(set(rp) - _YARN_KEYS)
    if unknown:
        raise _unsupported("rope_parameters", rp, f"only the YaRN keys {sorted(_YARN_KEYS)}")
    max_pos = d.get("max_position_embeddings")
    original = rp.get("original_max_position_embeddings", max_pos)
    factor = rp.get("factor")
    if factor is None:  # transformers: DeepSeek-style configs derive the factor
        factor = max_pos / original
    # transformers treats mscale=None as "use the plain log formula"; c2 tests `mscale and
    # mscale_all_dim`, so a missing mscale becomes 0.0 (falsy) to keep the same branch.
    yarn = YarnConfig(
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(rp.get("beta_fast") or 32.0),
        beta_slow=float(rp.get("beta_slow") or 1.0),
        mscale=float(rp.get("mscale") or 0.0),
        mscale_all_dim=float(rp.get("mscale_all_dim") or 0.0),
        truncate=bool(rp.get("truncate", True)),
    )
    if rp.get("attention_factor") is not None:
        from c2.model.layers import rope_frequencies

        derived = rope_frequencies(head_dim, theta, yarn)[1]
        if not math.isclose(rp["attention_factor"], derived, rel_tol=1e-6):
            raise _unsupported(
                "rope_parameters.attention_factor",
                rp["attention_factor"],
                f"unset or the value derived from factor/mscale ({derived:.6g})",
            )
    return theta, yarn


def config_from_hf(hf: dict, *, strict: bool = True) -> ModelConfig:
    """A c2 ModelConfig from a DeepseekV3 / Kimi-K2 / Qwen3-MoE config.json dict.

    Raises ValueError naming the field for any setting c2 does not compute; with strict=True also
    for fields it does not know. `mtp_depth` is the config's num_nextn_predict_layers; the loader
    lowers it to the MTP layers the checkpoint actually holds.
    """
    if "text_config" in hf:  # multimodal wrappers (Kimi-K2.5): the language model's config
        hf = hf["text_config"]
    mt = hf.get("model_type")
    arch = (hf.get("architectures") or [""])[0]
    if mt in DEEPSEEK_TYPES or arch == "DeepseekV3ForCausalLM":
        family, known = "deepseek_v3", _READ | _DEEPSEEK
    elif mt in QWEN_TYPES or arch == "Qwen3MoeForCausalLM":
        family, known = "qwen3_moe", _READ | _QWEN
    else:
        raise _unsupported("model_type", mt, f"one of {DEEPSEEK_TYPES + QWEN_TYPES}")
    unknown = sorted(set(hf) - known - _NO_EFFECT)
    if unknown:
        msg = f"HF config fields c2 does not know (they may change the computation): {unknown}"
        if strict:
            raise ValueError(msg + "; pass strict=False to ignore them")
        log.warning(msg)

    _require(hf, "hidden_act", lambda v: v == "silu", "'silu'", "silu")
    _require(hf, "attention_bias", lambda v: not v, "false", False)
    _require(hf, "attention_dropout", lambda v: not v, "0.0 (c2 has no dropout)", 0.0)
    H, N = hf["hidden_size"], hf["num_attention_heads"]
    common = dict(
        vocab_size=hf["vocab_size"],
        d_model=H,
        n_layers=hf["num_hidden_layers"],
        n_heads=N,
        d_ff=hf["intermediate_size"],
        d_ff_expert=hf["moe_intermediate_size"],
        n_experts_per_token=hf["num_experts_per_tok"],
        max_seq_len=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    if family == "deepseek_v3":
        _require(hf, "topk_method", lambda v: v == "noaux_tc", "'noaux_tc'", "noaux_tc")
        _require(hf, "scoring_func", lambda v: v == "sigmoid", "'sigmoid'", "sigmoid")
        _require(hf, "moe_layer_freq", lambda v: v == 1, "1 (every layer after the dense ones)", 1)
        theta, yarn = _rope(hf, hf["qk_rope_head_dim"])
        return ModelConfig(
            family=family,
            **common,
            n_experts=_get(hf, "n_routed_experts", "num_local_experts"),
            first_k_dense=hf.get("first_k_dense_replace", 0),
            n_shared_experts=hf.get("n_shared_experts") or 0,
            q_lora_rank=hf.get("q_lora_rank") or 0,
            kv_lora_rank=hf["kv_lora_rank"],
            qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"],
            score_func="sigmoid",
            n_group=hf.get("n_group") or 1,
            topk_group=hf.get("topk_group") or 1,
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            rope_theta=theta,
            rope_interleave=bool(hf.get("rope_interleave", True)),
            rope_scaling=yarn,
            mtp_depth=_get(hf, "num_nextn_predict_layers", "num_mtp_layers", default=0),
        )
    _require(hf, "use_sliding_window", lambda v: not v, "false (c2 attends the full context)")
    _require(hf, "decoder_sparse_step", lambda v: v == 1, "1 (every layer is MoE)", 1)
    lt = hf.get("layer_types")
    if lt is not None and set(lt) != {"full_attention"}:
        raise _unsupported("layer_types", lt, "only 'full_attention'")
    dense = sorted(hf.get("mlp_only_layers") or [])
    if dense != list(range(len(dense))):  # c2 runs dense layers first, then MoE layers
        raise _unsupported("mlp_only_layers", dense, "[] or the first k layers [0, ..., k-1]")
    head_dim = hf.get("head_dim") or H // N
    theta, yarn = _rope(hf, head_dim)
    return ModelConfig(
        family=family,
        **common,
        n_experts=_get(hf, "num_experts", "num_local_experts"),
        first_k_dense=len(dense) if dense else 0,
        n_kv_heads=hf.get("num_key_value_heads") or N,
        head_dim=head_dim,
        score_func="softmax",
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        rope_theta=theta,
        rope_interleave=False,
        rope_scaling=yarn,
    )


def _rope_parameters(c: ModelConfig) -> dict:
    rp = {"rope_type": "default", "rope_theta": c.rope_theta}
    y = c.rope_scaling
    if y is not None:
        rp.update(
            rope_type="yarn",
            factor=y.factor,
            original_max_position_embeddings=y.original_max_position_embeddings,
            beta_fast=y.beta_fast,
            beta_slow=y.beta_slow,
            mscale=y.mscale or None,
            mscale_all_dim=y.mscale_all_dim or None,
            truncate=y.truncate,
        )
    return rp


def config_to_hf(c: ModelConfig) -> dict:
    """config.json for transformers' DeepseekV3ForCausalLM / Qwen3MoeForCausalLM."""

    def need(ok: bool, field: str, expected: str):
        if not ok:
            raise ValueError(
                f"ModelConfig.{field}={getattr(c, field)!r} has no {c.family} HF equivalent: "
                f"expected {expected}"
            )

    out = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.d_ff,
        moe_intermediate_size=c.d_ff_expert,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_experts_per_tok=c.n_experts_per_token,
        norm_topk_prob=c.norm_topk_prob,
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters=_rope_parameters(c),
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        dtype=c.param_dtype,
    )
    if c.is_mla:
        need(c.score_func == "sigmoid", "score_func", "'sigmoid'")
        return dict(
            out,
            architectures=["DeepseekV3ForCausalLM"],
            model_type="deepseek_v3",
            n_routed_experts=c.n_experts,
            n_shared_experts=c.n_shared_experts,
            first_k_dense_replace=c.first_k_dense,
            q_lora_rank=c.q_lora_rank or None,
            kv_lora_rank=c.kv_lora_rank,
            qk_nope_head_dim=c.qk_nope_head_dim,
            qk_rope_head_dim=c.qk_rope_head_dim,
            v_head_dim=c.v_head_dim,
            num_key_value_heads=c.n_heads,  # MLA: every head has its own key and value
            n_group=c.n_group,
            topk_group=c.topk_group,
            routed_scaling_factor=c.routed_scaling_factor,
            rope_interleave=c.rope_interleave,
            num_nextn_predict_layers=c.mtp_depth,
        )
    need(c.score_func == "softmax", "score_func", "'softmax'")
    need(c.n_shared_experts == 0, "n_shared_experts", "0")
    need(c.n_group == 1, "n_group", "1")
    need(c.routed_scaling_factor == 1.0, "routed_scaling_factor", "1.0")
    need(not c.rope_interleave, "rope_interleave", "False (Qwen3 rotates halves)")
    return dict(
        out,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        num_experts=c.n_experts,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        decoder_sparse_step=1,
        mlp_only_layers=list(range(c.first_k_dense)),
        use_sliding_window=False,
    )
