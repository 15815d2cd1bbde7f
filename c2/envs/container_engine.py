"""The container engine as c2 drives it from the host: its client, its images, the flags that lock
every container down and bound it, what the kernel says about a running container, a client
started with descriptors to pass in, and the containers a killed run left behind.

What each flag is for, and how containers are run with them: container_run.py's module doc.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

from c2.envs.sandbox import SandboxError, SandboxLimits

LABEL = "c2.session"
# Every container's environment besides its image's: the package tools' network timeouts raised
# (uv's 30 s default fails wheels of a few MB through this machine's proxy under load).
SESSION_ENV = {"UV_HTTP_TIMEOUT": "300", "PIP_DEFAULT_TIMEOUT": "180"}
# Host uids 0..65535 of every container (podman) map onto USERNS_BASE.. on the host: outside
# the host's own users and /etc/subuid's usual ranges (100000.. per user).
USERNS_BASE = 1_879_048_192
USERNS_SIZE = 65536
# podman's default set less SETPCAP and SETFCAP (nothing measured needed them). Each one kept
# is needed: CHOWN, DAC_OVERRIDE, FOWNER (apt, dpkg, useradd), SETUID, SETGID (apt's _apt
# sandbox, su), FSETID (setgid files dpkg installs), KILL (stopping a service of another
# user), NET_BIND_SERVICE (a server on port 80), SYS_CHROOT (sshd's privilege separation).
CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
    "SYS_CHROOT",
)


def _conmon_cwd() -> str:
    """Where podman's conmon runs: it writes a file named `oom` into its working directory when
    a container process is OOM-killed, which must not land in the caller's (a checkout)."""
    path = Path(tempfile.gettempdir()) / "c2-conmon"
    path.mkdir(exist_ok=True)
    return str(path)


def engine_command(engine: str = "podman") -> list[str]:
    if engine not in ("podman", "docker"):
        raise SandboxError(f"engine={engine!r}: expected 'podman' or 'docker'")
    exe = shutil.which(engine)
    if exe is None:
        raise SandboxError(f"{engine} is not installed (Debian: apt-get install podman runc)")
    cmd = [exe]
    if engine == "podman" and shutil.which("runc"):
        cmd += ["--runtime", shutil.which("runc")]
    return cmd


def engine_available(engine: str = "podman") -> str | None:
    """None when `engine` can run containers here, else why not (for skips and errors)."""
    try:
        cmd = engine_command(engine)
    except SandboxError as e:
        return str(e)
    r = subprocess.run([*cmd, "info"], capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else f"`{engine} info` failed: {r.stderr.strip()[-300:]}"


def image_exists(tag: str, engine: str = "podman") -> bool:
    cmd = engine_command(engine)
    if engine == "podman":
        return subprocess.run([*cmd, "image", "exists", tag], capture_output=True).returncode == 0
    return subprocess.run([*cmd, "image", "inspect", tag], capture_output=True).returncode == 0


def image_id(tag: str, engine: str = "podman") -> str | None:
    """The id of local image `tag`; None when the engine has no such image or is not installed
    (it then has no images at all)."""
    if engine in ("podman", "docker") and shutil.which(engine) is None:
        return None
    r = subprocess.run(
        [*engine_command(engine), "image", "inspect", "-f", "{{.Id}}", tag],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def image_workdir(tag: str, engine: str = "podman") -> str:
    r = subprocess.run(
        [*engine_command(engine), "image", "inspect", "-f", "{{.Config.WorkingDir}}", tag],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip() or "/"


def _ulimits(limits: SandboxLimits) -> list[str]:
    """rlimits no higher than this process's own hard limits (raising them is refused)."""
    out = []
    for flag, res, want in (
        ("nofile", resource.RLIMIT_NOFILE, limits.max_open_files),
        ("nproc", resource.RLIMIT_NPROC, max(limits.max_processes, 1024)),
    ):
        hard = resource.getrlimit(res)[1]
        v = want if hard == resource.RLIM_INFINITY else min(want, hard)
        out += ["--ulimit", f"{flag}={v}:{v}"]
    return out


def _resources(limits: SandboxLimits) -> list[str]:
    argv = ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
    argv += ["--cpus", str(limits.cpus), "--pids-limit", str(limits.max_processes + 8)]
    return argv + _ulimits(limits)


def security_args(engine: str = "podman", network: bool = False) -> list[str]:
    """The lock-down of every container (container_run.py's module doc): user namespace,
    capabilities, network."""
    argv = ["--cap-drop=all", *(f"--cap-add={c}" for c in CAPABILITIES)]
    argv += ["--security-opt=no-new-privileges"]
    if engine == "podman":  # docker maps users daemon-wide (userns-remap), not per container
        m = f"0:{USERNS_BASE}:{USERNS_SIZE}"
        argv += ["--uidmap", m, "--gidmap", m]
    return argv + ([] if network else ["--network", "none"])


def _memory_cgroup(pid: int) -> tuple[Path, str] | None:
    """(directory, events file) of the memory cgroup of process `pid` (a container's init):
    cgroup v1's memory controller, else v2's unified hierarchy; None when unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    rows = [line.split(":", 2) for line in lines]
    for _, controllers, path in rows:
        if "memory" in controllers.split(","):
            return Path(f"/sys/fs/cgroup/memory{path}"), "memory.oom_control"
    for _, controllers, path in rows:
        if controllers == "":
            return Path(f"/sys/fs/cgroup{path}"), "memory.events"
    return None


def _oom_kills(pid: int) -> int | None:
    """The kernel's count of OOM kills in the container of init `pid`, or None."""
    cg = _memory_cgroup(pid)
    with contextlib.suppress(OSError, ValueError, TypeError):
        for row in (cg[0] / cg[1]).read_text().splitlines():
            key, _, value = row.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def _processes(pid: int) -> frozenset[int] | None:
    """Every process in the container of init `pid` (its cgroup's), or None when unreadable."""
    cg = _memory_cgroup(pid)
    with contextlib.suppress(OSError, ValueError, TypeError):
        return frozenset(int(x) for x in (cg[0] / "cgroup.procs").read_text().split())
    return None


def _popen_with_fds(argv, fds, **kwargs) -> subprocess.Popen:
    """`argv` started with `fds` as its descriptors 3, 4, ... (podman --preserve-fds passes
    those numbers on): a bash that moves them there (from copies at 10 and up, so no move
    overwrites another) and execs the podman client."""
    kwargs |= {"stdin": subprocess.DEVNULL, "cwd": _conmon_cwd()}
    if not fds:
        return subprocess.Popen(argv, **kwargs)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
    moves = " ".join(f"{3 + i}>&{fd} {fd}>&-" for i, fd in enumerate(high))
    try:
        return subprocess.Popen(
            ["bash", "-c", f'exec "$@" {moves}', "bash", *argv], pass_fds=high, **kwargs
        )
    finally:
        for fd in high:
            os.close(fd)


def collect_leftovers(engine: str = "podman") -> int:
    """Remove episode containers (label c2.session) whose workspace no longer exists: what a
    killed run left behind. Returns how many were removed."""
    cmd = engine_command(engine)
    fmt = '{{.Names}} {{index .Labels "' + LABEL + '"}}'
    r = subprocess.run(
        [*cmd, "ps", "-a", "--filter", f"label={LABEL}", "--format", fmt],
        capture_output=True,
        text=True,
    )
    gone = []
    for line in r.stdout.splitlines():
        name, _, ws = line.partition(" ")
        if name and not os.path.isdir(ws):
            gone.append(name)
    if gone:
        subprocess.run([*cmd, "rm", "-f", "-t", "0", *gone], capture_output=True)
    return len(gone)
