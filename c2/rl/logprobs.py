"""The RL learner's forwards (c2.rl.step): each target's log-prob under its row's sampling
distribution, the engine's experts replayed, over micro-batches of plain or packed rows.

Log-probs are those of each row's *sampling* distribution (temperature, top-k, top-p), so they
compare with the behaviour log-probs token by token; a target the recomputed top-k/top-p excludes
gets OUT_OF_SUPPORT_LOGP and is counted. The KL to the reference compares logits / temperature
without the truncation: it belongs to the sampler, and the reference's truncated support may miss
a sampled token (an infinite k1).

Micro-batch i holds rows i, i + n, i + 2n, ... (n micro-batches): each device keeps its own rows.
Packed groups (c2.rl.batching's `pack_buckets`) run a row per group in blockwise attention, and
`packed_index` reads each sample's values back into the [B, T] layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import model as model_lib
from c2 import sharding
from c2.infer.sampling import sampling_logprobs
from c2.model.config import ModelConfig
from c2.model.layers import rms_norm
from c2.rl.batching import CHAIN_KEYS, PACKED_KEYS, PACKED_TOKEN_KEYS, ROW_KEYS, TOKEN_KEYS
from c2.train.losses import from_chunks, to_chunks

# Stands in for log 0 (a target outside the recomputed top-k/top-p support): finite, and masked.
OUT_OF_SUPPORT_LOGP = -1e9


def target_logps(logits_BTV, targets_BT, *, temperature, top_k, top_p):
    """(log-prob of each target under its row's sampling distribution, finite; whether the
    target is in that distribution's support; its log-prob under logits / temperature alone).
    The sampling settings are per row [B] or per position [B, T] (packed groups)."""
    B, T, V = logits_BTV.shape

    def per_token(x):
        return jnp.broadcast_to(x if x.ndim == 2 else x[:, None], (B, T)).reshape(B * T)

    # Which ids each row's sampling distribution keeps: a piecewise-constant choice, so it is
    # found without gradient (no sort in the backward pass); the log-prob is then
    # differentiated through one masked logsumexp, never a [B*T, V] log-softmax.
    support_BTV = (
        sampling_logprobs(
            jax.lax.stop_gradient(logits_BTV).reshape(B * T, V),
            per_token(temperature),
            per_token(top_k),
            per_token(top_p),
        ).reshape(B, T, V)
        > -jnp.inf
    )
    temperature_BT = per_token(jnp.where(temperature > 0, temperature, 1.0)).reshape(B, T)  # greedy
    scaled_BTV = logits_BTV / temperature_BT[..., None]
    take = lambda x_BTV: jnp.take_along_axis(x_BTV, targets_BT[..., None], -1)[..., 0]  # noqa: E731
    target_BT, in_support_BT = take(scaled_BTV), take(support_BTV)
    logp_BT = target_BT - jax.nn.logsumexp(jnp.where(support_BTV, scaled_BTV, -jnp.inf), -1)
    kl_logp_BT = target_BT - jax.nn.logsumexp(scaled_BTV, axis=-1)
    logp_BT = jnp.where(in_support_BT, logp_BT, OUT_OF_SUPPORT_LOGP)
    return logp_BT, in_support_BT, kl_logp_BT


class Forwards:
    """The learner's log-prob forwards for one model and layout (traced inside its jits).

    specs: batch field -> PartitionSpec of its [B, ...] array under the layout's rules (tokens
    over batch and seq, rows over batch, routing [L_moe, B, T, k], chain values replicated).
    batch_devices: how many devices the layout's `batch` rule spreads the rows over.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        layout: sharding.Layout,
        micro_batch_size: int,
        *,
        router_replay: bool,
        logit_chunk_tokens: int,
        packed_attention_block: int,
    ):
        self.cfg, self.layout, self.router_replay = cfg, layout, router_replay
        if (
            isinstance(logit_chunk_tokens, bool)
            or not isinstance(logit_chunk_tokens, int)
            or logit_chunk_tokens < 0
        ):
            raise ValueError(
                f"logit_chunk_tokens={logit_chunk_tokens!r}: expected an int >= 0 (0: whole)"
            )
        self.logit_chunk_tokens = logit_chunk_tokens
        # RL trains no MTP loss: the forward skips the MTP modules (their output is unused).
        self.fwd_cfg = cfg.replace(mtp_depth=0) if cfg.mtp_depth else cfg
        # Packed groups' rows attend blockwise: dense attention would score every branch against
        # every other; blocks that no query can see (another branch, the future) are skipped.
        self.packed_cfg = self.fwd_cfg.replace(
            attention_impl="blockwise",
            attention_block_q=packed_attention_block,
            attention_block_kv=packed_attention_block,
        )
        self.batch_axes = sharding.axes_of(layout, "batch")
        self.batch_devices = sharding.axis_size(layout, self.batch_axes)
        if (
            isinstance(micro_batch_size, bool)
            or not isinstance(micro_batch_size, int)
            or micro_batch_size < 1
        ):
            raise ValueError(f"micro_batch_size={micro_batch_size!r}: expected a positive int")
        if micro_batch_size % self.batch_devices:
            raise ValueError(
                f"micro_batch_size={micro_batch_size} is not divisible by the mesh's batch axes "
                f"{self.batch_axes} of size {self.batch_devices} (mesh "
                f"{dict(layout.mesh.shape)}): every micro-batch is spread over all of them"
            )
        self.micro_batch_size = micro_batch_size

        token_spec = sharding.batch_sharding(layout).spec  # [B, T]: batch rule, seq rule
        self.specs = {k: token_spec for k in TOKEN_KEYS}
        self.specs |= {k: P(token_spec[0]) for k in ROW_KEYS}
        self.specs["routing"] = P(None, *token_spec, None)  # [L_moe, B, T, k]
        self.specs |= {k: token_spec for k in (*PACKED_TOKEN_KEYS, "packed_index")}
        self.specs["packed_routing"] = self.specs["routing"]
        self.specs |= {k: P() for k in CHAIN_KEYS}  # [B_c]: a few values, on every device
        self.row_spec = P(token_spec[0])

    # Micro-batches ------------------------------------------------------------------------------

    def split(self, x, axis: int, mb: int | None = None):
        """[..., B, ...] -> [n, ..., mb, ...]: micro-batch i holds rows i, i + n, ..."""
        mb = mb or self.micro_batch_size
        n = x.shape[axis] // mb
        x = x.reshape(x.shape[:axis] + (mb, n) + x.shape[axis + 1 :])
        return jnp.moveaxis(x, axis + 1, 0)

    def micro(self, arrays: dict, mb: int | None = None) -> dict:
        """Each array split into micro-batches (`split`), every micro-batch spread over the
        batch axes."""
        out = {}
        for k, x in arrays.items():
            if x is None:
                continue
            axis = 1 if k == "routing" else 0
            spec = self.specs["routing"] if k == "routing" else None
            spec = spec or (self.specs["target_mask"] if x.ndim == 2 else self.row_spec)
            out[k] = jax.lax.with_sharding_constraint(
                self.split(x, axis, mb), NamedSharding(self.layout.mesh, P(None, *spec))
            )
        return out

    def packed_rows_per_micro(self, R: int, B: int) -> int:
        """Rows of a packed micro-batch: as many micro-batches as the samples' (B / mb) where the
        R packed rows allow it, each a multiple of the batch axes' devices."""
        want = max(1, -(-R * self.micro_batch_size // B))
        for rows in range(want, R + 1):
            if R % rows == 0 and rows % self.batch_devices == 0:
                return rows
        raise ValueError(
            f"packed rows R={R} cannot be split into micro-batches spread over the mesh's batch "
            f"axes of size {self.batch_devices}"
        )

    @staticmethod
    def merge(x_nBT):
        """[n, mb, T] -> [B, T], the inverse of split."""
        n, mb = x_nBT.shape[:2]
        return jnp.moveaxis(x_nBT, 0, 1).reshape((n * mb,) + x_nBT.shape[2:])

    # Forwards -----------------------------------------------------------------------------------

    def token_logp(self, params, mb: dict, cfg: ModelConfig | None = None, replay=None):
        """Per micro-batch [mb, T]: the sampling distribution's log-prob of each target (finite),
        whether the target is in its support, and the log-prob under logits / temperature with no
        top-k/top-p (what KL compares: the reference's support need not hold the target).
        `replay` (default `router_replay`): force the recorded experts, else route live."""
        chunk = self.logit_chunk_tokens
        replay = self.router_replay if replay is None else replay
        logits_BTV, aux = model_lib.forward(
            params,
            mb["inputs"],
            cfg or self.fwd_cfg,
            positions=mb["positions"],
            segment_ids=mb["segment_ids"],
            routing=mb["routing"] if replay else None,
            mesh=self.layout,
            return_hidden=bool(chunk),
        )
        settings = {k: mb[k] for k in ("temperature", "top_k", "top_p")}
        if not chunk:
            return target_logps(logits_BTV, mb["targets"], **settings)
        per_token = {k: v for k, v in settings.items() if v.ndim == 2}  # packed groups
        # The model's own logits are unused, so XLA drops them: the head runs per chunk.
        B, T = mb["targets"].shape
        if T % chunk:
            raise ValueError(
                f"logit_chunk_tokens={chunk} does not divide the sequence length {T} "
                "(config.train.loss_chunk_tokens must divide every config.rl.seq_buckets)"
            )
        h_BTH = rms_norm(aux["hidden"], params["final_norm"], self.cfg.rms_norm_eps)

        @jax.checkpoint
        def body(_, xs):
            h_BCH, targets_BC, chunk_settings = xs
            logits_BCV = model_lib.lm_head(params, h_BCH, self.cfg)
            return None, target_logps(logits_BCV, targets_BC, **(settings | chunk_settings))

        chunked = {k: to_chunks(v, chunk) for k, v in per_token.items()}
        xs = (to_chunks(h_BTH, chunk), to_chunks(mb["targets"], chunk), chunked)
        _, out = jax.lax.scan(body, None, xs)
        return tuple(from_chunks(x_nBC) for x_nBC in out)

    def logp_batch(self, params, batch, replay=None):
        """token_logp's three [B, T] values for the whole batch, micro-batch by micro-batch."""
        if "packed_index" in batch:
            return self.logp_packed(params, batch, replay)

        def body(_, mb):
            return None, self.token_logp(params, mb, replay=replay)

        rows = {k: v for k, v in batch.items() if k not in CHAIN_KEYS + PACKED_KEYS}
        _, out = jax.lax.scan(body, None, self.micro(rows))
        return tuple(self.merge(x_nBT) for x_nBT in out)

    def logp_packed(self, params, batch, replay=None):
        """logp_batch's values from the packed groups' forward (c2.rl.batching): the packed
        rows run in micro-batches, and each sample's [B, T] values are read back by
        packed_index."""
        packed = {
            k.removeprefix("packed_"): batch[k] for k in (*PACKED_TOKEN_KEYS, "packed_routing")
        }
        R, W = packed["inputs"].shape
        rows = self.packed_rows_per_micro(R, batch["inputs"].shape[0])

        def body(_, mb):
            return None, self.token_logp(params, mb, self.packed_cfg, replay)

        _, out = jax.lax.scan(body, None, self.micro(packed, rows))
        index_BT = batch["packed_index"]
        return tuple(self.merge(x_nRW).reshape(R * W)[index_BT] for x_nRW in out)
