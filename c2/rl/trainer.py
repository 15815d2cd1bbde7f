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
import json
import logging
import time
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from c2 import distributed, sharding
from c2.data.chat import AgentChat
from c2.data.tokenizer import load_tokenizer
from c2.envs.sandbox import Sandbox
from c2.envs.tasks import Task
from c2.infer.engine import Engine
from c2.model.config import ModelConfig
from c2.model.params import frozen_copy
from c2.rl import config as rl_config
from c2.rl import engine_weights, evaluation, orchestrator
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.episodes import EpisodeRequest, EpisodeRunner, RolloutConfig
from c2.rl.prompts import Ledger, load_prompts, load_task_source  # noqa: F401 - API
from c2.rl.records import Sample, write_rollouts
from c2.rl.step import RLLearner
from c2.train import lm
from c2.train import metrics as metrics_lib
from c2.train.checkpoint import Checkpointer
from c2.train.config import sharding_rules
from c2.train.loop import Counters, abstract_state, init_key, load_init_params, plot_run
from c2.train.loop import Task as TrainTask
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


# The stage --------------------------------------------------------------------------------


@dataclasses.dataclass
class Stage:
    """What set-up makes once and every step reads: the validated config's parts, the learner,
    the prompts, and the trainer's state (params, opt_state and the ledger change each step)."""

    config: ml_collections.ConfigDict
    workdir: Path
    cfg: ModelConfig
    rollout: RolloutConfig
    task: TrainTask
    layout: sharding.Layout
    learner: RLLearner
    engine_layout: sharding.Layout | None  # the rollout engine's (rl.rollout_mesh) or None
    engine_shardings: object  # its weights' layout (a pytree of shardings), None with it
    chat: AgentChat
    sandbox: Sandbox | None  # process 0's (tools and grading); None on the others
    steps: int
    by_id: dict[str, Task]
    heldout: list[Task]
    ckpt: Checkpointer
    start: int
    params: dict
    opt_state: object
    ref_params: dict
    ledger: Ledger
    counters: Counters


def run(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains (or resumes) an RL stage in `workdir`; returns the final evaluation summary.

    Set-up, then per optimiser step s (weights version s -> s + 1): collect complete groups,
    batch them, update, publish the new weights to the engines, record."""
    stage = _set_up(config, Path(workdir))
    if not distributed.is_primary():
        state = (stage.params, stage.opt_state, stage.ref_params)
        return _follow(stage.learner, state, stage.ckpt, stage.start, stage.steps, config,
                       stage.workdir)  # fmt: skip
    r, workdir, steps, start = config.rl, stage.workdir, stage.steps, stage.start
    rollouts = _rollouts(stage)
    writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
    evals = evaluation.read_done(workdir, start)
    first_eval = distributed.share(start == 0 and 0 not in evals)
    bar = tqdm(total=steps, initial=start, desc=config.name, disable=not config.train.progress_bar)
    try:
        if first_eval:
            evals[0] = _evaluate_at(stage, 0)
        rollouts.start()
        clock = _Clock(time.perf_counter(), rollouts.counters(), metrics_lib.compile_seconds())
        for step in range(start + 1, steps + 1):
            s = step - 1  # the optimiser step, and the version of the weights it updates
            groups, waited = rollouts.next_groups(s)  # collect
            t0 = time.perf_counter()
            samples = _samples(groups, s, r.max_staleness)
            batch_of = _batcher(stage, len(samples))  # batch
            batch = batch_of(samples)
            terms, effort = reward_arrays(samples, len(samples))
            if r.precompile and step == start + 1:
                state = (stage.params, stage.opt_state, stage.ref_params)
                _precompile(stage.learner, state, batch_of, batch, terms, effort, s, config)
            evaluating = step == steps or bool(r.eval.every and step % r.eval.every == 0)
            step_metrics, per_sample = _update(stage, batch, terms, effort, evaluating, s)
            rollouts.publish(
                engine_weights.for_engine(stage.params, stage.engine_shardings),
                step,
            )  # publish
            t_train = time.perf_counter() - t0
            record = _record(stage, step, groups, samples, batch, per_sample, step_metrics)
            record |= clock.tick(rollouts, samples, batch, waited, t_train, stage)
            record |= rollouts.metrics()
            if evaluating:
                evals[step] = _evaluate_at(stage, step)
                record |= evaluation.step_metrics(evals[step])
            writer.write(step, record)
            bar.set_postfix(
                reward=f"{record['reward/total']:.3f}", passed=f"{record['pass_rate']:.2f}"
            )
            bar.update(1)
            if step % config.train.checkpoint_every == 0 or step == steps:
                _save(stage.ckpt, step, stage.params, stage.opt_state, stage.ledger, stage.counters)
    finally:
        rollouts.close()
        bar.close()
        writer.close()
        stage.ckpt.close()
    summary = evaluation.final_summary(evals, steps)
    (workdir / "final_metrics.json").write_text(json.dumps(summary, indent=2))
    plot_run(workdir, config.name, CURVES)
    return summary


# Set-up -----------------------------------------------------------------------------------


def _set_up(config: ml_collections.ConfigDict, workdir: Path) -> Stage:
    """The validated config, the task and learner on the stage's layout, the prompts (process 0
    holds them), and the state: restored from the newest checkpoint, else fresh."""
    mesh_sizes, cfg, objective, rollout = rl_config.validate_rl(config, jax.device_count())
    task = lm.build_task(rl_config.lm_part(config))  # mesh, shardings, init and import
    layout = lm.make_layout(config, mesh_sizes)  # config.mesh.rules: weights and activations
    # Several processes (c2/distributed.py): all train; process 0 alone runs the rollouts and
    # evaluations, holds the prompts and writes; the others follow it (_follow).
    primary = distributed.is_primary()
    if primary:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    chat = AgentChat(load_tokenizer(config.data.tokenizer))
    steps, train_tasks, heldout = load_prompts(config, workdir)
    order = [t.task_id for t in train_tasks]
    tx, schedule = make_optimizer(config.optimizer, steps, task.abstract_params)
    ckpt = Checkpointer(
        workdir / "checkpoints",
        keep=config.train.keep_checkpoints,
        async_save=config.train.async_checkpoints,
    )
    start, params, opt_state, ref_params, ledger, counters = _restore(
        config, cfg, task, tx, ckpt, order, workdir
    )
    if primary:
        _set_aside_lost_steps(workdir / "rollouts", start)
    engine_layout = engine_weights.engine_mesh(config)
    return Stage(
        config=config,
        workdir=workdir,
        cfg=cfg,
        rollout=rollout,
        task=task,
        layout=layout,
        learner=make_learner(config, cfg, objective, tx, schedule, layout),
        engine_layout=engine_layout,
        engine_shardings=engine_weights.engine_shardings(cfg, engine_layout),
        chat=chat,
        sandbox=Sandbox() if primary else None,
        steps=steps,
        by_id={t.task_id: t for t in train_tasks},
        heldout=heldout,
        ckpt=ckpt,
        start=start,
        params=params,
        opt_state=opt_state,
        ref_params=ref_params,
        ledger=ledger,
        counters=counters,
    )


def _restore(config, cfg, task, tx, ckpt: Checkpointer, order: list[str], workdir: Path):
    """(start, params, opt_state, ref_params, ledger, counters): the newest checkpoint's, else
    a fresh start from the reference (config.init_from, or a seeded init). The reference is
    kept as its forwards read it (`frozen_copy`)."""
    abstract_params, abstract_opt, opt_shardings = abstract_state(tx, task)
    if config.init_from:
        start_params = load_init_params(config.init_from, task)
    else:
        start_params = task.init_params(init_key(config.train.seed))
    ref_params = frozen_copy(start_params, cfg)
    restored = ckpt.restore_latest(abstract_params, abstract_opt)
    if restored is None:
        params = jax.tree.map(jnp.copy, start_params)
        opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
        return 0, params, opt_state, ref_params, Ledger(order, []), Counters()
    start, params, opt_state, meta = restored
    ledger = Ledger(order, list(meta["consumed"]))
    log.info("resumed %s at step %d (%d prompts consumed)", workdir, start, len(ledger.consumed))
    return start, params, opt_state, ref_params, ledger, Counters(**meta["counters"])


def make_learner(config, cfg, objective, tx, schedule, layout: sharding.Layout) -> RLLearner:
    """The stage's RLLearner (the memory plan compiles the same one: c2/bench/plan_stages.py)."""
    r = config.rl
    return RLLearner(
        cfg,
        objective,
        tx,
        mesh=layout,
        micro_batch_size=r.micro_batch_size,
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


def _engine_args(stage: Stage) -> dict:
    r, rollout = stage.config.rl, stage.rollout
    return dict(
        max_slots=r.rollout.engine_slots,
        max_len=max(r.seq_buckets),
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop_tokens=(stage.chat.im_end,),
        recompute_kv=r.recompute_kv,
        run_ahead=r.run_ahead,
    )


def _rollouts(stage: Stage):
    """The rollouts (in this process, or the Ray fleet) serving the state's weights, drawing the
    ledger's prompts in order; not started."""
    config, start, steps = stage.config, stage.start, stage.steps
    r, P = config.rl, config.rl.prompts_per_step
    scheduler = orchestrator.Scheduler(
        P, r.group_size, r.max_staleness, trained=len(stage.ledger.consumed)
    )
    prompts = stage.ledger.take(len(stage.ledger.order))
    by_id = stage.by_id
    request = lambda p, k: EpisodeRequest(by_id[p], p, f"g-{p}", k)  # noqa: E731
    if store := engine_weights.store_url(config, stage.workdir):
        weights = engine_weights.store_weights(
            config, store, start, shardings=stage.engine_shardings
        )
    else:
        weights = orchestrator.InProcessWeights()
    served = weights.initial(
        engine_weights.for_engine(stage.params, stage.engine_shardings),
        start,
    )
    engine_args = _engine_args(stage)
    if r.rollout_backend == "ray":
        return _fleet(
            config, stage.cfg, stage.rollout, engine_args, weights, scheduler, prompts, request,
            start, steps,
        )  # fmt: skip
    engine = Engine(
        served,
        stage.cfg,
        seed=config.train.seed + start,
        version=start,
        mesh=stage.engine_layout,
        **engine_args,
    )
    runner = EpisodeRunner(
        engine, stage.chat, stage.sandbox, stage.workdir / "episodes", stage.rollout
    )
    return orchestrator.AsyncRollouts(
        runner,
        scheduler,
        prompts,
        request,
        version=start,
        limit=(steps - start) * P,
        weights=weights,
    )


# Each step --------------------------------------------------------------------------------


def _samples(groups, step: int, max_staleness: int) -> list[Sample]:
    """The groups' samples in order, none staler than the bound."""
    samples = [x for g in groups for x in sorted(g.samples, key=lambda x: x.sample_index)]
    _check_staleness(samples, step, max_staleness)
    return samples


def _batcher(stage: Stage, batch_size: int):
    """make_batch of `batch_size` rows with the stage's buckets: `batch_of(samples)` (and, for
    precompiling, an all-padding batch of a bucket's shape: `batch_of([], min_seq=,
    min_pack=)`)."""
    config, devices = stage.config, stage.learner.batch_devices
    r = config.rl
    return functools.partial(
        make_batch,
        batch_size=batch_size,
        seq_buckets=tuple(r.seq_buckets),
        cfg=stage.cfg,
        pad_id=stage.chat.tokenizer.pad_id,
        group_size=r.group_size,
        pack_buckets=tuple(r.pack_buckets) if rl_config.packs_groups(config) else None,
        # A packed row per group, padded up to a multiple of the batch axes' devices.
        pack_rows=-(-r.prompts_per_step // devices) * devices,
    )


def _update(stage: Stage, batch, terms, effort, evaluating: bool, step: int):
    """The optimiser step on `batch` (the state advances in `stage`): (metrics as floats,
    per-row values on the host)."""
    # The other processes train on this batch too (a no-op with one process).
    distributed.share(dict(batch=batch, terms=terms, effort=effort, evaluate=evaluating))
    stage.params, stage.opt_state, metrics, per_sample = stage.learner.update(
        stage.params, stage.opt_state, stage.ref_params, batch, terms, effort, step
    )
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    return metrics, jax.device_get(per_sample)


def _record(stage: Stage, step: int, groups, samples, batch, per_sample, step_metrics) -> dict:
    """The step's prompts marked trained, its samples scored and written; its record's metrics
    of the update, the episodes and their staleness."""
    rows = [seg for x in samples for seg in x.chain]  # a row per segment
    last_rows = np.cumsum([len(x.chain) for x in samples]) - 1
    per_chain = {k: np.asarray(v)[last_rows] for k, v in per_sample.items()}
    stage.ledger.mark([g.prompt_id for g in groups])
    _score(rows, per_sample, step)
    write_rollouts(stage.workdir / "rollouts", f"step_{step:06d}", samples)
    return (
        step_metrics
        | _episode_metrics(samples)
        | orchestrator.staleness_metrics(groups, step - 1, per_chain)
    )


@dataclasses.dataclass
class _Clock:
    """Where the last step ended: wall time, the rollouts' counters, compile seconds so far."""

    t: float
    seen: dict
    compiled: float

    def tick(self, rollouts, samples, batch, waited: float, t_train: float, stage: Stage) -> dict:
        """This step's throughput and the run's cumulative counts (advanced in `stage`)."""
        rows = sum(len(x.chain) for x in samples)
        T = batch["inputs"].shape[1]
        now, counts = time.perf_counter(), rollouts.counters()
        wall, compiled = now - self.t, metrics_lib.compile_seconds()
        c = stage.counters
        c.tokens += rows * T
        c.flops += rows * T * stage.task.flops_per_token
        c.device_seconds += wall * stage.layout.mesh.devices.size
        out = {
            "generated_tokens_per_s": (counts["tokens"] - self.seen["tokens"]) / wall,
            "rollout_samples_per_s": (counts["samples"] - self.seen["samples"]) / wall,
            "samples_per_s": len(samples) / wall,
            "trainer_idle_frac": waited / wall,
            "train_s": t_train,
            "train_tokens_per_s": rows * T / max(t_train, 1e-9),
            "step_time_s": wall,
            # making programs (a batch shape seen for the first time), on any thread
            "compile_s": compiled - self.compiled,
            "cum_tokens": c.tokens,
            "cum_flops": c.flops,
            "cum_device_seconds": c.device_seconds,
            "prompts_consumed": len(stage.ledger.consumed),
        }
        self.t, self.seen, self.compiled = now, counts, compiled
        return out


def _evaluate_at(stage: Stage, step: int) -> dict:
    """Held-out episodes with the weights of `step`, on an engine of their own (training
    rollouts go on meanwhile)."""
    config, workdir = stage.config, stage.workdir
    weights = engine_weights.read_back(
        config, stage.engine_shardings, workdir, stage.start, stage.params, step
    )
    frozen = Engine(
        weights, stage.cfg, seed=config.train.seed, version=step, mesh=stage.engine_layout,
        **_engine_args(stage),
    )  # fmt: skip
    runner = EpisodeRunner(
        frozen, stage.chat, stage.sandbox, workdir / "episodes_eval", stage.rollout
    )
    return evaluation.run_heldout(runner, stage.heldout, config.rl.eval.samples, workdir, step)


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
        rollout_mesh=r.rollout_mesh,
        rollout_rules=sharding_rules(config),
        rollout_hosts=r.rollout_hosts,
    )
    shutdown = fleet.start_ray(
        r.ray_address, r.num_rollout_workers, r.ray_worker_cpus, r.ray_runtime_env
    )
    launch = fleet.ray_launcher(
        spec,
        num_cpus=r.ray_worker_cpus,
        num_gpus=r.ray_worker_gpus,
        place_timeout_s=r.ray_place_timeout_s,
        start_timeout_s=r.ray_start_timeout_s,
        call_timeout_s=r.ray_call_timeout_s,
    )
    return fleet.RayRollouts(
        launch,
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


def _follow(learner, state, ckpt, start: int, steps: int, config, workdir: Path) -> dict:
    """A process other than the first: the same collectives as process 0's loop in `run`, in the
    same order (its shards of each version published to the store, the update on its shared
    batch, the checkpoints); no rollouts, no files but its shards and checkpoint shards."""
    params, opt_state, ref_params = state
    url = engine_weights.store_url(config, workdir)
    weights = engine_weights.store_weights(config, url, start, subscribe=False)
    try:
        weights.publish(params, start)  # the rollout engine's first weights
        distributed.share()  # whether process 0 evaluates before the first step
        for step in range(start + 1, steps + 1):
            shared = distributed.share()
            params, opt_state, _, _ = learner.update(
                params, opt_state, ref_params, shared["batch"], shared["terms"],
                shared["effort"], step - 1,
            )  # fmt: skip
            weights.publish(params, step)  # to the rollout engines, shard by shard
            if step % config.train.checkpoint_every == 0 or step == steps:
                ckpt.save(step, params, opt_state, {}, None, force=True)  # meta: process 0's
    finally:
        weights.close()
        ckpt.close()
    return {}


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


def _chain_tokens(s: Sample) -> int:
    return sum(seg.generated_tokens for seg in s.chain)
