"""Running commands in containers: one container per episode, grading's fresh ones, the verifier's
restart. The engine's client, images and flags, and its cgroup readings: container_engine.py.

Every container c2 starts is locked down like the bubblewrap sandbox beside it:
- a user namespace (podman: `--uidmap 0:USERNS_BASE:USERNS_SIZE`, the same for every container,
  so one uid owns each workspace, as 65534 does for the sandbox): container root is host uid
  USERNS_BASE, which cannot write a host file it was not given (`give_workspace`) nor read a
  root-only one;
- `--cap-drop=all` plus CAPABILITIES (what apt, dpkg, useradd, su and a server on port 80
  need, measured one capability at a time), and `no-new-privileges`;
- the task's memory (swap included), cpus, process and file-descriptor limits;
- no network (`--network none`) unless the task allows it (Harbor: task.toml's
  `[environment] allow_internet`, true unless a task says otherwise, as in Harbor);
- a quota on what the container writes to its own filesystem (its writable layer): the storage
  driver here (overlay on ext4) has no `--storage-opt size=`, so the layer is measured while
  a command runs (every QUOTA_POLL_S) and after it; past the quota the command is stopped, its
  container restarted (every process ends) and the limit named "disk", as for the workspace.
An episode's container keeps its root filesystem writable within that quota: Harbor's solutions
and test scripts install packages into the image (apt, pip, uv), so a read-only root would fail
them (its verifier's restart too: test.sh installs its own tools). Grading's fresh containers
(`readonly` runs: the pytest and functions graders) write nothing but scratch: a read-only root
(`--read-only`), the workspace and binds mounted read-only, a private /tmp and /dev/shm of
tmp_mb each, as in the bubblewrap sandbox (and podman's own /dev, 64 MiB). So workspace code the
hidden tests call cannot plant a module in /grading or the image's standard library for the
trusted grader to import.

Memory kills are read from the kernel, never guessed from an exit status: the oom_kill count of
the container's memory cgroup (memory.oom_control on cgroup v1, memory.events on v2) before
and after the command: per command, where `podman inspect`'s `State.OOMKilled` is per container
(and podman 4.3 with runc on cgroup v1 leaves it false after a kill: measured). An agent's own
`kill -9 $$` is no memory limit.

Grading's pipes (`run(pass_fds=...)`, grading_channel.py) go in with podman's --preserve-fds
(as descriptors 3, 4, ...; docker has no such option and is refused), to a read-only run only:
a fresh container, the command exec'd with no `timeout` above it (which would hold them where
any process of the container could reopen them), the host stopping it at the time limit.

The verifier (`run_verifier`; grading's Harbor test.sh) runs in the episode's container
restarted: the restart ends every process the agent left (servers included), its filesystem
stays (what the agent installed, as Harbor's tests expect). /tests and an empty /logs/verifier
are copied in, the test script runs, then the container is stopped (every process of it dead)
and only then is /logs/verifier copied out for the grader to read. Where the container's cgroup
holds only the init and sleep it started with (nothing else is alive, and those two start
nothing), there is nothing to end: the restart, or the stop, is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from c2.envs.container_engine import (  # noqa: F401 - the engine's names, importable from here too
    CAPABILITIES,
    LABEL,
    SESSION_ENV,
    USERNS_BASE,
    USERNS_SIZE,
    _conmon_cwd,
    _oom_kills,
    _popen_with_fds,
    _processes,
    _resources,
    _ulimits,
    collect_leftovers,
    engine_available,
    engine_command,
    image_exists,
    image_id,
    image_workdir,
    security_args,
)
from c2.envs.sandbox import SandboxError, SandboxLimits, SandboxResult, _tree_bytes

QUOTA_POLL_S = 2.0


@dataclasses.dataclass(frozen=True)
class _Isolation:
    backend: str
    host_uid: int = dataclasses.field(default_factory=os.geteuid)

    def describe(self) -> str:
        return f"{self.backend} containers"


@dataclasses.dataclass
class _Container:
    """One running container: its name, its init's host pid, its writable layer on the host."""

    name: str
    pid: int
    upper: Path | None
    running: bool = True
    idle: frozenset[int] | None = None  # its processes when it (re)started: init and sleep

    def only_ours(self) -> bool:
        """Whether no process but init and its sleep is alive (none can start another)."""
        now = _processes(self.pid)
        return now is not None and self.idle is not None and now == self.idle


class ContainerSandbox:
    """Sandbox.run's arguments and result, in containers of one image (container.py's module
    doc: one container per episode, keyed by the workspace). Thread-safe; one instance serves
    every episode of the image (`container_sandbox`)."""

    isolated = True

    @property
    def passes_fds(self) -> bool:
        """Whether run(pass_fds=...) works: podman's --preserve-fds; `docker exec` has none."""
        return self.engine == "podman"

    @staticmethod
    def inner_fds(fds: Sequence[int]) -> tuple[int, ...]:
        """The numbers the command sees `run(pass_fds=fds)` under: 3, 4, ... in order."""
        return tuple(range(3, 3 + len(fds)))

    def __init__(
        self,
        image: str,
        *,
        engine: str = "podman",
        limits: SandboxLimits | None = None,
        network: bool = False,
    ):
        self.image, self.engine, self.network = image, engine, network
        self.cmd = engine_command(engine)
        self.limits = limits or SandboxLimits()
        uid = USERNS_BASE if engine == "podman" else os.geteuid()
        self.isolation = _Isolation(engine, uid)
        self._sessions: dict[str, _Container] = {}  # workspace realpath -> its container
        self._lock = threading.Lock()

    def give_workspace(self, path: str | os.PathLike) -> None:
        """Hand a directory tree to container root's host uid (it may write only what it owns)."""
        uid = self.isolation.host_uid
        if uid == os.geteuid():
            return
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(root, name), uid, uid)
        os.lchown(path, uid, uid)

    # ------------------------------------------------------------------ containers

    def _start(self, workdir: Path, mount_at: str, limits, *, readonly=False, binds=()):
        """A detached container of the image (init + sleep) with `workdir` at `mount_at`."""
        name = f"c2-{uuid.uuid4().hex[:12]}"
        argv = [*self.cmd, "run", "-d", "--name", name, "--init"]
        argv += [*security_args(self.engine, self.network), *_resources(limits)]
        argv += ["--label", f"{LABEL}={workdir}"]
        argv += [x for k, v in SESSION_ENV.items() for x in ("-e", f"{k}={v}")]
        argv += ["-v", f"{workdir}:{mount_at}" + (":ro" if readonly else ""), "-w", mount_at]
        if readonly:  # grading: /tmp and /dev/shm alone are writable (module doc)
            argv += _scratch_only(limits)
        for src, dst, writable in binds:
            argv += ["-v", f"{Path(src).resolve()}:{dst}" + ("" if writable else ":ro")]
        argv += [self.image, "sleep", "infinity"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=_conmon_cwd())
        if r.returncode != 0:
            self._remove(name)
            raise SandboxError(f"could not start a container of {self.image}: {r.stderr[-500:]}")
        return self._inspect(name)

    def _inspect(self, name: str) -> _Container:
        fmt = "{{.State.Pid}} {{.GraphDriver.Data.UpperDir}}"
        r = subprocess.run(
            [*self.cmd, "inspect", "--format", fmt, name], capture_output=True, text=True
        )
        pid, _, upper = r.stdout.strip().partition(" ")
        if r.returncode != 0 or not pid.isdigit():
            raise SandboxError(f"container {name}: inspect failed: {r.stderr.strip()[-300:]}")
        idle = _processes(int(pid))  # read before any command of ours ran in it
        idle = idle if idle is not None and len(idle) == 2 else None  # else: unknown
        return _Container(
            name, int(pid), Path(upper) if upper.startswith("/") else None, True, idle
        )

    def session(self, workdir: Path, mount_at: str, limits: SandboxLimits) -> str:
        """The running container of `workdir`'s episode, started on first use (and started
        again after the verifier stopped it)."""
        return self._session(Path(workdir), mount_at, limits).name

    def _session(self, workdir: Path, mount_at: str, limits: SandboxLimits) -> _Container:
        key = str(workdir)
        with self._lock:
            c = self._sessions.get(key)
            if c is not None and c.running:
                return c
            if c is not None:
                self._check([*self.cmd, "start", c.name])
                return self._refresh(c)
            self._collect_garbage_locked()
            c = self._sessions[key] = self._start(workdir, mount_at, limits)
            return c

    def _restart(self, c: _Container) -> None:
        """Every process of `c` ends (SIGKILL at once); its filesystem stays."""
        self._check([*self.cmd, "restart", "-t", "0", c.name])
        self._refresh(c)

    def _refresh(self, c: _Container) -> _Container:
        """`c` after a (re)start: its new init's pid (and cgroup)."""
        new = self._inspect(c.name)
        c.pid, c.upper, c.running, c.idle = new.pid, new.upper, True, new.idle
        return c

    def collect_garbage(self) -> None:
        """Remove the containers of episodes whose workspace was deleted."""
        with self._lock:
            self._collect_garbage_locked()

    def _collect_garbage_locked(self) -> None:
        for key, c in list(self._sessions.items()):
            if not os.path.isdir(key):
                self._remove(c.name)
                del self._sessions[key]

    def _remove(self, name: str) -> None:
        subprocess.run([*self.cmd, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)

    def close(self, workdir: str | os.PathLike | None = None) -> None:
        """Remove the container of `workdir`'s episode, or of every episode."""
        with self._lock:
            keys = list(self._sessions) if workdir is None else [str(Path(workdir).resolve())]
            for key in keys:
                c = self._sessions.pop(key, None)
                if c is not None:
                    self._remove(c.name)

    # ------------------------------------------------------------------ running

    def _prepare(self, command, workdir, python_env) -> tuple[list[str], Path]:
        workdir = Path(workdir)
        if not workdir.is_dir():
            raise SandboxError(f"workdir={str(workdir)!r}: expected an existing directory")
        if python_env is not None:
            raise SandboxError(
                f"python_env={str(python_env)!r}: a container task has its image's environment"
            )
        if isinstance(command, str):
            command = ["/bin/bash", "-c", command]
        return list(command), workdir.resolve()

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
        """`command` in the episode's container (binds copied in before, writable ones copied
        back after), or with `readonly` (grading) in a fresh container of the image with the
        workspace read-only and binds mounted, removed (every process dead) before this
        returns; the episode's container is stopped first where a process the agent left is
        alive in it (it could still write the workspace). `pass_fds` (with `readonly`, podman):
        the caller's descriptors, open in the command as `inner_fds(pass_fds)`; the command is
        then exec'd without coreutils `timeout` (which would hold them, reopenable through its
        /proc entry by any process in the container) and the host stops it at the time limit."""
        limits = limits or self.limits
        command, workdir = self._prepare(command, workdir, python_env)
        _check_fds(pass_fds, readonly, self.engine)
        if readonly:
            self._end_leftovers(workdir)
            return self._run_fresh(command, workdir, limits, mount_at, binds, env, pass_fds)
        c = self._session(workdir, mount_at, limits)
        copy_back = []
        for src, dst, writable in binds:
            self._copy_in(c.name, Path(src), dst)
            if writable:
                copy_back.append((Path(src), dst))
        result = self._exec(c, command, limits, workdir, mount_at, env, check_disk=True)
        for src, dst in copy_back:
            self._copy_out(c.name, dst, src)
        return result

    def run_verifier(
        self,
        command: str | Sequence[str],
        workdir: str | os.PathLike,
        *,
        limits: SandboxLimits | None = None,
        mount_at: str = "/workspace",
        binds: Sequence[tuple[str | os.PathLike, str, bool]] = (),
        env: dict[str, str] | None = None,
        python_env: str | os.PathLike | None = None,
    ) -> SandboxResult:
        """The tests over the episode's final state (module doc): its container restarted (no
        process of the agent survives), read-only binds copied in, writable ones made empty
        there, `command` run, the container stopped, and only then the writable binds copied
        back to the host (nothing can write them any more)."""
        limits = limits or self.limits
        command, workdir = self._prepare(command, workdir, python_env)
        c = self._session(workdir, mount_at, limits)
        if not c.only_ours():  # (a restart costs ~0.7 s: skipped when nothing is left)
            self._restart(c)
        for src, dst, _ in binds:  # the grader's own copies: what the agent left there goes
            self._copy_in(c.name, Path(src), dst)
        result = self._exec(c, command, limits, workdir, mount_at, env, check_disk=True)
        if not c.only_ours():  # a process the tests left could still write: stop them all
            self._check([*self.cmd, "stop", "-t", "0", c.name])
            c.running = False
        if "disk" not in result.limits_hit:  # past the quota: nothing is copied to the host
            for src, dst, writable in binds:
                if writable:
                    self._copy_out(c.name, dst, Path(src))
        return result

    def _end_leftovers(self, workdir: Path) -> None:
        """Stop the episode's container of `workdir` where a process the agent left is alive
        (every process ends; its filesystem stays, and the next command starts it again)."""
        with self._lock:
            c = self._sessions.get(str(workdir))
        if c is not None and c.running and not c.only_ours():
            self._check([*self.cmd, "stop", "-t", "0", c.name])
            c.running = False

    def _run_fresh(self, command, workdir, limits, mount_at, binds, env, pass_fds=()):
        c = self._start(workdir, mount_at, limits, readonly=True, binds=binds)
        try:
            return self._exec(
                c, command, limits, workdir, mount_at, env, check_disk=False, pass_fds=pass_fds
            )
        finally:
            self._remove(c.name)

    def _copy_in(self, name: str, src: Path, dst: str) -> None:
        parent = os.path.dirname(dst.rstrip("/")) or "/"
        prep = f"rm -rf {shlex.quote(dst)} && mkdir -p {shlex.quote(parent)}"
        self._check([*self.cmd, "exec", name, "sh", "-c", prep])
        # A tar stream owned by container root: podman 4.3's `cp` fails on a host owner that
        # only the user namespace maps (USERNS_BASE: give_workspace's).
        with tempfile.TemporaryFile() as tar:
            with tarfile.open(fileobj=tar, mode="w") as tf:
                tf.add(src.resolve(), arcname=dst.strip("/"), filter=_root_owned)
            tar.seek(0)
            r = subprocess.run(
                [*self.cmd, "cp", "-", f"{name}:/"], stdin=tar, capture_output=True, timeout=300
            )
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxError(f"copying {src} to {name}:{dst} failed: {err}")

    def _copy_out(self, name: str, dst: str, to: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="c2-cp-") as tmp:
            got = Path(tmp) / "d"  # `cp DIR NEW` copies DIR's contents into NEW
            r = subprocess.run(
                [*self.cmd, "cp", "--archive=false", f"{name}:{dst.rstrip('/')}", str(got)],
                capture_output=True,
                timeout=300,
            )
            if r.returncode == 0 and got.is_dir():
                shutil.copytree(got, to, symlinks=True, dirs_exist_ok=True)

    def _check(self, argv: list[str]) -> None:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=_conmon_cwd())
        if r.returncode != 0:
            raise SandboxError(f"{shlex.join(argv[-3:])}: {r.stderr.strip()[-300:]}")

    def _exec(
        self, c: _Container, command, limits, workdir, mount_at, env, check_disk, pass_fds=()
    ):
        # coreutils timeout: TERM to the command's whole process group at the limit, KILL 2 s on
        # (not with descriptors passed: run's doc).
        inner = [] if pass_fds else ["timeout", "-k", "2", f"{limits.timeout_s:g}"]
        argv = [*self.cmd, "exec", "-w", mount_at]
        if pass_fds:
            argv += ["--preserve-fds", str(len(pass_fds))]
        for k, v in (env or {}).items():
            argv += ["-e", f"{k}={v}"]
        quota = limits.max_workspace_mb << 20
        ooms = _oom_kills(c.pid)
        argv += [c.name, *inner, *command]
        r = _Execution(argv, limits, c.upper, quota, pass_fds).wait()
        after = _oom_kills(c.pid)
        if r.stopped:  # killing the exec client does not reach inside: every process ends
            with contextlib.suppress(SandboxError, subprocess.TimeoutExpired):
                self._restart(c)
        hit = list(r.hit)
        if ooms is not None and after is not None and after > ooms:
            hit.append("memory")
        if "disk" not in hit and c.upper is not None and _tree_bytes(c.upper) > quota:
            hit.append("disk")
        if check_disk and "disk" not in hit and _tree_bytes(workdir) > quota:
            hit.append("disk")
        return SandboxResult(
            exit_code=None if r.timed_out else r.code,
            timed_out=r.timed_out,
            stdout=r.stdout,
            stderr=r.stderr,
            limit=hit[0] if hit else None,
            limits_hit=hit,
            stdout_truncated=r.stdout_cut,
            stderr_truncated=r.stderr_cut,
            wall_s=r.wall,
            first_output_s=None,
            cpu_s=None,
            memory_peak_mb=None,
            isolation=self.isolation.describe(),
        )


class _Execution:
    """One `podman exec` watched from the host: output capped, a backstop deadline a few
    seconds past the `timeout` inside, the writable layer measured against its quota."""

    def __init__(self, argv, limits: SandboxLimits, upper: Path | None, quota: int, fds=()):
        self.argv, self.limits, self.upper, self.quota = argv, limits, upper, quota
        self.fds = tuple(fds)
        self.hit: list[str] = []
        self.stopped = self.timed_out = False

    def wait(self) -> _Execution:
        cap = self.limits.max_output_bytes
        t0 = time.monotonic()
        # The host's backstop a few seconds behind `timeout`; the limit itself without it.
        deadline = t0 + self.limits.timeout_s + (0 if self.fds else 10)
        next_quota = t0 + QUOTA_POLL_S
        overflow = over_quota = False
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = _popen_with_fds(self.argv, self.fds, stdout=out, stderr=err)
            while proc.poll() is None:
                time.sleep(0.05)
                now = time.monotonic()
                if os.fstat(out.fileno()).st_size + os.fstat(err.fileno()).st_size > cap:
                    overflow = True
                elif now >= deadline:
                    self.timed_out = True
                elif self.upper is not None and now >= next_quota:
                    next_quota = now + QUOTA_POLL_S
                    over_quota = _tree_bytes(self.upper) > self.quota
                    if not over_quota:
                        continue
                else:
                    continue
                proc.kill()
                self.stopped = True
                break
            self.code = proc.wait()
            self.wall = time.monotonic() - t0
            self.stdout, self.stdout_cut = _read(out, cap)
            self.stderr, self.stderr_cut = _read(err, max(0, cap - len(self.stdout.encode())))
        # `timeout` exits 124 when the limit stopped the command (137 after its KILL).
        if self.code in (124, 137) and self.wall >= self.limits.timeout_s * 0.98:
            self.timed_out = True
        if self.timed_out:
            self.hit.append("wall_time")
        if self.stdout_cut or self.stderr_cut or overflow:
            self.hit.append("output")
            self.stdout_cut = self.stdout_cut or overflow
            self.stderr_cut = self.stderr_cut or overflow
        if over_quota:
            self.hit.append("disk")
        return self


def _scratch_only(limits: SandboxLimits) -> list[str]:
    """A read-only root filesystem with a private /tmp and /dev/shm of `tmp_mb` each, as the
    bubblewrap sandbox has (podman's own --read-only-tmpfs would add unsized /run and /var/tmp)."""
    tmp = f"/tmp:rw,nosuid,nodev,mode=1777,size={limits.tmp_mb}m"
    argv = ["--read-only", "--read-only-tmpfs=false", "--tmpfs", tmp]
    return argv + [f"--shm-size={limits.tmp_mb}m"]


def _check_fds(fds: Sequence[int], readonly: bool, engine: str) -> None:
    for fd in fds:
        try:
            os.fstat(fd)
        except (OSError, TypeError) as e:
            raise SandboxError(f"pass_fds: {fd!r} is not an open descriptor ({e})") from e
    if fds and engine != "podman":
        raise SandboxError(f"pass_fds: {engine} cannot pass descriptors (no --preserve-fds)")
    if fds and not readonly:
        raise SandboxError(
            "pass_fds needs readonly=True: in the episode's container the agent's processes "
            "could reopen them"
        )
    if len(fds) > 6:
        raise SandboxError(f"pass_fds: {len(fds)} descriptors; at most 6")


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _read(f, cap: int) -> tuple[str, bool]:
    f.seek(0)
    data = f.read(cap + 1)
    return data[:cap].decode(errors="replace"), len(data) > cap
