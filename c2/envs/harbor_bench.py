"""Run the oracle / noop (or any agent of agents.py) over imported Harbor tasks, each with its
own limits from task.toml: the agent's commands get the task's memory, cpus and storage and may
run as long as its agent timeout; the tests run under its verifier timeout (grading.py).

    python -m c2.envs.harbor_bench --tasks DIR --agent oracle [--workers 2] [--out grades.jsonl]
    python -m c2.envs.harbor_bench --tasks DIR --agent oracle --backend podman --out g.jsonl \
        --resume

The backend comes from the tasks (`--backend auto`): tasks imported with `--backend podman`
run in their images (one container per episode, container.py), the others in the bubblewrap
sandbox. `--backend podman|docker` insists on containers (and picks the engine), `bwrap` on the
sandbox; a task imported for the other backend is an error, named before anything runs.

Prints one line per task as it finishes (appended to --out at once, so `--resume` skips what a
killed run already did, unless the task's image changed since), then a JSON summary with the
pass count.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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


def with_backend(task: Task, backend: str) -> Task:
    """`task` for `backend` ("auto": as imported); raises ValueError when it was imported for
    the other kind of backend."""
    if backend == "auto":
        return task
    if backend == "bwrap":
        if task.container is not None:
            raise ValueError(f"{task.task_id} was imported for containers (metadata 'container')")
        return task
    if task.container is None:
        raise ValueError(
            f"{task.task_id} was imported for the bubblewrap backend: re-import it with "
            f"`python -m c2.envs.sources harbor --backend {backend}`"
        )
    meta = {**task.metadata, "container": {**task.container, "engine": backend}}
    return dataclasses.replace(task, metadata=meta)


def run_one(task: Task, agent: str, sandbox: Sandbox) -> dict:
    t0 = time.monotonic()
    try:
        rec = evaluate([task], AGENTS[agent], sandbox=sandbox, workers=1, config=task_config(task))[
            0
        ]
        out = {"task_id": task.task_id, "passed": rec.passed, "why": rec.failure_reason}
        out["tests_tail"] = rec.correctness.get("tests_output_tail")
    except Exception as e:  # noqa: BLE001 - one task's harness error is that task's result
        out = {"task_id": task.task_id, "passed": False, "why": f"{type(e).__name__}: {e}"}
    finally:
        if task.container is not None:  # its episode's workspace is gone: so is its container
            with contextlib.suppress(Exception):  # the engine's error was reported above
                task.sandbox(sandbox).collect_garbage()
    out["backend"] = (task.container or {}).get("engine", "bwrap")
    out["image"] = (task.container or {}).get("image")
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m c2.envs.harbor_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", required=True)
    p.add_argument("--agent", required=True, choices=sorted(AGENTS))
    p.add_argument("--backend", default="auto", choices=("auto", "bwrap", "podman", "docker"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON lines, one per task, appended as they end")
    p.add_argument("--resume", action="store_true", help="skip tasks already in --out")
    p.add_argument("--only", nargs="*", default=None, help="task ids to run (default: all)")
    args = p.parse_args(argv)
    if args.resume and not args.out:
        p.error("--resume needs --out")
    tasks = load_tasks(args.tasks)
    if args.only:
        tasks = [t for t in tasks if t.task_id in args.only or t.task_id[7:] in args.only]
    try:
        tasks = [with_backend(t, args.backend) for t in tasks]
    except ValueError as e:
        p.error(str(e))
    done: list[dict] = []
    if args.out and Path(args.out).exists():
        if args.resume:  # a task re-imported since (another image) runs again
            want = {t.task_id: (t.container or {}).get("image") for t in tasks}
            done = [json.loads(x) for x in Path(args.out).read_text().splitlines() if x.strip()]
            done = [
                r for r in done if r["task_id"] in want and r.get("image") == want[r["task_id"]]
            ]
            ids = {r["task_id"] for r in done}
            tasks = [t for t in tasks if t.task_id not in ids]
        else:
            Path(args.out).unlink()
    sandbox = Sandbox(SandboxLimits(max_file_mb=1024))

    def one(task):
        r = run_one(task, args.agent, sandbox)
        why = (r["why"] or "").replace("\n", " ")[:160]
        status = "PASS" if r["passed"] else "FAIL"
        print(f"{r['task_id']}\t{status}\t{r['seconds']}s\t{why}", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
        return r

    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        results = done + list(pool.map(one, tasks))
    passed = sum(r["passed"] for r in results)
    backends = collections.Counter(r.get("backend", "bwrap") for r in results)
    print(
        json.dumps({"agent": args.agent, "n": len(results), "passed": passed, "backends": backends})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
