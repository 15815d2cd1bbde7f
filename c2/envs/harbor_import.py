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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import tomllib
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from c2.envs.sandbox import SandboxError
from c2.envs.tasks import Task, load_task, write_task

IMPORTER_VERSION = 2
IMPORT_RECORD = "harbor-import.json"
# Refusal reasons (UnsupportedTask.reason), in the order the report lists them.
REASONS = {
    "missing-file": "the task directory lacks instruction.md, task.toml or tests/test.sh",
    "unreadable": "task.toml or the Dockerfile cannot be parsed",
    "multi-stage": "a multi-stage Docker build (COPY --from, several FROM)",
    "copy-outside-workdir": "the Dockerfile puts files outside the working directory",
    "copy-source-missing": "a COPY source is missing from environment/ (e.g. a large file "
    "absent from this checkout)",
    "download": "downloads at build or test time (curl, wget, git clone, ADD <url>)",
    "apt": "apt packages this machine does not have",
    "pip-local": "installs a local path or requirement file with pip",
    "other-installer": "installs with something other than apt or pip (npm, cargo, conda, ...)",
    "env-build-failed": "pip could not build the task's Python environment",
    "build-failed": "a Dockerfile RUN step failed in the offline sandbox",
    "base-image": "(container backend) a FROM image with no local base and no registry",
    "image-build-failed": "(container backend) building the task's Dockerfile failed",
    "workdir": "(container backend) the image's working directory is / or a system directory",
    "error": "the importer hit an unexpected error (a bug: the message has the traceback)",
}
BACKENDS = ("bwrap", "podman", "docker")
_IGNORED_STEPS = {"ENV", "ARG", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "USER", "SHELL"}
_IGNORED_STEPS |= {"VOLUME", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD", "MAINTAINER"}
_DOWNLOAD = re.compile(
    r"\b(curl|wget|aria2c)\b|\bgit\s+(clone|fetch|pull|submodule)\b|\b(https?|ftp)://"
)
_OTHER_INSTALLER = re.compile(
    r"^(npm|yarn|pnpm|cargo|conda|mamba|gem|go|opam|cpan|cpanm|Rscript|R|apk|yum|dnf)$"
)
_PIP_FLAGS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint"}
_PIP_FLAGS_WITH_VALUE |= {"--target", "-t", "--prefix", "--root", "--python"}


class UnsupportedTask(ValueError):
    """A task this importer cannot run offline; `reason` is a key of REASONS, the message says
    what exactly."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclasses.dataclass
class ImportOutcome:
    src: str
    status: str  # "imported", "unchanged", "refused", "error"
    task_id: str | None = None
    reason: str | None = None  # for "refused" / "error": a key of REASONS
    detail: str | None = None
    seconds: float = 0.0


# ---------------------------------------------------------------------- shell lines


def split_shell(text: str) -> list[tuple[str, str]]:
    """Split a shell command at top-level `&&` and `;` (outside quotes): [(segment, separator
    before it)]. Never raises: unbalanced quotes leave the rest in one segment."""
    segs: list[tuple[str, str]] = []
    cur, sep, quote, i = [], "", None, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"' and i + 1 < len(text):
                cur.append(text[i : i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif text.startswith("&&", i) or c == ";" or c == "\n":
            segs.append(("".join(cur).strip(), sep))
            sep = "&&" if c == "&" else ";"
            cur = []
            i += 2 if c == "&" else 1
            continue
        cur.append(c)
        i += 1
    segs.append(("".join(cur).strip(), sep))
    return [(s, sep) for s, sep in segs if s]


def _words(segment: str) -> list[str] | None:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:  # e.g. "No closing quotation": the segment is kept as shell text
        return None


def _strip_assignments(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    if words[i : i + 1] == ["sudo"]:
        i += 1
    return words[i:]


def _pip_args(args: list[str], where: str) -> list[str]:
    """The requirements of `pip install ARGS` (flags dropped; pip itself never pinned)."""
    reqs, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in _PIP_FLAGS_WITH_VALUE:
            skip = True
        elif a in ("-r", "--requirement", "-e", "--editable") or (
            not a.startswith("-") and (a.startswith((".", "/")) or a.endswith((".txt", ".whl")))
        ):
            raise UnsupportedTask("pip-local", f"{where}: pip installs a local path: {a}")
        elif not a.startswith("-") and _req_name(a) != "pip":
            reqs.append(a)
    return reqs


def _req_name(req: str) -> str:
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
    return re.sub(r"[-_.]+", "-", m.group(0)).lower() if m else req


def classify(segment: str, where: str) -> tuple[str, list[str]]:
    """What one shell segment does: ("drop", []) apt bookkeeping and the uv installer;
    ("apt", packages); ("pip", requirements); ("keep", []) anything else, to be run as it is.
    Raises UnsupportedTask for downloads and other package managers."""
    words = _words(segment)
    if words is None:
        if _DOWNLOAD.search(segment):
            raise UnsupportedTask("download", f"{where}: downloads: {segment[:200]}")
        return "keep", []
    words = _strip_assignments(words)
    if not words:
        return "drop", []
    cmd, args = words[0], words[1:]
    if re.search(r"astral\.sh/uv/[^ ]*install\.sh", segment) or (
        cmd in ("source", ".") and args[:1] == ["$HOME/.local/bin/env"]
    ):
        return "drop", []  # the uv installer: uv and uvx are replaced by the task's environment
    if cmd in ("apt-get", "apt", "aptitude"):
        verb = next((a for a in args if not a.startswith("-")), "")
        if verb in ("update", "clean", "autoclean", "autoremove", "upgrade", "dist-upgrade"):
            return "drop", []
        if verb == "install":
            pkgs = [a.split("=")[0] for a in args if not a.startswith("-") and a != "install"]
            return "apt", pkgs
        raise UnsupportedTask("apt", f"{where}: apt {verb}: {segment[:200]}")
    if cmd == "rm" and all(a.startswith("-") or a.startswith("/var/lib/apt/") for a in args):
        return "drop", []
    if cmd == "debconf-set-selections" or (cmd == "echo" and "debconf" in segment):
        return "drop", []
    pip = None
    if re.fullmatch(r"pip3?(\.\d+)?", cmd) and args[:1] == ["install"]:
        pip = args[1:]
    elif re.fullmatch(r"python3?(\.\d+)?", cmd) and args[:3] == ["-m", "pip", "install"]:
        pip = args[3:]
    elif cmd == "uv" and args[:2] == ["pip", "install"]:
        pip = args[2:]
    if pip is not None:
        return "pip", _pip_args(pip, where)
    if cmd == "uv" and args[:1] == ["venv"] or cmd in ("source", ".") and "activate" in segment:
        return "drop", []  # a private venv for the tests: the task's environment is that venv
    if _DOWNLOAD.search(segment):
        raise UnsupportedTask("download", f"{where}: downloads: {segment[:200]}")
    if _OTHER_INSTALLER.match(cmd) and any(a in ("install", "i", "ci", "add", "get") for a in args):
        raise UnsupportedTask("other-installer", f"{where}: {segment[:200]}")
    return "keep", []


def _uvx(words: list[str]) -> tuple[list[str], list[str]]:
    """`uvx [-p V] [-w REQ]... [--from REQ] CMD ARGS` -> (requirements, [CMD, ARGS...])."""
    reqs, i = [], 1
    while i < len(words) and words[i].startswith("-"):
        flag = words[i]
        if flag in ("-w", "--with", "--from"):
            reqs.append(words[i + 1])
        if flag in ("-w", "--with", "--from", "-p", "--python", "--index-url"):
            i += 1
        i += 1
    return reqs, words[i:]


# ---------------------------------------------------------------------- the machine's packages

_HOST_PACKAGES: set[str] | None = None


def host_apt_packages() -> set[str]:
    """Debian packages installed on this machine (the sandbox sees its /usr)."""
    global _HOST_PACKAGES
    if _HOST_PACKAGES is None:
        try:
            out = subprocess.run(
                ["dpkg-query", "-W", "-f", "${Package} ${Status} ${Provides}\\n"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        pkgs = set()
        for line in out.splitlines():
            name, _, rest = line.partition(" ")
            if "install ok installed" in rest:
                pkgs.add(name.split(":")[0])
                provides = rest.split("installed", 1)[1]
                pkgs |= {p.strip().split(" ")[0] for p in provides.split(",") if p.strip()}
        _HOST_PACKAGES = pkgs
    return _HOST_PACKAGES


# ---------------------------------------------------------------------- test.sh


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def rewrite_test_sh(text: str, *, have: Callable[[str], bool]) -> tuple[str, list[str], list[str]]:
    """Harbor's test.sh without its setup: (script, requirements, apt packages it needs). The uvx
    line becomes its command, run from the task's environment; installs are dropped and their
    packages returned. Raises UnsupportedTask for downloads, other installers, missing apt."""
    out, reqs, apt = [], [], []
    for n, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            out.append(line)
            continue
        where = f"tests/test.sh line {n}"
        words = _words(stripped)
        if words and _strip_assignments(words)[:1] == ["uvx"]:
            r, cmd = _uvx(_strip_assignments(words))
            reqs += r
            out.append(shlex.join(cmd))
            continue
        if words and words[:2] == ["uv", "run"]:
            out.append(shlex.join(words[2:]))
            continue
        kept, segs = [], split_shell(stripped)
        for seg, sep in segs:
            kind, items = classify(seg, where)
            if kind == "pip":
                reqs += items
            elif kind == "apt":
                apt += items
            elif kind == "keep":
                kept.append(f"{sep} {seg}" if kept and sep else seg)
        if len(kept) == len(segs):
            out.append(line)  # nothing to take out: the line as it was
        elif kept:
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + " ".join(kept))
    missing = sorted({p for p in apt if not have(p)})
    if missing:
        raise UnsupportedTask(
            "apt", f"tests/test.sh installs apt packages this machine lacks: {' '.join(missing)}"
        )
    return "\n".join(out) + "\n", reqs, apt


# ---------------------------------------------------------------------- Dockerfile


def dockerfile_steps(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, rest) with continuations joined and comments dropped."""
    steps, buf, start = [], None, 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if buf is None:
            if not line or line.startswith("#"):
                continue
            start, buf = n, ""
        elif not line or line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1]  # Docker joins continued lines without the newline
            continue
        buf += raw
        word, _, rest = buf.strip().partition(" ")
        steps.append((start, word.upper(), rest.strip()))
        buf = None
    if buf is not None and buf.strip():
        word, _, rest = buf.strip().partition(" ")
        steps.append((start, word.upper(), rest.strip()))
    return steps


def _json_or_words(rest: str, where: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        except ValueError:
            pass
    words = _words(rest.replace("\n", " "))
    if words is None:
        raise UnsupportedTask("unreadable", f"{where}: cannot parse {rest[:120]!r}")
    return words


@dataclasses.dataclass
class BuildPlan:
    """What the Dockerfile asks for, in order: ("copy", (sources, dest, workdir)) and
    ("run", (command, workdir)) steps, the final working directory and what it installs."""

    root: str
    base_image: str | None
    steps: list[tuple[int, str, tuple]]
    requirements: list[str]
    apt: list[str]


def plan_dockerfile(text: str, env_dir: Path, *, have: Callable[[str], bool]) -> BuildPlan:
    steps = dockerfile_steps(text)
    froms = [s for s in steps if s[1] == "FROM"]
    if len(froms) > 1 or any(s[1] == "COPY" and "--from=" in s[2] for s in steps):
        raise UnsupportedTask("multi-stage", f"Dockerfile line {froms[-1][0]}: multi-stage build")
    base = froms[0][2].split()[0] if froms else None
    workdirs, cur = [], "/"
    for _, word, rest in steps:
        if word == "WORKDIR":
            d = _json_or_words(rest, "WORKDIR")[0]
            cur = os.path.normpath(d if d.startswith("/") else f"{cur}/{d}")
            workdirs.append(cur)
    workdirs = workdirs or ["/app"]
    root = min(workdirs, key=len)
    if root == "/" or any(not _under(w, root) for w in workdirs):
        raise UnsupportedTask(
            "copy-outside-workdir", f"Dockerfile WORKDIRs {workdirs} share no working directory"
        )
    plan = BuildPlan(root, base, [], [], [])
    cur = root
    for n, word, rest in steps:
        where = f"Dockerfile line {n}"
        if word == "FROM" or word in _IGNORED_STEPS:
            continue
        if word == "WORKDIR":
            d = _json_or_words(rest, where)[0]
            cur = os.path.normpath(d if d.startswith("/") else f"{cur}/{d}")
        elif word in ("COPY", "ADD"):
            args = [a for a in _json_or_words(rest, where) if not a.startswith("--")]
            if len(args) < 2:
                raise UnsupportedTask("unreadable", f"{where}: {word} {rest}")
            *sources, dest = args
            full = dest if dest.startswith("/") else f"{cur}/{dest}"
            if not _under(os.path.normpath(full), root):
                raise UnsupportedTask(
                    "copy-outside-workdir", f"{where}: {word} to {dest} is outside {root}"
                )
            for s in sources:
                if re.match(r"^[a-z]+://", s):
                    raise UnsupportedTask("download", f"{where}: ADD from a URL ({s})")
                origin = (env_dir / s).resolve()
                if not origin.is_relative_to(env_dir.resolve()):
                    raise UnsupportedTask("copy-outside-workdir", f"{where}: source {s} escapes")
                if not origin.exists():
                    raise UnsupportedTask(
                        "copy-source-missing", f"{where}: {s} is not in environment/"
                    )
                if word == "ADD" and origin.is_file() and re.search(r"\.(tar|tgz|gz|xz)", s):
                    raise UnsupportedTask("unreadable", f"{where}: ADD of an archive ({s})")
            plan.steps.append((n, "copy", (sources, full, dest)))
        elif word == "RUN":
            cmd = rest
            if rest.startswith("["):
                cmd = shlex.join(_json_or_words(rest, where))
            kept, segs = [], split_shell(cmd)
            for seg, sep in segs:
                kind, items = classify(seg, where)
                if kind == "pip":
                    plan.requirements += items
                elif kind == "apt":
                    plan.apt += items
                elif kind == "keep":
                    kept.append(f"{sep} {seg}" if kept and sep else seg)
            if kept:
                command = cmd if len(kept) == len(segs) else " ".join(kept)
                plan.steps.append((n, "run", (command, cur)))
        else:
            raise UnsupportedTask("unreadable", f"{where}: unknown instruction {word}")
    missing = sorted({p for p in plan.apt if not have(p)})
    if missing:
        raise UnsupportedTask(
            "apt", f"Dockerfile installs apt packages this machine lacks: {' '.join(missing)}"
        )
    return plan


def _under(path: str, root: str) -> bool:
    return (path.rstrip("/") + "/").startswith(root.rstrip("/") + "/")


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


# ---------------------------------------------------------------------- task.toml


def _size_mb(value) -> int | None:
    if isinstance(value, int | float):
        return int(value)
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)i?B?\s*", str(value), re.I)
    if not m:
        return None
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
    return max(1, int(float(m.group(1)) * scale[m.group(2).upper()]))


def task_limits(config: dict) -> dict:
    """metadata "limits" (SandboxLimits fields) and timeouts from task.toml."""
    env = config.get("environment", {})
    limits: dict = {"max_processes": 512, "max_open_files": 4096, "tmp_mb": 1024}
    memory = _size_mb(env["memory"]) if "memory" in env else env.get("memory_mb")
    storage = _size_mb(env["storage"]) if "storage" in env else env.get("storage_mb")
    if memory:
        limits["memory_mb"] = int(memory)
    if env.get("cpus"):
        limits["cpus"] = float(env["cpus"])
    if storage:
        limits["max_workspace_mb"] = int(storage)
        limits["max_file_mb"] = int(storage)
    return {
        "limits": limits,
        "test_timeout_s": float(config.get("verifier", {}).get("timeout_sec", 120)),
        "agent_timeout_s": float(config.get("agent", {}).get("timeout_sec", 600)),
        "build_timeout_s": float(env.get("build_timeout_sec", 600)),
    }


def allow_internet(config: dict) -> bool:
    """Whether the task's containers get a network: task.toml's `[environment]
    allow_internet`, true when absent (Harbor's default)."""
    value = config.get("environment", {}).get("allow_internet", True)
    if not isinstance(value, bool):
        raise UnsupportedTask(
            "unreadable", f"task.toml [environment] allow_internet={value!r}: expected true/false"
        )
    return value


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
