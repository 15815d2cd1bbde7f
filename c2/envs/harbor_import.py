"""Harbor / Terminal-Bench 2 task directories, converted to the task format of tasks.py.

A Harbor task is instruction.md, task.toml, environment/Dockerfile (+ build context),
tests/test.sh (+ test files) and solution/solve.sh. Harbor builds the Dockerfile into an image and
runs test.sh in it; here (the bubblewrap backend) the image is replaced by:

- the workspace: what the Dockerfile COPYs under its working directory, mounted where it says
  (`mount_at`), after the Dockerfile's offline RUN steps (compiling, generating data, unpacking)
  have run over it in the sandbox, at import time;
- a cached Python environment (envcache.ensure_env) with every package the Dockerfile and the test
  setup install from the package index (`pip install`, `uvx -w`, `uv pip install`): the sandbox
  mounts it read-only in place of c2's own, so every imported task names one (at least pytest);
- the machine's own /usr for apt packages: an `apt-get install` is accepted when every package it
  names is installed here, and refused (naming the missing ones) otherwise;
- Harbor's standard test setup (apt-get update, apt-get install curl, the uv installer,
  `uvx -p 3.13 -w pytest==8.4.1 ... pytest ARGS`; or `pip install pytest ...`) is recognised and
  rewritten to run `pytest ARGS` from that environment; the rest of test.sh (writing reward.txt
  from the exit code) is kept. The original is kept as tests/test.sh.orig;
- resources from task.toml ([environment] memory, cpus, storage; [verifier] / [agent] /
  [environment] timeouts) in metadata "limits" (SandboxLimits fields), "test_timeout_s",
  "agent_timeout_s" and "build_timeout_s" (Task.limits).

Anything else is refused with an `UnsupportedTask` whose `reason` is one of REASONS (and whose
message says exactly what): downloads at build or test time, apt packages this machine lacks,
files COPYed outside the working directory, multi-stage builds, a build step that fails offline.

`import_harbor_tasks` imports a batch: each task is built in a staging directory and renamed into
place, so a refused or crashing task leaves nothing behind and never stops the batch; a task that
is already there from the same source (fingerprint in harbor-import.json) is kept as it is.

Reading test.sh, the Dockerfile and task.toml (and refusing): harbor_translate.py; here, the
conversion of a task directory (both backends) and the batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
import tomllib
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# Reading test.sh, the Dockerfile and task.toml lives in harbor_translate.py; its public names
# stay importable from here.
from c2.envs.harbor_translate import (  # noqa: F401
    REASONS,
    BuildPlan,
    UnsupportedTask,
    _json_or_words,
    _req_name,
    allow_internet,
    classify,
    dockerfile_steps,
    host_apt_packages,
    plan_dockerfile,
    rewrite_test_sh,
    split_shell,
    task_limits,
)
from c2.envs.sandbox import SandboxError
from c2.envs.tasks import Task, load_task, write_task

IMPORTER_VERSION = 2
IMPORT_RECORD = "harbor-import.json"
BACKENDS = ("bwrap", "podman", "docker")


@dataclasses.dataclass
class ImportOutcome:
    src: str
    status: str  # "imported", "unchanged", "refused", "error"
    task_id: str | None = None
    reason: str | None = None  # for "refused" / "error": a key of REASONS
    detail: str | None = None
    seconds: float = 0.0


def _copy_into(stage: Path, root: str, env_dir: Path, sources: list[str], full: str, dest: str):
    """Docker's COPY: a directory source copies its contents; a file lands at `dest`, or inside it
    when `dest` ends with / or is a directory already, or there are several sources."""
    target = stage / os.path.relpath(os.path.normpath(full), root)
    into_dir = dest.endswith(("/", "/.")) or dest == "." or len(sources) > 1 or target.is_dir()
    for s in sources:
        origin = (env_dir / s).resolve()
        if origin.is_dir():
            shutil.copytree(origin, target, symlinks=True, dirs_exist_ok=True)
        else:
            to = target / origin.name if into_dir else target
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, to)


# ---------------------------------------------------------------------- one task


def source_fingerprint(src: Path, backend: str = "bwrap") -> str:
    tail = "" if backend == "bwrap" else f" {backend}"
    h = hashlib.sha256(f"c2-harbor-import {IMPORTER_VERSION}{tail}\n".encode())
    for f in sorted(src.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(src).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def merge_requirements(build: Iterable[str], test: Iterable[str]) -> list[str]:
    """One environment for the task: the tests' pins win over the Dockerfile's for a package."""
    merged: dict[str, str] = {}
    for r in build:
        merged[_req_name(r)] = r
    for r in test:
        merged[_req_name(r)] = r
    if "pytest" not in merged:
        from c2.envs.envcache import pytest_requirement

        merged["pytest"] = pytest_requirement()
    return sorted(merged.values())


def _task_id(src: Path, config: dict) -> str:
    name = config.get("task", {}).get("name") or src.name
    return "harbor-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def import_harbor(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    sandbox=None,
    have: Callable[[str], bool] | None = None,
    env_builder: Callable[[list[str]], Path] | None = None,
    backend: str = "bwrap",
    build_timeout_scale: float = 3.0,
) -> Task:
    """Convert one Harbor task directory into out_dir/<task_id>; raises UnsupportedTask (with a
    reason) for what cannot run offline here. Atomic: the task appears complete or not at all; a
    task already imported from the same source is returned as it is. `backend` "podman" or
    "docker" keeps the Dockerfile and builds its image instead (import_container)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if backend != "bwrap":
        return import_container(
            src, out_dir, engine=backend, build_timeout_scale=build_timeout_scale
        )
    src, out_dir = Path(src), Path(out_dir)
    for need in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (src / need).is_file():
            raise UnsupportedTask("missing-file", f"{src}: missing {need}")
    try:
        config = tomllib.loads((src / "task.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UnsupportedTask("unreadable", f"task.toml: {e}") from None
    task_id = _task_id(src, config)
    final = out_dir / task_id
    fingerprint = source_fingerprint(src)
    record = final / IMPORT_RECORD
    if record.is_file():
        try:
            if json.loads(record.read_text()).get("fingerprint") == fingerprint:
                return load_task(final)
        except (ValueError, OSError):
            pass
    if have is None:
        packages = host_apt_packages()
        have = packages.__contains__
    env_dir = src / "environment"
    dockerfile = env_dir / "Dockerfile"
    docker_text = dockerfile.read_text() if dockerfile.is_file() else ""
    plan = plan_dockerfile(docker_text, env_dir, have=have)
    test_sh = (src / "tests" / "test.sh").read_text()
    new_test_sh, test_reqs, _ = rewrite_test_sh(test_sh, have=have)
    requirements = merge_requirements(plan.requirements, test_reqs)
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = _stage(out_dir, task_id)
    try:
        python_env = _build_env(requirements, env_builder)
        workspace = stage / "build"
        workspace.mkdir()
        _build_workspace(plan, env_dir, workspace, python_env, config, sandbox)
        metadata = {
            **_metadata(task_id, src, config),
            "mount_at": plan.root,
            "environment": {"requirements": requirements},
            "harbor": {"base_image": plan.base_image, "apt": sorted(set(plan.apt))},
            **task_limits(config),
        }
        tests = _files(src / "tests")
        tests["test.sh"] = new_test_sh.encode()
        if new_test_sh != test_sh:
            tests["test.sh.orig"] = test_sh.encode()
        write_task(
            stage / "task",
            instruction=(src / "instruction.md").read_text(),
            metadata=metadata,
            workspace={},
            tests=tests,
            solution=_files(src / "solution"),
        )
        ws = stage / "task" / "workspace"
        ws.rmdir()
        os.rename(workspace, ws)
        (stage / "task" / IMPORT_RECORD).write_text(
            json.dumps({"fingerprint": fingerprint, "importer_version": IMPORTER_VERSION}) + "\n"
        )
        old = None
        if final.exists():
            old = out_dir / f".{task_id}.old-{os.getpid()}"
            os.rename(final, old)
        os.rename(stage / "task", final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return load_task(final)


def _metadata(task_id: str, src: Path, config: dict) -> dict:
    """The metadata every imported Harbor task has, whatever its backend."""
    return {
        "task_id": task_id,
        "source": "harbor",
        "origin": str(src),
        "fail_to_pass": ["tests/test.sh"],
        "pass_to_pass": [],
        "difficulty": config.get("metadata", {}).get("difficulty", "unknown"),
        "category": config.get("metadata", {}).get("category", "unknown"),
        "seed": 0,
        "grader": "harbor",
    }


def _stage(out_dir: Path, task_id: str) -> Path:
    """A fresh staging directory for `task_id` under out_dir, after removing what an import
    that was killed left there."""
    for debris in out_dir.glob(f".{task_id}.*"):
        shutil.rmtree(debris, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{task_id}.", dir=out_dir))


def _files(d: Path) -> dict[str, bytes]:
    if not d.is_dir():
        return {}
    files = sorted(f for f in d.rglob("*") if f.is_file())
    return {f.relative_to(d).as_posix(): f.read_bytes() for f in files}


def _build_env(requirements: list[str], env_builder) -> Path:
    from c2.envs.envcache import EnvBuildError, ensure_env

    try:
        return (env_builder or ensure_env)(requirements)
    except EnvBuildError as e:
        raise UnsupportedTask("env-build-failed", str(e)[-600:]) from None


def _build_workspace(plan: BuildPlan, env_dir: Path, workspace: Path, python_env, config, sandbox):
    """Apply the plan's COPY and RUN steps in order over `workspace` (the image's working
    directory); RUN steps run in the sandbox, offline, with the task's environment and limits."""
    from c2.envs.sandbox import SandboxLimits

    lim = task_limits(config)
    limits = SandboxLimits(
        **{**lim["limits"], "timeout_s": lim["build_timeout_s"], "max_output_bytes": 1 << 20}
    )
    for n, kind, args in plan.steps:
        if kind == "copy":
            _copy_into(workspace, plan.root, env_dir, *args)
            continue
        command, cwd = args
        if sandbox is None:
            from c2.envs.sandbox import Sandbox

            sandbox = Sandbox()
        (workspace / os.path.relpath(cwd, plan.root)).mkdir(parents=True, exist_ok=True)
        sandbox.give_workspace(workspace)
        r = sandbox.run(
            f"set -e\ncd {shlex.quote(cwd)}\n{command}\n",
            workspace,
            limits=limits,
            mount_at=plan.root,
            python_env=str(python_env),
        )
        if r.exit_code != 0 or r.limit:
            why = f"limit {r.limit}" if r.limit else f"exit code {r.exit_code}"
            tail = (r.stderr or r.stdout).strip()[-300:]
            raise UnsupportedTask(
                "build-failed", f"Dockerfile line {n} ({command[:120]!r}): {why}: {tail}"
            )


# ---------------------------------------------------------------------- the container backend


def import_container(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    engine: str = "podman",
    build_timeout_s: float | None = None,
    build_timeout_scale: float = 3.0,
) -> Task:
    """Import one Harbor task for the container backend (container.py): the Dockerfile and its
    build context are kept (task/environment/), the image is built here once (tagged by a
    content hash of the context; FROM lines mapped onto local bases), the image's working
    directory is copied out as the workspace, and tests/ and solution/ are kept as they are:
    test.sh runs in the episode's container as Harbor runs it, with a network only where
    task.toml allows it (`allow_internet`, true when absent). The build may take
    `build_timeout_scale` times task.toml's build_timeout_sec (this machine is slower than
    Harbor's), or `build_timeout_s` when given."""
    from c2.envs.container import (
        BASE_IMAGES,
        context_hash,
        copy_out_of_image,
        ensure_image,
        from_images,
        image_exists,
        image_workdir,
    )
    from c2.envs.tasks import _SYSTEM_DIRS

    src, out_dir = Path(src), Path(out_dir)
    for need in ("instruction.md", "task.toml", "tests/test.sh", "environment/Dockerfile"):
        if not (src / need).is_file():
            raise UnsupportedTask("missing-file", f"{src}: missing {need}")
    try:
        config = tomllib.loads((src / "task.toml").read_text())
        docker_text = (src / "environment" / "Dockerfile").read_text()
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UnsupportedTask("unreadable", f"task.toml or Dockerfile: {e}") from None
    task_id = _task_id(src, config)
    final = out_dir / task_id
    fingerprint = source_fingerprint(src, engine)
    env_dir = src / "environment"
    repo = "localhost/c2-task/" + re.sub(r"[^a-z0-9_.-]+", "-", task_id.lower())
    # The tag follows the context, the FROM mapping and the base images: any change, a new image.
    want = f"{repo}:{context_hash(env_dir, engine=engine)}"
    network = allow_internet(config)
    record = final / IMPORT_RECORD
    if record.is_file():
        try:
            if json.loads(record.read_text()).get("fingerprint") == fingerprint:
                task = load_task(final)
                same = task.container["image"] == want and task.container["network"] is network
                if same and image_exists(want, engine):
                    return task
        except (ValueError, OSError):
            pass
    for image in from_images(docker_text):
        local = BASE_IMAGES.get(image, image)
        if not image_exists(local, engine):
            hint = (
                "build it with `python -m c2.envs.container base`"
                if image in BASE_IMAGES
                else "no local base maps it (container.BASE_IMAGES) and it is not pulled"
            )
            raise UnsupportedTask("base-image", f"FROM {image}: {local} is missing; {hint}")
    _check_copy_sources(docker_text, env_dir)
    timeout = build_timeout_s or build_timeout_scale * task_limits(config)["build_timeout_s"]
    logs = out_dir / "build-logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        tag, built = ensure_image(
            env_dir, repo=repo, engine=engine, timeout_s=timeout, log=logs / f"{task_id}.log"
        )
    except SandboxError as e:  # an image the build copies from could not be made here
        raise UnsupportedTask("image-build-failed", str(e)) from None
    if built is not None and built.returncode != 0:
        from c2.envs.container import _build_error

        why = "timed out" if built.returncode == 124 else f"exit code {built.returncode}"
        raise UnsupportedTask("image-build-failed", f"{why}: {_build_error(built)}")
    workdir = image_workdir(tag, engine)
    if workdir == "/" or workdir.split("/")[1] in _SYSTEM_DIRS:
        raise UnsupportedTask("workdir", f"the image's working directory is {workdir}")
    stage = _stage(out_dir, task_id)
    try:
        metadata = {
            **_metadata(task_id, src, config),
            "mount_at": workdir,
            "container": {
                "engine": engine,
                "image": tag,
                "context": "environment",
                "dockerfile": "Dockerfile",
                "network": network,
                "from": from_images(docker_text),
            },
            **task_limits(config),
        }
        write_task(
            stage / "task",
            instruction=(src / "instruction.md").read_text(),
            metadata=metadata,
            workspace={},
            tests=_files(src / "tests"),
            solution=_files(src / "solution"),
        )
        copy_out_of_image(tag, workdir, stage / "task" / "workspace", engine)
        shutil.copytree(env_dir, stage / "task" / "environment", symlinks=True)
        (stage / "task" / IMPORT_RECORD).write_text(
            json.dumps(
                {"fingerprint": fingerprint, "importer_version": IMPORTER_VERSION, "image": tag}
            )
            + "\n"
        )
        old = None
        if final.exists():
            old = out_dir / f".{task_id}.old-{os.getpid()}"
            os.rename(final, old)
        os.rename(stage / "task", final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return load_task(final)


def _check_copy_sources(docker_text: str, env_dir: Path) -> None:
    """Every COPY / ADD source (not from another stage, not a URL) is in the build context."""
    for n, word, rest in dockerfile_steps(docker_text):
        if word not in ("COPY", "ADD") or "--from=" in rest:
            continue
        args = [a for a in _json_or_words(rest, f"Dockerfile line {n}") if not a.startswith("--")]
        for s in args[:-1]:
            if re.match(r"^[a-z]+://", s):
                continue
            if not list(env_dir.glob(s.lstrip("/"))) and not (env_dir / s).exists():
                raise UnsupportedTask(
                    "copy-source-missing", f"Dockerfile line {n}: {s} is not in environment/"
                )


# ---------------------------------------------------------------------- a batch


def harbor_task_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Task directories: each path is one (it has task.toml) or holds them (one level down)."""
    out = []
    for p in map(Path, paths):
        if (p / "task.toml").is_file() or not p.is_dir():
            out.append(p)
        else:
            out += sorted(d for d in p.iterdir() if (d / "task.toml").is_file())
    return out


def import_harbor_tasks(
    srcs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    log: Callable[[str], None] = print,
    **kwargs,
) -> list[ImportOutcome]:
    """Import every task; one that is refused or crashes is reported and skipped. A task that
    was imported before but is refused now is removed, so out_dir matches the report."""
    import time

    out_dir = Path(out_dir)
    outcomes = []
    for src in harbor_task_dirs(srcs):
        t0 = time.monotonic()
        before = _existing_record(src, out_dir)
        try:
            task = import_harbor(src, out_dir, **kwargs)
            after = json.loads((task.root / IMPORT_RECORD).read_text())
            status = "unchanged" if before == after else "imported"
            o = ImportOutcome(str(src), status, task.task_id)
        except UnsupportedTask as e:
            o = ImportOutcome(str(src), "refused", None, e.reason, e.detail)
        except Exception as e:  # noqa: BLE001 - one broken task never stops the batch
            tb = traceback.format_exc(limit=-3)
            o = ImportOutcome(str(src), "error", None, "error", f"{type(e).__name__}: {e}\n{tb}")
        if o.status in ("refused", "error"):
            stale = _stale_task(src, out_dir)
            if stale is not None:
                shutil.rmtree(stale, ignore_errors=True)
        o.seconds = round(time.monotonic() - t0, 2)
        outcomes.append(o)
        line = f"{o.status}\t{Path(o.src).name}"
        if o.reason:
            line += f"\t{o.reason}\t{(o.detail or '').splitlines()[0][:200]}"
        log(line)
    return outcomes


def _stale_task(src: Path, out_dir: Path) -> Path | None:
    try:
        config = tomllib.loads((src / "task.toml").read_text())
    except (OSError, ValueError):
        return None
    p = out_dir / _task_id(src, config)
    return p if (p / IMPORT_RECORD).is_file() else None


def _existing_record(src: Path, out_dir: Path) -> dict | None:
    """The import record (fingerprint; the image, for containers) of src's task, if any."""
    p = _stale_task(src, out_dir)
    try:
        return json.loads((p / IMPORT_RECORD).read_text()) if p else None
    except (OSError, ValueError):
        return None


def report(outcomes: Sequence[ImportOutcome]) -> dict:
    """Counts by status and by refusal reason (the table for BENCHMARKS.md)."""
    by_status: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for o in outcomes:
        by_status[o.status] = by_status.get(o.status, 0) + 1
        if o.reason:
            by_reason[o.reason] = by_reason.get(o.reason, 0) + 1
    return {
        "tasks": len(outcomes),
        "imported": by_status.get("imported", 0) + by_status.get("unchanged", 0),
        **{k: v for k, v in sorted(by_status.items())},
        "reasons": dict(sorted(by_reason.items(), key=lambda kv: -kv[1])),
    }
