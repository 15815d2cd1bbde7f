"""Which isolation this machine allows, probed once per process, strongest first.

Backends, strongest first:
  bwrap-root    bubblewrap run as root: new mount/pid/net/ipc/uts namespaces, a read-only view of
                the runtime only, then the command drops to an unprivileged uid (65534) with no
                capabilities, a seccomp filter that refuses new user namespaces, a cgroup per
                sandbox (memory, processes, CPU) and rlimits (CPU seconds, file size, open files).
  bwrap-userns  bubblewrap in an unprivileged user namespace (when not root, or no setpriv);
                cgroups when this process may create them, else RLIMIT_NPROC (binds non-root).
  rlimit        no bubblewrap: rlimits, its own session and a cgroup when root. Not a filesystem
                or network sandbox; every result says so in its `isolation` field.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import platform
import shutil
import struct
import subprocess
import sys

from c2.envs.cgroups import CgroupManager

SANDBOX_UID = 65534  # "nobody": owns nothing on the host

# Syscall numbers per architecture: (audit arch, clone, unshare, clone3, refused outright).
# Refused: setns, keyctl, add_key, request_key, bpf, perf_event_open, userfaultfd, io_uring_setup.
_SYSCALLS = {
    "x86_64": (0xC000003E, 56, 272, 435, (308, 250, 248, 249, 321, 298, 323, 425)),
    "aarch64": (0xC00000B7, 220, 97, 435, (268, 219, 217, 218, 280, 241, 282, 425)),
}
_CLONE_NEWUSER = 0x10000000


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """Classic-BPF seccomp program: no new user namespaces, no rarely-needed kernel surfaces.

    clone3 answers ENOSYS so libc falls back to clone, whose flags the filter can inspect.
    Returns None on an architecture without a syscall table here.
    """
    table = _SYSCALLS.get(machine or platform.machine())
    if table is None:
        return None
    arch, nr_clone, nr_unshare, nr_clone3, refused = table
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, enosys),  # a foreign ABI (e.g. 32-bit) gets nothing
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, 0x40000000),  # x32 syscalls
        (ret, 0, 0, enosys),
        (jeq, 0, 1, nr_clone3),
        (ret, 0, 0, enosys),
    ]
    for nr in refused:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    for nr in (nr_clone, nr_unshare):
        prog += [
            (jeq, 0, 4, nr),
            (ld, 0, 0, 16),  # low word of args[0]: the clone/unshare flags
            (jset, 0, 1, _CLONE_NEWUSER),
            (ret, 0, 0, eperm),
            (ret, 0, 0, allow),
        ]
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def find_binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/bin:/sbin")


def python_runtime_paths() -> list[str]:
    """Directories the sandboxed Python needs read-only: the venv and the interpreter it uses."""
    paths = []
    for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        real = os.path.realpath(p)
        for q in (p, real):
            if q not in paths and not q.startswith("/usr/") and q != "/usr":
                paths.append(q)
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    if not any(exe_dir.startswith(p + "/") for p in paths) and not exe_dir.startswith("/usr/"):
        paths.append(exe_dir)
    return paths


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The isolation a sandbox run gets on this machine."""

    backend: str  # "bwrap-root" | "bwrap-userns" | "rlimit"
    bwrap: str | None
    setpriv: str | None
    prlimit: str
    inner_uid: int | None  # the uid inside the sandbox (None: the caller's)
    host_uid: int  # the uid its processes have on the host: who must own the workspace
    cgroups: CgroupManager | None
    seccomp: bool
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [self.backend]
        if self.backend.startswith("bwrap"):
            parts.append("ns(mount,pid,net,ipc,uts)")
        parts.append(f"host uid {self.host_uid}")
        if self.seccomp:
            parts.append("seccomp(no userns)")
        parts.append(self.cgroups.describe() if self.cgroups else "no cgroup")
        parts.append("rlimits")
        return "+".join(parts)


def _bwrap_works(bwrap: str, args: list[str]) -> bool:
    cmd = [bwrap, *args, "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for link in ("bin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            cmd += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    try:
        out = subprocess.run([*cmd, "--", "/usr/bin/true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


@functools.cache
def probe(backend: str = "auto") -> Isolation:
    """Probe (once per process) and return the strongest isolation, or the one asked for."""
    if backend not in ("auto", "bwrap-root", "bwrap-userns", "rlimit"):
        raise ValueError(f"backend={backend!r}: expected auto, bwrap-root, bwrap-userns or rlimit")
    bwrap, setpriv, prlimit = find_binary("bwrap"), find_binary("setpriv"), find_binary("prlimit")
    if prlimit is None:
        raise RuntimeError("prlimit (util-linux) is missing: no sandbox backend can set rlimits")
    root = os.geteuid() == 0
    cgroups = CgroupManager.probe()
    has_seccomp = seccomp_filter() is not None
    notes = []
    ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    if backend in ("auto", "bwrap-root") and bwrap and setpriv and root:
        if _bwrap_works(bwrap, [*ns, "--cap-drop", "ALL"]):
            return Isolation(
                "bwrap-root",
                bwrap,
                setpriv,
                prlimit,
                SANDBOX_UID,
                SANDBOX_UID,
                cgroups,
                has_seccomp,
            )
        notes.append("bwrap as root failed its self-test")
    elif backend == "bwrap-root":
        raise RuntimeError("backend=bwrap-root needs root, bwrap and setpriv")
    if backend in ("auto", "bwrap-userns") and bwrap:
        if _bwrap_works(bwrap, [*ns, "--unshare-user", "--disable-userns"]):
            # As root the inner uid must not be 0: bwrap keeps capabilities for an inner root.
            uid = SANDBOX_UID if root else None
            return Isolation(
                "bwrap-userns",
                bwrap,
                None,
                prlimit,
                uid,
                os.geteuid(),
                cgroups,
                has_seccomp,
                tuple(notes),
            )
        notes.append("bwrap in a user namespace failed its self-test")
    elif backend == "bwrap-userns":
        raise RuntimeError("backend=bwrap-userns needs bwrap (Debian package `bubblewrap`)")
    if backend == "auto":
        logging.getLogger(__name__).warning(
            "bubblewrap unavailable (%s): sandboxes fall back to rlimits only; install bubblewrap",
            "; ".join(notes) or "not installed",
        )
    return Isolation(
        "rlimit", None, None, prlimit, None, os.geteuid(), cgroups, False, tuple(notes)
    )


def probe_report() -> dict:
    """What each isolation layer does on this machine (for logs and the CLI's --probe)."""
    bwrap = find_binary("bwrap")
    ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    userns = bool(bwrap) and _bwrap_works(bwrap, [*ns, "--unshare-user", "--disable-userns"])
    root_ns = bool(bwrap) and os.geteuid() == 0 and _bwrap_works(bwrap, [*ns, "--cap-drop", "ALL"])
    cgroups = CgroupManager.probe()
    chosen = probe()
    return {
        "euid": os.geteuid(),
        "bwrap": bwrap,
        "namespaces_as_root": root_ns,
        "unprivileged_user_namespace": userns,
        "setpriv_to_uid": SANDBOX_UID if (find_binary("setpriv") and os.geteuid() == 0) else None,
        "prlimit": find_binary("prlimit"),
        "cgroup": cgroups.describe() if cgroups else None,
        "seccomp_arch": platform.machine() if seccomp_filter() is not None else None,
        "backend": chosen.backend,
        "isolation": chosen.describe(),
        "notes": list(chosen.notes),
    }
