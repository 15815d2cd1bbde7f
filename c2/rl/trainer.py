"""The RL stage (docs/recipe.md §2), asynchronous with bounded staleness.

    python -m c2.main --config=experiments/rl_tiny.py --workdir=DIR [--config.init_from=SFT_DIR]

Rollouts run continuously in a background thread (c2/rl/orchestrator.py: one engine with
continuous batching, the sandbox pool for tools and grading); the trainer takes complete groups
as they finish. Optimiser step s (weights version s -> s + 1) trains `prompts_per_step` groups of
`group_size` episodes, none with a token older than version s - max_staleness (0: synchronous,
on-policy), through `RLLearner.update` (router replay, mismatch filter, TIS, k1 KL to the RL
start weights in the reward, the objective's defaults); the new weights reach the engine at its
next decode step. Samples are written to DIR/rollouts/step_NNNNNN.jsonl with the step that
trained them; held-out evaluations (pass@1, best-of-K), on an engine of their own holding the
weights of that step, to DIR/rollouts/eval_NNNNNN.jsonl and DIR/eval.jsonl. The prompt ledger is
single-epoch: the ids trained are saved with every checkpoint; a resumed run (after a crash,
even SIGKILL) regenerates whatever was in flight, trains no prompt twice and skips none, and
moves the rollout and evaluation files of steps the crash undid to DIR/rollouts/discarded/.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from c2 import distributed
from c2.data.chat import AgentChat
from c2.data.tokenizer import load_tokenizer
from c2.envs.sandbox import Sandbox
from c2.envs.tasks import Task, load_tasks
from c2.infer.engine import Engine
from c2.rl import config as rl_config
from c2.rl import evaluation, orchestrator
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.episodes import EpisodeRequest, EpisodeRunner
from c2.rl.records import Sample, write_rollouts
from c2.rl.step import RLLearner
from c2.train import lm
from c2.train import metrics as metrics_lib
from c2.train.checkpoint import Checkpointer
from c2.train.config import ConfigError, sharding_rules
from c2.train.loop import Counters, abstract_state, init_key, load_init_params, plot_run
from c2.train.optimizer import make_optimizer

log = logging.getLogger(__name__)

CURVES = {
    "rewards": ("reward/total", "reward/task", "reward/style", "reward/communication"),
    "penalties": ("reward/tool_call_penalty", "reward/length_penalty", "reward/kl", "kl"),
    "heldout": ("eval_pass@1", "eval_best_of_k", "pass_rate"),
    "mismatch": ("mismatch_p50", "mismatch_p99", "mismatch_max", "frac_tokens_dropped"),
    "throughput": ("generated_tokens_per_s", "train_tokens_per_s", "step_time_s"),
    "async": ("staleness_mean", "trainer_idle_frac", "samples_per_s", "groups_zero_advantage"),
    "episodes": ("turns_mean", "generated_tokens_mean", "invalid_tool_calls_mean"),
    "optim": ("loss", "grad_norm", "update_norm", "lr"),
}


# Prompts ----------------------------------------------------------------------------------


def load_task_source(spec: str, split: str, n: int, seed: int, workdir: Path) -> list[Task]:
    """Tasks in ledger order, independent of how many a run needs (so a resumed run with more
    steps keeps the order): "functions" and "notes" generate tasks 0..n-1 of (seed, split) into
    workdir/tasks/<split> (each task is its own seeded draw: index order is the order); a
    directory gives all its tasks in a seeded hash order."""
    kind, _, rest = spec.partition(":")
    if kind == "functions":
        from c2.envs.functions import LEVELS, generate_function_tasks

        level = rest or "full"
        if level not in LEVELS:
            raise ConfigError(f"config.rl.tasks={spec!r}: level {level!r} is not one of {LEVELS}")
        want = {"n": n, "seed": seed, "level": level}
        make = lambda out: generate_function_tasks(out, n, seed, split, level)  # noqa: E731
        return _generated(workdir / "tasks" / split, want, make)
    if kind == "notes":  # notes[:full|fixed|keyed][:files[:note_chars]]
        from c2.envs.notes import generate_notes_tasks, parse_spec

        try:
            level, files, chars = parse_spec(spec)
        except ValueError as e:
            raise ConfigError(f"config.rl.tasks: {e}") from None
        want = {"n": n, "seed": seed, "files": files, "note_chars": chars, "level": level}
        make = lambda out: generate_notes_tasks(out, n, seed, split, files, chars, level)  # noqa: E731
        return _generated(workdir / "tasks" / split, want, make)
    path = Path(spec)
    if not path.is_dir():
        raise ConfigError(
            f"config.rl.tasks={spec!r}: expected 'functions[:full|basic|wide]', "
            "'notes[:full|fixed|keyed][:files[:note_chars]]' or a task directory"
        )
    tasks = load_tasks(path)
    key = lambda t: hashlib.sha1(f"{seed}:{t.task_id}".encode()).hexdigest()  # noqa: E731
    return sorted(tasks, key=key)


def _generated(out: Path, want: dict, make) -> list[Task]:
    """Generated tasks in `out`, made again unless done.json says they are these (`want`)."""
    done = out / "done.json"
    if done.is_file() and json.loads(done.read_text()) == want:
        return load_tasks(out)
    if out.exists():  # another size, or half-written by a crash: make it again
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tasks = make(out)
    done.write_text(json.dumps(want))
    return tasks


@dataclasses.dataclass
class Ledger:
    """Single-epoch prompt order: a seeded permutation; `consumed` ids are persisted."""

    order: list[str]
    consumed: list[str]

    def take(self, n: int) -> list[str]:
        done = set(self.consumed)
        fresh = [p for p in self.order if p not in done][:n]
        return fresh

    def mark(self, ids) -> None:
        self.consumed.extend(ids)


# The stage --------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains (or resumes) an RL stage in `workdir`; returns the final evaluation summary."""
    workdir = Path(workdir)
    mesh_sizes, cfg, objective, rollout = rl_config.validate_rl(config, jax.device_count())
    r = config.rl
    task = lm.build_task(rl_config._without_rl(config))  # mesh, shardings, init and import
    mesh = task.mesh
    # Several processes (c2/distributed.py): all train; process 0 alone runs the rollouts and
    # evaluations, holds the prompts and writes; the others follow it (_follow).
    primary = distributed.is_primary()
    if primary:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    tokenizer = load_tokenizer(config.data.tokenizer)
    chat = AgentChat(tokenizer)
    steps = config.train.steps
    n_train = steps * r.prompts_per_step
    train_tasks, heldout, problem = [], [], None
    if primary:
        try:
            train_tasks = load_task_source(r.tasks, "train", n_train, r.task_seed, workdir)
            heldout = load_task_source(
                r.heldout_tasks, "eval", r.eval.tasks, r.task_seed + 1, workdir
            )
        except ConfigError as e:
            problem = str(e)
        heldout = heldout[: r.eval.tasks]
        if problem is None and len(train_tasks) < n_train:
            steps = len(train_tasks) // r.prompts_per_step
            log.warning("single epoch: %d prompts give %d steps", len(train_tasks), steps)
            if steps < 1:
                problem = (
                    f"config.rl.tasks: {len(train_tasks)} prompts; need at least "
                    f"prompts_per_step={r.prompts_per_step}"
                )
    steps, problem = distributed.share((steps, problem))
    if problem is not None:
        raise ConfigError(problem)
    by_id = {t.task_id: t for t in train_tasks}
    order = [t.task_id for t in train_tasks]

    tx, schedule = make_optimizer(config.optimizer, steps, task.abstract_params)
    abstract_params, abstract_opt, opt_shardings = abstract_state(tx, task)
    ckpt = Checkpointer(
        workdir / "checkpoints",
        keep=config.train.keep_checkpoints,
        async_save=config.train.async_checkpoints,
    )
    if config.init_from:
        ref_params = load_init_params(config.init_from, task)
    else:
        ref_params = task.init_params(init_key(config.train.seed))
    restored = ckpt.restore_latest(abstract_params, abstract_opt)
    if restored is not None:
        start, params, opt_state, meta = restored
        ledger = Ledger(order, list(meta["consumed"]))
        counters = Counters(**meta["counters"])
        log.info(
            "resumed %s at step %d (%d prompts consumed)", workdir, start, len(ledger.consumed)
        )
    else:
        start, counters = 0, Counters()
        params = jax.tree.map(jnp.copy, ref_params)
        opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
        ledger = Ledger(order, [])
    learner = RLLearner(
        cfg,
        objective,
        tx,
        mesh=mesh,
        micro_batch_size=r.micro_batch_size,
        rules=sharding_rules(config),
        reward_weights=rl_config.reward_weights(config),
        effort_weights=rl_config.effort_weights(config),
        length_penalty_k=float(r.rewards.length_k),
        length_penalty_q=float(r.rewards.length_q),
        schedule=schedule,
        router_replay=r.router_replay,
        single_forward=r.single_forward,
        logit_chunk_tokens=int(config.train.loss_chunk_tokens),
        packed_attention_block=int(r.pack_attention_block),
        mismatch_tokens=r.mismatch_tokens,
        tool_call_credit=r.rewards.tool_call_credit,
    )
    rollouts_dir = workdir / "rollouts"
    if primary:
        _set_aside_lost_steps(rollouts_dir, start)
    engine_args = dict(
        max_slots=r.rollout.engine_slots,
        max_len=max(r.seq_buckets),
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop_tokens=(chat.im_end,),
        recompute_kv=r.recompute_kv,
        run_ahead=r.run_ahead,
    )
    if not primary:
        return _follow(learner, (params, opt_state, ref_params), ckpt, start, steps, config)
    G, P = r.group_size, r.prompts_per_step
    # A packed row per group, padded up to a multiple of the batch axes' devices.
    pack_rows = -(-P // learner.batch_devices) * learner.batch_devices
    scheduler = orchestrator.Scheduler(P, G, r.max_staleness, trained=len(ledger.consumed))
    prompts = ledger.take(len(order))
    request = lambda p, k: EpisodeRequest(by_id[p], p, f"g-{p}", k)
    # Ray workers fetch their weights from the store: on one machine it may default to DIR's.
    store = r.weight_store or (str(workdir / "weight_store") if r.rollout_backend == "ray" else "")
    if store:
        weights = orchestrator.StoreWeights(
            store, dtype=r.weight_store_dtype, full_every=r.weight_store_full_every, start=start
        )
    else:
        weights = orchestrator.InProcessWeights()
    served = weights.initial(_for_engine(params, mesh), start)
    sandbox = Sandbox()
    if r.rollout_backend == "ray":
        rollouts = _fleet(
            config, cfg, rollout, engine_args, weights, scheduler, prompts, request, start, steps
        )
    else:
        engine = Engine(served, cfg, seed=config.train.seed + start, version=start, **engine_args)
        runner = EpisodeRunner(engine, chat, sandbox, workdir / "episodes", rollout)
        rollouts = orchestrator.AsyncRollouts(
            runner,
            scheduler,
            prompts,
            request,
            version=start,
            limit=(steps - start) * P,
            weights=weights,
        )

    def evaluate(step: int) -> dict:
        """Held-out episodes with the weights of `step`, on an engine of their own (training
        rollouts go on meanwhile)."""
        frozen = Engine(
            _for_engine(params, mesh), cfg, seed=config.train.seed, version=step, **engine_args
        )
        runner = EpisodeRunner(frozen, chat, sandbox, workdir / "episodes_eval", rollout)
        return _evaluate(runner, heldout, r.eval.samples, workdir, step)

    writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
    evals = _read_evals(workdir, start)
    first_eval = distributed.share(start == 0 and 0 not in evals)
    bar = tqdm(total=steps, initial=start, desc=config.name, disable=not config.train.progress_bar)
    try:
        if first_eval:
            evals[0] = evaluate(0)
        rollouts.start()
        t_prev, seen = time.perf_counter(), rollouts.counters()
        compiled_prev = metrics_lib.compile_seconds()
        for step in range(start + 1, steps + 1):
            s = step - 1  # the optimiser step, and the version of the weights it updates
            groups, waited = rollouts.next_groups(s)
            t0 = time.perf_counter()
            samples = [x for g in groups for x in sorted(g.samples, key=lambda x: x.sample_index)]
            _check_staleness(samples, s, r.max_staleness)
            rows = [seg for x in samples for seg in x.chain]  # a row per segment
            last_rows = np.cumsum([len(x.chain) for x in samples]) - 1
            batch_of = functools.partial(
                make_batch,
                batch_size=len(samples),
                seq_buckets=tuple(r.seq_buckets),
                cfg=cfg,
                pad_id=tokenizer.pad_id,
                group_size=G,
                pack_buckets=tuple(r.pack_buckets) if rl_config.packs_groups(config) else None,
                pack_rows=pack_rows,
            )
            batch = batch_of(samples)
            terms, effort = reward_arrays(samples, len(samples))
            if r.precompile and step == start + 1:
                state = (params, opt_state, ref_params)
                _precompile(learner, state, batch_of, batch, terms, effort, s, config)
            evaluating = step == steps or bool(r.eval.every and step % r.eval.every == 0)
            # The other processes train on this batch too (a no-op with one process).
            distributed.share(dict(batch=batch, terms=terms, effort=effort, evaluate=evaluating))
            params, opt_state, step_metrics, per_sample = learner.update(
                params, opt_state, ref_params, batch, terms, effort, s
            )
            step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            per_sample = jax.device_get(per_sample)
            per_chain = {k: np.asarray(v)[last_rows] for k, v in per_sample.items()}
            rollouts.publish(_for_engine(params, mesh), step)
            t_train = time.perf_counter() - t0
            ids = [g.prompt_id for g in groups]
            ledger.mark(ids)
            _score(rows, per_sample, step)
            write_rollouts(rollouts_dir, f"step_{step:06d}", samples)
            T = batch["inputs"].shape[1]
            now, counts = time.perf_counter(), rollouts.counters()
            wall, compiled = now - t_prev, metrics_lib.compile_seconds()
            counters.tokens += len(rows) * T
            counters.flops += len(rows) * T * task.flops_per_token
            counters.device_seconds += wall * mesh.devices.size
            record = (
                step_metrics
                | _episode_metrics(samples)
                | orchestrator.staleness_metrics(groups, s, per_chain)
                | {
                    "generated_tokens_per_s": (counts["tokens"] - seen["tokens"]) / wall,
                    "rollout_samples_per_s": (counts["samples"] - seen["samples"]) / wall,
                    "samples_per_s": len(samples) / wall,
                    "trainer_idle_frac": waited / wall,
                    "train_s": t_train,
                    "train_tokens_per_s": len(rows) * T / max(t_train, 1e-9),
                    "step_time_s": wall,
                    # making programs (a batch shape seen for the first time), on any thread
                    "compile_s": compiled - compiled_prev,
                    "cum_tokens": counters.tokens,
                    "cum_flops": counters.flops,
                    "cum_device_seconds": counters.device_seconds,
                    "prompts_consumed": len(ledger.consumed),
                }
                | rollouts.metrics()
            )
            t_prev, seen, compiled_prev = now, counts, compiled
            if evaluating:
                evals[step] = evaluate(step)
                record |= _eval_metrics(evals[step])
            writer.write(step, record)
            bar.set_postfix(
                reward=f"{record['reward/total']:.3f}", passed=f"{record['pass_rate']:.2f}"
            )
            bar.update(1)
            if step % config.train.checkpoint_every == 0 or step == steps:
                _save(ckpt, step, params, opt_state, ledger, counters)
    finally:
        rollouts.close()
        bar.close()
        writer.close()
        ckpt.close()
    summary = _final_summary(evals, steps)
    (workdir / "final_metrics.json").write_text(json.dumps(summary, indent=2))
    plot_run(workdir, config.name, CURVES)
    return summary


def _fleet(config, cfg, rollout, engine_args, weights, scheduler, prompts, request, start, steps):
    """The Ray rollout fleet (c2/rl/fleet.py) for this run: workers fetch `weights`' store."""
    from c2.rl import fleet

    r = config.rl
    spec = fleet.WorkerSpec(
        model=cfg,
        tokenizer=config.data.tokenizer,
        rollout=rollout,
        engine_args=engine_args,
        weight_url=weights.url,
        seed=config.train.seed + start,
        max_staleness=r.max_staleness,
        compilation_cache=jax.config.jax_compilation_cache_dir or "",
    )
    shutdown = fleet.start_ray(r.ray_address, r.num_rollout_workers, r.ray_worker_cpus)
    return fleet.RayRollouts(
        fleet.ray_launcher(spec, num_cpus=r.ray_worker_cpus, num_gpus=r.ray_worker_gpus),
        scheduler,
        prompts,
        request,
        version=start,
        limit=(steps - start) * r.prompts_per_step,
        weights=weights,
        workers=r.num_rollout_workers,
        max_restarts=None if r.ray_max_restarts < 0 else r.ray_max_restarts,
        on_close=shutdown,
    )


def _check_staleness(samples: list[Sample], step: int, bound: int) -> None:
    """The scheduler's guarantee, checked on what is about to be trained."""
    for x in samples:
        v = orchestrator.oldest_version(x)
        if v is not None and step - v > bound:
            raise RuntimeError(
                f"sample {x.group_id}/{x.sample_index} has a token of version {v}: staleness "
                f"{step - v} at optimiser step {step} exceeds config.rl.max_staleness={bound}"
            )


def _save(ckpt, step: int, params, opt_state, ledger: Ledger, counters: Counters) -> None:
    """Checkpoint the state after `step`. orbax writes `meta` on a thread of its own after this
    returns, while the next step extends the ledger: it gets a copy of the ledger as it is."""
    meta = {"consumed": list(ledger.consumed), "counters": dataclasses.asdict(counters)}
    ckpt.save(step, params, opt_state, meta, None, force=True)


def _set_aside_lost_steps(rollouts_dir: Path, start: int) -> None:
    """Rollout files (training `step_*` and held-out `eval_*`, with their routing side files)
    of steps after the restored checkpoint describe what a crash undid: move them to
    rollouts/discarded/ (kept for inspection, out of the committed history)."""
    lost = [
        p
        for pattern in ("step_*", "eval_*")
        for p in rollouts_dir.glob(pattern)
        if p.is_file() and int(p.name[5:11]) > start
    ]
    if not lost:
        return
    aside = rollouts_dir / "discarded"
    aside.mkdir(exist_ok=True)
    for path in lost:
        path.replace(aside / path.name)
    steps = sorted({int(p.name[5:11]) for p in lost})
    log.info("rollouts of steps %s (after the restored step %d) moved to %s", steps, start, aside)


def _precompile(learner, state, batch_of, batch, terms, effort, step: int, config) -> None:
    """Compiles the update for every batch shape config.rl's buckets allow besides `batch`'s
    (`rl.precompile`), without running it (RLLearner.compile_update): for each bucket an
    all-padding batch of its shape (`batch_of([], min_seq=, min_pack=)`), with `batch`'s reward
    terms (a program depends on the inputs' shapes and names, not on their values)."""
    r = config.rl
    packs = rl_config.packs_groups(config)
    shape = lambda b: (b["inputs"].shape, b["packed_inputs"].shape if packs else None)  # noqa: E731
    done, t0 = {shape(batch)}, time.perf_counter()
    for T in r.seq_buckets:
        for W in r.pack_buckets if packs else (0,):
            other = batch_of([], min_seq=T, min_pack=W)
            if shape(other) not in done:
                done.add(shape(other))
                learner.compile_update(*state, other, terms, effort, step)
    log.info(
        "compiled the update for %d batch shapes in %.1f s (config.rl.precompile)",
        len(done) - 1,
        time.perf_counter() - t0,
    )


def _follow(learner, state, ckpt, start: int, steps: int, config) -> dict:
    """A process other than the first: the same collectives as process 0's loop in `run`, in the
    same order (the weights gathered for its engine, the update on its shared batch, its
    evaluations' weights, the checkpoints); no rollouts, no files but its checkpoint shards."""
    params, opt_state, ref_params = state
    try:
        _for_engine(params, learner.mesh)  # the rollout engine's first weights
        if distributed.share():  # an evaluation before the first step
            _for_engine(params, learner.mesh)
        for step in range(start + 1, steps + 1):
            shared = distributed.share()
            params, opt_state, _, _ = learner.update(
                params, opt_state, ref_params, shared["batch"], shared["terms"],
                shared["effort"], step - 1,
            )  # fmt: skip
            _for_engine(params, learner.mesh)  # published to the rollout engine
            if shared["evaluate"]:
                _for_engine(params, learner.mesh)
            if step % config.train.checkpoint_every == 0 or step == steps:
                ckpt.save(step, params, opt_state, {}, None, force=True)  # meta: process 0's
    finally:
        ckpt.close()
    return {}


def _for_engine(params, mesh):
    """The engine's own copy of the weights, on one device: the update donates the trainer's
    while the engine is still decoding (a device_put alone may alias the trainer's shard).
    Several processes: a collective (every process calls it; each receives the whole weights)
    whose copy is process 0's alone (None elsewhere)."""
    if jax.process_count() > 1:
        whole = distributed.gather(params)
        return jax.device_put(whole, jax.local_devices()[0]) if distributed.is_primary() else None
    if mesh.devices.size > 1:
        params = jax.device_put(params, jax.devices()[0])
    return jax.tree.map(jnp.copy, params)


def _score(samples: list[Sample], per_sample: dict, step: int) -> None:
    """Write the trainer's scores (combined reward, its signed terms) into the samples."""
    host = jax.device_get(per_sample)
    for i, s in enumerate(samples):
        s.reward = float(host["reward"][i])
        for k, v in host.items():
            if k.startswith("reward/") and k != "reward/total":
                s.reward_terms[k.split("/", 1)[1] + "_weighted"] = float(v[i])
        if "kl" in host:
            s.reward_terms["kl"] = float(host["kl"][i])
        s.trained_step = step


def _episode_metrics(samples: list[Sample]) -> dict:
    stops = Counter(s.stop_reason for s in samples)
    out = {
        "pass_rate": float(np.mean([s.passed for s in samples])),
        "turns_mean": float(np.mean([s.info["turns"] for s in samples])),
        "generated_tokens_mean": float(np.mean([_chain_tokens(s) for s in samples])),
        "sample_tokens_max": float(max(s.length for s in samples)),
        "invalid_tool_calls_mean": float(np.mean([s.info["invalid_tool_calls"] for s in samples])),
        "segments_mean": float(np.mean([len(s.chain) for s in samples])),
        "summaries_cut": float(sum(s.info.get("summaries_cut", 0) for s in samples)),
    }
    for name in ("task", "style", "communication", "tool_call_penalty"):
        out[f"term/{name}"] = float(np.mean([s.reward_terms[name] for s in samples]))
    for reason, n in stops.items():
        out[f"stop/{reason}"] = n / len(samples)
    return out


def _evaluate(runner, heldout, k: int, workdir: Path, step: int) -> dict:
    requests = [
        EpisodeRequest(t, t.task_id, f"eval{step:06d}-{t.task_id}", j)
        for t in heldout
        for j in range(k)
    ]
    samples = runner.run(requests)
    write_rollouts(workdir / "rollouts", f"eval_{step:06d}", samples)
    summary = evaluation.summarize(samples) | {"step": step}
    with open(workdir / "eval.jsonl", "a") as f:
        f.write(json.dumps(summary) + "\n")
    log.info(
        "held-out at step %d: pass@1 %.3f best-of-%d %.3f",
        step,
        summary["pass@1"],
        k,
        summary[f"best_of_{k}"],
    )
    return summary


def _eval_metrics(summary: dict) -> dict:
    k = summary["k"]
    return {"eval_pass@1": summary["pass@1"], "eval_best_of_k": summary[f"best_of_{k}"]}


def _read_evals(workdir: Path, upto: int) -> dict[int, dict]:
    """Evaluations already done (a resumed run keeps those at or before its step)."""
    path = workdir / "eval.jsonl"
    if not path.is_file():
        return {}
    evals = {}
    for line in path.read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if e["step"] <= upto:
                evals[e["step"]] = e
    path.write_text("".join(json.dumps(e) + "\n" for _, e in sorted(evals.items())))
    return evals


def _final_summary(evals: dict[int, dict], steps: int) -> dict:
    out = {"steps": steps, "evaluations": {str(s): _brief(e) for s, e in sorted(evals.items())}}
    if 0 in evals and steps in evals and steps:
        out["gain"] = evaluation.compare(evals[0], evals[steps])
    return out


def _brief(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != "per_task_passes"}


def _chain_tokens(s: Sample) -> int:
    return sum(seg.generated_tokens for seg in s.chain)
