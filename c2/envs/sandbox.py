"""Run one command in a sandbox over a workspace directory (docs/recipe.md §3).

Every command gets: its own mount/pid/net/ipc/uts namespaces (bubblewrap), a read-only view of
only /usr and the Python runtime, a private /tmp, the workspace at `mount_at`, no network, an
unprivileged uid, limits on wall time, CPU, memory, processes, file size and output bytes, and
every process it started is gone when `run` returns. See isolation.py for the backends.

CLI (one JSON object on the last line):
  python -m c2.envs.sandbox --workdir DIR --timeout S --memory_mb M -- CMD [ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from c2.envs.cgroups import CgroupLimits
from c2.envs.isolation import (
    SANDBOX_UID,
    Isolation,
    probe,
    probe_report,
    python_runtime_paths,
    seccomp_filter,
)

# Order of precedence when naming the limit that stopped a command.
LIMITS = ("wall_time", "output", "memory", "cpu", "file_size", "processes", "disk")
_ETC_PASSWD = f"root:x:0:0:root:/root:/bin/sh\nnobody:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/sh\n"
_ETC_GROUP = f"root:x:0:\nnogroup:x:{SANDBOX_UID}:\n"
# What shells and Python print when RLIMIT_FSIZE stops a write (SIGXFSZ / EFBIG).
_FSIZE_MESSAGES = (b"File size limit exceeded", b"File too large")
_ETC_HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")


class SandboxError(RuntimeError):
    """The harness could not start a sandbox (never raised for what the command does)."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits. cpu_s=None means the wall-clock timeout times `cpus`."""

    timeout_s: float = 30.0
    memory_mb: int = 1024
    cpu_s: float | None = None
    cpus: float = 1.0
    max_processes: int = 64
    max_file_mb: int = 64
    max_open_files: int = 256
    max_output_bytes: int = 1 << 20
    tmp_mb: int = 64
    max_workspace_mb: int = 256

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and not (isinstance(v, int | float) and v > 0):
                raise ValueError(f"SandboxLimits.{f.name}={v!r}: expected a positive number")

    @property
    def cpu_limit_s(self) -> int:
        return math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s * self.cpus)


@dataclasses.dataclass
class SandboxResult:
    """What one sandboxed command did. exit_code is 128+N when signal N ended it; `limit` is
    the one of LIMITS that stopped it, `limits_hit` every one it ran into."""

    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str
    limit: str | None  # the limit that stopped the command, if any
    limits_hit: list[str]
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    first_output_s: float | None
    cpu_s: float | None
    memory_peak_mb: float | None
    isolation: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def _pipe_with(data: bytes) -> int:
    r, w = os.pipe()
    try:
        os.write(w, data)  # small (< one pipe buffer): never blocks
    finally:
        os.close(w)
    return r


def _dirs_for(path: str, made: set[str]) -> list[str]:
    """bwrap creates missing parents mode 0700: make them 0755 first so uid 65534 can pass."""
    out = []
    parts = Path(path).parent.parts[1:]
    for i in range(len(parts)):
        d = "/" + "/".join(parts[: i + 1])
        if d not in made:
            made.add(d)
            out += ["--perms", "0755", "--dir", d]
    return out


class Sandbox:
    """Runs commands in sandboxes; thread-safe, one instance serves a whole pool."""

    passes_fds = True  # run(pass_fds=...) hands descriptors to the command (grading_channel.py)

    @staticmethod
    def inner_fds(fds: Sequence[int]) -> tuple[int, ...]:
        """The numbers the command sees `run(pass_fds=fds)` under: the same."""
        return tuple(fds)

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        backend: str = "auto",
        runtime_paths: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
    ):
        self.limits = limits or SandboxLimits()
        self.isolation: Isolation = probe(backend)
        self.runtime_paths = list(runtime_paths or python_runtime_paths())
        self._base_runtime = [p for p in self.runtime_paths if not _is_venv(p)]
        venv_bin = os.path.join(sys.prefix, "bin")
        self.env = {
            "PATH": f"{venv_bin}:{_SYSTEM_PATH}",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        self._seccomp = seccomp_filter() if self.isolation.seccomp else None
        self._dash = shutil.which("dash", path="/usr/bin:/bin")

    @property
    def isolated(self) -> bool:
        """True when commands get namespaces (a filesystem and network sandbox)."""
        return self.isolation.backend != "rlimit"

    def give_workspace(self, path: str | os.PathLike) -> None:
        """Hand a directory tree to the sandbox's host uid (needed for writes as uid 65534)."""
        uid = self.isolation.host_uid
        if uid == os.geteuid():
            return
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(root, name), uid, uid)
        os.lchown(path, uid, uid)

    # ---------------------------------------------------------------- command line assembly

    def _runtime(self, python_env: str | None) -> list[str]:
        """What is mounted for Python: c2's environment, or a task's (and its base interpreter)."""
        if python_env is None:
            return self.runtime_paths
        return [python_env, *(p for p in self._base_runtime if p != python_env)]

    def _bwrap_args(
        self, workdir, mount_at, readonly, binds, env, limits, fds, python_env=None
    ) -> list[str]:
        iso = self.isolation
        a = [iso.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
        if iso.backend == "bwrap-root":
            # Keep only what setpriv needs to drop to the sandbox uid (and bwrap to chdir into a
            # 0700 workspace owned by that uid); setpriv clears them all before the command.
            a += ["--cap-drop", "ALL"]
            keep = ("SETUID", "SETGID", "SETPCAP", "DAC_READ_SEARCH")
            a += [x for c in keep for x in ("--cap-add", f"CAP_{c}")]
        else:
            a += ["--unshare-user", "--disable-userns"]
            if iso.inner_uid is not None:
                a += ["--uid", str(iso.inner_uid), "--gid", str(iso.inner_uid)]
        if self._seccomp is not None:
            fds.append(_pipe_with(self._seccomp))
            a += ["--seccomp", str(fds[-1])]
        a += ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = f"/{top}"
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                a += ["--ro-bind", p, p]
        for name in _ETC_FILES:
            a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name, text in (("passwd", _ETC_PASSWD), ("group", _ETC_GROUP)):
            fds.append(_pipe_with(text.encode()))
            a += ["--perms", "0644", "--ro-bind-data", str(fds[-1]), f"/etc/{name}"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        a += ["--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
        a += ["--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm"]
        # The runtime after the private /tmp: a venv that lives under the host's /tmp stays visible.
        made = {"/usr", "/etc", "/tmp", "/dev", "/proc"}
        # A private /etc/hosts: localhost resolves (servers and torch.distributed bind to it).
        fds.append(_pipe_with(_ETC_HOSTS.encode()))
        a += ["--perms", "0644", "--ro-bind-data", str(fds[-1]), "/etc/hosts"]
        for p in self._runtime(python_env):
            a += [*_dirs_for(p, made), "--ro-bind", p, p]
            made.add(p)
        a += [*_dirs_for(mount_at, made), "--ro-bind" if readonly else "--bind", workdir, mount_at]
        for src, dst, writable in binds:
            a += [*_dirs_for(dst, made), "--bind" if writable else "--ro-bind", str(src), dst]
        a += ["--chdir", mount_at, "--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a.append("--")
        if iso.backend == "bwrap-root":
            uid = str(iso.host_uid)
            a += [iso.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            a += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        return a

    def _argv(
        self, command, workdir, mount_at, readonly, binds, env, limits, cgroup, fds, python_env=None
    ):
        """wrapper (join the cgroup, set rlimits) -> [bwrap ... -> setpriv ->] command."""
        cpu = limits.cpu_limit_s
        rl = {"cpu": (cpu, cpu + 1), "core": 0, "fsize": limits.max_file_mb << 20}
        rl["nofile"] = limits.max_open_files
        if cgroup is None:  # without a cgroup: weaker per-uid / per-process stand-ins
            rl["nproc"], rl["as"] = limits.max_processes, limits.memory_mb << 20
        if isinstance(command, str):
            command = ["/bin/bash", "-c", command]
        if self.isolated:
            inner = self._bwrap_args(
                workdir, mount_at, readonly, binds, env, limits, fds, python_env
            )
        else:
            inner = []
            if self.isolation.host_uid != os.geteuid():
                inner = [self.isolation.setpriv, f"--reuid={self.isolation.host_uid}", "--"]
        return self._wrapper(rl, cgroup) + inner + list(command)

    def _wrapper(self, rl, cgroup) -> list[str]:
        """One dash process joins the cgroup and sets rlimits (prlimit where dash is missing)."""
        procs = cgroup.procs_files if cgroup is not None else []
        join = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 > "$1" || exit 125; shift; '
        join += "n=$((n-1)); done; "
        if self._dash is not None:
            letters = {"cpu": "t", "core": "c", "fsize": "f", "nofile": "n", "nproc": "p"}
            letters["as"] = "v"
            units = {"fsize": 512, "as": 1024}  # dash counts 512-byte blocks and KiB
            sets = []
            for name, value in rl.items():
                soft, hard = value if isinstance(value, tuple) else (value, value)
                u = units.get(name, 1)
                sets.append(f"ulimit -S -{letters[name]} {soft // u}")
                sets.append(f"ulimit -H -{letters[name]} {hard // u}")
            script = join + " && ".join(sets) + ' || exit 125; exec "$@"'
            return [self._dash, "-c", script, "sh", str(len(procs)), *procs]
        pl = [self.isolation.prlimit]
        for name, value in rl.items():
            soft, hard = value if isinstance(value, tuple) else (value, value)
            pl.append(f"--{name}={soft}:{hard}")
        pl.append("--")
        if not procs:
            return pl
        return ["/bin/sh", "-c", join + 'exec "$@"', "sh", str(len(procs)), *procs, *pl]

    # ---------------------------------------------------------------- running

    def run(
        self,
        command: str | Sequence[str],
        workdir: str | os.PathLike,
        *,
        limits: SandboxLimits | None = None,
        mount_at: str = "/workspace",
        readonly: bool = False,
        binds: Sequence[tuple[str | os.PathLike, str, bool]] = (),
        env: dict[str, str] | None = None,
        python_env: str | os.PathLike | None = None,
        pass_fds: Sequence[int] = (),
    ) -> SandboxResult:
        """Run `command` (argv list, or a string for bash -c) over `workdir`, mounted at
        `mount_at`. `binds` are extra (host path, sandbox path, writable) mounts. `python_env` is a
        task's environment (envcache.ensure_env): mounted read-only and first on PATH in place of
        c2's own, which the command then cannot see. `pass_fds`: the caller's descriptors, open
        in the command under the same numbers (bwrap's pid 1 closes its copies); the caller
        keeps and closes them."""
        limits = limits or self.limits
        for fd in pass_fds:
            try:
                os.fstat(fd)
            except (OSError, TypeError) as e:
                raise SandboxError(f"pass_fds: {fd!r} is not an open descriptor ({e})") from e
        workdir = Path(workdir)
        if not workdir.is_dir():
            raise SandboxError(f"workdir={str(workdir)!r}: expected an existing directory")
        workdir = workdir.resolve()
        if python_env is not None:
            python_env = os.path.realpath(python_env)
            if not os.path.isfile(os.path.join(python_env, "pyvenv.cfg")):
                raise SandboxError(f"python_env={python_env!r}: not a virtual environment")
        clash = [p for p in self._runtime(python_env) if _nested(p, mount_at)]
        if self.isolated and (clash or _nested("/usr", mount_at) or mount_at in ("/", "/etc")):
            raise SandboxError(f"mount_at={mount_at!r} would cover the runtime {clash or '/usr'}")
        if not self.isolated and binds:
            raise SandboxError(
                f"binds={list(binds)!r}: the {self.isolation.backend!r} backend cannot mount "
                "paths; install bubblewrap (Debian package `bubblewrap`)"
            )
        if not readonly and workdir.stat().st_uid != self.isolation.host_uid:
            raise SandboxError(
                f"workdir={str(workdir)!r} is owned by uid {workdir.stat().st_uid} but sandboxed "
                f"commands run as uid {self.isolation.host_uid}: call Sandbox.give_workspace first"
            )
        full_env = {**self.env, **(env or {})}
        if python_env is not None:
            full_env["PATH"] = f"{python_env}/bin:{_SYSTEM_PATH}"
            full_env["VIRTUAL_ENV"] = python_env
        cgroups = self.isolation.cgroups
        cgroup = None
        if cgroups is not None:
            # +3: the wrapper, bwrap and bwrap's pid 1 live in the cgroup too.
            cg_limits = CgroupLimits(limits.memory_mb << 20, limits.max_processes + 3, limits.cpus)
            try:
                cgroup = cgroups.create(cg_limits)
            except OSError as e:
                raise SandboxError(f"could not create the sandbox's cgroup: {e}") from e
        fds: list[int] = []
        try:
            argv = self._argv(
                command,
                str(workdir),
                mount_at,
                readonly,
                binds,
                full_env,
                limits,
                cgroup,
                fds,
                python_env,
            )
            return self._execute(
                argv, workdir, limits, cgroup, fds, full_env, readonly, tuple(pass_fds)
            )
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if cgroup is not None:
                try:
                    cgroup.remove()
                except OSError as e:  # a leftover directory is cleaned up by a later probe
                    logging.getLogger(__name__).warning("cgroup %s not removed: %s", cgroup.name, e)

    def _execute(
        self, argv, workdir, limits, cgroup, fds, env, readonly, pass_fds=()
    ) -> SandboxResult:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[*fds, *pass_fds],
                cwd=None if self.isolated else workdir,
                env=None if self.isolated else env,
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"could not start the sandbox ({argv[0]}): {e}") from e
        for fd in fds:  # the child holds its copies; ours must not keep the pipes alive
            os.close(fd)
        fds.clear()
        out, err, first, timed_out, overflow = self._collect(proc, limits, t0)
        if timed_out or overflow:
            self._kill(proc, cgroup)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill(proc, cgroup)
            proc.wait()
        if cgroup is not None:
            cgroup.kill_all()  # normally already empty: the pid namespace died with bwrap
        elif self.isolated is False:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        wall = time.monotonic() - t0
        rc = proc.returncode
        rc = 128 - rc if rc is not None and rc < 0 else rc
        sig = rc - 128 if rc is not None and 128 < rc <= 128 + 64 else None
        stats = cgroup.stats() if cgroup is not None else None
        cpu_s = stats.cpu_s if stats is not None else None
        hit = []
        if timed_out:
            hit.append("wall_time")
        if overflow:
            hit.append("output")
        stderr_tail = err[-4096:]
        if (stats and stats.oom_kills) or (
            stats is None and (b"MemoryError" in stderr_tail or b"Cannot allocate" in stderr_tail)
        ):
            hit.append("memory")
        if sig == signal.SIGXCPU or (
            sig == signal.SIGKILL and cpu_s is not None and cpu_s >= 0.95 * limits.cpu_limit_s
        ):
            hit.append("cpu")
        if sig == signal.SIGXFSZ or any(m in stderr_tail for m in _FSIZE_MESSAGES):
            hit.append("file_size")
        if stats and stats.pids_limit_hits:
            hit.append("processes")
        if not readonly and _tree_bytes(workdir) > limits.max_workspace_mb << 20:
            hit.append("disk")
        cap = limits.max_output_bytes
        return SandboxResult(
            exit_code=rc,
            timed_out=timed_out,
            stdout=bytes(out[:cap]).decode("utf-8", "replace"),
            stderr=bytes(err[: max(0, cap - min(len(out), cap))]).decode("utf-8", "replace"),
            limit=next((x for x in LIMITS if x in hit), None),
            limits_hit=hit,
            stdout_truncated=len(out) > cap or overflow,
            stderr_truncated=len(out) + len(err) > cap or overflow,
            wall_s=wall,
            first_output_s=first,
            cpu_s=cpu_s,
            memory_peak_mb=(stats.memory_peak_bytes / 2**20)
            if stats and stats.memory_peak_bytes is not None
            else None,
            isolation=self.isolation.describe(),
        )

    def _collect(self, proc, limits, t0):
        """Read both pipes until EOF, the deadline, or the output bound."""
        bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        sel = selectors.DefaultSelector()
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        deadline = t0 + limits.timeout_s
        first, total, timed_out, overflow = None, 0, False, False
        # Without a pid namespace an orphan can hold the pipes open: stop when the command ends.
        poll = None if self.isolated else 0.05
        try:
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                events = sel.select(remaining if poll is None else min(remaining, poll))
                for key, _ in events:
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    if first is None:
                        first = time.monotonic() - t0
                    total += len(chunk)
                    room = limits.max_output_bytes + 1 - len(bufs[key.fd])
                    bufs[key.fd] += chunk[: max(0, room)]
                if total > limits.max_output_bytes:
                    overflow = True
                    break
                if poll is not None and not events and proc.poll() is not None:
                    break
        finally:
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        out, err = bufs.values()
        return out, err, first, timed_out, overflow

    def _kill(self, proc, cgroup) -> None:
        if cgroup is not None:
            cgroup.kill_all()
        victims = []
        with contextlib.suppress(psutil.Error):
            victims = psutil.Process(proc.pid).children(recursive=True)
        for p in [proc, *victims]:
            with contextlib.suppress(ProcessLookupError, psutil.Error):
                p.kill()  # bwrap's pid 1 dying takes its whole pid namespace with it
        if not self.isolated:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _is_venv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _nested(a: str, b: str) -> bool:
    """Whether one of two absolute paths is the other or inside it."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c2.envs.sandbox",
        description="Run CMD in a sandbox over DIR; print one JSON result as the last line. "
        "When commands run as another uid (root with bubblewrap: uid 65534), DIR is handed to it.",
    )
    parser.add_argument("--probe", action="store_true", help="print what isolation works here")
    parser.add_argument("--workdir", help="the workspace, mounted at --mount_at")
    parser.add_argument("--timeout", type=float, default=30.0, help="wall-clock seconds")
    parser.add_argument("--memory_mb", type=int, default=1024)
    parser.add_argument("--cpu_s", type=float, default=None, help="CPU seconds (default: timeout)")
    parser.add_argument("--max_processes", type=int, default=64)
    parser.add_argument("--max_output_bytes", type=int, default=1 << 20)
    parser.add_argument("--max_file_mb", type=int, default=64)
    parser.add_argument("--mount_at", default="/workspace")
    parser.add_argument("--readonly", action="store_true", help="mount the workspace read-only")
    parser.add_argument("--backend", default="auto", help="auto|bwrap-root|bwrap-userns|rlimit")
    parser.add_argument("command", nargs="*", help="the command (after --)")
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe_report()))
        return 0
    if not args.workdir or not args.command:
        parser.error("--workdir DIR and a command (after --) are required")
    try:
        limits = SandboxLimits(
            timeout_s=args.timeout,
            memory_mb=args.memory_mb,
            cpu_s=args.cpu_s,
            max_processes=args.max_processes,
            max_output_bytes=args.max_output_bytes,
            max_file_mb=args.max_file_mb,
        )
        sandbox = Sandbox(limits, backend=args.backend)
        if not args.readonly and os.path.isdir(args.workdir):
            sandbox.give_workspace(args.workdir)
        result = sandbox.run(
            args.command, args.workdir, mount_at=args.mount_at, readonly=args.readonly
        )
    except (ValueError, SandboxError, RuntimeError) as e:
        parser.error(str(e))
    print(result.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
