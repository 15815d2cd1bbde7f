"""The pass@k benchmark runner: N graded episodes per task, through the engine and the sandbox.

    python -m c2.eval.run --tasks DIR --policy P --samples N --out OUT

P: a c2 workdir (a stage's, or a pipeline's: its last stage), `hf:DIR`, `oracle` or `noop`. A model
plays on the generation engine (`c2.infer.Engine`, continuous batching) through
`c2.rl.episodes.EpisodeRunner`, exactly as RL rollouts and the RL stage's held-out evaluation do;
`oracle` / `noop` are the scripted reference agents of `c2.envs.agents`, played by
`c2.envs.episode.run_episode`. Either way each episode is graded by `c2.envs.grading.grade` in the
namespace sandbox. DIR is any task directory (or directory of them): the generated held-out
split (`python -m c2.envs.functions --split eval`, `python -m c2.envs.generate`), HumanEval,
Harbor / Terminal-Bench tasks imported by `c2.envs.sources`.

Writes, under OUT:
  episodes.jsonl    one line per finished episode (appended as each ends): the grade's four
                    dimensions (correctness, quality, efficiency, interaction), tokens, FLOPs, and
                    the patch (a unified diff of the final workspace against the task's files);
                    for a model, its transcript (each segment's token ids decoded)
  results.json      per task and overall: pass@k for k = 1, 2, 4, ..., N (unbiased estimator,
                    c2.eval.passk.pass_at_k; overall = mean over tasks with a 95% interval),
                    best-of-N, the four dimensions, tokens and compute
  predictions.jsonl SWE-bench style, one line per task (sample 0):
                    {"instance_id", "model_name_or_path", "model_patch"}
  report.md, passk.png, per_task.png
Resumable: a second invocation reads episodes.jsonl and plays only the episodes not in it (a
larger --samples plays only the new sample indices).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import difflib
import json
import logging
import math
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

from c2.eval.passk import pass_at_k

log = logging.getLogger(__name__)

SCRIPTED = ("oracle", "noop")
EPISODES = "episodes.jsonl"
RESULTS = "results.json"
PREDICTIONS = "predictions.jsonl"
RUN_META = "run.json"
Z95 = 1.959963984540054
DIMENSIONS = ("correctness", "quality", "efficiency", "interaction")


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
    tool_workers: int = 4
    run_timeout_s: float = 20.0
    seed: int = 0
    workers: int = 2  # scripted policies: episodes at once
    # Long episodes (c2/rl/episodes.py): self_summary | compaction | none; 0: the defaults.
    context_management: str = "none"
    summary_trigger: int = 0
    summary_max_tokens: int = 0
    max_segments: int = 4


# Patches ------------------------------------------------------------------------------------


def _text_files(root: Path) -> dict[str, Path]:
    out = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache"))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file() or name.endswith(".pyc"):
                continue
            out[str(p.relative_to(root))] = p
    return out


def _read(path: Path | None) -> list[str] | None:
    """Lines of a text file; None if absent, binary or over 1 MiB."""
    if path is None:
        return []
    if path.stat().st_size > 1 << 20:
        return None
    try:
        return path.read_text().splitlines(keepends=True)
    except (UnicodeDecodeError, OSError):
        return None


def workspace_patch(original: str | Path, final: str | Path) -> str:
    """A git-style unified diff turning `original` into `final` (added, modified and deleted
    text files; binary or >1 MiB files are named only). `git apply` / `patch -p1` apply it."""
    a_files, b_files = _text_files(Path(original)), _text_files(Path(final))
    out = []
    for rel in sorted(set(a_files) | set(b_files)):
        a_path, b_path = a_files.get(rel), b_files.get(rel)
        a, b = _read(a_path), _read(b_path)
        if a is None or b is None:
            if a_path is None or b_path is None or a_path.read_bytes() != b_path.read_bytes():
                out.append(f"diff --git a/{rel} b/{rel}\nBinary files differ\n")
            continue
        if a == b and a_path is not None and b_path is not None:
            continue
        for lines in (a, b):  # a last line without a newline, as diff marks it
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n\\ No newline at end of file\n"
        header = [f"diff --git a/{rel} b/{rel}\n"]
        if a_path is None:
            header.append("new file mode 100644\n")
        elif b_path is None:
            header.append("deleted file mode 100644\n")
        diff = difflib.unified_diff(
            a,
            b,
            fromfile="/dev/null" if a_path is None else f"a/{rel}",
            tofile="/dev/null" if b_path is None else f"b/{rel}",
        )
        out.append("".join(header) + "".join(diff))
    return "".join(out)


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


def _scripted_episodes(tasks_and_samples, policy: str, work: Path, opts: RunOptions, done):
    """Plays scripted episodes (c2.envs.episode.run_episode) and grades each; `done(record)`."""
    from c2.envs.agents import AGENTS
    from c2.envs.episode import EpisodeConfig, run_episode
    from c2.envs.grading import grade
    from c2.envs.sandbox import Sandbox

    sandbox = Sandbox()
    make_policy = AGENTS[policy]

    def one(task, j: int) -> dict:
        episode_id = f"{task.task_id}-{j}"
        shutil.rmtree(work / episode_id, ignore_errors=True)  # left by a killed run
        ep = run_episode(
            task, make_policy(task), sandbox, work, EpisodeConfig(), episode_id=episode_id
        )
        try:
            g = grade(task, ep.workspace, sandbox, ep)
            patch = workspace_patch(task.workspace_dir, ep.workspace)
        finally:
            shutil.rmtree(ep.workspace, ignore_errors=True)
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

    with cf.ThreadPoolExecutor(max(1, opts.workers), thread_name_prefix="episode") as ex:
        futures = [ex.submit(one, t, j) for t, j in tasks_and_samples]
        for f in cf.as_completed(futures):
            done(f.result())


def _correctness(c: dict) -> dict:
    keys = ("f2p_passed", "f2p_total", "p2p_passed", "p2p_total", "tests_error")
    return {k: c.get(k) for k in keys}


def _quality(q: dict) -> dict:
    return {
        "ruff_available": q.get("available", True),
        "new_findings": q.get("new_findings"),
        "changed_py_files": q.get("changed_py_files", []),
    }


def _model_episodes(tasks_and_samples, model, work: Path, opts: RunOptions, done):
    """Plays model episodes on one engine (c2.rl.episodes.EpisodeRunner), grades, `done`."""
    from c2.data.chat import AgentChat
    from c2.envs.sandbox import Sandbox
    from c2.infer.engine import Engine
    from c2.rl.episodes import EpisodeRequest, EpisodeRunner, RolloutConfig

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
        seed=opts.seed,
        stop_tokens=(chat.im_end,),
    )
    rollout = RolloutConfig(
        max_turns=opts.max_turns,
        max_tokens=opts.max_tokens,
        max_turn_tokens=opts.max_turn_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k,
        tool_workers=opts.tool_workers,
        run_timeout_s=opts.run_timeout_s,
        keep_workspaces=True,  # for the patch; removed once it is taken
        context_management=opts.context_management,
        summary_trigger=opts.summary_trigger,
        summary_max_tokens=opts.summary_max_tokens,
        max_segments=opts.max_segments,
    )
    runner = EpisodeRunner(engine, chat, Sandbox(), work, rollout)
    by_id = {t.task_id: t for t, _ in tasks_and_samples}
    flops_per_token = model.forward_flops_per_token

    def finished(s) -> None:
        task = by_id[s.task_id]
        workspace = work / s.info["episode_id"]
        patch = workspace_patch(task.workspace_dir, workspace) if workspace.is_dir() else ""
        shutil.rmtree(workspace, ignore_errors=True)
        info = s.info
        done(
            {
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
        )

    requests = [EpisodeRequest(t, t.task_id, t.task_id, j) for t, j in tasks_and_samples]
    runner.run(requests, on_sample=finished)


# Results ------------------------------------------------------------------------------------


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return ks if not ks or ks[-1] == n else ks + [n]


def _interval(values: Sequence[float]) -> dict:
    v = np.asarray(values, float)
    mean = float(v.mean())
    half = Z95 * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) > 1 else 0.0
    return {"mean": mean, "ci95": [mean - half, mean + half]}


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _dimensions(eps: list[dict]) -> dict:
    def rate(num, den):
        d = sum(e["correctness"][den] or 0 for e in eps)
        return sum(e["correctness"][num] or 0 for e in eps) / d if d else None

    return {
        "correctness": {
            "pass_rate": _mean(e["passed"] for e in eps),
            "f2p_rate": rate("f2p_passed", "f2p_total"),
            "p2p_rate": rate("p2p_passed", "p2p_total"),
            "tests_error_rate": _mean(bool(e["correctness"]["tests_error"]) for e in eps),
        },
        "quality": {"new_ruff_findings_mean": _mean(e["quality"]["new_findings"] for e in eps)},
        "efficiency": {
            k + "_mean": _mean(e["efficiency"][k] for e in eps)
            for k in ("generated_tokens", "context_tokens", "turns", "tool_calls", "wall_s")
        },
        "interaction": {
            "submitted_rate": _mean(e["interaction"]["submitted"] for e in eps),
            "final_message_rate": _mean(e["interaction"]["final_message"] for e in eps),
            "invalid_tool_calls_mean": _mean(e["interaction"]["invalid_tool_calls"] for e in eps),
            "tool_errors_mean": _mean(e["interaction"]["tool_errors"] for e in eps),
            "sandbox_limit_rate": _mean(bool(e["interaction"]["sandbox_limits_hit"]) for e in eps),
        },
    }


def summarize(records: Sequence[dict], task_ids: Sequence[str], n: int) -> dict:
    """results.json's body from the episode records of samples 0..n-1 of every task."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["sample"] < n:
            by_task[r["task_id"]].append(r)
    missing = [t for t in task_ids if len(by_task[t]) != n]
    if missing:
        raise ValueError(f"summarize: tasks without {n} finished episodes: {missing[:5]}")
    ks = ks_for(n)
    per_task = {}
    for t in task_ids:
        eps = sorted(by_task[t], key=lambda r: r["sample"])
        c = sum(e["passed"] for e in eps)
        per_task[t] = {
            "n": n,
            "correct": c,
            "pass@k": {str(k): pass_at_k(n, c, k) for k in ks},
            f"best_of_{n}": float(c > 0),
            **_dimensions(eps),
            "generated_tokens": int(sum(e["efficiency"]["generated_tokens"] or 0 for e in eps)),
            "flops": float(sum(e["flops"] for e in eps)),
            "wall_s": float(sum(e["efficiency"]["wall_s"] or 0.0 for e in eps)),
        }
    every = [e for t in task_ids for e in by_task[t]]
    overall = {
        "tasks": len(task_ids),
        "episodes": len(every),
        "pass@k": {
            str(k): _interval([per_task[t]["pass@k"][str(k)] for t in task_ids]) for k in ks
        },
        f"best_of_{n}": _interval([per_task[t][f"best_of_{n}"] for t in task_ids]),
        **_dimensions(every),
        "generated_tokens": sum(per_task[t]["generated_tokens"] for t in task_ids),
        "flops": sum(per_task[t]["flops"] for t in task_ids),
        "wall_s": sum(per_task[t]["wall_s"] for t in task_ids),
    }
    return {"samples": n, "ks": ks, "overall": overall, "per_task": per_task}


def write_predictions(path: Path, records: Sequence[dict], task_ids, model_name: str) -> None:
    by_key = {(r["task_id"], r["sample"]): r for r in records}
    with open(path, "w") as f:
        for t in task_ids:
            patch = by_key[(t, 0)]["patch"]
            line = {"instance_id": t, "model_name_or_path": model_name, "model_patch": patch}
            f.write(json.dumps(line) + "\n")


def _plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = results["ks"]
    o = results["overall"]["pass@k"]
    mean = [o[str(k)]["mean"] for k in ks]
    lo = [o[str(k)]["ci95"][0] for k in ks]
    hi = [o[str(k)]["ci95"][1] for k in ks]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, mean, "o-")
    ax.fill_between(ks, lo, hi, alpha=0.25, label="95% interval over tasks")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(-0.02, 1.02)
    ax.set(xlabel="k", ylabel="pass@k", title=f"pass@k: {results['policy']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "passk.png", dpi=110)
    plt.close(fig)
    per = results["per_task"]
    names = list(per)
    fig, ax = plt.subplots(figsize=(max(5, 0.25 * len(names)), 3.5))
    ax.bar(range(len(names)), [per[t]["pass@k"]["1"] for t in names])
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_ylim(0, 1.02)
    ax.set(ylabel="pass@1", title="pass@1 per task")
    fig.tight_layout()
    fig.savefig(out / "per_task.png", dpi=110)
    plt.close(fig)
    return ["passk.png", "per_task.png"]


def _fmt(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def write_report(results: dict, out: Path) -> Path:
    plots = _plots(results, out)
    o, n = results["overall"], results["samples"]
    lines = [
        f"# Benchmark: {results['policy']}",
        "",
        f"Tasks `{results['tasks_dir']}`: {o['tasks']} tasks x {n} samples = {o['episodes']} "
        f"episodes; isolation: {results.get('isolation', '-')}.",
        "",
        "| k | pass@k | 95% interval |",
        "|---|---|---|",
    ]
    for k in results["ks"]:
        p = o["pass@k"][str(k)]
        lines.append(f"| {k} | {p['mean']:.3f} | [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}] |")
    lines += ["", f"best-of-{n}: {o[f'best_of_{n}']['mean']:.3f}", "", "## Grading dimensions", ""]
    lines += ["| dimension | measure | value |", "|---|---|---|"]
    for dim in DIMENSIONS:
        for k, v in o[dim].items():
            lines.append(f"| {dim} | {k} | {_fmt(v)} |")
    lines += [
        "",
        f"Generated tokens {o['generated_tokens']}, forward FLOPs {o['flops']:.3g}, "
        f"episode wall time {o['wall_s']:.1f} s (summed).",
        "",
        "## Per task",
        "",
        "| task | correct | pass@1 | tokens |",
        "|---|---|---|---|",
    ]
    for t, r in results["per_task"].items():
        lines.append(
            f"| {t} | {r['correct']}/{n} | {r['pass@k']['1']:.3f} | {r['generated_tokens']} |"
        )
    lines += [""] + [f"![{p}]({p})" for p in plots] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


# The run ------------------------------------------------------------------------------------


def run(
    tasks_dir: str | Path,
    policy: str,
    samples: int,
    out: str | Path,
    options: RunOptions = RunOptions(),
    *,
    progress: bool = True,
    load: Callable | None = None,
) -> dict:
    """Plays what OUT/episodes.jsonl lacks, then writes results.json, predictions.jsonl and
    report.md; returns the results."""
    from c2.envs.sandbox import Sandbox
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
    meta_path = out / RUN_META
    if meta_path.is_file():
        before = json.loads(meta_path.read_text())
        for k, v in meta.items():
            if before.get(k) != v:
                raise ValueError(
                    f"{out} holds episodes of {k}={before.get(k)!r}, not {v!r}: use another --out"
                )
    meta_path.write_text(json.dumps(meta | {"options": dataclasses.asdict(options)}, indent=2))
    episodes = EpisodeLog(out / EPISODES)
    todo = [(t, j) for t in tasks for j in range(samples) if (t.task_id, j) not in episodes.records]
    log.info("%d of %d episodes to play", len(todo), len(tasks) * samples)
    model_name = policy
    sandbox = Sandbox()
    if todo:
        if not sandbox.isolated:
            raise RuntimeError(
                "episodes need a namespace sandbox; this machine has "
                f"{sandbox.isolation.describe()}"
            )
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
                _scripted_episodes(todo, policy, work, options, done)
            else:
                from c2.eval.models import load_model

                model = (load or load_model)(policy)
                _model_episodes(todo, model, work, options, done)
        finally:
            bar.close()
        log.info("played %d episodes in %.1f s", len(todo), time.perf_counter() - t0)
        shutil.rmtree(work, ignore_errors=True)
    records = list(episodes.records.values())
    results = {**meta, **summarize(records, ids, samples)}
    results["isolation"] = sandbox.isolation.describe()
    (out / RESULTS).write_text(json.dumps(results, indent=2))
    write_predictions(out / PREDICTIONS, records, ids, model_name)
    write_report(results, out)
    return results


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
            f"--{f.name}", type=type(getattr(d, f.name)), default=getattr(d, f.name)
        )
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("c2").setLevel(logging.INFO)
    options = RunOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions)})
    try:
        results = run(
            args.tasks, args.policy, args.samples, args.out, options, progress=not args.no_progress
        )
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    o = results["overall"]
    brief = {"pass@k": {k: v["mean"] for k, v in o["pass@k"].items()}, "tasks": o["tasks"]}
    print(json.dumps({"policy": args.policy, **brief, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
