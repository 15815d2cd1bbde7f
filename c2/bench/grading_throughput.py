"""Grading throughput: oracle solutions of function tasks graded by the "functions" grader and
by the pytest grader, this checkout against another revision's, interleaved (docs/recipe.md §3).

    git worktree add /tmp/c2-base REV   # the revision to compare with (optional)
    python -m c2.bench.grading_throughput --n 30 --baseline /tmp/c2-base \
        --out c2/bench/results/grading_throughput.json

Each revision grades in its own process (`grade(task, workspace, sandbox)` from the c2 it
imports, the only entry point both share); the tasks and the oracle workspaces are made once, by
this checkout, and every task is graded by each revision in turn, the order alternating. Every
grade must pass (an oracle that fails is an error, not a time). Prints grades/s and the median
per revision and, with --baseline, this checkout's time over the baseline's.
"""

from __future__ import annotations

import argparse
import json
import selectors
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from c2.bench import fair
from c2.envs import functions

GRADERS = ("functions", "pytest")

# Runs in each revision's process: one JSON request a line in, one JSON answer a line out.
_SERVE = """
import json, sys, time
from c2.envs.grading import grade
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.tasks import load_task
sandbox = Sandbox(SandboxLimits(timeout_s=30, memory_mb=512))
for line in sys.stdin:
    req = json.loads(line)
    task = load_task(req["task"])
    t = time.perf_counter()
    record = grade(task, req["workspace"], sandbox)
    s = time.perf_counter() - t
    print(json.dumps({"s": s, "passed": record.passed, "why": record.failure_reason}), flush=True)
"""


class Revision:
    """A c2 checkout grading in a process of its own."""

    def __init__(self, name: str, root: Path):
        if not (root / "c2" / "envs" / "grading.py").is_file():
            raise SystemExit(f"{name}: {root} holds no c2 checkout (c2/envs/grading.py missing)")
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def grade(self, task: Path, workspace: Path, timeout_s: float = 120.0) -> float:
        self.proc.stdin.write(json.dumps({"task": str(task), "workspace": str(workspace)}) + "\n")
        self.proc.stdin.flush()
        line = _readline(self.proc, timeout_s)
        answer = json.loads(line)
        if not answer["passed"]:
            raise SystemExit(f"{self.name}: the oracle failed {task}: {answer['why']}")
        return answer["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            proc.kill()
            raise SystemExit(f"a grade took over {timeout_s} s")
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the grading process exited ({proc.wait()})")
    return line


def make_tasks(root: Path, n: int, seed: int) -> list[tuple[str, Path, Path]]:
    """(grader, task dir, oracle workspace) for n function tasks under each grader."""
    out = []
    for task in functions.generate_function_tasks(root / "tasks", n, seed, "train"):
        workspace = root / "ws" / task.task_id
        shutil.copytree(task.workspace_dir, workspace)
        for f in task.solution_dir.iterdir():
            shutil.copy(f, workspace / f.name)
        as_pytest = root / "tasks_pytest" / task.task_id
        shutil.copytree(task.root, as_pytest)
        meta = json.loads((as_pytest / "metadata.json").read_text())
        (as_pytest / "metadata.json").write_text(json.dumps({**meta, "grader": "pytest"}))
        out += [("functions", task.root, workspace), ("pytest", as_pytest, workspace)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.bench.grading_throughput")
    parser.add_argument("--n", type=int, default=30, help="function tasks (each graded twice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", help="another c2 checkout to compare with")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--require-quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n {args.n}: expected a positive number")
    here = Path(__file__).resolve().parents[2]
    check = fair.load_check(require_quiet=args.require_quiet)
    root = Path(tempfile.mkdtemp(prefix="c2-grading-bench-"))
    revisions = [Revision("this", here)]
    if args.baseline:
        revisions.append(Revision("baseline", Path(args.baseline).resolve()))
    try:
        from c2.envs.sandbox import Sandbox

        sandbox = Sandbox()
        tasks = make_tasks(root, args.n, args.seed)
        for _, _, workspace in tasks[::2]:
            sandbox.give_workspace(workspace)
        times = {(r.name, g): [] for r in revisions for g in GRADERS}
        for i, (grader, task, workspace) in enumerate(tasks):
            for r in revisions if i // 2 % 2 == 0 else revisions[::-1]:
                times[(r.name, grader)].append(r.grade(task, workspace))
    finally:
        for r in revisions:
            r.close()
        shutil.rmtree(root, ignore_errors=True)
    fair.finish(check)
    results = {"n": args.n, "baseline": args.baseline, **check.record(), "graders": {}}
    for grader in GRADERS:
        row = {}
        for r in revisions:
            t = fair.Timing(tuple(times[(r.name, grader)]))
            row[r.name] = {"grades_per_s": len(t.times) / sum(t.times), **t.summary()}
            print(
                f"{grader:>9} {r.name:>8}: {row[r.name]['grades_per_s']:.2f} grades/s, "
                f"median {t.spread()} ms"
            )
        if args.baseline:
            ratio = sum(times[("this", grader)]) / sum(times[("baseline", grader)])
            row["time_ratio"] = ratio
            print(f"{grader:>9}: this / baseline time {ratio:.3f}")
        results["graders"][grader] = row
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
