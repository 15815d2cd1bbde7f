"""Small building blocks: RMSNorm, RoPE (with YaRN), linear projections (bf16 or MXFP8), MLP."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from c2 import sharding
from c2.model.config import ModelConfig, YarnConfig
from c2.quant import target


def einsum_f32(spec: str, *operands: jax.Array) -> jax.Array:
    """einsum with float32 accumulation and output. XLA:CPU's dot has no bf16 x bf16 -> f32 form,
    so on the CPU the operands are widened first (exact: the same products and sums)."""
    if target.platform() == "cpu":
        return jnp.einsum(spec, *(o.astype(jnp.float32) for o in operands))
    return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32)


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32, scaled in the input dtype (as transformers does)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * xf.astype(x.dtype)


# RoPE -----------------------------------------------------------------------------------------


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(dim: int, theta: float, yarn: YarnConfig | None) -> tuple[np.ndarray, float]:
    """Inverse frequencies [dim/2] and the cos/sin attention factor (YaRN's mscale ratio)."""
    pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_freq = (1.0 / pos_freqs).astype(np.float32)
    if yarn is None:
        return inv_freq, 1.0
    f = yarn.factor

    def correction_dim(n_rot: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (n_rot * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp  # 1: keep the original frequency (high-frequency dims)
    inv_freq = (1.0 / (f * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    if yarn.mscale and yarn.mscale_all_dim:
        attn_factor = _yarn_mscale(f, yarn.mscale) / _yarn_mscale(f, yarn.mscale_all_dim)
    else:
        attn_factor = _yarn_mscale(f)
    return inv_freq.astype(np.float32), float(attn_factor)


def softmax_scale(c: ModelConfig) -> float:
    """1/sqrt(d_qk), times YaRN's mscale_all_dim correction squared for MLA (DeepSeek-V3)."""
    scale = c.qk_head_dim**-0.5
    y = c.rope_scaling
    if c.is_mla and y is not None and y.mscale_all_dim:
        scale *= _yarn_mscale(y.factor, y.mscale_all_dim) ** 2
    return scale


def rope_cos_sin(positions: jax.Array, c: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [..., rope_dim/2] in float32 for integer positions [...]."""
    inv_freq, factor = rope_frequencies(c.rope_dim, c.rope_theta, c.rope_scaling)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    return jnp.cos(ang) * factor, jnp.sin(ang) * factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, interleave: bool) -> jax.Array:
    """Rotate x [B, T, heads, d] by cos/sin [B, T, d/2].

    interleave=True rotates pairs (x0, x1), (x2, x3), ... and writes the rotated evens then the
    rotated odds (DeepSeek's layout, as transformers computes it); False rotates the two halves.
    """
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    xf = x.astype(jnp.float32)
    if interleave:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        x1, x2 = jnp.split(xf, 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


# Projections ----------------------------------------------------------------------------------


def linear(x: jax.Array, w: jax.Array, c: ModelConfig, n_in: int = 1, mesh=None) -> jax.Array:
    """Contract x's last n_in axes with w's first: [..., *in] x [*in, *out] -> [..., *out].

    Computed in the config's dtype with float32 accumulation; with `quant="mxfp8"` all three
    GEMMs of the layer run in MXFP8 (c2.quant.mxfp8). The Pallas MXFP8 kernels run on each
    device's own rows inside `shard_map` when `mesh` is given (`sharding.per_device_tokens`: x's
    leading axes are batch-major tokens, w whole on every device).
    """
    dtype = jnp.dtype(c.dtype)
    in_shape, out_shape = w.shape[:n_in], w.shape[n_in:]
    assert x.shape[x.ndim - n_in :] == in_shape, (x.shape, w.shape, n_in)
    lead = x.shape[: x.ndim - n_in]
    # One flattened row axis: [rows, in] x [in, out]. With the leading axes kept ([B, T, in]),
    # the weight gradient contracts two axes, which XLA:CPU runs about 2x slower (BENCHMARKS.md).
    x2 = x.reshape(math.prod(lead), math.prod(in_shape)).astype(dtype)
    w2 = w.reshape(math.prod(in_shape), math.prod(out_shape)).astype(dtype)
    if c.quant == "mxfp8":
        from c2.quant import mxfp8

        def dot(x2, w2):
            return (mxfp8.mxfp8_dot(x2, w2, block_size=c.mxfp8_block_size, impl=c.mxfp8_impl),)

        if (
            c.mxfp8_impl == "pallas"
            and x2.shape[0] % sharding.axis_size(mesh, sharding.token_axes(mesh)) == 0
        ):  # (decoding's few rows: not split, the kernel runs whole)
            dot = sharding.per_device_tokens(dot, mesh, (True, False), 1)
        (y,) = dot(x2, w2)
    else:
        y = einsum_f32("mk,kn->mn", x2, w2).astype(dtype)
    return y.reshape(*lead, *out_shape)


def mlp(x: jax.Array, p: dict, c: ModelConfig, mesh=None) -> jax.Array:
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
    h = jax.nn.silu(linear(x, p["w_gate"], c, mesh=mesh)) * linear(x, p["w_up"], c, mesh=mesh)
    return linear(h, p["w_down"], c, mesh=mesh)
