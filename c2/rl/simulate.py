"""A discrete-event simulation of the asynchronous orchestrator at cluster scale (docs/recipe.md
§2): N inference instances, one trainer, heavy-tailed episode lengths and test runtimes. The real
`c2.rl.orchestrator.Scheduler` decides admission and which groups each step trains on; only time
is simulated.

    python -m c2.rl.simulate --preset kimi_k2 --gpus 64,128,256,512,1024 [--staleness 0,1,2,4]
    python -m c2.rl.simulate --validate c2/bench/results/async_rl.json   (vs the measured run)

Model (every parameter is a field of `SimConfig`):
  inference  each instance decodes its active episodes together: one decode step of n episodes
             takes step_s(n) = decode_floor_s + decode_per_seq_s * n, and yields one token per
             episode (processor sharing); at most `slots` episodes per instance. New weights
             reach an instance `weight_sync_s` after the trainer publishes them and pause it for
             `weight_pause_s`; admission there uses the version the instance holds.
  episodes   generated tokens ~ lognormal(median, sigma), capped; then the hidden tests run for
             a Pareto(scale, alpha) time drawn per task (capped at 20 x scale), off the slot.
  trainer    a step of B samples takes train_fixed_s + train_per_token_s x their tokens; with
             `shared_cpu` (the 2-core validation) decoding runs `contention` times slower while
             the trainer computes.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import sys
from collections.abc import Sequence

import numpy as np

from c2.rl.orchestrator import Scheduler


@dataclasses.dataclass(frozen=True)
class SimConfig:
    instances: int = 1
    slots: int = 16
    decode_floor_s: float = 0.02
    decode_per_seq_s: float = 0.002
    weight_sync_s: float = 0.0
    weight_pause_s: float = 0.0
    tokens_median: float = 100.0
    tokens_sigma: float = 0.6
    tokens_max: int = 512
    test_scale_s: float = 1.5
    test_alpha: float = 1.5
    train_fixed_s: float = 1.0
    train_per_token_s: float = 0.001
    prompts_per_step: int = 4
    group_size: int = 8
    max_staleness: int = 2
    steps: int = 50
    shared_cpu: bool = False
    contention: float = 1.0  # decode slowdown factor - 1 while the trainer computes (shared_cpu)
    seed: int = 0


@dataclasses.dataclass
class _Episode:
    prompt_id: str
    index: int
    tokens: int
    test_s: float
    version: int = -1  # the instance's version at its first token
    left: float = 0.0  # tokens still to generate


class _Sample:  # what the Scheduler reads
    def __init__(self, ep: _Episode):
        self.prompt_id, self.sample_index = ep.prompt_id, ep.index
        self.tokens, self.version = ep.tokens, ep.version


class _Instance:
    def __init__(self):
        self.active: list[_Episode] = []
        self.pending: list[_Episode] = []  # admitted here (at this instance's version), queued
        self.version = 0
        self.busy_until = 0.0  # paused for a weight swap until then
        self.last = 0.0  # time its episodes' progress was last brought up to date
        self.token = 0  # invalidates scheduled events when the instance's state changes


def simulate(c: SimConfig) -> dict:
    """Runs `c.steps` trainer steps; returns throughput, idle fractions and staleness."""
    rng = np.random.default_rng(c.seed)
    sched = Scheduler(c.prompts_per_step, c.group_size, c.max_staleness)
    instances = [_Instance() for _ in range(c.instances)]
    events: list = []  # (time, seq, kind, payload)
    seq = iter(range(1 << 62))
    now, next_prompt = 0.0, 0
    test_runtime: dict[str, float] = {}
    trainer_busy_until, trainer_idle, training = 0.0, 0.0, False
    idle_since = 0.0
    staleness: list[int] = []
    versions_at: dict[int, int] = {}
    step = 0
    generated = 0

    def push(t, kind, payload=None):
        heapq.heappush(events, (t, next(seq), kind, payload))

    def rate(inst) -> float:
        """Tokens per second per active episode on an instance."""
        n = len(inst.active)
        slow = 1.0 + (c.contention if c.shared_cpu and training else 0.0)
        return 1.0 / ((c.decode_floor_s + c.decode_per_seq_s * n) * slow)

    def advance(inst) -> None:
        """Bring its episodes' progress up to `now` (nothing moves while it is paused)."""
        dt = max(0.0, now - max(inst.last, inst.busy_until))
        if inst.active and dt:
            r = rate(inst)
            for ep in inst.active:
                ep.left -= dt * r
        inst.last = now

    def schedule(i) -> None:
        inst = instances[i]
        inst.token += 1
        if inst.active:
            r = rate(inst)
            left = min(ep.left for ep in inst.active)
            t = max(now, inst.busy_until) + max(left, 0.0) / r
            push(t, "gen_done", (i, inst.token))

    def admit_and_fill() -> None:
        nonlocal next_prompt
        for i, inst in enumerate(instances):
            changed = False
            while len(inst.active) < c.slots:
                if not inst.pending:
                    if sched.quota(inst.version) < 1:
                        break
                    pid = f"p{next_prompt}"
                    next_prompt += 1
                    sched.admit(pid, inst.version)
                    test_runtime[pid] = min(
                        c.test_scale_s * (1 - rng.random()) ** (-1 / c.test_alpha),
                        20 * c.test_scale_s,
                    )
                    for k in range(c.group_size):
                        n = rng.lognormal(np.log(c.tokens_median), c.tokens_sigma)
                        n = int(min(c.tokens_max, max(1, round(n))))
                        inst.pending.append(_Episode(pid, k, n, test_runtime[pid]))
                ep = inst.pending.pop(0)
                advance(inst)
                ep.version, ep.left = inst.version, float(ep.tokens)
                inst.active.append(ep)
                changed = True
            if changed:
                schedule(i)

    def try_train() -> None:
        nonlocal training, trainer_busy_until, trainer_idle, step
        if training or step >= c.steps:
            return
        chosen = sched.select(step)
        if chosen is None:
            return
        sched.consume(chosen)
        trainer_idle += now - idle_since
        samples = [s for g in chosen for s in g.samples]
        staleness.extend(step - s.version for s in samples)
        tokens = sum(s.tokens for s in samples)
        for i in range(len(instances)):  # decoding slows down from now (shared CPU)
            advance(instances[i])
        training = True
        for i in range(len(instances)):
            schedule(i)
        push(now + c.train_fixed_s + c.train_per_token_s * tokens, "train_done")

    admit_and_fill()
    while events and step < c.steps:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "gen_done":
            i, token = payload
            inst = instances[i]
            if token != inst.token:
                continue  # superseded
            advance(inst)
            done = [ep for ep in inst.active if ep.left <= 1e-9]
            inst.active = [ep for ep in inst.active if ep.left > 1e-9]
            for ep in done:
                generated += ep.tokens
                push(now + ep.test_s, "graded", ep)
            admit_and_fill()
            schedule(i)
        elif kind == "graded":
            sched.add(_Sample(payload))
            try_train()
        elif kind == "train_done":
            step += 1
            versions_at[step] = now
            for inst in instances:  # progress at the contended rate up to now
                advance(inst)
            training, idle_since = False, now
            for i in range(len(instances)):
                schedule(i)
                push(now + c.weight_sync_s, "weights", (i, step))
            try_train()
        elif kind == "weights":
            i, version = payload
            inst = instances[i]
            advance(inst)
            inst.version = max(inst.version, version)
            inst.busy_until = now + c.weight_pause_s
            admit_and_fill()
            schedule(i)
    steps_done = step
    # rates after the first step (the measured run leaves out its first step too)
    t1 = versions_at.get(1, 0.0)
    wall = now - t1
    B = c.prompts_per_step * c.group_size
    hist = np.bincount(np.asarray(staleness, np.int64), minlength=c.max_staleness + 1)
    return {
        "steps": steps_done,
        "wall_s": now,
        "samples_per_s": (steps_done - 1) * B / wall if wall > 0 else 0.0,
        "trainer_idle_frac": trainer_idle / now if now else 0.0,
        "staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
        "staleness_hist": (hist / max(hist.sum(), 1)).round(4).tolist(),
        "generated_tokens_per_s": generated / now if now else 0.0,
        "step_s": wall / max(steps_done - 1, 1),
    }


# Cluster presets: published per-GPU throughputs of a DeepSeek-V3-class model on H800s.
#   decoding: 14.8k output tokens/s per 8-GPU node at large batch (DeepSeek's inference system,
#   open-source week, day 6), i.e. a decode step of 256 sequences in ~17 ms;
#   training: 180K H800 GPU-hours per trillion tokens (DeepSeek-V3 report) = 1,543 tokens/s/GPU,
#   times 4/3 for the RL step's extra forward (the reference model's log-probs).
def cluster_config(gpus: int, staleness: int, train_fraction: float = 0.25, **kw) -> SimConfig:
    train_gpus = max(8, int(gpus * train_fraction) // 8 * 8)
    nodes = max(1, (gpus - train_gpus) // 8)
    base = dict(
        instances=nodes,
        slots=256,
        decode_floor_s=0.008,
        decode_per_seq_s=0.009 / 256,
        weight_sync_s=30.0,
        weight_pause_s=2.0,
        tokens_median=6000.0,
        tokens_sigma=1.0,
        tokens_max=65536,
        test_scale_s=20.0,
        test_alpha=1.5,
        train_fixed_s=10.0,
        train_per_token_s=(4 / 3) / (1543.0 * train_gpus),
        prompts_per_step=64,
        group_size=8,
        max_staleness=staleness,
        steps=30,
    )
    base.update(kw)
    return SimConfig(**base)


def validation_config(measured: dict, staleness: int) -> SimConfig:
    """The 2-core run's settings, its costs measured in that run (see c2/bench/async_rl.py)."""
    m = measured["sim_inputs"]
    scale, alpha = measured["latency_pareto"]
    return SimConfig(
        instances=1,
        slots=m["engine_slots"],
        decode_floor_s=m["decode_floor_s"],
        decode_per_seq_s=m["decode_per_seq_s"],
        tokens_median=m["tokens_median"],
        tokens_sigma=m["tokens_sigma"],
        tokens_max=m["tokens_max"],
        test_scale_s=scale,
        test_alpha=alpha,
        train_fixed_s=m["train_fixed_s"],
        train_per_token_s=m["train_per_token_s"],
        prompts_per_step=m["prompts_per_step"],
        group_size=m["group_size"],
        max_staleness=staleness,
        steps=m["steps"],
        shared_cpu=True,
        contention=m["contention"],
        seed=0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.rl.simulate")
    parser.add_argument("--gpus", default="64,128,256,512,1024")
    parser.add_argument("--staleness", default="0,1,2,4")
    parser.add_argument("--validate", default=None, help="a c2.bench.async_rl JSON result")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    settings = [int(s) for s in args.staleness.split(",")]
    out: dict = {}
    if args.validate:
        with open(args.validate) as f:
            measured = json.load(f)
        print(f"{'S':>3} {'measured/s':>11} {'sim/s':>7} {'stale':>6} {'sim stale':>10}")
        for S in settings:
            runs = [
                simulate(dataclasses.replace(validation_config(measured, S), seed=k))
                for k in range(args.seeds)
            ]
            keys = ("samples_per_s", "staleness_mean", "trainer_idle_frac")
            sim = {k: float(np.mean([r[k] for r in runs])) for k in keys}
            got = measured["results"].get(str(S))
            out[f"validate_S{S}"] = {"simulated": sim, "measured": got}
            if got:
                print(
                    f"{S:>3} {got['samples_per_s']:>11.2f} {sim['samples_per_s']:>7.2f} "
                    f"{got['staleness_mean']:>6.2f} {sim['staleness_mean']:>10.2f}"
                )
    else:
        print(f"{'GPUs':>5} {'S':>3} {'samples/s':>10} {'step s':>7} {'idle':>6} {'stale':>6}")
        for g in (int(x) for x in args.gpus.split(",")):
            for S in settings:
                r = simulate(cluster_config(g, S))
                out[f"{g}_S{S}"] = r
                print(
                    f"{g:>5} {S:>3} {r['samples_per_s']:>10.2f} {r['step_s']:>7.1f} "
                    f"{r['trainer_idle_frac']:>6.2f} {r['staleness_mean']:>6.2f}"
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
