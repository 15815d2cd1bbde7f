"""Held-out bits per byte and MTP acceptance over a fixed, ordered set of batches.

Bits per byte = total next-token nll (nats) / (ln 2 * total bytes the targets stand for), summed
over every batch (not a mean of per-batch ratios), so it is the same number for any batch size and
comparable across tokenisers. The untrained byte model sits near 8 bits per byte (log2 of the
vocabulary).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from c2 import model as model_lib
from c2 import sharding, xla_cpu
from c2.train.losses import mtp_distillation, next_token_loss


def forward_on_batch(
    params,
    batch,
    cfg: model_lib.ModelConfig,
    mesh: Mesh | sharding.Layout | None,
    return_hidden: bool = False,
):
    """The model on a packed batch (inputs, positions, segment_ids): (logits, aux)."""
    return model_lib.forward(
        params,
        batch["inputs"],
        cfg,
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        mesh=mesh,
        return_hidden=return_hidden,
    )


def eval_sums(params, batch, cfg: model_lib.ModelConfig, mesh: Mesh | sharding.Layout | None):
    """Additive statistics of one batch: nll sum, target tokens, target bytes, MTP agreements."""
    logits_BTV, aux = forward_on_batch(params, batch, cfg, mesh)
    mask_BT = batch["loss_mask"].astype(jnp.float32)
    _, nll_sum, n_tokens = next_token_loss(logits_BTV, batch["targets"], mask_BT)
    sums = {
        "nll_sum": nll_sum,
        "tokens": n_tokens,
        "bytes": jnp.sum(batch["target_bytes"].astype(jnp.float32) * mask_BT),
    }
    if cfg.mtp_depth:
        mtp_DBTV = model_lib.mtp_logits(params, aux, cfg)
        _, m = mtp_distillation(mtp_DBTV, logits_BTV, batch["segment_ids"], mask_BT)
        for d in range(1, cfg.mtp_depth + 1):
            n = m[f"mtp{d}_positions"]
            sums[f"mtp{d}_accepted"] = m[f"mtp{d}_acceptance"] * n
            sums[f"mtp{d}_positions"] = n
    return sums


@functools.lru_cache(maxsize=16)
def _eval_fn(cfg: model_lib.ModelConfig, mesh: Mesh | sharding.Layout | None):
    # Parameters keep the shardings they live in; batches are placed by `heldout_bpb`.
    return jax.jit(
        functools.partial(eval_sums, cfg=cfg, mesh=mesh),
        compiler_options=xla_cpu.train_options(),
    )


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """bpb, nll per token and per-depth MTP acceptance from summed statistics."""
    out = {
        "bpb": sums["nll_sum"] / (math.log(2.0) * max(sums["bytes"], 1.0)),
        "nll_per_token": sums["nll_sum"] / max(sums["tokens"], 1.0),
        "tokens": sums["tokens"],
        "bytes": sums["bytes"],
    }
    for key in sums:
        if key.endswith("_accepted"):
            depth = key[: -len("_accepted")]
            out[f"{depth}_acceptance"] = sums[key] / max(sums[f"{depth}_positions"], 1.0)
    return out


def heldout_bpb(
    params,
    cfg: model_lib.ModelConfig,
    batches: Sequence[dict[str, np.ndarray]],
    mesh: Mesh | sharding.Layout | None = None,
) -> dict[str, float]:
    """Bits per byte (and MTP acceptance) of `params` over every batch of `batches`."""
    if not batches:
        raise ValueError("heldout_bpb: no held-out batches (is the held-out split empty?)")
    fn = _eval_fn(cfg, mesh)
    if mesh is None:
        put = jnp.asarray
    else:
        put = functools.partial(
            jax.make_array_from_process_local_data, sharding.batch_sharding(mesh)
        )
    totals = None
    for batch in batches:
        sums = fn(params, {k: put(v) for k, v in batch.items()})
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    return summarize({k: float(v) for k, v in jax.device_get(totals).items()})
