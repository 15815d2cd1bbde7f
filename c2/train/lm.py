"""The language-model task of a pretraining / long-context / SFT stage (docs/recipe.md §1).

Builds the model config from the stage config, the mesh, the loss (next-token CE + MTP
self-distillation + optional balance loss), the aux-loss-free router-bias update, the grain
pipelines and the held-out evaluation, as a `c2.train.loop.Task`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import jax
import jax.numpy as jnp
import ml_collections

from c2 import distributed, sharding
from c2 import model as model_lib
from c2.data import pipeline as data_pipeline
from c2.data.tokenizer import load_tokenizer
from c2.model.layers import rms_norm
from c2.train import sft_sources  # noqa: F401 - registers the environments' SFT specs
from c2.train.bpb import forward_on_batch, heldout_bpb
from c2.train.config import ConfigError, sharding_rules, validate_stage
from c2.train.loop import Task
from c2.train.losses import chunked_lm_sums, mtp_distillation, next_token_loss
from c2.train.optimizer import path_str

log = logging.getLogger(__name__)

_OVERRIDE_FIELDS = {
    f.name: f for f in dataclasses.fields(model_lib.ModelConfig) if f.name != "rope_scaling"
}


def model_config(config: ml_collections.ConfigDict) -> model_lib.ModelConfig:
    """The ModelConfig a stage trains: the preset, then dtype/quant, overrides and YaRN."""
    mc = config.model
    known = sorted(model_lib.presets.PRESETS)
    if mc.preset not in known:
        raise ConfigError(f"config.model.preset={mc.preset!r}: unknown; known: {known}")
    base = model_lib.presets.get(mc.preset)
    fields = {"dtype": mc.dtype, "param_dtype": mc.param_dtype, "quant": mc.quant}
    for key, value in mc.overrides.items():
        if key not in _OVERRIDE_FIELDS:
            raise ConfigError(
                f"config.model.overrides.{key}: not a ModelConfig field; known: "
                f"{sorted(_OVERRIDE_FIELDS)}"
            )
        current = getattr(base, key)
        int_for_float = isinstance(current, float) and isinstance(value, int)
        if current is not None and not isinstance(value, type(current)) and not int_for_float:
            raise ConfigError(
                f"config.model.overrides.{key}: expected {type(current).__name__}, got "
                f"{type(value).__name__} ({value!r})"
            )
        fields[key] = value
    if mc.yarn.factor:
        fields["rope_scaling"] = model_lib.YarnConfig(
            factor=float(mc.yarn.factor),
            original_max_position_embeddings=int(mc.yarn.original_max_position_embeddings),
            beta_fast=float(mc.yarn.beta_fast),
            beta_slow=float(mc.yarn.beta_slow),
            mscale=float(mc.yarn.mscale),
            mscale_all_dim=float(mc.yarn.mscale_all_dim),
        )
    try:
        cfg = base.replace(**fields)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model: {e}") from e
    if config.data.seq_len > cfg.max_seq_len:
        raise ConfigError(
            f"config.data.seq_len={config.data.seq_len} exceeds the model's max_seq_len="
            f"{cfg.max_seq_len} (set config.model.overrides.max_seq_len)"
        )
    return cfg


def check_model_against_data(
    cfg: model_lib.ModelConfig, config, mesh_sizes: dict, *, load_files: bool = True
) -> None:
    """What the mesh, its rules (`config.mesh.rules`) and the tokenizer need from the model,
    named by field."""
    vocab = load_tokenizer(config.data.tokenizer).vocab_size if load_files else 0
    rules = sharding_rules(config)

    def size(logical: str) -> tuple[tuple[str, ...], int]:
        axes = sharding.rule_axes(rules[logical])
        return axes, math.prod(mesh_sizes[a] for a in axes)

    if cfg.vocab_size < vocab:
        raise ConfigError(
            f"config.model: vocab_size={cfg.vocab_size} is smaller than the tokenizer's {vocab} "
            f"(config.data.tokenizer={config.data.tokenizer!r})"
        )
    for logical, field, n in (
        ("experts", "n_experts", cfg.n_experts),
        ("heads", "n_heads", cfg.n_heads),
    ):
        axes, n_shards = size(logical)
        if n % n_shards:
            mesh = ", ".join(f"config.mesh.{a}={mesh_sizes[a]}" for a in axes)
            raise ConfigError(
                f"{mesh} does not divide the model's {field}={n} (the {logical!r} rule's axes)"
            )
    batch_names, batch_axes = size("batch")
    if config.data.batch_size % batch_axes:
        raise ConfigError(
            f"config.data.batch_size={config.data.batch_size} is not divisible by the batch "
            f"axes {batch_names} of total size {batch_axes}"
        )
    micro = config.train.micro_batches
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise ConfigError(f"config.train.micro_batches={micro!r}: expected a positive int")
    if config.data.batch_size % (micro * batch_axes):
        raise ConfigError(
            f"config.data.batch_size={config.data.batch_size} is not divisible by "
            f"config.train.micro_batches={micro} x the batch axes {batch_names} "
            f"({batch_axes}): each micro-batch needs whole rows on every device"
        )


def validate(config: ml_collections.ConfigDict, num_devices: int, *, load_files: bool = True):
    """The whole stage check, before anything compiles: (mesh sizes, ModelConfig).

    `load_files=False` skips what needs the tokenizer file (real-scale configs name files that
    exist only on the cluster).
    """
    mesh_sizes = validate_stage(config, num_devices)
    cfg = model_config(config)
    check_model_against_data(cfg, config, mesh_sizes, load_files=load_files)
    return mesh_sizes, cfg


def router_stats(expert_load_LE: jax.Array, dropped, n_assignments) -> dict[str, jax.Array]:
    """Load balance per MoE layer, averaged: max/mean expert load (1 = perfectly balanced)."""
    load = expert_load_LE.astype(jnp.float32)
    mean = jnp.maximum(jnp.mean(load, axis=-1), 1e-9)
    return {
        "router_max_over_mean": jnp.mean(jnp.max(load, axis=-1) / mean),
        "router_min_over_mean": jnp.mean(jnp.min(load, axis=-1) / mean),
        "router_dropped": jnp.asarray(dropped, jnp.float32),
        "router_dropped_frac": jnp.asarray(dropped, jnp.float32) / jnp.maximum(n_assignments, 1),
    }


def lm_loss(params, batch, rng, *, cfg: model_lib.ModelConfig, tc, mesh):
    """Next-token CE (+ mtp_weight * MTP self-distillation + balance_weight * balance loss).

    With `tc.loss_chunk_tokens` the LM head and both losses run over chunks of positions
    (`chunked_lm_sums`): the same values, no [B, T, V] float32 logits in the step."""
    del rng  # no dropout: the step is a deterministic function of params and batch
    mask_BT = batch["loss_mask"].astype(jnp.float32)
    if tc.loss_chunk_tokens:
        ce, nll_sum, n_tokens, mtp_loss, mtp_metrics, aux = _chunked_losses(
            params, batch, cfg, tc, mesh
        )
    else:
        logits_BTV, aux = forward_on_batch(params, batch, cfg, mesh)
        ce, nll_sum, n_tokens = next_token_loss(logits_BTV, batch["targets"], mask_BT)
        if cfg.mtp_depth:
            mtp_DBTV = model_lib.mtp_logits(params, aux, cfg)
            mtp_loss, mtp_metrics = mtp_distillation(
                mtp_DBTV, logits_BTV, batch["segment_ids"], mask_BT, tc.mtp_distill
            )
    n_bytes = jnp.sum(batch["target_bytes"].astype(jnp.float32) * mask_BT)
    loss = ce
    metrics = {
        "ce_loss": ce,
        "bpb": nll_sum / (math.log(2.0) * jnp.maximum(n_bytes, 1.0)),
        "target_tokens": n_tokens,
    }
    if cfg.mtp_depth:
        loss = loss + tc.mtp_weight * mtp_loss
        metrics |= {"mtp_loss": mtp_loss} | {
            k: v for k, v in mtp_metrics.items() if not k.endswith("_positions")
        }
    if "expert_load" in aux:
        metrics["balance_loss"] = aux["balance_loss"]
        if tc.balance_weight:
            loss = loss + tc.balance_weight * aux["balance_loss"]
        n_assign = jnp.sum(batch["segment_ids"] != 0) * cfg.n_experts_per_token * cfg.n_moe_layers
        metrics |= router_stats(aux["expert_load"], aux["dropped"], n_assign)
    return loss, (metrics, {"expert_load": aux.get("expert_load")})


def _chunked_losses(params, batch, cfg: model_lib.ModelConfig, tc, mesh):
    """`lm_loss`'s CE and MTP distillation by `chunked_lm_sums`: (ce, nll sum, target tokens,
    MTP loss, MTP metrics as `mtp_distillation` gives them, aux). The model's own logits are
    never used, so XLA drops them."""
    _, aux = forward_on_batch(params, batch, cfg, mesh, return_hidden=True)
    eps = cfg.rms_norm_eps
    mtp_h = None
    if cfg.mtp_depth:
        mtp_h = jax.vmap(lambda h, w: rms_norm(h, w, eps))(aux["mtp_hidden"], params["mtp"]["norm"])
    sums = chunked_lm_sums(
        lambda h: model_lib.lm_head(params, h, cfg),
        rms_norm(aux["hidden"], params["final_norm"], eps),
        batch["targets"],
        batch["loss_mask"],
        int(tc.loss_chunk_tokens),
        mtp_h_DBTH=mtp_h,
        segment_ids_BT=batch["segment_ids"],
        kind=tc.mtp_distill,
    )
    nll_sum, n_tokens = sums["nll_sum"], sums["tokens"]
    ce = nll_sum / jnp.maximum(n_tokens, 1.0)
    mtp_loss, mtp_metrics = None, {}
    if cfg.mtp_depth:
        losses = []
        for d in range(1, cfg.mtp_depth + 1):
            n_valid = jnp.maximum(sums[f"mtp{d}_positions"], 1.0)
            losses.append(sums[f"mtp{d}_loss_sum"] / n_valid)
            mtp_metrics[f"mtp{d}_loss"] = losses[-1]
            mtp_metrics[f"mtp{d}_acceptance"] = sums[f"mtp{d}_accepted"] / n_valid
            mtp_metrics[f"mtp{d}_positions"] = sums[f"mtp{d}_positions"]
        mtp_loss = jnp.mean(jnp.stack(losses))
    return ce, nll_sum, n_tokens, mtp_loss, mtp_metrics, aux


@functools.cache
def measured_peak_flops(dtype: str) -> float:
    """The machine's measured matmul peak per device (once per process), for MFU."""
    from c2.train.peak import matmul_peak_flops

    return float(matmul_peak_flops(dtype))


def _train_dataset(config, shard: tuple[int, int] = (0, 1)):
    """The training batches; with several hosts, this host's block `shard` = (index, count) of
    every global batch, the whole stream packed on every host (host_split="rows"), so the global
    batches, and the losses, are those of a single-host run."""
    d = config.data
    kw = dict(split="train", shard_index=shard[0], shard_count=shard[1], host_split="rows")
    if d.kind == "sft":
        return data_pipeline.make_sft_dataset(
            d.corpus, d.tokenizer, d.seq_len, d.batch_size, d.seed, **kw
        )
    return data_pipeline.make_pretrain_dataset(
        d.corpus,
        d.tokenizer,
        d.seq_len,
        d.batch_size,
        d.seed,
        replay=d.get("replay", ""),
        replay_fraction=d.get("replay_fraction", 0.0),
        **kw,
    )


def eval_batches(
    config,
    seq_len: int | None = None,
    kind: str | None = None,
    shard: tuple[int, int] | None = None,
):
    """The stage's fixed held-out batches (pretraining text, or SFT responses); `shard` =
    (index, count): this host's block of each (default: by process index)."""
    d = config.data
    make = (
        data_pipeline.make_sft_eval_batches
        if (kind or d.kind) == "sft"
        else data_pipeline.make_eval_batches
    )
    index, count = shard or (None, None)
    return make(
        d.corpus,
        d.tokenizer,
        seq_len or d.seq_len,
        d.batch_size,
        max_batches=d.eval_batches,
        shard_index=index,
        shard_count=count,
    )


def import_hf_params(path: str, cfg: model_lib.ModelConfig, mesh, *, seed: int = 0):
    """Parameters from a Hugging Face checkpoint, sharded on `mesh`, for the model `cfg`.

    Every leaf the checkpoint holds must have the shape `cfg` expects; leaves it lacks may only be
    the MTP module (the recipe adds MTP layers to a base model that has none), which keeps its
    fresh initialisation.
    """
    _, hf_params = model_lib.load_hf_checkpoint(path, mesh=mesh, dtype=cfg.param_dtype)
    hf_flat = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(hf_params)[0]}
    ours = jax.tree_util.tree_flatten_with_path(model_lib.abstract_params(cfg))
    missing = []
    for p, want in ours[0]:
        name = path_str(p)
        got = hf_flat.get(name)
        if got is None:
            missing.append(name)
        elif got.shape != want.shape:
            raise ConfigError(
                f"config.init_from='hf:{path}': checkpoint leaf {name} has shape {got.shape}, "
                f"config.model expects {want.shape}"
            )
    if any(not m.startswith("mtp/") for m in missing):
        raise ConfigError(
            f"config.init_from='hf:{path}': the checkpoint lacks {missing[:5]} "
            "(only the MTP module may be missing: it is added fresh)"
        )
    fresh = model_lib.init_params(cfg, jax.random.key(seed), mesh) if missing else None
    leaves = [
        hf_flat[path_str(p)] if path_str(p) in hf_flat else _leaf_at(fresh, p) for p, _ in ours[0]
    ]
    if missing:
        log.info("HF import: %d MTP leaves freshly initialised (%s...)", len(missing), missing[0])
    return jax.tree_util.tree_unflatten(ours[1], leaves)


def _leaf_at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def make_mesh(mesh_sizes: dict) -> jax.sharding.Mesh:
    return sharding.make_mesh(**mesh_sizes)


def make_layout(config: ml_collections.ConfigDict, mesh_sizes: dict) -> sharding.Layout:
    """The stage's mesh with its rules (RULES under `config.mesh.rules`): the one value that lays
    out its weights, activations and batches."""
    return sharding.Layout(make_mesh(mesh_sizes), sharding_rules(config))


def build_task(config: ml_collections.ConfigDict) -> Task:
    """The LM Task of a stage config (validated first; nothing is compiled here)."""
    mesh_sizes, cfg = validate(config, jax.device_count())
    layout = make_layout(config, mesh_sizes)
    mesh = layout.mesh
    distributed.warm_collectives(mesh)  # several CPU processes: connect them while in step
    shardings = model_lib.param_shardings(cfg, layout)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model_lib.abstract_params(cfg),
        shardings,
    )
    tc = config.train
    post_update = None
    if cfg.n_moe_layers and tc.router_bias_rate:
        post_update = lambda params, aux: model_lib.update_router_bias(  # noqa: E731
            params, aux, cfg, tc.router_bias_rate
        )
    batch_sharding = sharding.batch_sharding(layout)
    # The rows of every global batch this process's devices hold (all of them on one host).
    shard = distributed.process_rows(batch_sharding, (config.data.batch_size, config.data.seq_len))
    heldout = []

    def evaluate(params):
        if not heldout:
            heldout.extend(eval_batches(config, shard=shard))
        return heldout_bpb(params, cfg, heldout, layout)

    def import_params(path):
        return jax.device_put(import_hf_params(path, cfg, layout, seed=tc.seed), shardings)

    peak = measured_peak_flops(cfg.dtype) if tc.measure_peak else 0.0
    return Task(
        mesh=mesh,
        abstract_params=abstract,
        init_params=lambda key: model_lib.init_params(cfg, key, layout),
        loss_fn=functools.partial(lm_loss, cfg=cfg, tc=tc, mesh=layout),
        make_train_iter=lambda: iter(_train_dataset(config, shard)),
        batch_sharding=batch_sharding,
        post_update=post_update,
        evaluate=evaluate,
        flops_per_token=model_lib.flops_per_token(cfg, config.data.seq_len),
        peak_flops_per_device=peak,
        import_params=import_params,
    )
