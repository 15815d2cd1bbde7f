"""Per-sandbox control groups: memory, process-count and CPU limits that hold even for root.

RLIMIT_NPROC does not bind uid 0, and a sandbox that forks past its limit must not starve the
others, so every sandbox gets its own cgroup. Both the v1 hierarchies (one mount per controller)
and the unified v2 tree are handled; which one is used is probed, never assumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import signal
import time
from pathlib import Path

_COUNTER = itertools.count()
_PREFIX = "c2sb-"


@dataclasses.dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    max_pids: int
    cpus: float


@dataclasses.dataclass
class CgroupStats:
    oom_kills: int = 0
    pids_limit_hits: int = 0
    cpu_s: float | None = None
    memory_peak_bytes: int | None = None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fs type, super options) of cgroup mounts."""
    out = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], fields[3], rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """Controller name (or "" for the unified tree) -> this process's cgroup path."""
    out = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _join(mount: str, root: str, path: str) -> Path:
    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
    return Path(mount) / rel.lstrip("/")


class CgroupManager:
    """Creates, kills and removes one cgroup per sandbox under this process's own cgroup."""

    def __init__(self, version: int, bases: dict[str, Path]):
        self.version = version
        self.bases = bases  # v1: controller -> our directory in its hierarchy; v2: {"": dir}

    @classmethod
    def probe(cls) -> CgroupManager | None:
        """The usable cgroup setup, or None (not root, read-only, or no controllers)."""
        if os.geteuid() != 0:
            return None
        mounts, own = _mounts(), _own_paths()
        for make in (cls._probe_v2, cls._probe_v1):
            with contextlib.suppress(OSError):
                manager = make(mounts, own)
                if manager is not None and manager._self_test():
                    manager._remove_stale()
                    return manager
        return None

    @classmethod
    def _probe_v2(cls, mounts, own) -> CgroupManager | None:
        for mount, root, fstype, _ in mounts:
            if fstype != "cgroup2" or "" not in own:
                continue
            base = _join(mount, root, own[""])
            available = set(_read(base / "cgroup.controllers").split())
            if not {"pids", "memory"} <= available:
                continue
            enabled = set(_read(base / "cgroup.subtree_control").split())
            wanted = {"pids", "memory", "cpu"} & available
            if not wanted <= enabled:
                # Fails with EBUSY when our cgroup holds processes (the no-internal-process rule).
                (base / "cgroup.subtree_control").write_text(
                    " ".join(f"+{c}" for c in sorted(wanted - enabled))
                )
            return cls(2, {"": base})
        return None

    @classmethod
    def _probe_v1(cls, mounts, own) -> CgroupManager | None:
        bases = {}
        for controller in ("pids", "memory", "cpu", "cpuacct"):
            for mount, root, fstype, opts in mounts:
                if fstype == "cgroup" and controller in opts and controller in own:
                    bases[controller] = _join(mount, root, own[controller])
        if "pids" not in bases or "memory" not in bases:
            return None
        return cls(1, bases)

    def _self_test(self) -> bool:
        cg = self.create(CgroupLimits(memory_bytes=64 << 20, max_pids=8, cpus=1.0))
        cg.remove()
        return True

    def _remove_stale(self) -> None:
        """Drop empty sandbox cgroups left by processes that died without cleaning up."""
        for base in set(self.bases.values()):
            for d in base.glob(_PREFIX + "*"):
                owner = d.name[len(_PREFIX) :].split("-")[0]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    with contextlib.suppress(OSError):
                        d.rmdir()

    def create(self, limits: CgroupLimits) -> Cgroup:
        name = f"{_PREFIX}{os.getpid()}-{next(_COUNTER)}"
        dirs = []
        try:
            for base in dict.fromkeys(self.bases.values()):  # co-mounted hierarchies once
                d = base / name
                d.mkdir()
                dirs.append(d)
            cg = Cgroup(self.version, dirs, self.bases, name)
            cg.set_limits(limits)
            return cg
        except BaseException:
            for d in reversed(dirs):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise

    def describe(self) -> str:
        controllers = (
            sorted(c for c in self.bases if c) if self.version == 1 else ["pids", "memory"]
        )
        if self.version == 2 and "cpu" in _read(self.bases[""] / "cgroup.subtree_control").split():
            controllers.append("cpu")
        return f"cgroup v{self.version} ({','.join(controllers)})"


class Cgroup:
    """One sandbox's cgroup (a directory per v1 hierarchy, or one v2 directory)."""

    def __init__(self, version: int, dirs: list[Path], bases: dict[str, Path], name: str):
        self.version, self.dirs, self.name = version, dirs, name
        self._by_controller = {c: b / name for c, b in bases.items()}

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes "0" into to join this cgroup (every hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _dir(self, controller: str) -> Path | None:
        return self._by_controller.get("" if self.version == 2 else controller)

    def set_limits(self, limits: CgroupLimits) -> None:
        period = 100_000
        quota = max(1000, int(limits.cpus * period))
        if self.version == 2:
            d = self.dirs[0]
            (d / "memory.max").write_text(str(limits.memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(limits.max_pids))
            if (d / "cpu.max").exists():
                (d / "cpu.max").write_text(f"{quota} {period}")
            return
        mem = self._dir("memory")
        (mem / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        if (mem / "memory.memsw.limit_in_bytes").exists():
            with contextlib.suppress(OSError):  # absent or refused without swap accounting
                (mem / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        (self._dir("pids") / "pids.max").write_text(str(limits.max_pids))
        cpu = self._dir("cpu")
        if cpu is not None:
            (cpu / "cpu.cfs_period_us").write_text(str(period))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.dirs[0] / "cgroup.procs").split()]

    def kill_all(self, deadline_s: float = 5.0) -> None:
        """SIGKILL everything inside until the cgroup is empty (the pids limit bounds forks)."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def stats(self) -> CgroupStats:
        s = CgroupStats()
        if self.version == 2:
            d = self.dirs[0]
            s.oom_kills = _keyed(_read(d / "memory.events")).get("oom_kill", 0)
            s.pids_limit_hits = _keyed(_read(d / "pids.events")).get("max", 0)
            usage = _keyed(_read(d / "cpu.stat")).get("usage_usec")
            s.cpu_s = usage / 1e6 if usage is not None else None
            peak = _read(d / "memory.peak").strip()
            s.memory_peak_bytes = int(peak) if peak.isdigit() else None
            return s
        mem, pids, acct = self._dir("memory"), self._dir("pids"), self._dir("cpuacct")
        s.oom_kills = _keyed(_read(mem / "memory.oom_control")).get("oom_kill", 0)
        peak = _read(mem / "memory.max_usage_in_bytes").strip()
        s.memory_peak_bytes = int(peak) if peak.isdigit() else None
        s.pids_limit_hits = _keyed(_read(pids / "pids.events")).get("max", 0)
        if acct is not None:
            usage = _read(acct / "cpuacct.usage").strip()
            s.cpu_s = int(usage) / 1e9 if usage.isdigit() else None
        return s

    def remove(self, deadline_s: float = 5.0) -> None:
        """Kill what is left and delete the directories (retrying while tasks finish exiting)."""
        self.kill_all(deadline_s)
        end = time.monotonic() + deadline_s
        for d in reversed(self.dirs):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > end:
                        raise
                    time.sleep(0.002)
