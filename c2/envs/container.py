"""A container backend for tasks that need their image (podman; docker where a daemon runs).

`ContainerSandbox(image)` has Sandbox.run's contract and result type (SandboxResult): each command
runs in a fresh container of `image` with the workspace mounted at `mount_at`, `binds` mounted,
no network, and the limits of SandboxLimits (memory, cpus, processes, wall time, output bytes).
Only the workspace persists between commands (as with the bubblewrap backend).

Images: `build_image` builds a task's Dockerfile; its FROM lines are mapped onto local base images
(BASE_IMAGES) when no registry is reachable; `build_base_image` makes such a base from the Debian
archive with mmdebstrap and imports it. On this kind of machine podman needs the runc runtime
(crun refuses hybrid cgroups) and rlimits no higher than the caller's own.

    python -m c2.envs.container base --suite bookworm --tag localhost/c2-base:bookworm
    python -m c2.envs.container build --context DIR --tag TAG     # DIR/Dockerfile
    python -m c2.envs.container run --image TAG --workdir DIR -- CMD...

Status: a building block. The evaluation commands (episodes, grading) still use the bubblewrap
Sandbox; Harbor tasks are not yet imported for this backend (see the report of issue 21).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from c2.envs.sandbox import SandboxError, SandboxLimits, SandboxResult

# The tasks' common FROM lines, on images built locally from the Debian archive.
BASE_IMAGES = {
    "python:3.13-slim-bookworm": "localhost/c2-base:bookworm",
    "python:3.11-slim": "localhost/c2-base:bookworm",
    "python:3.11": "localhost/c2-base:bookworm",
    "python:3.10-slim-bookworm": "localhost/c2-base:bookworm",
    "debian:bookworm-slim": "localhost/c2-base:bookworm",
}


@dataclasses.dataclass(frozen=True)
class _Isolation:
    backend: str

    def describe(self) -> str:
        return f"{self.backend} containers"


def engine_command(engine: str = "podman") -> list[str]:
    exe = shutil.which(engine)
    if exe is None:
        raise SandboxError(f"{engine} is not installed (Debian: apt-get install podman runc)")
    cmd = [exe]
    if engine == "podman" and shutil.which("runc"):
        cmd += ["--runtime", shutil.which("runc")]
    return cmd


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


class ContainerSandbox:
    """Runs commands in containers of one image; Sandbox.run's arguments and result."""

    def __init__(self, image: str, *, engine: str = "podman", limits: SandboxLimits | None = None):
        self.image, self.engine = image, engine
        self.cmd = engine_command(engine)
        self.limits = limits or SandboxLimits()
        self.isolation = _Isolation(engine)

    isolated = True

    def give_workspace(self, path: str | os.PathLike) -> None:
        """Commands run as the container's root: nothing to hand over."""

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
    ) -> SandboxResult:
        limits = limits or self.limits
        workdir = Path(workdir).resolve()
        if not workdir.is_dir():
            raise SandboxError(f"workdir={str(workdir)!r}: expected an existing directory")
        name = f"c2-{uuid.uuid4().hex[:12]}"
        argv = [*self.cmd, "run", "--name", name, "--network", "none", "--init"]
        argv += ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
        argv += ["--cpus", str(limits.cpus), "--pids-limit", str(limits.max_processes + 8)]
        argv += _ulimits(limits)
        argv += ["-v", f"{workdir}:{mount_at}" + (":ro" if readonly else ""), "-w", mount_at]
        for src, dst, writable in binds:
            argv += ["-v", f"{Path(src).resolve()}:{dst}" + ("" if writable else ":ro")]
        if python_env is not None:
            argv += ["-v", f"{os.path.realpath(python_env)}:{os.path.realpath(python_env)}:ro"]
        for k, v in (env or {}).items():
            argv += ["-e", f"{k}={v}"]
        if isinstance(command, str):
            command = ["/bin/bash", "-c", command]
        argv += [self.image, *command]
        t0 = time.monotonic()
        timed_out = False
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            try:
                code = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                subprocess.run([*self.cmd, "kill", name], capture_output=True, timeout=60)
                code = proc.wait(timeout=60)
            wall = time.monotonic() - t0
            stdout, so_cut = _read(out, limits.max_output_bytes)
            stderr, se_cut = _read(err, limits.max_output_bytes)
        oom = subprocess.run(
            [*self.cmd, "inspect", "-f", "{{.State.OOMKilled}}", name],
            capture_output=True,
            text=True,
        ).stdout.strip()
        subprocess.run([*self.cmd, "rm", "-f", name], capture_output=True, timeout=120)
        hit = []
        if timed_out:
            hit.append("wall_time")
        if so_cut or se_cut:
            hit.append("output")
        # A SIGKILL nobody sent on a timeout is the kernel's OOM killer (under --init the
        # container itself survives, so OOMKilled stays false).
        if oom == "true" or (code == 137 and not timed_out):
            hit.append("memory")
        return SandboxResult(
            exit_code=None if timed_out else code,
            timed_out=timed_out,
            stdout=stdout,
            stderr=stderr,
            limit=hit[0] if hit else None,
            limits_hit=hit,
            stdout_truncated=so_cut,
            stderr_truncated=se_cut,
            wall_s=wall,
            first_output_s=None,
            cpu_s=None,
            memory_peak_mb=None,
            isolation=self.isolation.describe(),
        )


def _read(f, cap: int) -> tuple[str, bool]:
    f.seek(0)
    data = f.read(cap + 1)
    return data[:cap].decode(errors="replace"), len(data) > cap


def map_from_lines(dockerfile: str, bases: dict[str, str] | None = None) -> str:
    """The Dockerfile with each FROM image that has a local base replaced by it."""
    bases = BASE_IMAGES if bases is None else bases

    def sub(m):
        image = m.group(2)
        return m.group(1) + bases.get(image, image)

    return re.sub(r"(?im)^(\s*FROM\s+(?:--\S+\s+)*)(\S+)", sub, dockerfile)


def build_image(
    context: str | os.PathLike,
    tag: str,
    *,
    engine: str = "podman",
    timeout_s: float = 1800,
    bases: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Build context/Dockerfile as `tag` (FROM lines mapped onto local bases)."""
    context = Path(context)
    text = map_from_lines((context / "Dockerfile").read_text(), bases)
    with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as f:
        f.write(text)
    try:
        ul = _ulimits(SandboxLimits(max_open_files=4096, max_processes=1024))
        argv = [*engine_command(engine), "build", *ul, "-t", tag, "-f", f.name, str(context)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    finally:
        os.unlink(f.name)


def build_base_image(
    suite: str,
    tag: str,
    *,
    include: Sequence[str] = ("ca-certificates", "python3"),
    engine: str = "podman",
) -> None:
    """A base image from the Debian archive: mmdebstrap SUITE into a tarball, imported as TAG."""
    if shutil.which("mmdebstrap") is None:
        raise SandboxError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        inc = ",".join(include)
        subprocess.run(
            ["mmdebstrap", "--variant=apt", f"--include={inc}", suite, str(tar)], check=True
        )
        subprocess.run([*engine_command(engine), "import", str(tar), tag], check=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m c2.envs.container", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base")
    b.add_argument("--suite", default="bookworm")
    b.add_argument("--tag", default="localhost/c2-base:bookworm")
    bd = sub.add_parser("build")
    bd.add_argument("--context", required=True)
    bd.add_argument("--tag", required=True)
    r = sub.add_parser("run")
    r.add_argument("--image", required=True)
    r.add_argument("--workdir", required=True)
    r.add_argument("--timeout", type=float, default=30)
    r.add_argument("--memory_mb", type=int, default=1024)
    r.add_argument("command", nargs="+")
    for x in (b, bd, r):
        x.add_argument("--engine", default="podman", choices=("podman", "docker"))
    args = p.parse_args(argv)
    if args.cmd == "base":
        build_base_image(args.suite, args.tag, engine=args.engine)
    elif args.cmd == "build":
        res = build_image(args.context, args.tag, engine=args.engine)
        print(res.stdout[-2000:], res.stderr[-2000:], sep="\n")
        return res.returncode
    else:
        lim = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb)
        sb = ContainerSandbox(args.image, engine=args.engine, limits=lim)
        print(sb.run(args.command, args.workdir).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
