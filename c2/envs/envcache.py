"""Cached Python environments for tasks: built once per requirement set, mounted read-only.

A task that needs packages beyond the standard library (a mined repository's dependencies, a
Terminal-Bench task's `pip install` lines) names them in its metadata:

    "environment": {"requirements": ["toolz==1.0.0", "pytest==8.3.4"]}

`ensure_env` builds a virtual environment for that exact list once, under the cache directory
($C2_ENV_CACHE, default ~/.cache/c2/envs), keyed by the hash of the sorted list and the Python
version, and returns its root. The sandbox mounts it read-only and puts its bin/ first on PATH in
place of c2's own environment (`Sandbox.run(python_env=...)`), so the task sees its packages and
nothing of c2's. Builds are serialised by a file lock; a half-built environment (killed mid-build)
has no completion marker and is rebuilt.

    python -m c2.envs.envcache toolz==1.0.0 pytest      # build (or find) and print the root
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_MARKER = "c2-env.json"


class EnvBuildError(RuntimeError):
    """pip could not build the environment (the message carries pip's own error)."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("C2_ENV_CACHE", "~/.cache/c2/envs")).expanduser()


def pytest_requirement() -> str:
    """The pytest c2 runs with, pinned, so graders behave the same inside a task environment."""
    try:
        return f"pytest=={importlib.metadata.version('pytest')}"
    except importlib.metadata.PackageNotFoundError:
        return "pytest"


@functools.cache
def _python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def env_key(requirements: Sequence[str], python: str | None = None) -> str:
    version = _python_version(python or sys.executable)
    blob = json.dumps({"requirements": sorted(set(requirements)), "python": version})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def env_python(root: str | os.PathLike) -> Path:
    return Path(root) / "bin" / "python"


def ensure_env(
    requirements: Sequence[str],
    *,
    cache_dir: str | os.PathLike | None = None,
    python: str | None = None,
    pip_args: Sequence[str] = (),
) -> Path:
    """The root of a virtual environment holding exactly `requirements` (pip specifiers or local
    paths), built on first use. `pip_args` are passed to `pip install` (e.g. --no-index,
    --find-links DIR for an offline build). Raises EnvBuildError with pip's output on failure."""
    for r in requirements:
        if not isinstance(r, str) or not r.strip() or r.strip().startswith("-"):
            raise ValueError(f"requirements: {r!r} is not a package specifier")
    reqs = sorted({r.strip() for r in requirements})
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / env_key(reqs, python)
    if (root / _MARKER).is_file():
        return root
    with open(cache / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / _MARKER).is_file():  # another process built it while we waited
            return root
        shutil.rmtree(root, ignore_errors=True)  # a build that was killed part-way
        _build(root, reqs, python or sys.executable, pip_args)
    return root


def _build(root: Path, reqs: list[str], python: str, pip_args: Sequence[str]) -> None:
    def run(cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            tail = (p.stderr or p.stdout)[-2000:]
            raise EnvBuildError(f"building the environment for {reqs} failed:\n{tail}")

    # The base interpreter, not c2's venv: the new environment must not inherit c2's packages.
    base = subprocess.run(
        [python, "-c", "import sys; print(sys._base_executable)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run([base, "-m", "venv", "--without-pip", str(root)])
    if reqs:
        pip = [sys.executable, "-m", "pip", "--python", str(env_python(root)), "install"]
        run([*pip, "--no-input", "--disable-pip-version-check", *pip_args, *reqs])
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env_python(root)), "freeze"],
        capture_output=True,
        text=True,
    ).stdout.split()
    info = {"requirements": reqs, "installed": frozen, "python": base}
    (root / _MARKER).write_text(json.dumps(info, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requirements", nargs="*")
    p.add_argument("--cache_dir", default=None)
    args = p.parse_args(argv)
    try:
        print(ensure_env(args.requirements, cache_dir=args.cache_dir))
    except (EnvBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
