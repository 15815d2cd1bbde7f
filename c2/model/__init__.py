"""The functional MoE transformer (DeepSeek-V3 / Kimi-K2 and Qwen3-MoE families)."""

from c2.model import presets
from c2.model.config import ModelConfig, YarnConfig
from c2.model.params import (
    abstract_params,
    check_mesh,
    count_params,
    flops_per_token,
    init_params,
    param_shardings,
    param_specs,
)
from c2.model.transformer import (
    decode_step,
    forward,
    init_cache,
    lm_head,
    mtp_logits,
    prefill,
    restack,
    unstack,
    update_router_bias,
)


def load_hf_checkpoint(path, *args, **kwargs):
    """(config, params) from a Hugging Face safetensors directory; see c2.model.hf."""
    from c2.model import hf

    return hf.load_hf_checkpoint(path, *args, **kwargs)


__all__ = [
    "ModelConfig",
    "YarnConfig",
    "presets",
    "abstract_params",
    "check_mesh",
    "count_params",
    "flops_per_token",
    "init_params",
    "param_shardings",
    "param_specs",
    "decode_step",
    "forward",
    "init_cache",
    "lm_head",
    "mtp_logits",
    "prefill",
    "restack",
    "unstack",
    "update_router_bias",
    "load_hf_checkpoint",
]
