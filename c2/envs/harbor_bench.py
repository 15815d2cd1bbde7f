"""Run the oracle / noop (or any agent of agents.py) over imported Harbor tasks, each with its
own limits from task.toml: the agent's commands get the task's memory, cpus and storage and may
run as long as its agent timeout; the tests run under its verifier timeout (grading.py).

    python -m c2.envs.harbor_bench --tasks DIR --agent oracle [--workers 2] [--out grades.jsonl]

Prints one line per task, then a JSON summary with the pass count and the failure reasons.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from c2.envs.agents import AGENTS
from c2.envs.episode import EpisodeConfig
from c2.envs.evaluate import evaluate
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.tasks import Task, load_tasks


def task_config(task: Task, base: EpisodeConfig | None = None) -> EpisodeConfig:
    """An episode config whose tool calls get the task's own limits."""
    base = base or EpisodeConfig()
    agent_s = float(task.metadata.get("agent_timeout_s", base.max_run_timeout_s))
    run_limits = dataclasses.replace(task.limits(base.run_limits), timeout_s=agent_s)
    return dataclasses.replace(base, run_limits=run_limits, max_run_timeout_s=agent_s)


def run_one(task: Task, agent: str, sandbox: Sandbox) -> dict:
    t0 = time.monotonic()
    try:
        rec = evaluate([task], AGENTS[agent], sandbox=sandbox, workers=1, config=task_config(task))[
            0
        ]
        out = {"task_id": task.task_id, "passed": rec.passed, "why": rec.failure_reason}
    except Exception as e:  # noqa: BLE001 - one task's harness error is that task's result
        out = {"task_id": task.task_id, "passed": False, "why": f"{type(e).__name__}: {e}"}
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m c2.envs.harbor_bench", description=__doc__)
    p.add_argument("--tasks", required=True)
    p.add_argument("--agent", required=True, choices=sorted(AGENTS))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--only", nargs="*", default=None, help="task ids to run (default: all)")
    args = p.parse_args(argv)
    tasks = load_tasks(args.tasks)
    if args.only:
        tasks = [t for t in tasks if t.task_id in args.only or t.task_id[7:] in args.only]
    sandbox = Sandbox(SandboxLimits(max_file_mb=1024))

    def one(task):
        r = run_one(task, args.agent, sandbox)
        why = (r["why"] or "").replace("\n", " ")[:160]
        status = "PASS" if r["passed"] else "FAIL"
        print(f"{r['task_id']}\t{status}\t{r['seconds']}s\t{why}", flush=True)
        return r

    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        results = list(pool.map(one, tasks))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in results))
    passed = sum(r["passed"] for r in results)
    print(json.dumps({"agent": args.agent, "n": len(results), "passed": passed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
