"""One mesh with named axes, and a rules table from logical axes to mesh axes.

Layers name logical axes (`batch, seq, embed, heads, experts, mlp, vocab, ...`); `RULES` maps
each to mesh axes. A `Layout` is a mesh with its rules: the one value that lays out weights,
activations, the engine's state and the plan's programs alike (a bare `Mesh` means the default
`RULES`). Expert and context parallelism are explicit `shard_map`s in the model; the rest is GSPMD
driven by these shardings.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding
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


def parse_mesh(spec: str) -> dict[str, int]:
    """Mesh axis sizes from a spec such as "expert=4,tensor=2" (axes not named are 1; "" is one
    device), as `config.rl.rollout_mesh` gives them."""
    sizes = dict.fromkeys(MESH_AXES, 1)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in MESH_AXES or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(
                f"mesh spec {spec!r}: {part!r} is not axis=size with an axis of {MESH_AXES} "
                "and a positive size (e.g. 'expert=4,tensor=2')"
            )
        sizes[name] = int(value)
    return sizes


def mesh_from_spec(spec: str, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh a spec names (`parse_mesh`), on the first devices it needs (default: this
    process's local devices)."""
    sizes = parse_mesh(spec)
    devices = list(jax.local_devices() if devices is None else devices)
    n = math.prod(sizes.values())
    if n > len(devices):
        raise ValueError(f"mesh spec {spec!r} needs {n} devices but {len(devices)} are available")
    return make_mesh(**sizes, devices=devices[:n])


def rule_axes(target: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axes a rule maps to, as a tuple (() for None: replicated)."""
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def logical_to_spec(axes: Sequence[str | None], rules: Mapping = RULES) -> P:
    """PartitionSpec for a tuple of logical axis names (None = replicated).

    A mesh axis can shard only one dimension of an array: rules that map two of its dimensions
    onto one mesh axis raise a ValueError naming both logical axes and the mesh axis.
    """
    out, owner = [], {}
    for a in axes:
        if a is None:
            out.append(None)
            continue
        if a not in rules:
            raise KeyError(f"logical axis {a!r} has no sharding rule; known: {sorted(rules)}")
        for m in rule_axes(rules[a]):
            if m in owner:
                raise ValueError(
                    f"logical axes {owner[m]!r} and {a!r} of {tuple(axes)} both map to mesh axis "
                    f"{m!r} (rules {owner[m]}={rules[owner[m]]!r}, {a}={rules[a]!r}): a mesh axis "
                    "can shard only one dimension of an array"
                )
            owner[m] = a
        target = rules[a]
        out.append(tuple(target) if isinstance(target, list) else target)
    return P(*out)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and the rules that lay arrays out on it, passed as one value wherever a mesh goes
    (`forward`, `init_params`, `param_shardings`, `batch_sharding`, the engine, the plan), so
    weights and activations follow one table. `rules` is a whole table (`{**RULES, ...}`)."""

    mesh: Mesh | AbstractMesh
    rules: Mapping[str, str | tuple[str, ...] | None] = dataclasses.field(
        default_factory=lambda: dict(RULES)
    )

    def __post_init__(self):
        rules = {k: tuple(v) if isinstance(v, list) else v for k, v in self.rules.items()}
        missing = sorted(set(RULES) - set(rules))
        if missing:
            raise ValueError(
                f"sharding rules lack logical axes {missing}: give a whole table, "
                "e.g. {**c2.sharding.RULES, ...overrides}"
            )
        names = tuple(self.mesh.axis_names)
        for logical, target in rules.items():
            for axis in rule_axes(target):
                if axis not in names:
                    raise ValueError(
                        f"sharding rule {logical}={target!r}: {axis!r} is not an axis of the "
                        f"mesh {names}"
                    )
        if rule_axes(rules["experts"]) not in ((), ("expert",)):
            raise ValueError(
                f"sharding rule experts={rules['experts']!r}: expert parallelism runs over the "
                "'expert' mesh axis; map experts to 'expert' or None (replicated)"
            )
        logical_to_spec(("batch", "seq"), rules)  # every token array needs them apart
        object.__setattr__(self, "rules", types.MappingProxyType(rules))

    def __hash__(self):  # a static argument of jit, like a Mesh
        return hash((self.mesh, frozenset(self.rules.items())))


def as_layout(
    mesh: Mesh | AbstractMesh | Layout | None, rules: Mapping | None = None
) -> Layout | None:
    """The layout a `mesh` argument stands for: a Layout as given, a bare mesh with `rules`
    (default: RULES), None without a mesh. A Layout and other rules beside it is refused."""
    if mesh is None:
        return None
    if isinstance(mesh, Layout):
        if rules is not None and Layout(mesh.mesh, rules) != mesh:
            raise ValueError(
                "a Layout carries its own sharding rules; other rules were passed beside it "
                f"({dict(rules)} vs {dict(mesh.rules)}): pass one or the other"
            )
        return mesh
    return Layout(mesh, RULES if rules is None else rules)


def mesh_of(mesh: Mesh | AbstractMesh | Layout | None) -> Mesh | AbstractMesh | None:
    """The jax mesh of a mesh argument (a Layout's, or the mesh itself)."""
    return mesh.mesh if isinstance(mesh, Layout) else mesh


def named_sharding(
    mesh: Mesh | Layout, axes: Sequence[str | None], rules: Mapping | None = None
) -> NamedSharding:
    """NamedSharding by logical axes, under `rules` or else the mesh's own (RULES when bare)."""
    layout = as_layout(mesh, rules)
    return NamedSharding(layout.mesh, logical_to_spec(axes, layout.rules))


def axis_size(mesh: Mesh | Layout | None, name: str | tuple[str, ...] | None) -> int:
    mesh = mesh_of(mesh)
    if mesh is None or name is None:
        return 1
    names = name if isinstance(name, tuple) else (name,)
    return math.prod(mesh.shape[n] for n in names)


def axes_of(mesh: Mesh | Layout | None, logical: str) -> tuple[str, ...]:
    """The mesh axes the layout's rules map `logical` to (() without a mesh)."""
    layout = as_layout(mesh)
    return () if layout is None else rule_axes(layout.rules[logical])


def batch_sharding(mesh: Mesh | Layout) -> NamedSharding:
    """Sharding of a [batch, seq] token array by the `batch` and `seq` rules (by default batch
    over the data-like axes, seq over context)."""
    return named_sharding(mesh, ("batch", "seq"))


# A flattened [tokens, ...] array (batch-major rows of a [batch, seq, ...] one) is split over these
# (under the default RULES; `token_axes` gives a layout's).
TOKEN_AXES = (*BATCH_AXES, "context")


def token_axes(mesh: Mesh | Layout | None) -> tuple[str, ...]:
    """The mesh axes a flattened [tokens, ...] array is split over: batch's, then seq's."""
    return axes_of(mesh, "batch") + axes_of(mesh, "seq")


def per_device_tokens(fn, mesh: Mesh | Layout | None, tokens: Sequence[bool], n_out: int):
    """`fn` run on each device's own tokens inside `jax.shard_map`.

    Arguments marked True in `tokens` (and every output) are [T, ...] arrays whose T is split over
    `token_axes(mesh)`; the others enter whole on every device (a sharded weight is gathered
    first, as FSDP does for any matmul; autodiff sums its gradient over the mesh). For Pallas
    calls, which have no partitioning rule: outside shard_map XLA would gather their token
    operands too and run the global call on every device. `fn` returns a tuple of `n_out`
    arrays; with no mesh (or one device) it is returned unchanged.
    """
    layout = as_layout(mesh)
    if layout is None or layout.mesh.size == 1:
        return fn
    tok = P(token_axes(layout))
    return jax.shard_map(
        fn,
        mesh=layout.mesh,
        in_specs=tuple(tok if t else P() for t in tokens),
        out_specs=(tok,) * n_out,
        check_vma=False,
    )


def constrain(x: jax.Array, mesh: Mesh | Layout | None, axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical axes under the layout's rules; a no-op without a
    mesh."""
    layout = as_layout(mesh)
    if layout is None or layout.mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(layout, axes))


def check_divisible(
    mesh: Mesh | Layout | None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    n_experts: int | None = None,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
) -> None:
    """Fail before compiling, with the numbers, when the layout does not divide the activations
    (parameters: `c2.model.check_mesh`)."""
    layout = as_layout(mesh)
    if layout is None:
        return
    checks = [
        ("batch", batch, "batch"),
        ("sequence length", seq, "seq"),
        ("n_experts", n_experts, "experts"),
        ("n_heads", n_heads, "heads"),
        ("n_kv_heads", n_kv_heads, "kv_heads"),
    ]
    for what, n, logical in checks:
        axes = layout.rules[logical]
        size = axis_size(layout, rule_axes(axes))
        if n is not None and n % size:
            raise ValueError(
                f"{what}={n} is not divisible by mesh axes {axes} of size {size} "
                f"(mesh {dict(layout.mesh.shape)})"
            )
