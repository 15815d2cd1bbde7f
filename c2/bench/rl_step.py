"""The RL learner's update: a log-prob forward then a gradient per micro-batch, vs one forward.

`RLLearner.update` needs the current policy's log-probs of the whole batch before any gradient
(the mismatch filter's quantile, rewards with the k1 term, group advantages, normalisers). The
default computes them in a forward of their own, then runs each micro-batch's forward again
inside its gradient; `single_forward` (config.rl.single_forward) keeps the first forward's
activations for the backward (jax.vjp), so the update runs one forward of the current policy
less. This times both updates (and the reference forward and a bare log-prob forward, for
scale) on the RL config's batch shape, interleaved (c2.bench.fair), after checking that they
give the same parameters from the same start.

The batch: `prompts_per_step x group_size` rows of `--prompt` + `--generated` tokens (the tiny
RL stage's episodes: ~300 prompt and ~165 generated tokens in a 512 bucket), random tokens and
experts; the model: the config's, at random init (the time does not depend on the values).

Command:
    python -m c2.bench.rl_step [--config experiments/rl_tiny.py] [--micro 8,64] [--repeats 5]
        [--out FILE.json]
Runtime: about 3 minutes on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import datetime
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
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.records import Sample
from c2.rl.step import RLLearner
from c2.train.config import load_config
from c2.train.optimizer import make_optimizer


def random_samples(cfg, rows: int, group_size: int, prompt: int, generated: int, seed: int = 0):
    """`rows` samples (groups of `group_size`) of random tokens and experts, with rewards."""
    rng = np.random.default_rng(seed)
    n, k = prompt + generated, cfg.n_experts_per_token
    out = []
    for i in range(rows):
        routing = np.argsort(rng.random((n, cfg.n_moe_layers, cfg.n_experts)), -1)[..., :k]
        generated_mask = np.arange(n) >= prompt
        out.append(
            Sample(
                prompt_id=f"p{i // group_size}",
                group_id=f"g{i // group_size}",
                sample_index=i % group_size,
                task_id="t",
                tokens=rng.integers(0, cfg.vocab_size, n).astype(np.int32),
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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m c2.bench.rl_step")
    ap.add_argument("--config", default="experiments/rl_tiny.py")
    ap.add_argument("--micro", default="8,64", help="micro-batch sizes to time")
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--generated", type=int, default=167)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    _, cfg, objective, _ = rl_config.validate_rl(config, 1, load_files=False)
    r = config.rl
    rows = r.prompts_per_step * r.group_size
    samples = random_samples(cfg, rows, r.group_size, args.prompt, args.generated)
    batch = make_batch(
        samples,
        batch_size=rows,
        seq_buckets=tuple(r.seq_buckets),
        cfg=cfg,
        pad_id=0,
        group_size=r.group_size,
    )
    terms, effort = reward_arrays(samples, rows)
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
        )

    def update(lrn: RLLearner):
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
            name = f"micro {micro}, " + ("single forward" if single else "two forwards")
            lrn = learner(micro, single)
            p = lrn.shard_params(jax.tree.map(jnp.copy, ref))
            first[name] = jax.device_get(
                lrn.update(p, lrn.init_opt_state(p), ref, batch, terms, effort, 1)[0]
            )
            runs[name] = update(lrn)
    base = next(iter(first.values()))
    for params in first.values():  # every variant: the same first update
        chex.assert_trees_all_close(params, base, rtol=1e-4, atol=1e-6)
    plain = learner(int(args.micro.split(",")[0]), False)
    placed = plain._put_batch(batch)
    runs["log-prob forward"] = lambda: jax.block_until_ready(plain._logp_jit(ref, placed))
    timings, _ = fair.interleave(runs, args.repeats, pause=0.2)
    fair.finish(check)
    tokens = rows * batch["inputs"].shape[1]
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.node(),
        "config": args.config,
        "batch": [rows, int(batch["inputs"].shape[1])],
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
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
