"""Hugging Face checkpoints in and out: safetensors <-> c2 parameter trees.

Import reads a directory written by transformers' `DeepseekV3ForCausalLM` (DeepSeek-V3, Kimi-K2's
text model) or `Qwen3MoeForCausalLM`: config.json (mapped by `c2.model.hf_config`) and *.safetensors
(+ model.safetensors.index.json when sharded). Each c2 leaf is built by
`jax.make_array_from_callback`: a device's callback reads only the slice of each HF tensor that its
shard holds, so no host ever holds the whole model. Per-expert tensors
(`mlp.experts.{e}.gate_proj.weight`, what `save_pretrained` writes) and transformers 5's fused
in-memory layout (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) are both read, and
block-FP8 weights (`weight_scale_inv`, DeepSeek-V3 / Kimi-K2 releases) are dequantised on the fly.
DeepSeek MTP layers (`model.layers.{n_layers + d}.*`) are imported into `params["mtp"]` when the
checkpoint holds them; their copies of the embedding and head are skipped (c2 shares them).

The parameter dtype follows the stored embedding (float32 stays float32; bf16 and FP8 releases
load as bfloat16) unless `dtype=` says otherwise; routers stay float32. The compute dtype
(`ModelConfig.dtype`) follows config.json's `dtype` / `torch_dtype` (else the parameter dtype)
unless `compute_dtype=` says otherwise, so a float32 checkpoint computes in float32 and matches
transformers out of the box; pass `compute_dtype="bfloat16"` for bf16 speed. Slicing and FP8 live in
`c2.model.hf_tensors`, config.json mapping in `c2.model.hf_config`.

Export writes per-expert safetensors + config.json that `from_pretrained` loads (single process:
each layer is gathered to the host in turn). CLI, through orbax:
`python -m c2.model.hf import HF_DIR ORBAX_DIR [--dtype bfloat16] [--compute_dtype bfloat16]
[--mesh fsdp=8]` and
`python -m c2.model.hf export ORBAX_DIR HF_DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from c2.model import params as params_lib
from c2.model.config import ModelConfig, YarnConfig
from c2.model.hf_config import checkpoint_dtype, config_from_hf, config_to_hf
from c2.model.hf_tensors import DictSource, SafetensorsSource, Src, read_slice

__all__ = [
    "DictSource", "SafetensorsSource", "checkpoint_dtype", "config_from_hf", "config_to_hf",
    "export_hf_checkpoint", "from_hf_source", "load_hf_checkpoint", "load_orbax", "save_orbax",
]  # fmt: skip

log = logging.getLogger(__name__)

_NP_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


# The name plan: which HF tensor (and which part of it) fills each c2 leaf -----------------------


@dataclasses.dataclass
class Leaf:
    shape: tuple[int, ...]  # the c2 leaf
    dtype: str
    srcs: np.ndarray  # object array of Src over the leading stack dims (layers, experts)

    @property
    def n_stack(self) -> int:
        return self.srcs.ndim


def _attn_names(c: ModelConfig) -> dict:
    if c.is_mla:
        names = {
            "wkv_a": ("kv_a_proj_with_mqa.weight", 1),
            "kv_norm": ("kv_a_layernorm.weight", None),
            "wkv_b": ("kv_b_proj.weight", 1),
            "wo": ("o_proj.weight", 2),
        }
        if c.q_lora_rank:
            names.update(
                wq_a=("q_a_proj.weight", 1),
                q_norm=("q_a_layernorm.weight", None),
                wq_b=("q_b_proj.weight", 1),
            )
        else:
            names["wq"] = ("q_proj.weight", 1)
        return names
    return {
        "wq": ("q_proj.weight", 1),
        "wk": ("k_proj.weight", 1),
        "wv": ("v_proj.weight", 1),
        "q_norm": ("q_norm.weight", None),
        "k_norm": ("k_norm.weight", None),
        "wo": ("o_proj.weight", 2),
    }


def _mlp_names(prefix: str) -> dict:
    return {f"w_{k}": (f"{prefix}{k}_proj.weight", 1) for k in ("gate", "up", "down")}


def _layer_srcs(c: ModelConfig, p: str, moe: bool, fused: bool) -> dict:
    """{c2 sub-path: Src or [E] list of Src} for one decoder layer with HF prefix p."""
    attn = {k: Src(f"{p}self_attn.{n}", k_in) for k, (n, k_in) in _attn_names(c).items()}
    out = {
        "attn_norm": Src(f"{p}input_layernorm.weight", None),
        "attn": attn,
        "mlp_norm": Src(f"{p}post_attention_layernorm.weight", None),
    }
    if not moe:
        out["mlp"] = {k: Src(f"{p}mlp.{n}", k_in) for k, (n, k_in) in _mlp_names("").items()}
        return out
    E, I = c.n_experts, c.d_ff_expert
    mlp = {"router": Src(f"{p}mlp.gate.weight")}
    if c.score_func == "sigmoid":
        mlp["router_bias"] = Src(f"{p}mlp.gate.e_score_correction_bias", None)
    if fused:
        mlp["w_gate"] = [Src(f"{p}mlp.experts.gate_up_proj", 1, e, 0) for e in range(E)]
        mlp["w_up"] = [Src(f"{p}mlp.experts.gate_up_proj", 1, e, I) for e in range(E)]
        mlp["w_down"] = [Src(f"{p}mlp.experts.down_proj", 1, e) for e in range(E)]
    else:
        for k, (n, k_in) in _mlp_names("").items():
            mlp[k] = [Src(f"{p}mlp.experts.{e}.{n}", k_in) for e in range(E)]
    if c.n_shared_experts:
        mlp["shared"] = {
            k: Src(f"{p}mlp.{n}", k_in) for k, (n, k_in) in _mlp_names("shared_experts.").items()
        }
    out["mlp"] = mlp
    return out


def _mtp_srcs(c: ModelConfig, p: str, fused: bool) -> dict:
    return {
        "hnorm": Src(f"{p}hnorm.weight", None),
        "enorm": Src(f"{p}enorm.weight", None),
        "eh_proj": Src(f"{p}eh_proj.weight"),
        "block": _layer_srcs(c, p, c.n_moe_layers > 0, fused),
        "norm": Src(f"{p}shared_head.norm.weight", None),
    }


def _is_src(x) -> bool:
    return isinstance(x, Src)


def _stacked(per_layer: list[dict]) -> dict:
    """Stack per-layer Src trees into object arrays [L] or [L, E]."""

    def stack(*xs):
        arr = np.empty((len(xs), *np.shape(xs[0])), dtype=object)
        for i, x in enumerate(xs):
            arr[i] = x if _is_src(x) else np.array(x, dtype=object)
        return arr

    return jax.tree.map(stack, *per_layer, is_leaf=lambda x: _is_src(x) or isinstance(x, list))


def name_plan(c: ModelConfig, prefix: str = "", fused_layers: frozenset = frozenset()) -> dict:
    """The c2 parameter tree with, at each leaf, an object array of `Src` over its stack dims."""
    P = f"{prefix}model."
    plan = {
        "embed": Src(f"{P}embed_tokens.weight", None),
        "final_norm": Src(f"{P}norm.weight", None),
    }
    if not c.tie_word_embeddings:
        plan["lm_head"] = Src(f"{prefix}lm_head.weight")

    def layers(idx, moe, fn):
        return _stacked([fn(c, f"{P}layers.{i}.", moe, i in fused_layers) for i in idx])

    if c.first_k_dense:
        plan["dense_layers"] = layers(range(c.first_k_dense), False, _layer_srcs)
    if c.n_moe_layers:
        plan["moe_layers"] = layers(range(c.first_k_dense, c.n_layers), True, _layer_srcs)
    if c.mtp_depth:
        idx = range(c.n_layers, c.n_layers + c.mtp_depth)
        plan["mtp"] = layers(idx, None, lambda c, p, _, f: _mtp_srcs(c, p, f))
    return jax.tree.map(
        lambda s: np.array(s, dtype=object) if _is_src(s) else s, plan, is_leaf=_is_src
    )


def _hf_shape(s: Src, c2_shape: tuple[int, ...]) -> tuple[int, ...]:
    if s.n_in is None:
        return c2_shape
    return (math.prod(c2_shape[s.n_in :]), math.prod(c2_shape[: s.n_in]))


def _leaves(c: ModelConfig, plan: dict) -> dict[str, tuple[tuple, Leaf]]:
    """{"a/b/c": (tree path, Leaf)} pairing the plan with `param_specs` (shapes and dtypes)."""
    specs = params_lib.param_specs(c)
    is_spec = lambda x: isinstance(x, params_lib.ParamSpec)
    flat_specs = jax.tree_util.tree_flatten_with_path(specs, is_leaf=is_spec)[0]
    flat_plan = dict(
        (jax.tree_util.keystr(p), v)
        for p, v in jax.tree_util.tree_flatten_with_path(
            plan, is_leaf=lambda x: isinstance(x, np.ndarray)
        )[0]
    )
    out = {}
    for path, spec in flat_specs:
        srcs = flat_plan[jax.tree_util.keystr(path)]
        key = "/".join(str(k.key) for k in path)
        out[key] = (path, Leaf(spec.shape, spec.dtype or c.param_dtype, srcs))
    return out


# Import ----------------------------------------------------------------------------------------


def _prefix(names: set[str]) -> str:
    """Weight-name prefix of the language model ("" or e.g. "language_model." in VLM wrappers)."""
    for n in sorted(names, key=len):
        if n.endswith("model.embed_tokens.weight"):
            return n[: -len("model.embed_tokens.weight")]
    raise ValueError("checkpoint has no tensor named model.embed_tokens.weight (or prefixed)")


def _check_names(leaves: dict, src, c: ModelConfig, fused_layers, prefix: str, block) -> None:
    """Every expected tensor present with the expected shape; nothing unexpected left over."""
    names = src.names()
    used, missing, wrong = set(), [], []
    for _, leaf in leaves.values():
        per_tensor = leaf.shape[leaf.n_stack :]
        for s in leaf.srcs.flat:
            used.add(s.name)
            if s.name not in names:
                missing.append(s.name)
                continue
            found = src.shape(s.name)
            if s.lead is None:
                exp = _hf_shape(s, per_tensor)
            elif s.name.endswith("gate_up_proj"):
                exp = (c.n_experts, 2 * c.d_ff_expert, c.d_model)
            else:
                exp = (c.n_experts, c.d_model, c.d_ff_expert)
            if found != exp:
                wrong.append(f"{s.name}: expected shape {list(exp)}, found {list(found)}")
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint is missing tensors: {sorted(set(missing))[:5]}{more}")
    if wrong:
        raise ValueError("checkpoint tensors have the wrong shape: " + "; ".join(wrong[:5]))
    mtp = [f"{prefix}model.layers.{c.n_layers + d}." for d in range(c.mtp_depth)]
    ignorable = re.compile(r".*rotary_emb\.inv_freq$")
    extra = []
    for n in sorted(names - used):
        if n.endswith("_scale_inv") and n[: -len("_scale_inv")] in used and block is not None:
            continue
        if ignorable.match(n) or any(
            n in (m + "embed_tokens.weight", m + "shared_head.head.weight") for m in mtp
        ):
            continue  # derived buffers; MTP copies of the shared embedding and head
        if c.tie_word_embeddings and n == f"{prefix}lm_head.weight":
            continue
        extra.append(n)
    if extra:
        more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
        raise ValueError(f"checkpoint has unexpected tensors: {extra[:5]}{more}")


def _make_leaf(leaf: Leaf, src, sharding, block) -> jax.Array:
    dtype = _NP_DTYPES[leaf.dtype]
    k = leaf.n_stack
    per_tensor = leaf.shape[k:]
    cache: dict = {}

    def callback(index):
        sl = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, leaf.shape))
        key = tuple((s.start, s.stop) for s in sl)
        if key not in cache:  # replicated shards ask for the same slice: read it once
            shape = tuple(s.stop - s.start for s in sl)
            parts = []
            for i in np.ndindex(*shape[:k]):  # the layers / experts of this shard
                s = leaf.srcs[tuple(a.start + j for a, j in zip(sl, i))]
                parts.append(read_slice(src, s, per_tensor, sl[k:], block).astype(dtype))
            cache[key] = np.stack(parts).reshape(shape)
        return cache[key]

    return jax.make_array_from_callback(leaf.shape, sharding, callback)


def _fp8_block(q: dict | None) -> tuple[int, int] | None:
    """Block shape of block-FP8 weights (DeepSeek-V3 / Kimi-K2 releases), None if unquantised."""
    if not q:
        return None
    if q.get("quant_method") != "fp8" or q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(
            f"HF config quantization_config={q!r} is not supported by c2: expected block FP8 "
            "(quant_method 'fp8', fmt 'e4m3') or no quantization"
        )
    return tuple(q.get("weight_block_size") or (128, 128))


def _default_dtype(src, embed_name: str) -> str:
    """The embedding's stored precision: float32 (also for float16, losslessly) or bfloat16."""
    return "float32" if src.dtype(embed_name) in ("float32", "float16") else "bfloat16"


def from_hf_source(
    src,
    hf_config: dict,
    *,
    mesh: Mesh | None = None,
    dtype: str | None = None,
    compute_dtype: str | None = None,
    strict: bool = True,
) -> tuple[ModelConfig, dict]:
    """(config, params) from a tensor source (`SafetensorsSource`, `DictSource`) and config.json.

    `dtype` is the parameter dtype ("bfloat16" or "float32"; default: that of the stored
    embedding, so float32 checkpoints stay float32 and bf16 / FP8 releases load as bfloat16).
    `compute_dtype` is `ModelConfig.dtype` (default: config.json's `dtype` / `torch_dtype`, else
    the parameter dtype). With a mesh every leaf is created in its `param_shardings` shards.
    """
    names = src.names()
    prefix = _prefix(names)
    cfg = config_from_hf(hf_config, strict=strict)
    param_dtype = dtype or _default_dtype(src, f"{prefix}model.embed_tokens.weight")
    cfg = cfg.replace(
        param_dtype=param_dtype,
        dtype=compute_dtype or checkpoint_dtype(hf_config) or param_dtype,
    )
    # MTP layers: as many as the checkpoint holds (transformers' save_pretrained drops them).
    depth = 0
    while depth < cfg.mtp_depth and any(
        n.startswith(f"{prefix}model.layers.{cfg.n_layers + depth}.") for n in names
    ):
        depth += 1
    if depth < cfg.mtp_depth:
        log.info("config has %d MTP layers, checkpoint holds %d", cfg.mtp_depth, depth)
        cfg = cfg.replace(mtp_depth=depth)
    fused = frozenset(
        i
        for i in range(cfg.n_layers + cfg.mtp_depth)
        if f"{prefix}model.layers.{i}.mlp.experts.gate_up_proj" in names
    )
    block = _fp8_block(
        hf_config.get("quantization_config")
        or hf_config.get("text_config", {}).get("quantization_config")
    )
    leaves = _leaves(cfg, name_plan(cfg, prefix, fused))
    _check_names(leaves, src, cfg, fused, prefix, block)
    shardings = (
        params_lib.param_shardings(cfg, mesh)
        if mesh is not None
        else jax.tree.map(
            lambda _: SingleDeviceSharding(jax.devices()[0]), params_lib.abstract_params(cfg)
        )
    )
    flat_sh = {
        "/".join(str(k.key) for k in p): s
        for p, s in jax.tree_util.tree_flatten_with_path(shardings)[0]
    }
    arrays = {}
    for key, (path, leaf) in leaves.items():
        arrays[path] = _make_leaf(leaf, src, flat_sh[key], block)
    treedef = jax.tree.structure(params_lib.abstract_params(cfg))
    return cfg, jax.tree.unflatten(treedef, [arrays[p] for p, _ in leaves.values()])


def load_hf_checkpoint(
    path: str | Path,
    *,
    mesh: Mesh | None = None,
    dtype: str | None = None,
    compute_dtype: str | None = None,
    strict: bool = True,
) -> tuple[ModelConfig, dict]:
    """(config, params) from a transformers checkpoint directory (see the module docstring).

    `dtype` is the parameter dtype (default: the stored embedding's); `compute_dtype` is
    `ModelConfig.dtype` (default: config.json's `dtype` / `torch_dtype`, so a float32 checkpoint
    computes in float32 and matches transformers).
    """
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"no config.json in {path}")
    src = SafetensorsSource(path)
    try:
        return from_hf_source(
            src,
            json.loads(cfg_file.read_text()),
            mesh=mesh,
            dtype=dtype,
            compute_dtype=compute_dtype,
            strict=strict,
        )
    finally:
        src.close()


# Export ----------------------------------------------------------------------------------------


def _to_hf(x: np.ndarray, s: Src) -> np.ndarray:
    if s.n_in is None:
        return x
    n_in = math.prod(x.shape[: s.n_in])
    return np.ascontiguousarray(x.reshape(n_in, -1).T)


def export_hf_checkpoint(
    params: dict,
    config: ModelConfig,
    path: str | Path,
    *,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Write config.json + per-expert safetensors that transformers `from_pretrained` loads.

    MTP layers go to `model.layers.{n_layers + d}.*` with copies of the embedding and head, as in
    the DeepSeek-V3 release (transformers itself ignores them).
    """
    from safetensors.numpy import save_file

    c = config
    if c.mtp_depth and not c.is_mla:
        raise ValueError("ModelConfig.mtp_depth>0 for qwen3_moe: Qwen3-MoE has no HF MTP format")
    leaves = _leaves(c, name_plan(c))
    flat = {
        "/".join(str(k.key) for k in p): x
        for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    if set(flat) != set(leaves):
        raise ValueError(
            f"params do not match the config: missing {sorted(set(leaves) - set(flat))}, "
            f"unexpected {sorted(set(flat) - set(leaves))}"
        )
    hf_cfg = config_to_hf(c) | {"dtype": str(flat["embed"].dtype)}  # what the arrays hold
    # (Src, leaf key, stack index) for every HF tensor, then greedy shards by bytes.
    items = []
    for key, (_, leaf) in leaves.items():
        if flat[key].shape != leaf.shape:
            raise ValueError(f"param {key}: expected shape {leaf.shape}, found {flat[key].shape}")
        items += [(leaf.srcs[i], key, i) for i in np.ndindex(*leaf.srcs.shape)]
    for d in range(c.mtp_depth):  # DeepSeek's MTP layers carry their own embedding and head
        p = f"model.layers.{c.n_layers + d}."
        items.append((Src(p + "embed_tokens.weight", None), "embed", ()))
        head = ("embed", None) if c.tie_word_embeddings else ("lm_head", 1)
        items.append((Src(p + "shared_head.head.weight", head[1]), head[0], ()))

    def nbytes(key):
        leaf = leaves[key][1]
        return math.prod(leaf.shape[leaf.n_stack :]) * flat[key].dtype.itemsize

    shards, size = [[]], 0
    for it in items:
        if shards[-1] and size + nbytes(it[1]) > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(it)
        size += nbytes(it[1])
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weight_map, host = {}, {}
    for n, shard in enumerate(shards):
        fname = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {}
        for src, key, i in shard:
            # One host transfer per layer (not per expert), dropped when the next leaf starts.
            if (key, i[:1]) not in host:
                host.clear()
                host[key, i[:1]] = np.asarray(jax.device_get(flat[key][i[:1]]))
            tensors[src.name] = _to_hf(host[key, i[:1]][i[1:]], src)
            weight_map[src.name] = fname
        save_file(tensors, str(path / fname), metadata={"format": "pt"})
    if len(shards) > 1:
        total = sum(nbytes(k) for _, k, _ in items)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True))


# orbax and the CLI --------------------------------------------------------------------------------


def config_to_json(c: ModelConfig) -> str:
    return json.dumps(dataclasses.asdict(c), indent=2, sort_keys=True)


def config_from_json(text: str) -> ModelConfig:
    d = json.loads(text)
    d.pop("balance_loss_weight", None)  # a removed, never-used field of older files
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = YarnConfig(**d["rope_scaling"])
    return ModelConfig(**d)


def save_orbax(params: dict, path: str | Path, config: ModelConfig | None = None) -> None:
    """params to PATH/params (orbax) and, given a config, PATH/model_config.json."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path / "params", params)
    if config is not None:
        (path / "model_config.json").write_text(config_to_json(config))


def load_orbax(path: str | Path, mesh: Mesh | None = None) -> tuple[ModelConfig, dict]:
    """(config, params) written by `save_orbax` (with a config); sharded when a mesh is given."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    cfg = config_from_json((path / "model_config.json").read_text())
    abstract = params_lib.abstract_params(cfg)
    if mesh is not None:
        abstract = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract,
            params_lib.param_shardings(cfg, mesh),
        )
    with ocp.StandardCheckpointer() as ckpt:
        return cfg, ckpt.restore(path / "params", abstract)


def _mesh_from_flag(spec: str) -> Mesh | None:
    """A c2 mesh from "AXIS=N,..." (e.g. "fsdp=8"); None for "" (one device)."""
    if not spec:
        return None
    from c2 import sharding

    sizes = {}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        if k not in sharding.MESH_AXES or not v.isdigit():
            raise ValueError(
                f"--mesh entry {part!r}: expected AXIS=N, AXIS in {sharding.MESH_AXES}"
            )
        sizes[k] = int(v)
    return sharding.make_mesh(**sizes)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m c2.model.hf", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import", help="HF safetensors dir -> orbax dir (+ model_config.json)")
    imp.add_argument("src")
    imp.add_argument("dst")
    imp.add_argument("--dtype", choices=sorted(_NP_DTYPES), default=None, help="param dtype")
    imp.add_argument(
        "--compute_dtype",
        choices=["bfloat16", "float16", "float32"],
        default=None,
        help="ModelConfig.dtype (default: config.json's dtype)",
    )
    imp.add_argument("--mesh", default="", help='e.g. "fsdp=8" (default: one device)')
    imp.add_argument("--no-strict", action="store_true", help="warn on unknown HF config fields")
    exp = sub.add_parser("export", help="orbax dir (from `import` or save_orbax) -> HF dir")
    exp.add_argument("src")
    exp.add_argument("dst")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.cmd == "import":
        mesh = _mesh_from_flag(args.mesh)
        cfg, params = load_hf_checkpoint(
            args.src,
            mesh=mesh,
            dtype=args.dtype,
            compute_dtype=args.compute_dtype,
            strict=not args.no_strict,
        )
        save_orbax(params, args.dst, cfg)
        total, active = params_lib.count_params(cfg, include_mtp=True)
        log.info("imported %s -> %s: %.3gB params (%.3gB active)", args.src, args.dst,
                 total / 1e9, active / 1e9)  # fmt: skip
    else:
        cfg, params = load_orbax(args.src)
        export_hf_checkpoint(params, cfg, args.dst)
        log.info("exported %s -> %s", args.src, args.dst)


if __name__ == "__main__":
    main()
