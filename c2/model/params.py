"""Parameters declared abstractly (shape, dtype, logical axes, initialiser), then one jitted init.

The declaration is a pytree of `ParamSpec`; shardings, `jax.ShapeDtypeStruct`s, parameter counts
and the real init are all derived from it, so no array is ever built on one host and moved.
Layers of one kind are stacked on a leading `layers` axis and scanned.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh

from c2 import sharding
from c2.model.config import ModelConfig

Init = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]
INIT_STD = 0.02  # transformers' initializer_range for both families

# The ModelConfig field that sets a logical axis' size, for errors that name it; a spec whose
# dimension comes from another expression says so in `ParamSpec.fields`.
AXIS_FIELDS = {
    "vocab": "vocab_size",
    "embed": "d_model",
    "expert_embed": "d_model",
    "heads": "n_heads",
    "kv_heads": "n_kv_heads",
    "mlp": "d_ff",
    "experts": "n_experts",
    "expert_mlp": "d_ff_expert",
    "q_lora": "q_lora_rank",
    "kv_lora": "kv_lora_rank",
}


def normal(std: float = INIT_STD) -> Init:
    return lambda key, shape, dtype: (std * jax.random.normal(key, shape, jnp.float32)).astype(
        dtype
    )


def constant(value: float) -> Init:
    return lambda key, shape, dtype: jnp.full(shape, value, dtype)


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: Init = dataclasses.field(default=normal(), compare=False)
    dtype: str | None = None  # None: the config's param_dtype
    # The config field behind each dimension (None: AXIS_FIELDS of its logical axis).
    fields: tuple[str | None, ...] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        assert len(self.shape) == len(self.axes), (self.shape, self.axes)
        assert self.fields is None or len(self.fields) == len(self.shape), (self.shape, self.fields)

    def field(self, dim: int) -> str | None:
        return AXIS_FIELDS.get(self.axes[dim]) if self.fields is None else self.fields[dim]


def _stack(tree: dict, n: int, field: str) -> dict:
    """Prefix every spec with a `layers` axis of size n (the config's `field`)."""
    return jax.tree.map(
        lambda s: dataclasses.replace(
            s,
            shape=(n, *s.shape),
            axes=("layers", *s.axes),
            fields=(field, *(s.field(i) for i in range(len(s.shape)))),
        ),
        tree,
        is_leaf=lambda x: isinstance(x, ParamSpec),
    )


def _norm(d: int) -> ParamSpec:
    return ParamSpec((d,), (None,), constant(1.0))


def attention_specs(c: ModelConfig) -> dict:
    H, N = c.d_model, c.n_heads
    if c.is_mla:
        p = {
            "wkv_a": ParamSpec((H, c.kv_lora_rank + c.qk_rope_head_dim), ("embed", None)),
            "kv_norm": _norm(c.kv_lora_rank),
            "wkv_b": ParamSpec(
                (c.kv_lora_rank, N, c.qk_nope_head_dim + c.v_head_dim), ("kv_lora", "heads", None)
            ),
            "wo": ParamSpec((N, c.v_head_dim, H), ("heads", None, "embed")),
        }
        if c.q_lora_rank:
            # As wkv_a: the rank's rule shards wq_b only (FSDP configs put q_lora on embed's axis).
            p["wq_a"] = ParamSpec((H, c.q_lora_rank), ("embed", None))
            p["q_norm"] = _norm(c.q_lora_rank)
            p["wq_b"] = ParamSpec((c.q_lora_rank, N, c.qk_head_dim), ("q_lora", "heads", None))
        else:
            p["wq"] = ParamSpec((H, N, c.qk_head_dim), ("embed", "heads", None))
        return p
    D, K = c.head_dim, c.n_kv_heads
    return {
        "wq": ParamSpec((H, N, D), ("embed", "heads", None)),
        "wk": ParamSpec((H, K, D), ("embed", "kv_heads", None)),
        "wv": ParamSpec((H, K, D), ("embed", "kv_heads", None)),
        "q_norm": _norm(D),
        "k_norm": _norm(D),
        "wo": ParamSpec((N, D, H), ("heads", None, "embed")),
    }


def mlp_specs(d_model: int, d_ff: int, d_ff_field: str = "d_ff") -> dict:
    f = ("d_model", d_ff_field)
    return {
        "w_gate": ParamSpec((d_model, d_ff), ("embed", "mlp"), fields=f),
        "w_up": ParamSpec((d_model, d_ff), ("embed", "mlp"), fields=f),
        "w_down": ParamSpec((d_ff, d_model), ("mlp", "embed"), fields=f[::-1]),
    }


def moe_specs(c: ModelConfig) -> dict:
    H, E, I = c.d_model, c.n_experts, c.d_ff_expert
    p = {
        # The router stays in float32 whatever the param dtype (as in DeepSeek-V3).
        "router": ParamSpec((H, E), ("embed", None), dtype="float32"),
        "w_gate": ParamSpec((E, H, I), ("experts", "expert_embed", "expert_mlp")),
        "w_up": ParamSpec((E, H, I), ("experts", "expert_embed", "expert_mlp")),
        "w_down": ParamSpec((E, I, H), ("experts", "expert_mlp", "expert_embed")),
    }
    if c.score_func == "sigmoid":
        # Aux-loss-free balancing bias: used for selection only, updated outside the optimiser.
        p["router_bias"] = ParamSpec((E,), (None,), constant(0.0), dtype="float32")
    if c.n_shared_experts:
        p["shared"] = mlp_specs(H, I * c.n_shared_experts, "d_ff_expert * n_shared_experts")
    return p


def layer_specs(c: ModelConfig, moe: bool) -> dict:
    return {
        "attn_norm": _norm(c.d_model),
        "attn": attention_specs(c),
        "mlp_norm": _norm(c.d_model),
        "mlp": moe_specs(c) if moe else mlp_specs(c.d_model, c.d_ff),
    }


def param_specs(c: ModelConfig) -> dict:
    """The whole model's parameters, declared."""
    H, V = c.d_model, c.vocab_size
    p = {"embed": ParamSpec((V, H), ("vocab", "embed")), "final_norm": _norm(H)}
    if not c.tie_word_embeddings:
        p["lm_head"] = ParamSpec((H, V), ("embed", "vocab"))
    if c.first_k_dense:
        p["dense_layers"] = _stack(layer_specs(c, moe=False), c.first_k_dense, "first_k_dense")
    if c.n_moe_layers:
        p["moe_layers"] = _stack(
            layer_specs(c, moe=True), c.n_moe_layers, "n_layers - first_k_dense"
        )
    if c.mtp_depth:
        # DeepSeek-V3 MTP module: norms of hidden and next-token embedding, projection, a block,
        # and its own output norm before the shared head.
        mtp = {
            "hnorm": _norm(H),
            "enorm": _norm(H),
            "eh_proj": ParamSpec((2 * H, H), (None, "embed")),
            "block": layer_specs(c, moe=c.n_moe_layers > 0),
            "norm": _norm(H),
        }
        p["mtp"] = _stack(mtp, c.mtp_depth, "mtp_depth")
    return p


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def abstract_params(c: ModelConfig) -> dict:
    """`jax.ShapeDtypeStruct` tree: plan with it (memory, counts) without allocating anything."""
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype or c.param_dtype)),
        param_specs(c),
        is_leaf=_is_spec,
    )


def routed_experts(c: ModelConfig) -> dict:
    """True for the routed experts' weights (the leaves with an `experts` axis), else False."""
    return jax.tree.map(lambda s: "experts" in s.axes, param_specs(c), is_leaf=_is_spec)


def frozen_copy(params: dict, c: ModelConfig) -> dict:
    """A frozen copy of `params` for forwards only (the RL reference): with
    `expert_gather_in_dtype` every MoE path casts the routed experts to `dtype` before using
    them, so they are kept in it (the same values; Kimi-K2's float32 experts are 90% of its
    bytes); every other weight as it is."""
    if not c.expert_gather_in_dtype:
        return params
    dtype = jnp.dtype(c.dtype)
    return jax.tree.map(
        lambda p, routed: p.astype(dtype) if routed else p, params, routed_experts(c)
    )


def check_mesh(c: ModelConfig, mesh: Mesh | AbstractMesh | sharding.Layout, rules=None) -> None:
    """Every dimension the rules shard divisible by its mesh axes, else one ValueError naming
    each config field, its value, the mesh axes and their size (jax would name none of them).
    `rules`: the layout's own when None (RULES for a bare mesh)."""
    layout = sharding.as_layout(mesh, rules)
    bad = {}
    for path, s in jax.tree_util.tree_flatten_with_path(param_specs(c), is_leaf=_is_spec)[0]:
        try:
            spec = sharding.logical_to_spec(s.axes, layout.rules)
        except ValueError as e:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)}: {e}") from None
        for dim, (n, axes) in enumerate(zip(s.shape, spec)):
            size = sharding.axis_size(layout, axes)
            if n % size:
                key = (s.field(dim) or f"{s.axes[dim]} dimension", n, axes, size)
                bad.setdefault(key, (s.axes[dim], jax.tree_util.keystr(path)))
    if bad:
        lines = [
            f"ModelConfig.{field}={n} is not divisible by mesh axes {_axes(axes)} of size {size} "
            f"(logical axis {logical!r}, e.g. parameter {where})"
            for (field, n, axes, size), (logical, where) in bad.items()
        ]
        raise ValueError(
            f"the mesh {dict(layout.mesh.shape)} cannot shard the model: " + "; ".join(lines)
        )


def _axes(axes: str | tuple[str, ...]) -> str:
    return axes if isinstance(axes, str) else " x ".join(axes)


def param_shardings(c: ModelConfig, mesh: Mesh | sharding.Layout, rules=None) -> dict:
    """NamedShardings of every parameter (`check_mesh` first: an indivisible layout fails here).
    `rules`: the layout's own when None (RULES for a bare mesh)."""
    layout = sharding.as_layout(mesh, rules)
    check_mesh(c, layout)
    return jax.tree.map(
        lambda s: sharding.named_sharding(layout, s.axes), param_specs(c), is_leaf=_is_spec
    )


def init_params(
    c: ModelConfig, rng: jax.Array, mesh: Mesh | sharding.Layout | None = None, rules=None
) -> dict:
    """One jitted init; with a mesh every array is created directly in its shards (laid out by
    `rules`, else the layout's own)."""
    specs = param_specs(c)
    paths_specs, treedef = jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec)

    def init(key):
        leaves = []
        for path, s in paths_specs:
            # Keys from the parameter's name: adding a parameter never changes the others.
            name = jax.tree_util.keystr(path)
            k = jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)
            leaves.append(s.init(k, s.shape, jnp.dtype(s.dtype or c.param_dtype)))
        return jax.tree_util.tree_unflatten(treedef, leaves)

    out_shardings = None if mesh is None else param_shardings(c, mesh, rules)
    return jax.jit(init, out_shardings=out_shardings)(rng)


# Accounting ----------------------------------------------------------------------------------


def _count(tree) -> int:
    return sum(math.prod(s.shape) for s in jax.tree.leaves(tree, is_leaf=_is_spec))


def count_params(c: ModelConfig, include_mtp: bool = False) -> tuple[int, int]:
    """(total, active per token). Active counts only the k routed experts a token uses."""
    specs = param_specs(c)
    if not include_mtp:
        specs.pop("mtp", None)
    total = _count(specs)
    n_moe = c.n_moe_layers + (c.mtp_depth if include_mtp and c.n_moe_layers else 0)
    inactive = n_moe * (c.n_experts - c.n_experts_per_token) * 3 * c.d_model * c.d_ff_expert
    return total, total - inactive


def flops_per_token(c: ModelConfig, seq_len: int, include_mtp: bool = True) -> float:
    """Training FLOPs (forward + backward = 3x forward) per token.

    Matmuls: 2 FLOPs per active weight (the embedding lookup is not a matmul). Attention: QK^T and
    AV over a causal context, on average seq_len / 2 keys per query.
    """
    total, active = count_params(c, include_mtp=include_mtp)
    matmul_params = active - c.vocab_size * c.d_model * (1 if not c.tie_word_embeddings else 0)
    n_attn = c.n_layers + (c.mtp_depth if include_mtp else 0)
    attn = 2 * c.n_heads * (c.qk_head_dim + c.attn_v_dim) * (seq_len / 2) * n_attn
    mtp_heads = (c.mtp_depth if include_mtp else 0) * c.d_model * c.vocab_size  # shared head reused
    return 3.0 * (2.0 * (matmul_params + mtp_heads) + attn)
