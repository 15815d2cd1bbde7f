"""The RL train step (docs/recipe.md §2): router-replayed log-probs, rewards, advantages, mismatch
filter, policy-gradient loss, gradients accumulated over micro-batches, one Adam update.

The learner is algorithm-blind beyond `ObjectiveConfig`: every choice is a function of
c2.rl.objectives, composed as c2/rl/objectives/loss.py describes. Three policies, kept apart:
behaviour (`batch["behaviour_logp"]`, recorded by the engine), current (the trainer's forward
with `params`, the engine's experts replayed) and reference (`ref_params`, the frozen RL start,
for k1). The reference routes every token itself: k1 compares the current policy with the
reference *policy*, router included; replaying the sampler's experts there would measure the
reference's weights under the current router's choices, blind to the router's own drift.

The log-prob forwards (each row's sampling distribution, the engine's experts replayed, plain or
packed rows) live in c2.rl.logprobs; the input checks and placement in c2.rl.step_inputs.

Micro-batch i holds rows i, i + n, i + 2n, ... (n micro-batches): each device keeps its own
rows, and the whole-batch steps (groups, quantiles, normalisers) run before the split, so the
update does not depend on the micro-batch size. The current policy's log-probs come first (the
whole-batch steps need them), then each micro-batch's gradient runs its forward again; with
`single_forward` one forward serves both (jax.vjp keeps its activations for the backward): the
same update, one forward less a step, the whole batch's activations in memory at once.

Packed groups (a batch from make_batch with `pack_buckets`): the log-prob forwards run on the
packed rows; with `single_forward` that forward is also the gradient's; with two forwards the
micro-batches' gradient forwards run on the plain rows.
No aux-loss-free router-bias update here: the router's experts are replayed, and the bias stays
as the RL start left it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import model as model_lib
from c2 import sharding, xla_cpu
from c2.model.config import ModelConfig
from c2.rl.credit import MISMATCH_TOKENS, chain_advantages, group_counts, mismatch_keep
from c2.rl.logprobs import OUT_OF_SUPPORT_LOGP, Forwards, target_logps
from c2.rl.objectives import (
    REWARD_SIGNS,
    EffortWeights,
    ObjectiveConfig,
    aggregate_loss,
    combine_rewards,
    effort,
    kl_token_loss,
    length_penalty,
    loss_normalizers,
    rl_loss,
    sequence_kl,
)
from c2.rl.objectives.rewards import Weight
from c2.rl.step_inputs import (
    COMPUTED_TERMS,
    check_batch,
    check_rewards,
    is_zero,
    place,
    put_batch,
)
from c2.train.loop import opt_state_shardings

# Public names of this module before the forwards and the input checks moved to rooms of their own.
__all__ = [
    "COMPUTED_TERMS",
    "MISMATCH_TOKENS",
    "OUT_OF_SUPPORT_LOGP",
    "TOOL_CALL_CREDITS",
    "RLLearner",
    "target_logps",
]

TOOL_CALL_CREDITS = ("episode", "turn")


class RLLearner:
    """Builds and runs the RL step for one model, objective, optimiser and layout.

    mesh: a `c2.sharding.Layout` (mesh and rules, e.g. `c2.train.lm.make_layout`), or a bare mesh
      with `rules` (default c2.sharding.RULES): weights, activations and batches all follow it.

    reward_weights: term -> number or optax schedule of the step ("task" defaults to 1; the
      "kl" weight is `objective.kl_beta`). A nonzero "length_penalty" weight turns on
      length_penalty(effort(counts, effort_weights), length_penalty_k, length_penalty_q).
    schedule: the optimiser's learning-rate schedule, only to report `lr`.
    logit_chunk_tokens: > 0 computes the LM head and the log-probs over chunks of that many
      positions (`c2.train.losses.to_chunks`, every row at once) in a rematerialised scan: the
      same values, and no [B, T, V] float32 logits in the step (`config.train.loss_chunk_tokens`;
      must divide every sequence bucket). 0: whole.
    packed_attention_block: the query and key block of the packed rows' blockwise attention.
    mismatch_tokens: which tokens the objective's mismatch quantile ranks: "fresh" (sampled by
      the weights this step updates; older ones are kept, their importance weights correct
      them) or "all"; its threshold judges every token (c2.rl.credit.mismatch_keep).
    tool_call_credit: where the tool-call penalty lands: "episode" (a term of the episode's
      reward, so its advantage carries it to every token) or "turn" (the turn that made the
      calls: its tokens' advantage is the episode's, computed without the term, less the
      weighted count of its own penalised calls, `batch["target_penalty"]`). With "episode" an
      episode that passes after a malformed call reinforces the malformed turn with the rest;
      with "turn" the turn is pushed down whatever the episode's outcome, once the weight
      exceeds the largest advantage.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        objective: ObjectiveConfig,
        tx: optax.GradientTransformation,
        *,
        mesh: Mesh | sharding.Layout,
        micro_batch_size: int,
        rules=None,
        reward_weights: Mapping[str, Weight] | None = None,
        effort_weights: EffortWeights | None = None,
        length_penalty_k: float | None = None,
        length_penalty_q: float | None = None,
        schedule: optax.Schedule | None = None,
        router_replay: bool = True,
        logit_chunk_tokens: int = 0,
        single_forward: bool = False,
        packed_attention_block: int = 128,
        mismatch_tokens: str = "fresh",
        tool_call_credit: str = "episode",
    ):
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg: expected a c2.model.ModelConfig, got {type(cfg).__name__}")
        if not isinstance(objective, ObjectiveConfig):
            raise TypeError(f"objective: expected an ObjectiveConfig, got {type(objective)}")
        self.cfg, self.objective, self.tx = cfg, objective, tx
        # One value lays out weights, activations and batches alike (a bare mesh: RULES).
        self.layout = sharding.as_layout(mesh, rules)
        self.mesh = self.layout.mesh
        self.schedule = schedule
        # Off (an ablation): the train forwards route every token themselves, so train and
        # behaviour log-probs may come from different experts.
        self.router_replay = bool(router_replay)
        self.forwards = Forwards(
            cfg,
            self.layout,
            micro_batch_size,
            router_replay=self.router_replay,
            logit_chunk_tokens=logit_chunk_tokens,
            packed_attention_block=packed_attention_block,
        )
        self.logit_chunk_tokens = logit_chunk_tokens
        self.micro_batch_size = micro_batch_size
        self.batch_devices = self.forwards.batch_devices
        # One forward of the current policy per step instead of two (its activations kept for
        # the whole batch, not one micro-batch): the same update, about a forward's time less.
        self.single_forward = bool(single_forward)
        # The mismatch filter's tokens: "fresh", those the weights being trained sampled (an older
        # token's difference is mostly the policy's own change since, and filtering the largest
        # drops the tokens the updates moved most), or "all".
        if mismatch_tokens not in MISMATCH_TOKENS:
            raise ValueError(
                f"mismatch_tokens={mismatch_tokens!r}: expected one of {MISMATCH_TOKENS}"
            )
        self.mismatch_tokens = mismatch_tokens
        if tool_call_credit not in TOOL_CALL_CREDITS:
            raise ValueError(
                f"tool_call_credit={tool_call_credit!r}: expected one of {TOOL_CALL_CREDITS}"
            )
        self.tool_call_credit = tool_call_credit

        weights = dict(reward_weights or {})
        bad = sorted(set(weights) - (set(REWARD_SIGNS) - {"kl"}))
        if bad:
            raise ValueError(
                f"reward_weights {bad}: not among {sorted(set(REWARD_SIGNS) - {'kl'})} (the kl "
                "weight is objective.kl_beta)"
            )
        self.reward_weights = {"task": 1.0, **weights}
        self.use_length_penalty = not is_zero(self.reward_weights.get("length_penalty", 0.0))
        if self.use_length_penalty:
            if effort_weights is None or length_penalty_k is None or length_penalty_q is None:
                raise ValueError(
                    "reward_weights['length_penalty'] is set: give effort_weights, "
                    f"length_penalty_k ({length_penalty_k}) and length_penalty_q "
                    f"({length_penalty_q})"
                )
            if not length_penalty_k > 0:
                raise ValueError(f"length_penalty_k={length_penalty_k}: expected > 0")
        self._length_penalty_weight = self.reward_weights.pop("length_penalty", 0.0)
        self.effort_weights = effort_weights
        self.length_penalty_k, self.length_penalty_q = length_penalty_k, length_penalty_q
        self.uses_kl_reward = objective.kl_placement == "reward" and objective.kl_beta > 0
        self.needs_ref = self.uses_kl_reward or objective.kl_placement == "loss"

        self.param_shardings = model_lib.param_shardings(cfg, self.layout)
        self.abstract_params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            model_lib.abstract_params(cfg),
            self.param_shardings,
        )
        abstract_opt = jax.eval_shape(tx.init, self.abstract_params)
        self.opt_shardings = opt_state_shardings(abstract_opt, self.abstract_params, self.mesh)

        token_sharding = sharding.batch_sharding(self.layout)  # [B, T]: batch rule, seq rule
        options = xla_cpu.train_options()
        self._logp_jit = jax.jit(
            self.forwards.logp_batch, out_shardings=(token_sharding,) * 3, compiler_options=options
        )
        # The reference's temperature-only log-probs, its own router choosing (module doc).
        self._ref_logp_jit = jax.jit(
            lambda p, batch: self.forwards.logp_batch(p, batch, replay=False)[2],
            out_shardings=token_sharding,
            compiler_options=options,
        )
        # Metrics and per-sample values replicated: every process (host) can read them whole.
        replicated = NamedSharding(self.mesh, P())
        self._update_jit = jax.jit(
            self._update,
            out_shardings=(self.param_shardings, self.opt_shardings, replicated, replicated),
            donate_argnums=(0, 1),
            compiler_options=options,
        )
        self._update_single_forward_jit = jax.jit(
            self._update_single_forward,
            out_shardings=(self.param_shardings, self.opt_shardings, replicated, replicated),
            donate_argnums=(0, 1),
            compiler_options=options,
        )

    # State ------------------------------------------------------------------------------------

    def shard_params(self, params):
        """`params` laid out by the model's parameter shardings (a no-op where they already are)."""
        return jax.device_put(params, self.param_shardings)

    def init_opt_state(self, params):
        """The optimiser state of `params`, each leaf sharded like the parameter it mirrors."""
        return jax.jit(self.tx.init, out_shardings=self.opt_shardings)(self.shard_params(params))

    # Public steps -------------------------------------------------------------------------------

    def logprobs(self, params, batch: Mapping[str, np.ndarray]) -> jax.Array:
        """[B, T] float32: log-prob of each target under its row's sampling distribution, experts
        replayed. A target outside the recomputed top-k/top-p support gets OUT_OF_SUPPORT_LOGP."""
        self.check_batch(batch)
        return self._logp_jit(self.shard_params(params), self._put_batch(batch))[0]

    def update(self, params, opt_state, ref_params, batch, terms, effort_counts, step):
        """One optimiser step on `batch` (see c2.rl.batching); params and opt_state are donated.

        terms: reward term -> [B] (from the environment: task, style, ...); effort_counts:
        EFFORT_TERMS name -> [B] (read when the length penalty is on); step: steps taken so far
        (the argument of reward-weight and learning-rate schedules). ref_params: the frozen RL
        start (needed for a KL term; may be None without one).
        Returns (params, opt_state, metrics: name -> scalar, per_sample: name -> [B]), arrays on
        device: metrics include "failed_samples", "groups_too_few_valid" and
        "groups_zero_advantage" (c2.rl.credit.group_counts); per_sample holds "reward" (the
        row's total), each signed "reward/<term>", "kl" (the row's k1 to the reference),
        "advantage" and "mismatch_mean" / "mismatch_max" (|train - behaviour| log-probs over the
        sample's targets).
        """
        fn, args = self._update_call(
            params, opt_state, ref_params, batch, terms, effort_counts, step
        )
        return fn(*args)

    def compile_update(self, params, opt_state, ref_params, batch, terms, effort_counts, step):
        """Compiles the programs `update` runs for this batch's shapes, running nothing (nothing
        donated, no collective): a later `update` on a batch of these shapes starts at once."""
        fn, args = self._update_call(
            params, opt_state, ref_params, batch, terms, effort_counts, step, compile_only=True
        )
        fn.lower(*args).compile()

    def _update_call(
        self, params, opt_state, ref_params, batch, terms, effort_counts, step, compile_only=False
    ):
        """(jitted update, its arguments) for `update`'s inputs, checked and placed. With
        `compile_only`, the log-prob forwards whose outputs the update reads are compiled, not
        run, and stand in the arguments as their shapes."""

        def logp(p, b, jitted=self._logp_jit):
            if not compile_only:
                return jitted(p, b)
            out = jitted.lower(p, b).compile().out_info
            return jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), out
            )

        B, _ = self.check_batch(batch)
        terms, effort_counts = check_rewards(
            terms,
            effort_counts,
            B,
            self.reward_weights,
            self.effort_weights,
            self.use_length_penalty,
        )
        if self.needs_ref and ref_params is None:
            raise ValueError(
                f"ref_params is None, but the objective needs the reference policy "
                f"(kl_placement={self.objective.kl_placement!r}, kl_beta={self.objective.kl_beta})"
            )
        ids = lambda tree: {id(x) for x in jax.tree.leaves(tree)}  # noqa: E731
        shared = ref_params is not None and ids(params) & ids(ref_params)
        params = self.shard_params(params)
        if ref_params is not None:
            ref_params = self.shard_params(ref_params)
            if shared or ids(params) & ids(ref_params):
                raise ValueError(
                    "ref_params shares arrays with params, which the update donates: pass a copy "
                    "(e.g. jax.tree.map(jnp.copy, params))"
                )
        opt_state = jax.device_put(opt_state, self.opt_shardings)
        batch = self._put_batch(batch)
        ref_kl_logp_BT = None if ref_params is None else logp(ref_params, batch, self._ref_logp_jit)
        rows = NamedSharding(self.mesh, self.forwards.row_spec)
        terms = {k: place(v, rows) for k, v in terms.items()}
        effort_counts = {k: place(v, rows) for k, v in effort_counts.items()}
        step = jnp.asarray(step, jnp.int32)
        if self.single_forward:
            fn = self._update_single_forward_jit
            return fn, (params, opt_state, batch, ref_kl_logp_BT, terms, effort_counts, step)
        logp_BT, support_BT, kl_logp_BT = logp(params, batch)
        return self._update_jit, (
            params,
            opt_state,
            batch,
            logp_BT,
            support_BT,
            kl_logp_BT,
            ref_kl_logp_BT,
            terms,
            effort_counts,
            step,
        )

    # Inputs -----------------------------------------------------------------------------------

    def check_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[int, int]:
        """(B, T) of a batch from c2.rl.batching.make_batch; a ValueError naming a bad field."""
        return check_batch(batch, self.cfg, self.objective.group_size, self.forwards)

    def _put_batch(self, batch):
        return put_batch(batch, self.forwards)

    # Traced functions ---------------------------------------------------------------------------

    def _rewards(self, kl_logp_BT, ref_kl_logp_BT, keep_BT, terms, effort_counts, step):
        """(total_B, combine_rewards' log, kl_B): the environment's terms plus k1 and length."""
        obj = self.objective
        terms = dict(terms)
        weights = {n: self.reward_weights[n] for n in terms}
        kl_B = jnp.zeros(keep_BT.shape[:1], jnp.float32)
        if ref_kl_logp_BT is not None:
            kl_B = sequence_kl(kl_logp_BT, ref_kl_logp_BT, keep_BT, obj.kl_kind)
        if self.uses_kl_reward:
            terms["kl"], weights["kl"] = kl_B, obj.kl_beta
        if self.use_length_penalty:
            x_B = effort(effort_counts, self.effort_weights)
            terms["length_penalty"] = length_penalty(
                x_B, self.length_penalty_k, self.length_penalty_q
            )
            weights["length_penalty"] = self._length_penalty_weight
        total_B, log = combine_rewards(terms, weights, step)
        return total_B, log, kl_B

    def _advantages(self, batch, total_B, log):
        """(adv_B, what the loss weighs each token by: [B] or [B, T]). adv_B is the chain's
        advantage (c2.rl.credit: a chain's KL is the sum of its segments'); with
        tool_call_credit="turn" it leaves the tool-call penalty out, and each token takes its
        turn's penalty (`target_penalty`, signed and weighted) on top."""
        valid_B = batch["valid"]
        kl_B = log.get("reward/kl", jnp.zeros_like(total_B))
        term = "reward/tool_call_penalty"
        if self.tool_call_credit == "episode" or term not in log:
            adv_B = chain_advantages(self.objective, total_B, kl_B, batch)
            return adv_B, adv_B
        adv_B = chain_advantages(self.objective, total_B - log[term], kl_B, batch)
        per_call = REWARD_SIGNS["tool_call_penalty"] * log["weight/tool_call_penalty"]
        adv_BT = adv_B[:, None] + per_call * batch["target_penalty"]
        return adv_B, jnp.where(valid_B[:, None], adv_BT, 0.0)

    def _whole_batch(
        self, batch, logp_BT, support_BT, kl_logp_BT, ref_kl_logp_BT, terms, effort_counts, step
    ) -> dict:
        """What the whole batch decides before any gradient: the mismatch filter (its quantile),
        rewards, group advantages and loss normalisers."""
        valid_B = batch["valid"]
        targets_BT = (batch["target_mask"] > 0) & valid_B[:, None]
        mask_BT = targets_BT & support_BT
        keep_BT, mismatch = mismatch_keep(
            self.objective, self.mismatch_tokens, batch, logp_BT, mask_BT, step
        )
        total_B, log, kl_B = self._rewards(
            kl_logp_BT, ref_kl_logp_BT, keep_BT, terms, effort_counts, step
        )
        adv_B, adv = self._advantages(batch, total_B, log)
        return dict(
            targets_BT=targets_BT,
            mask_BT=mask_BT,
            keep_BT=keep_BT,
            mismatch=mismatch,
            total_B=total_B,
            log=log,
            kl_B=kl_B,
            adv_B=adv_B,
            adv=adv,
            normalizers=loss_normalizers(keep_BT),
            groups=group_counts(self.objective.group_size, terms["task"], batch),
        )

    @property
    def _pg_objective(self) -> ObjectiveConfig:
        # rl_loss composes the policy-gradient term; a KL loss term (the "loss" placement) is
        # added by _loss, on the temperature-only log-probs (c2.rl.logprobs).
        return dataclasses.replace(self.objective, kl_placement="reward")

    @property
    def _loss_keys(self) -> tuple[str, ...]:
        return ("loss", "pg_loss") + (("kl_loss",) if self.objective.kl_placement == "loss" else ())

    def _loss(self, logp, kl_logp, behaviour, advantages, keep, ref_kl_logp, normalizers):
        """The objective of some rows, given their current log-probs: (loss, metrics). With the
        whole batch's normalisers, the losses of disjoint row sets add up to the batch's."""
        obj = self.objective
        loss, m = rl_loss(self._pg_objective, logp, behaviour, advantages, keep, **normalizers)
        if obj.kl_placement == "loss":
            kl_BT = kl_token_loss(kl_logp, ref_kl_logp, keep, obj.kl_kind, obj.kl_beta)
            m["kl_loss"] = aggregate_loss(
                kl_BT, keep, obj.aggregation, constant=obj.loss_constant, **normalizers
            )
            loss = m["loss"] = loss + m["kl_loss"]
        return loss, m

    def _update(
        self,
        params,
        opt_state,
        batch,
        logp_BT,
        support_BT,
        kl_logp_BT,
        ref_kl_logp_BT,
        terms,
        effort_counts,
        step,
    ):
        """The update from log-probs computed beforehand: each micro-batch's gradient runs its
        forward again (activations live for one micro-batch at a time)."""
        w = self._whole_batch(
            batch, logp_BT, support_BT, kl_logp_BT, ref_kl_logp_BT, terms, effort_counts, step
        )

        def loss_fn(p, mb):
            logp, _, kl_logp = self.forwards.token_logp(p, mb)
            return self._loss(
                logp,
                kl_logp,
                mb["behaviour_logp"],
                mb["advantages"],
                mb["keep"],
                mb["ref_kl_logp"],
                w["normalizers"],
            )

        loss_keys = self._loss_keys

        def body(carry, mb):
            grads, sums = carry
            (_, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
            grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
            return (grads, {k: sums[k] + m[k] for k in loss_keys}), None

        micro_in = {
            k: batch[k]
            for k in ("inputs", "positions", "segment_ids", "targets", "routing")
            + ("temperature", "top_k", "top_p", "behaviour_logp")
        }
        micro_in |= {"advantages": w["adv"], "keep": w["keep_BT"], "ref_kl_logp": ref_kl_logp_BT}
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
        zeros = jax.lax.with_sharding_constraint(zeros, self.param_shardings)
        init = (zeros, {k: jnp.zeros((), jnp.float32) for k in loss_keys})
        (grads, sums), _ = jax.lax.scan(body, init, self.forwards.micro(micro_in))
        _, whole = rl_loss(
            self._pg_objective,
            logp_BT,
            batch["behaviour_logp"],
            w["adv"],
            w["keep_BT"],
            **w["normalizers"],
        )
        return self._apply(params, opt_state, grads, sums, whole, batch, logp_BT, w, step)

    def _update_single_forward(
        self, params, opt_state, batch, ref_kl_logp_BT, terms, effort_counts, step
    ):
        """The same update from one forward of the current policy: its log-probs feed the
        whole-batch decisions and its kept activations the gradient (jax.vjp), so the forward
        is not run twice; the activations of every micro-batch live until the backward."""

        def logps(p):
            logp, support, kl_logp = self.forwards.logp_batch(p, batch)
            return (logp, kl_logp), support

        (logp_BT, kl_logp_BT), backward, support_BT = jax.vjp(logps, params, has_aux=True)
        w = self._whole_batch(
            batch, logp_BT, support_BT, kl_logp_BT, ref_kl_logp_BT, terms, effort_counts, step
        )
        (_, m), cotangents = jax.value_and_grad(
            lambda logp, kl_logp: self._loss(
                logp,
                kl_logp,
                batch["behaviour_logp"],
                w["adv"],
                w["keep_BT"],
                ref_kl_logp_BT,
                w["normalizers"],
            ),
            argnums=(0, 1),
            has_aux=True,
        )(logp_BT, kl_logp_BT)
        (grads,) = backward(cotangents)
        sums = {k: m[k] for k in self._loss_keys}
        return self._apply(params, opt_state, grads, sums, m, batch, logp_BT, w, step)

    def _apply(self, params, opt_state, grads, sums, whole, batch, logp_BT, w, step):
        """Adam on the gradient; the step's metrics (`whole`: the loss's over the whole batch)
        and per-sample values."""
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)

        valid_B, targets_BT, mask_BT = batch["valid"], w["targets_BT"], w["mask_BT"]
        keep_BT, adv_B, kl_B, total_B = w["keep_BT"], w["adv_B"], w["kl_B"], w["total_B"]
        n_valid = jnp.maximum(valid_B.sum(), 1).astype(jnp.float32)
        per_valid = lambda x_B: jnp.where(valid_B, x_B, 0.0).sum() / n_valid  # noqa: E731
        metrics = dict(sums)
        metrics |= {
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
            "kl": per_valid(kl_B),
            "advantage_abs_mean": per_valid(jnp.abs(adv_B)),
            "valid_samples": valid_B.sum().astype(jnp.float32),
            "target_tokens": targets_BT.sum().astype(jnp.float32),
            "kept_tokens": keep_BT.sum().astype(jnp.float32),
            "tokens_out_of_support": (targets_BT & ~mask_BT).sum().astype(jnp.float32),
            "penalised_tokens": (targets_BT & (batch["target_penalty"] > 0)).sum(),
        }
        if self.schedule is not None:
            metrics["lr"] = jnp.asarray(self.schedule(step), jnp.float32)
        metrics |= {k: v for k, v in whole.items() if k.startswith(("is_", "frac_"))}
        metrics |= w["mismatch"] | w["groups"]
        # Per sample: the mean and largest |train - behaviour| log-prob gap over its targets.
        gap_BT = jnp.where(mask_BT, jnp.abs(logp_BT - batch["behaviour_logp"]), 0.0)
        n_B = jnp.maximum(mask_BT.sum(-1), 1).astype(jnp.float32)
        per_sample = {"reward": total_B, "kl": kl_B, "advantage": adv_B}
        per_sample |= {"mismatch_mean": gap_BT.sum(-1) / n_B, "mismatch_max": gap_BT.max(-1)}
        for name, value in w["log"].items():
            if name.startswith("weight/"):
                metrics[name] = value
            elif name != "reward/total":
                per_sample[name] = value
                metrics[name] = per_valid(value)
        metrics["reward/total"] = per_valid(total_B)
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        return params, opt_state, metrics, per_sample
