"""The pass@k benchmark runner: N graded episodes per task, through the engine and the sandbox.

    python -m c2.eval.run --tasks DIR --policy P --samples N --out OUT

P: a c2 workdir (a stage's, or a pipeline's: its last stage), `hf:DIR`, `oracle` or `noop`. A model
plays on the generation engine (`c2.infer.Engine`, continuous batching) through
`c2.rl.episodes.EpisodeRunner`, exactly as RL rollouts and the RL stage's held-out evaluation do;
`oracle` / `noop` are the scripted reference agents of `c2.envs.agents`, played by
`c2.envs.episode.run_episode`. Either way each episode is graded by `c2.envs.grading.grade`. DIR is
any task directory (or directory of them): the generated held-out split (`python -m
c2.envs.functions --split eval`, `python -m c2.envs.generate`), HumanEval, Harbor /
Terminal-Bench tasks imported by `c2.envs.sources`.

Each task runs where it says (`Task.sandbox`): the bubblewrap sandbox, or its container image;
only the backends the task set uses must work here (a container-only set needs no bubblewrap).
An agent's command may run as long as its task allows (`command_timeout_s`: task.toml's agent
timeout, else the task's test timeout), unless --run_timeout_s > 0 sets one limit for all. An
episode whose play or grading raises is tried again up to --max_attempts times, then recorded as
a failure (stop_reason "rollout_error", the error in failure_reason) and the run goes on.

Writes, under OUT:
  episodes.jsonl    one line per finished episode (appended as each ends): the grade's four
                    dimensions (correctness, quality, efficiency, interaction), tokens, FLOPs, and
                    the patch (a unified diff of the final workspace against the task's files);
                    for a model, its transcript (each segment's token ids decoded)
  results.json      per task and overall: pass@k for k = 1, 2, 4, ..., N (unbiased estimator,
                    c2.eval.passk.pass_at_k; overall = mean over tasks with a 95% Wilson
                    interval), best-of-N, the four dimensions, tokens, compute, harness errors
  predictions.jsonl SWE-bench style, one line per task (sample 0):
                    {"instance_id", "model_name_or_path", "model_patch"}
  run.json          the policy, the tasks and the settings the episodes were played with
  report.md, passk.png, per_task.png
Resumable: a second invocation reads episodes.jsonl and plays only the episodes not in it (a
larger --samples plays only the new sample indices: samples are independent draws, and each
invocation's engine draws from its own seed). It refuses settings that differ from run.json's
(sampling, budgets, command limits, seed), naming the field, the recorded and the new value.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from c2.eval.backends import (  # noqa: F401 - check_isolation: this module's API too
    ContainersOnly,
    IsolationMissing,
    check_isolation,
    default_sandbox,
    describe_isolation,
    task_backends,
)
from c2.eval.patches import workspace_patch
from c2.eval.run_results import (  # noqa: F401 - ks_for, summarize: this module's API too
    DIMENSIONS,
    ERROR_STOP,
    ks_for,
    summarize,
    write_predictions,
    write_report,
)

log = logging.getLogger(__name__)

SCRIPTED = ("oracle", "noop")
EPISODES = "episodes.jsonl"
RESULTS = "results.json"
PREDICTIONS = "predictions.jsonl"
RUN_META = "run.json"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Episode budgets and sampling for a model policy (the RL stage's defaults)."""

    max_turns: int = 4
    max_tokens: int = 512
    max_turn_tokens: int = 192
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    engine_slots: int = 16
    engine_mesh: str = ""  # the engine's mesh, e.g. "expert=4,tensor=2" ("": one device)
    tool_workers: int = 4
    run_timeout_s: float = 0.0  # > 0: every command's limit; 0: each task's (command_timeout_s)
    seed: int = 0
    workers: int = 2  # scripted policies: episodes at once
    # Long episodes (c2/rl/episodes.py): self_summary | compaction | none; 0: the defaults.
    context_management: str = "none"
    summary_trigger: int = 0
    summary_max_tokens: int = 0
    max_segments: int = 4
    max_attempts: int = 3  # an episode that raises is played again, up to this many times

    def __post_init__(self):
        if self.run_timeout_s < 0:
            raise ValueError(f"--run_timeout_s={self.run_timeout_s}: expected >= 0 (0: the task's)")
        if self.max_attempts < 1:
            raise ValueError(f"--max_attempts={self.max_attempts}: expected >= 1")
        from c2.sharding import parse_mesh

        try:
            parse_mesh(self.engine_mesh)
        except ValueError as e:
            raise ValueError(f"--engine_mesh: {e}") from None


# How fast episodes are played, not what is played: free to change on resume.
THROUGHPUT_FIELDS = ("engine_slots", "engine_mesh", "tool_workers", "workers", "max_attempts")
# What a scripted agent's episodes depend on (sampling and token budgets are a model's).
SCRIPTED_FIELDS = ("run_timeout_s",)


def command_timeout_s(task, override: float = 0.0) -> float:
    """How long one of the agent's commands may run on `task`: `override` when > 0, else the
    task's own: its agent timeout (a Harbor task's task.toml), else its tests' timeout (the time
    the grader gives the same tests the agent runs)."""
    if override > 0:
        return float(override)
    return float(task.metadata.get("agent_timeout_s", task.test_timeout_s))


def engine_seed(seed: int, invocation: int) -> int:
    """The engine's seed in the `invocation`-th invocation that plays episodes into one OUT. The
    engine keys a request's draws by (seed, request number), and request numbers restart with
    each engine: a resumed run on the same seed would replay the first run's draws."""
    if invocation == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(invocation)]).generate_state(1)[0])


# Episodes -----------------------------------------------------------------------------------


class EpisodeLog:
    """OUT/episodes.jsonl: what has been played (read back on resume), appended thread-safely."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[tuple[str, int], dict] = {}
        if path.is_file():
            lines = path.read_text().splitlines()
            for n, line in enumerate(lines):
                try:
                    r = json.loads(line)
                except ValueError:
                    if n == len(lines) - 1:  # cut short by a kill: played again
                        continue
                    raise ValueError(f"{path}: line {n + 1} is not JSON") from None
                self.records[(r["task_id"], r["sample"])] = r
            # Rewrite without a torn last line, so appends start on a fresh line.
            path.write_text("".join(json.dumps(r) + "\n" for r in self.records.values()))
        self._lock = threading.Lock()

    def add(self, record: dict) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
            self.records[(record["task_id"], record["sample"])] = record


def _error(where: str, e: BaseException) -> str:
    return f"{where}: {type(e).__name__}: {e}"


def _patch(task, workspace: Path) -> str:
    """The episode's patch; "" when the workspace is gone or unreadable (never fails a run)."""
    if not workspace.is_dir():
        return ""
    try:
        return workspace_patch(task.workspace_dir, workspace)
    except OSError as e:
        log.warning("no patch for %s: %s", workspace.name, e)
        return ""


def failed_record(task, j: int, episode_id: str, reason: str, ep=None) -> dict:
    """The record of an episode the harness could not play or grade: a failure, with its
    reason (and what the episode did, when it got that far)."""
    return {
        "task_id": task.task_id,
        "sample": j,
        "episode_id": episode_id,
        "passed": False,
        "failure_reason": reason,
        "stop_reason": ERROR_STOP,
        "correctness": _correctness({}),
        "quality": _quality({"available": False}),
        "efficiency": {
            "generated_tokens": ep.model_tokens if ep else 0,
            "context_tokens": None,
            "turns": ep.turns if ep else 0,
            "tool_calls": ep.tool_calls if ep else 0,
            "wall_s": round(ep.wall_s, 3) if ep else None,
        },
        "interaction": {
            "submitted": bool(ep and ep.submitted),
            "final_message": bool(ep and ep.final_message),
            "invalid_tool_calls": ep.invalid_tool_calls if ep else 0,
            "tool_errors": ep.tool_errors if ep else 0,
            "sandbox_limits_hit": [],
        },
        "flops": 0.0,
        "patch": "",
    }


def _scripted_episodes(tasks_and_samples, policy: str, work: Path, opts: RunOptions, done, sandbox):
    """Plays scripted episodes (c2.envs.episode.run_episode) and grades each; `done(record)`.
    An attempt whose episode or grading raises is played again (`opts.max_attempts` in all),
    then recorded as a failure with the last error."""
    from c2.envs.agents import AGENTS
    from c2.envs.episode import EpisodeConfig, run_episode
    from c2.envs.grading import grade
    from c2.envs.sandbox import SandboxLimits

    make_policy = AGENTS[policy]

    def attempt(task, j: int, episode_id: str) -> dict:
        shutil.rmtree(work / episode_id, ignore_errors=True)  # left by a killed run
        limit = command_timeout_s(task, opts.run_timeout_s)
        config = EpisodeConfig(run_limits=SandboxLimits(timeout_s=limit), max_run_timeout_s=limit)
        try:
            try:
                ep = run_episode(
                    task, make_policy(task), sandbox, work, config, episode_id=episode_id
                )
            except Exception as e:  # noqa: BLE001 - one task's failure is that task's result
                return failed_record(task, j, episode_id, _error("episode", e))
            try:
                g = grade(task, ep.workspace, sandbox, ep)
            except Exception as e:  # noqa: BLE001
                return failed_record(task, j, episode_id, _error("grading", e), ep)
            patch = _patch(task, ep.workspace)
        finally:
            shutil.rmtree(work / episode_id, ignore_errors=True)
            if task.container is not None:  # the workspace is gone: so is its container
                with contextlib.suppress(Exception):
                    task.sandbox(sandbox).collect_garbage()
        return {
            "task_id": task.task_id,
            "sample": j,
            "episode_id": episode_id,
            "passed": bool(g.passed),
            "failure_reason": g.failure_reason,
            "stop_reason": ep.stop_reason,
            "correctness": _correctness(g.correctness),
            "quality": _quality(g.quality),
            "efficiency": {
                "generated_tokens": ep.model_tokens,
                "context_tokens": None,
                "turns": ep.turns,
                "tool_calls": ep.tool_calls,
                "wall_s": round(ep.wall_s, 3),
            },
            "interaction": {
                "submitted": ep.submitted,
                "final_message": bool(ep.final_message),
                "invalid_tool_calls": ep.invalid_tool_calls,
                "tool_errors": ep.tool_errors,
                "sandbox_limits_hit": g.interaction["sandbox_limits_hit"],
            },
            "flops": 0.0,
            "patch": patch,
        }

    def one(task, j: int) -> dict:
        for k in range(opts.max_attempts):
            episode_id = f"{task.task_id}-{j}" + (f"-retry{k}" if k else "")
            record = attempt(task, j, episode_id)
            if record["stop_reason"] != ERROR_STOP:
                break
            log.warning("episode %s failed (%s)", episode_id, record["failure_reason"])
        return record

    with cf.ThreadPoolExecutor(max(1, opts.workers), thread_name_prefix="episode") as ex:
        futures = [ex.submit(one, t, j) for t, j in tasks_and_samples]
        for f in cf.as_completed(futures):
            done(f.result())


def _model_episodes(tasks_and_samples, model, work: Path, opts: RunOptions, done, sandbox, seed):
    """Plays model episodes on one engine (c2.rl.episodes.EpisodeRunner), grades, `done`. The
    runner gives every command one limit, so tasks play in groups of equal command limits (one
    group for a generated task set) on the same engine. An episode that fails every attempt
    comes back as a failed sample (stop reason "rollout_error", its error in failure_reason)."""
    from c2.data.chat import AgentChat
    from c2.infer.engine import Engine
    from c2.rl.episodes import EpisodeRequest, EpisodeRunner, RolloutConfig
    from c2.sharding import mesh_from_spec

    chat = AgentChat(model.tokenizer)
    if opts.max_tokens > model.cfg.max_seq_len:
        raise ValueError(
            f"--max_tokens={opts.max_tokens} exceeds the model's max_seq_len "
            f"{model.cfg.max_seq_len}"
        )
    engine = Engine(
        model.params,
        model.cfg,
        max_slots=opts.engine_slots,
        max_len=opts.max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        seed=seed,
        stop_tokens=(chat.im_end,),
        mesh=mesh_from_spec(opts.engine_mesh) if opts.engine_mesh else None,
    )
    rollout = RolloutConfig(
        max_turns=opts.max_turns,
        max_tokens=opts.max_tokens,
        max_turn_tokens=opts.max_turn_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        tool_workers=opts.tool_workers,
        keep_workspaces=True,  # for the patch; removed once it is taken
        max_attempts=opts.max_attempts,
        context_management=opts.context_management,
        summary_trigger=opts.summary_trigger,
        summary_max_tokens=opts.summary_max_tokens,
        max_segments=opts.max_segments,
    )
    by_id = {t.task_id: t for t, _ in tasks_and_samples}
    flops_per_token = model.forward_flops_per_token

    def finished(s) -> None:
        task, info = by_id[s.task_id], s.info
        workspace = work / info["episode_id"]
        patch = _patch(task, workspace)
        shutil.rmtree(workspace, ignore_errors=True)
        if task.container is not None:  # the workspace is gone: so is its container
            with contextlib.suppress(Exception):
                task.sandbox(sandbox).collect_garbage()
        done(_model_record(s, info, patch, flops_per_token, chat))

    groups = defaultdict(list)
    for t, j in tasks_and_samples:
        groups[command_timeout_s(t, opts.run_timeout_s)].append((t, j))
    for limit, group in sorted(groups.items()):
        config = dataclasses.replace(rollout, run_timeout_s=limit)
        runner = EpisodeRunner(engine, chat, sandbox, work, config)
        runner.run([EpisodeRequest(t, t.task_id, t.task_id, j) for t, j in group], finished)


def _model_record(s, info: dict, patch: str, flops_per_token: float, chat) -> dict:
    return {
        "task_id": s.task_id,
        "sample": s.sample_index,
        "episode_id": info["episode_id"],
        "passed": bool(s.passed),
        "failure_reason": s.failure_reason,
        "stop_reason": s.stop_reason,
        "correctness": _correctness(info.get("correctness", {})),
        "quality": _quality(info.get("quality", {"new_findings": None})),
        "efficiency": {
            "generated_tokens": sum(x.generated_tokens for x in s.chain),
            "context_tokens": sum(x.length for x in s.chain),  # every segment's
            "turns": info.get("turns", 0),
            "tool_calls": info.get("tool_calls", 0),
            "wall_s": info.get("wall_s"),
        },
        "interaction": {
            "submitted": s.stop_reason == "submit",
            "final_message": bool(info.get("final_message")),
            "invalid_tool_calls": info.get("invalid_tool_calls", 0),
            "tool_errors": info.get("tool_errors", 0),
            "sandbox_limits_hit": info.get("sandbox_limits_hit", []),
        },
        # Every id of the episode goes through the model once (KV cached).
        "flops": flops_per_token * sum(x.length for x in s.chain),
        "patch": patch,
        # What the model read and wrote: each segment's ids decoded (specials as text).
        "transcript": [chat.tokenizer.decode(x.tokens) for x in s.chain],
    }


def _correctness(c: dict) -> dict:
    keys = ("f2p_passed", "f2p_total", "p2p_passed", "p2p_total", "tests_error")
    return {k: c.get(k) for k in keys}


def _quality(q: dict) -> dict:
    return {
        "ruff_available": q.get("available", True),
        "new_findings": q.get("new_findings"),
        "changed_py_files": q.get("changed_py_files", []),
    }


# The run ------------------------------------------------------------------------------------


def check_resume(before: dict, meta: dict, options: RunOptions, out: Path) -> None:
    """Raises ValueError when OUT's episodes were played with other settings than this run's
    (naming the field, the recorded and the new value): their samples would not be draws of one
    distribution. Fields run.json lacks (added to c2 since) read as their defaults."""
    recorded = before.get("options", {})
    settings = {k: (before.get(k), v) for k, v in meta.items()}
    names = (
        SCRIPTED_FIELDS
        if meta["policy"] in SCRIPTED
        else [f.name for f in dataclasses.fields(RunOptions) if f.name not in THROUGHPUT_FIELDS]
    )
    default = RunOptions()
    for name in names:
        settings[name] = (recorded.get(name, getattr(default, name)), getattr(options, name))
    for name, (old, new) in settings.items():
        if old != new:
            raise ValueError(
                f"{out} holds episodes played with {name}={old!r}, not {new!r}: resume with "
                f"--{'tasks' if name == 'tasks_dir' else name}={old} or use another --out"
            )


def _record_run(out: Path, meta: dict, options: RunOptions) -> int:
    """Checks OUT/run.json against this run and rewrites it; returns this invocation's index
    (how many invocations ran on OUT before: a run.json without the count, one)."""
    path = out / RUN_META
    invocation = 0
    if path.is_file():
        before = json.loads(path.read_text())
        check_resume(before, meta, options, out)
        invocation = int(before.get("invocations", 1))
    record = meta | {"options": dataclasses.asdict(options), "invocations": invocation + 1}
    path.write_text(json.dumps(record, indent=2))
    return invocation


def run(
    tasks_dir: str | Path,
    policy: str,
    samples: int,
    out: str | Path,
    options: RunOptions = RunOptions(),
    *,
    progress: bool = True,
    load: Callable | None = None,
    sandbox=None,
) -> dict:
    """Plays what OUT/episodes.jsonl lacks, then writes results.json, predictions.jsonl and
    report.md; returns the results. `sandbox`: what runs the tasks that run in bubblewrap
    (default: a new Sandbox)."""
    from c2.envs.tasks import load_tasks

    if samples < 1:
        raise ValueError(f"--samples={samples}: expected >= 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(tasks_dir)
    ids = [t.task_id for t in tasks]
    dup = sorted({t for t in ids if ids.count(t) > 1})
    if dup:
        raise ValueError(f"{tasks_dir}: task ids occur more than once: {dup[:5]}")
    meta = {"policy": policy, "tasks_dir": str(Path(tasks_dir).resolve())}
    invocation = _record_run(out, meta, options)
    episodes = EpisodeLog(out / EPISODES)
    todo = [(t, j) for t in tasks for j in range(samples) if (t.task_id, j) not in episodes.records]
    log.info("%d of %d episodes to play", len(todo), len(tasks) * samples)
    sandbox = sandbox if sandbox is not None else default_sandbox(tasks)
    if todo:
        check_isolation(tasks, sandbox)
        default = sandbox if "bwrap" in task_backends(tasks) else ContainersOnly(sandbox.limits)
        work = out / "work"
        work.mkdir(exist_ok=True)
        bar = tqdm(total=len(todo), desc=f"{policy} episodes", disable=not progress)
        passed = [0]

        def done(record: dict) -> None:
            episodes.add(record)
            passed[0] += record["passed"]
            bar.update(1)
            bar.set_postfix(passed=f"{passed[0]}/{bar.n}")

        t0 = time.perf_counter()
        try:
            if policy in SCRIPTED:
                _scripted_episodes(todo, policy, work, options, done, default)
            else:
                from c2.eval.models import load_model

                model = (load or load_model)(policy)
                seed = engine_seed(options.seed, invocation)
                _model_episodes(todo, model, work, options, done, default, seed)
        finally:
            bar.close()
        log.info("played %d episodes in %.1f s", len(todo), time.perf_counter() - t0)
        shutil.rmtree(work, ignore_errors=True)
    records = list(episodes.records.values())
    results = {**meta, **summarize(records, ids, samples)}
    results["isolation"] = describe_isolation(tasks, sandbox)
    (out / RESULTS).write_text(json.dumps(results, indent=2))
    write_predictions(out / PREDICTIONS, records, ids, policy)
    write_report(results, out)
    return results


FLAG_HELP = {
    "run_timeout_s": "seconds one agent command may run; 0 (default): each task's own limit",
    "max_attempts": "plays of an episode whose play or grading raises before it counts failed",
    "seed": "the engine's sampling seed (a resumed run draws from a seed derived from it)",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c2.eval.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", required=True, help="a task directory or a directory of them")
    parser.add_argument(
        "--policy", required=True, help="a c2 workdir, hf:DIR, or one of " + ", ".join(SCRIPTED)
    )
    parser.add_argument("--samples", type=int, default=1, help="episodes per task (N)")
    parser.add_argument("--out", required=True, help="output directory (resumable)")
    d = RunOptions()
    for f in dataclasses.fields(RunOptions):
        parser.add_argument(
            f"--{f.name}",
            type=type(getattr(d, f.name)),
            default=getattr(d, f.name),
            help=FLAG_HELP.get(f.name),
        )
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("c2").setLevel(logging.INFO)
    try:
        fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions)}
        results = run(
            args.tasks,
            args.policy,
            args.samples,
            args.out,
            RunOptions(**fields),
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    except IsolationMissing as e:
        parser.exit(1, f"{parser.prog}: {e}\n")
    o = results["overall"]
    brief = {"pass@k": {k: v["mean"] for k, v in o["pass@k"].items()}, "tasks": o["tasks"]}
    print(json.dumps({"policy": args.policy, **brief, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
