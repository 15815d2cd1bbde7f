"""One mesh with named axes, and a rules table from logical axes to mesh axes.

Layers name logical axes (`batch, seq, embed, heads, experts, mlp, vocab, ...`); `RULES` maps
each to mesh axes. Expert and context parallelism are explicit `shard_map`s in the model; the rest
is GSPMD driven by these shardings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")

# Tokens are split over every data-like axis: the expert axis doubles as a data axis outside the
# MoE block, as in DeepSeek-V3's training layout.
BATCH_AXES = ("data", "fsdp", "expert")

RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "seq": "context",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
    "experts": "expert",
    "layers": None,
    "q_lora": None,
    "kv_lora": None,
    "head_dim": None,
    "expert_embed": None,
    "expert_mlp": None,
}


def make_mesh(
    data: int = 1,
    fsdp: int = 1,
    expert: int = 1,
    context: int = 1,
    tensor: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """The c2 mesh; the product of the axis sizes must equal the number of devices used."""
    shape = (data, fsdp, expert, context, tensor)
    for name, size in zip(MESH_AXES, shape):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh axis {name}={size!r}: expected a positive int")
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(shape) != len(devices):
        sizes = ", ".join(f"{n}={s}" for n, s in zip(MESH_AXES, shape))
        raise ValueError(
            f"mesh ({sizes}) has {math.prod(shape)} devices but {len(devices)} are available"
        )
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], rules: Mapping = RULES) -> P:
    """PartitionSpec for a tuple of logical axis names (None = replicated)."""
    out, used = [], set()
    for a in axes:
        m = None if a is None else rules.get(a)
        if a is not None and a not in rules:
            raise KeyError(f"logical axis {a!r} has no sharding rule; known: {sorted(rules)}")
        # A mesh axis may shard only one dimension of an array.
        if isinstance(m, tuple):
            m = tuple(x for x in m if x not in used) or None
            used.update(m or ())
        elif m is not None:
            m = None if m in used else m
            used.add(m)
        out.append(m)
    return P(*out)


def named_sharding(mesh: Mesh, axes: Sequence[str | None], rules: Mapping = RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, rules))


def axis_size(mesh: Mesh | None, name: str | tuple[str, ...] | None) -> int:
    if mesh is None or name is None:
        return 1
    names = name if isinstance(name, tuple) else (name,)
    return math.prod(mesh.shape[n] for n in names)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a [batch, seq] token array: batch over data-like axes, seq over context."""
    return named_sharding(mesh, ("batch", "seq"))


# A flattened [tokens, ...] array (batch-major rows of a [batch, seq, ...] one) is split over these.
TOKEN_AXES = (*BATCH_AXES, "context")


def per_device_tokens(fn, mesh: Mesh | None, tokens: Sequence[bool], n_out: int):
    """`fn` run on each device's own tokens inside `jax.shard_map`.

    Arguments marked True in `tokens` (and every output) are [T, ...] arrays whose T is split over
    TOKEN_AXES; the others enter whole on every device (a sharded weight is gathered first, as
    FSDP does for any matmul; autodiff sums its gradient over the mesh). For Pallas calls, which
    have no partitioning rule: outside shard_map XLA would gather their token operands too and
    run the global call on every device. `fn` returns a tuple of `n_out` arrays; with no mesh (or
    one device) it is returned unchanged.
    """
    if mesh is None or mesh.size == 1:
        return fn
    tok = P(TOKEN_AXES)
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=tuple(tok if t else P() for t in tokens),
        out_specs=(tok,) * n_out,
        check_vma=False,
    )


def constrain(x: jax.Array, mesh: Mesh | None, axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical axes; a no-op without a mesh."""
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, axes))


def check_divisible(
    mesh: Mesh | None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    n_experts: int | None = None,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
) -> None:
    """Fail before compiling, with the numbers, when the mesh does not divide the activations
    (parameters: `c2.model.check_mesh`)."""
    if mesh is None:
        return
    checks = [
        ("batch", batch, RULES["batch"]),
        ("sequence length", seq, RULES["seq"]),
        ("n_experts", n_experts, RULES["experts"]),
        ("n_heads", n_heads, RULES["heads"]),
        ("n_kv_heads", n_kv_heads, RULES["kv_heads"]),
    ]
    for what, n, axes in checks:
        size = axis_size(mesh, axes)
        if n is not None and n % size:
            raise ValueError(
                f"{what}={n} is not divisible by mesh axes {axes} of size {size} "
                f"(mesh {dict(mesh.shape)})"
            )
