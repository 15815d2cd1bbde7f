"""Run an agent on a directory of tasks and grade every episode.

    python -m c2.envs.evaluate --tasks DIR --agent oracle|noop [--workers 2] [--out grades.jsonl]

Prints one line per task, then, last, a JSON line with `pass_rate`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from c2.envs.agents import AGENTS
from c2.envs.episode import EpisodeConfig, JsonlWriter, Policy, run_episodes
from c2.envs.grading import GradeRecord, grade
from c2.envs.sandbox import Sandbox
from c2.envs.tasks import Task, load_tasks


def evaluate(
    tasks: Sequence[Task],
    make_policy: Callable[[Task], Policy],
    *,
    sandbox: Sandbox | None = None,
    workers: int = 2,
    workdir: str | os.PathLike | None = None,
    config: EpisodeConfig | None = None,
    trajectories: str | os.PathLike | None = None,
) -> list[GradeRecord]:
    """One graded episode per task, `workers` at a time; records in task order."""
    sandbox = sandbox or Sandbox()
    writer = JsonlWriter(trajectories) if trajectories else None
    with tempfile.TemporaryDirectory(prefix="c2-eval-") as tmp:
        return run_episodes(
            tasks,
            make_policy,
            sandbox,
            workdir or tmp,
            config or EpisodeConfig(),
            workers=workers,
            writer=writer,
            then=lambda task, ep: grade(task, ep.workspace, sandbox, ep),
        )


def summary(records: Sequence[GradeRecord], agent: str) -> dict:
    n = len(records)
    passed = sum(r.passed for r in records)
    return {
        "agent": agent,
        "n": n,
        "passed": passed,
        "pass_rate": passed / n if n else 0.0,
        "f2p_rate": sum(r.correctness["f2p_passed"] for r in records)
        / max(1, sum(r.correctness["f2p_total"] for r in records)),
        "new_ruff_findings": sum(r.quality.get("new_findings") or 0 for r in records),
        "invalid_tool_calls": sum(r.interaction["invalid_tool_calls"] or 0 for r in records),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.envs.evaluate", description=__doc__)
    parser.add_argument("--tasks", required=True, help="a task directory or a directory of them")
    parser.add_argument("--agent", required=True, choices=sorted(AGENTS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="write every grade record here (JSONL)")
    parser.add_argument("--trajectories", default=None, help="write trajectories here (JSONL)")
    args = parser.parse_args(argv)
    try:
        tasks = load_tasks(args.tasks)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    sandbox = Sandbox()
    records = evaluate(
        tasks,
        AGENTS[args.agent],
        sandbox=sandbox,
        workers=args.workers,
        trajectories=args.trajectories,
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for r in records:
                f.write(json.dumps(r.to_dict()) + "\n")
    for r in records:
        c = r.correctness
        status = "PASS" if r.passed else "FAIL"
        print(
            f"{r.task_id}\t{status}\tf2p {c['f2p_passed']}/{c['f2p_total']}\t"
            f"p2p {c['p2p_passed']}/{c['p2p_total']}\t{r.failure_reason or ''}"
        )
    print(json.dumps({**summary(records, args.agent), "isolation": sandbox.isolation.describe()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
