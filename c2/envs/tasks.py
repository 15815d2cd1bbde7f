"""The task format on disk (docs/recipe.md §3).

    <task>/workspace/        the repository the agent works in
    <task>/instruction.md    the short instruction it is given
    <task>/tests/            hidden tests: never inside the sandbox while the agent works
    <task>/solution/         the reference fix, as files relative to workspace/ (for the oracle)
    <task>/metadata.json     fail_to_pass, pass_to_pass, difficulty, seed, source, grader, ...

Graders: "pytest" runs tests/ with pytest and reads per-test outcomes; "functions" runs plain
test functions in tests/test_*.py without pytest (grading_runner.py: same ids and outcomes,
~10x faster); "harbor" runs tests/test.sh and reads /logs/verifier/reward.txt or reward.json
(Harbor's convention). metadata "prompt_style" picks the system prompt: "full" (default: every
tool's JSON schema) or "compact" (one line per tool; episode.task_system_prompt).

Backends: a task runs in the bubblewrap Sandbox unless its metadata has "container" (a task
imported with its Dockerfile: container.py); `Task.sandbox(default)` is the one place that picks,
and episodes and grading go through it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

REQUIRED_METADATA = ("task_id", "fail_to_pass", "pass_to_pass", "difficulty", "seed", "source")
GRADERS = ("pytest", "functions", "harbor")
PROMPT_STYLES = ("full", "compact")
# The workspace may not be mounted over what the sandbox itself provides.
_SYSTEM_DIRS = {
    "usr",
    "bin",
    "sbin",
    "lib",
    "lib64",
    "etc",
    "proc",
    "dev",
    "tmp",
    "grading",
    "root",
}


@dataclasses.dataclass(frozen=True)
class Task:
    root: Path
    instruction: str
    metadata: Mapping

    @property
    def task_id(self) -> str:
        return self.metadata["task_id"]

    @property
    def workspace_dir(self) -> Path:
        return self.root / "workspace"

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.root / "solution"

    @property
    def fail_to_pass(self) -> list[str]:
        return list(self.metadata["fail_to_pass"])

    @property
    def pass_to_pass(self) -> list[str]:
        return list(self.metadata["pass_to_pass"])

    @property
    def grader(self) -> str:
        return self.metadata.get("grader", "pytest")

    @property
    def mount_at(self) -> str:
        """Where the workspace appears in the sandbox (Harbor tasks expect /app)."""
        return self.metadata.get("mount_at", "/workspace")

    @property
    def requirements(self) -> list[str]:
        """Packages the task's code and tests need (metadata "environment"); [] for none."""
        return list(self.metadata.get("environment", {}).get("requirements", []))

    def python_env(self) -> Path | None:
        """The task's cached Python environment (built on first use), or None when it names no
        requirements and runs on the sandbox's default Python."""
        if not self.requirements:
            return None
        from c2.envs.envcache import ensure_env, pytest_requirement

        reqs = self.requirements
        if self.grader == "pytest" and not any(re.match(r"pytest\b", r) for r in reqs):
            reqs = [*reqs, pytest_requirement()]
        return ensure_env(reqs)

    @property
    def container(self) -> Mapping | None:
        """metadata "container" ({"image", "context", "dockerfile", "engine", "network"}), or None
        for a task that runs in the bubblewrap sandbox."""
        return self.metadata.get("container")

    def sandbox(self, default, *, engine: str | None = None):
        """What runs this task's commands and tests: `default` (a Sandbox), or for a container
        task the shared ContainerSandbox of its image (built from the task's context on first use
        when missing). `engine` overrides the one in the metadata (podman / docker)."""
        c = self.container
        if c is None:
            return default
        from c2.envs.container import container_sandbox

        return container_sandbox(
            c["image"],
            engine=engine or c.get("engine", "podman"),
            network=bool(c.get("network", False)),
            limits=default.limits,
            context=self.root / c.get("context", "environment"),
            dockerfile=c.get("dockerfile", "Dockerfile"),
        )

    @property
    def test_timeout_s(self) -> float:
        return float(self.metadata.get("test_timeout_s", 120))

    def limits(self, base):
        """`base` (a SandboxLimits) with the task's own resource limits in place of its defaults:
        metadata "limits" holds SandboxLimits fields (a Harbor task's memory, cpus and storage
        from its task.toml)."""
        own = {k: v for k, v in self.metadata.get("limits", {}).items() if k != "timeout_s"}
        return dataclasses.replace(base, **own) if own else base

    def materialize(self, dest: str | os.PathLike) -> Path:
        """A private copy of the workspace for one episode (symlinks copied as links)."""
        dest = Path(dest)
        shutil.copytree(self.workspace_dir, dest, symlinks=True)
        return dest


def validate_metadata(meta: Mapping, where: str) -> None:
    missing = [k for k in REQUIRED_METADATA if k not in meta]
    if missing:
        raise ValueError(f"{where}: metadata is missing {missing}")
    for k in ("fail_to_pass", "pass_to_pass"):
        if not isinstance(meta[k], list) or not all(isinstance(t, str) for t in meta[k]):
            raise ValueError(f"{where}: metadata[{k!r}]={meta[k]!r}: expected a list of test ids")
    if not meta["fail_to_pass"]:
        raise ValueError(f"{where}: metadata['fail_to_pass'] is empty: nothing to solve")
    mount = meta.get("mount_at", "/workspace")
    if not re.fullmatch(r"(/[A-Za-z0-9_.-]+)+", mount) or mount.split("/")[1] in _SYSTEM_DIRS:
        raise ValueError(
            f"{where}: metadata['mount_at']={mount!r}: expected an absolute path outside "
            f"the system directories {sorted(_SYSTEM_DIRS)}"
        )
    if meta.get("prompt_style", "full") not in PROMPT_STYLES:
        raise ValueError(
            f"{where}: metadata['prompt_style']={meta['prompt_style']!r}: "
            f"expected one of {PROMPT_STYLES}"
        )
    env = meta.get("environment", {})
    reqs = env.get("requirements", []) if isinstance(env, Mapping) else None
    if not isinstance(reqs, list) or not all(isinstance(r, str) and r.strip() for r in reqs):
        raise ValueError(
            f"{where}: metadata['environment']={env!r}: expected "
            '{"requirements": [pip specifiers]}'
        )
    limits = meta.get("limits", {})
    fields = {"memory_mb", "cpus", "cpu_s", "max_processes", "max_file_mb", "max_open_files"}
    fields |= {"max_output_bytes", "tmp_mb", "max_workspace_mb"}
    if not isinstance(limits, Mapping) or not all(
        k in fields and isinstance(v, int | float) and v > 0 for k, v in limits.items()
    ):
        raise ValueError(
            f"{where}: metadata['limits']={limits!r}: expected positive numbers for "
            f"SandboxLimits fields {sorted(fields)}"
        )
    container = meta.get("container")
    if container is not None and (
        not isinstance(container, Mapping)
        or not isinstance(container.get("image"), str)
        or container.get("engine", "podman") not in ("podman", "docker")
    ):
        raise ValueError(
            f"{where}: metadata['container']={container!r}: expected "
            '{"image": TAG, "engine": "podman"|"docker", "context": DIR, "network": bool}'
        )
    if meta.get("grader", "pytest") not in GRADERS:
        raise ValueError(
            f"{where}: metadata['grader']={meta['grader']!r}: expected one of {GRADERS}"
        )


def load_task(path: str | os.PathLike) -> Task:
    root = Path(path)
    for need in ("workspace", "instruction.md", "tests", "metadata.json"):
        if not (root / need).exists():
            raise FileNotFoundError(f"task {str(root)!r}: missing {need}")
    meta = json.loads((root / "metadata.json").read_text())
    validate_metadata(meta, str(root / "metadata.json"))
    return Task(root.resolve(), (root / "instruction.md").read_text(), meta)


def load_tasks(path: str | os.PathLike) -> list[Task]:
    """One task directory, or a directory of task directories (sorted by name)."""
    root = Path(path)
    if (root / "metadata.json").exists():
        return [load_task(root)]
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / "metadata.json").exists()]
    if not tasks:
        raise FileNotFoundError(f"{str(root)!r}: no task directories (with metadata.json) found")
    return tasks


def _check_paths(files: Mapping[str, str | bytes]) -> None:
    for rel in files:
        if not rel or ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ValueError(f"file path {rel!r}: expected a plain relative path")


def _write_files(base: Path, files: Mapping[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def write_task(
    root: str | os.PathLike,
    *,
    instruction: str,
    metadata: Mapping,
    workspace: Mapping[str, str | bytes],
    tests: Mapping[str, str | bytes],
    solution: Mapping[str, str | bytes] | None = None,
) -> Task:
    """Write a task directory (which must not exist yet) and load it back."""
    root = Path(root)
    validate_metadata(metadata, str(root))
    for files in (workspace, tests, solution or {}):
        _check_paths(files)
    root.mkdir(parents=True)
    (root / "workspace").mkdir()
    (root / "tests").mkdir()
    _write_files(root / "workspace", workspace)
    _write_files(root / "tests", tests)
    if solution:
        (root / "solution").mkdir()
        _write_files(root / "solution", solution)
    (root / "instruction.md").write_text(instruction.rstrip() + "\n")
    (root / "metadata.json").write_text(json.dumps(dict(metadata), indent=2, sort_keys=True) + "\n")
    return load_task(root)
