"""The RL learner's update: a log-prob forward then a gradient per micro-batch, vs one forward;
plain rows vs packed groups.

`RLLearner.update` needs the current policy's log-probs of the whole batch before any gradient
(the mismatch filter's quantile, rewards with the k1 term, group advantages, normalisers). The
default computes them in a forward of their own, then runs each micro-batch's forward again
inside its gradient; `single_forward` (config.rl.single_forward) keeps the first forward's
activations for the backward (jax.vjp), so the update runs one forward of the current policy
less. Packed groups (config.rl.pack_groups) put each group's prompt through the model once, its
samples as branches of it (c2.rl.batching). This times the updates (each with the reference
forward it needs; and a bare log-prob forward, for scale) on the RL config's batch shape,
interleaved (c2.bench.fair), after checking that they give the same parameters from the same
start.

The batch: `prompts_per_step x group_size` samples, each group sharing a `--prompt`-token prompt
(ids and experts) and each sample generating between half and 1.5x `--generated` tokens (capped
by the bucket), random tokens and experts; or, with `--rollouts FILE.jsonl`, the first such
batch of a run's recorded samples (c2.rl.records). The model: the config's, at random init (the
time does not depend on the values).

Command:
    python -m c2.bench.rl_step [--config experiments/rl_tiny.py] [--micro 8] [--repeats 5]
        [--rollouts RUN/rollouts/step_000040.jsonl] [--out FILE.json]
Runtime: about 8 minutes on the 2-core reference machine (6 with --repeats 3).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2 import model, sharding
from c2.bench import fair
from c2.rl import config as rl_config
from c2.rl import records
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.objectives import REWARD_SIGNS
from c2.rl.records import Sample
from c2.rl.step import COMPUTED_TERMS, RLLearner
from c2.train.config import load_config
from c2.train.optimizer import make_optimizer


def random_samples(
    cfg, rows: int, group_size: int, prompt: int, generated: int, max_len: int, seed: int = 0
):
    """`rows` samples (groups of `group_size` sharing a prompt) of random tokens and experts,
    generating between generated / 2 and 1.5 * generated tokens (at most max_len in all)."""
    rng = np.random.default_rng(seed)
    k = cfg.n_experts_per_token
    experts = lambda n: np.argsort(rng.random((n, cfg.n_moe_layers, cfg.n_experts)), -1)[..., :k]  # noqa: E731
    out = []
    for i in range(rows):
        if i % group_size == 0:
            shared, shared_routing = rng.integers(0, cfg.vocab_size, prompt), experts(prompt)
        n = min(prompt + int(rng.integers(generated // 2, generated * 3 // 2 + 1)), max_len)
        routing = np.concatenate([shared_routing, experts(n - prompt)])
        tokens = np.concatenate([shared, rng.integers(0, cfg.vocab_size, n - prompt)])
        generated_mask = np.arange(n) >= prompt
        out.append(
            Sample(
                prompt_id=f"p{i // group_size}",
                group_id=f"g{i // group_size}",
                sample_index=i % group_size,
                task_id="t",
                tokens=tokens.astype(np.int32),
                loss_mask=generated_mask.astype(np.uint8),
                logprobs=np.where(generated_mask, -5.0, 0.0).astype(np.float32),
                versions=np.where(generated_mask, 0, -1).astype(np.int32),
                routing=routing.astype(np.uint8),
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                reward_terms={
                    "task": float(rng.random() < 0.3),
                    "style": 1.0,
                    "communication": 1.0,
                    "tool_call_penalty": 0.0,
                },
                effort={
                    "thinking_tokens": 0.0,
                    "tool_call_tokens": 0.0,
                    "final_message_tokens": 0.0,
                },
                passed=True,
                stop_reason="submit",
            )
        )
    return out


def recorded_samples(path: str, rows: int, group_size: int) -> list[Sample]:
    """The first `rows` samples of a rollouts file (complete groups, in order), as the trainer
    saw them."""
    by_group: dict[str, list[dict]] = {}
    for r in records.read_rollouts(path):
        by_group.setdefault(r["group_id"], []).append(r)
    groups = [g for g in by_group.values() if len(g) == group_size]
    if len(groups) * group_size < rows:
        raise ValueError(f"{path}: {len(groups)} complete groups of {group_size}; need {rows} rows")
    chosen = [r for g in groups[: rows // group_size] for r in sorted(g, key=_index)]
    return [records.sample_from_record(r) for r in chosen]


def _index(record: dict) -> int:
    return record["sample_index"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m c2.bench.rl_step")
    ap.add_argument("--config", default="experiments/rl_tiny.py")
    ap.add_argument("--micro", default="8", help="micro-batch sizes to time")
    ap.add_argument("--prompt", type=int, default=251)
    ap.add_argument("--generated", type=int, default=217)
    ap.add_argument("--rollouts", help="a rollouts JSONL: time its recorded samples instead")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    _, cfg, objective, _ = rl_config.validate_rl(config, 1, load_files=False)
    r = config.rl
    rows = r.prompts_per_step * r.group_size
    if args.rollouts:
        samples = recorded_samples(args.rollouts, rows, r.group_size)
    else:
        samples = random_samples(
            cfg, rows, r.group_size, args.prompt, args.generated, max(r.seq_buckets)
        )
    kw = dict(
        batch_size=rows,
        seq_buckets=tuple(r.seq_buckets),
        cfg=cfg,
        pad_id=0,
        group_size=r.group_size,
    )
    batches = {
        "plain": make_batch(samples, **kw),
        "packed": make_batch(samples, pack_buckets=tuple(r.pack_buckets), **kw),
    }
    terms, effort = reward_arrays(samples, rows)
    # Recorded samples carry the trainer's weighted terms too: the learner takes the raw ones.
    terms = {k: v for k, v in terms.items() if k in REWARD_SIGNS and k not in COMPUTED_TERMS}
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    tx, schedule = make_optimizer(config.optimizer, config.train.steps, model.abstract_params(cfg))
    ref = model.init_params(cfg, jax.random.key(0))

    def learner(micro: int, single: bool) -> RLLearner:
        return RLLearner(
            cfg,
            objective,
            tx,
            mesh=mesh,
            micro_batch_size=micro,
            reward_weights=rl_config.reward_weights(config),
            schedule=schedule,
            logit_chunk_tokens=int(config.train.loss_chunk_tokens),
            single_forward=single,
            packed_attention_block=int(r.pack_attention_block),
        )

    def update(lrn: RLLearner, batch):
        """A run taking one update per call from the state the last call left (donated)."""
        state = [jax.tree.map(jnp.copy, ref), lrn.init_opt_state(ref)]

        def run():
            params, opt_state, metrics, _ = lrn.update(*state, ref, batch, terms, effort, 1)
            state[:] = [params, opt_state]
            return jax.block_until_ready(metrics)

        return run

    check = fair.load_check()
    runs, first = {}, {}
    for micro in (int(m) for m in args.micro.split(",")):
        for single in (False, True):
            for layout, batch in batches.items():
                name = f"micro {micro}, " + ("single forward" if single else "two forwards")
                name += ", packed" if layout == "packed" else ""
                lrn = learner(micro, single)
                p = lrn.shard_params(jax.tree.map(jnp.copy, ref))
                first[name] = jax.device_get(
                    lrn.update(p, lrn.init_opt_state(p), ref, batch, terms, effort, 1)[0]
                )
                runs[name] = update(lrn, batch)
    base = next(iter(first.values()))
    for params in first.values():  # every variant: the same first update
        chex.assert_trees_all_close(params, base, rtol=1e-4, atol=1e-6)
    plain = learner(int(args.micro.split(",")[0]), False)
    for layout, batch in batches.items():
        placed = plain._put_batch(batch)
        runs[f"log-prob forward, {layout}"] = functools.partial(
            lambda placed: jax.block_until_ready(plain._logp_jit(ref, placed)), placed
        )
    timings, _ = fair.interleave(runs, args.repeats, pause=0.2)
    fair.finish(check)
    plain_batch, packed = batches["plain"], batches["packed"]
    tokens = int((plain_batch["segment_ids"] > 0).sum())  # the samples' tokens
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.node(),
        "config": args.config,
        "rollouts": args.rollouts,
        "batch": list(plain_batch["inputs"].shape),
        "packed_batch": list(packed["packed_inputs"].shape),
        "tokens": {
            "samples": tokens,
            "plain_rows": int(plain_batch["inputs"].size),
            "packed": int((packed["packed_segment_ids"] > 0).sum()),
            "packed_rows": int(packed["packed_inputs"].size),
        },
        "load": check.record(),
        "timings": {n: t.summary() for n, t in timings.items()},
    }
    for name, t in timings.items():
        print(
            f"{name:32s} {t.median:7.2f} s ({t.min:.2f}-{t.max:.2f}), "
            f"{tokens / t.median:,.0f} tok/s"
        )
    for micro in args.micro.split(","):
        two, one = (
            timings[f"micro {micro}, two forwards"],
            timings[f"micro {micro}, single forward"],
        )
        result[f"single_over_two_micro_{micro}"] = one.median / two.median
        print(f"micro {micro}: single forward / two forwards = {one.median / two.median:.3f}")
        for single in ("two forwards", "single forward"):
            a, b = timings[f"micro {micro}, {single}"], timings[f"micro {micro}, {single}, packed"]
            key = f"plain_over_packed_micro_{micro}_" + single.replace(" ", "_")
            result[key] = a.median / b.median
            print(f"micro {micro}, {single}: plain / packed = {a.median / b.median:.2f}x")
    print(f"tokens: {result['tokens']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
