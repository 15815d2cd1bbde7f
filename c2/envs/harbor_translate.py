"""A Harbor task's files in c2's terms: test.sh rewritten, the Dockerfile as an offline build plan.

Harbor's standard test setup in tests/test.sh (apt-get curl, the uv installer, `uvx ... pytest`
or `pip install pytest`) becomes `pytest ARGS` from the task's cached environment; the
Dockerfile's steps become a BuildPlan (the working directory, what to COPY, the offline RUN steps,
the pip and apt packages); task.toml's resources and timeouts become metadata "limits" and
timeouts. Whatever cannot run offline here is refused with an `UnsupportedTask` whose `reason`
is a key of REASONS. The conversion of a whole task directory: harbor_import.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

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
