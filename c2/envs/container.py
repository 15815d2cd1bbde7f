"""The container backend: tasks that run in their own image (podman; docker where a daemon runs).

A task imported for this backend (`python -m c2.envs.sources harbor --backend podman`) keeps its
Dockerfile and build context (task/environment/) and names its image in metadata:

    "container": {"engine": "podman", "context": "environment", "dockerfile": "Dockerfile",
                  "image": "localhost/c2-task/<id>:<hash>", "network": true, "from": [...]}

`Task.sandbox(default)` (tasks.py) is the one seam: for such a task it returns the shared
`ContainerSandbox` of its image (`container_sandbox`), which episodes (episode.py, and
c2/rl/episodes.py through the same call) and grading use in place of the bubblewrap Sandbox;
every other task gets `default` back unchanged.

One container per episode (container_run.py: how each is locked down, run and measured). The
first non-read-only `run` over a workspace starts a container of the image (`sleep infinity`
under --init) with that workspace bind-mounted at `mount_at` and the task's memory, cpus and
process limits; every later command over the same workspace is a `podman exec` in it. So the
agent's tool calls and the oracle's solve.sh share one filesystem, inside and outside the
workspace (packages the solution installs, files it writes to /usr/local or /tmp), as they do
in Harbor. Harbor's tests (`run_verifier`) run in that container restarted: they see the same
filesystem, but no process the agent left (a server it started included: in Harbor it would
still run) survives into grading, and the reward is read only once every process is dead. The
workspace is the image's working directory, copied out at import (task/workspace/), so the
file tools read and edit it on the host (owned by container root's host uid: give_workspace).
One difference from Harbor follows: the workspace is a mount of its own, so `rename` between
it and the rest of the container's filesystem fails with EXDEV (in Harbor both are the image's
filesystem; Terminal-Bench 2's path-tracing-reverse tests do this). `binds` (grading's /tests
and /logs) are copied into the container before the command and writable ones copied back
after it. Each command runs under coreutils `timeout` (its whole process group is stopped at
the wall-time limit; the host also gives up a few seconds later), output is capped at
max_output_bytes, a memory kill is the kernel's count for the container's cgroup, and the
workspace and the container's own writes are each measured against max_workspace_mb: the same
SandboxResult fields as the bubblewrap backend (cpu_s and memory_peak_mb are not measured:
None). A `readonly` run gets a fresh container of the image with the workspace mounted
read-only (the pytest and functions graders: their pipes passed in with --preserve-fds, see
container_run.py), removed before its results are read; the episode's container is stopped
first where a process the agent left is still alive in it. A session's container is
removed by `close(workdir)`, by `close()` (all; also at exit), or when the next session starts
after its workspace was deleted.

Network: a task's "network" gives the container the engine's default network; otherwise
--network none. Harbor tasks take it from task.toml's `[environment] allow_internet` (true
when absent, as Harbor runs them; their test setup installs curl, uv and pytest at test time).

Images: `ensure_image` builds a task's Dockerfile once, tagged by a content hash of the build
context, the Dockerfile and the base images' ids. Where no registry is reachable the FROM lines
are mapped onto local base images (BASE_IMAGES), which `build_base_image` makes from the Debian
and Ubuntu archives with mmdebstrap plus a small layer: this machine's extra CA certificates
(its egress proxy; so apt, pip and uv reach their indexes during builds and tests), uv 0.9.5
from PyPI where the uv installer would put it (~/.local/bin, with its `env` file: astral.sh is
not reachable here, PyPI is) and a uv-managed Python 3.13 (what `uvx -p 3.13` fetches: CPython
built from Debian's python3.13 source, verified by apt; or the release's own python3.13). The
python:3.13-slim-bookworm image is Debian 12 with that CPython in /usr/local and ensurepip's pip
(as the official image); python:3.11 / 3.10 are Debian 12's python3 (3.11) with pip and venv as
/usr/local/bin/python; debian:bullseye-slim maps onto Debian 12 (the nearest base built here).
An image a build copies tools from is made locally too (`tool_image`): `COPY
--from=ghcr.io/astral-sh/uv:X` takes /uv and /uvx from localhost/c2-uv:X, built from uv X's PyPI
wheel (the same static binaries as the release image).
On this kind of machine podman needs the runc runtime (crun refuses hybrid cgroups) and rlimits
no higher than the caller's own. Background processes a command leaves (without a timeout)
keep running in the episode's container until grading, as in Harbor; the bubblewrap backend
ends them after each command.

Rooms: here, the shared sandbox of each image and the CLI; container_images.py, the images (base
recipes, task builds); container_run.py, the containers.

    python -m c2.envs.container base [TAG ...]                  # all of BASES by default
    python -m c2.envs.container build --context DIR [--tag TAG] # DIR/Dockerfile
    python -m c2.envs.container run --image TAG --workdir DIR -- CMD...
    python -m c2.envs.container gc                              # containers left by killed runs
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Sequence

from c2.envs.container_images import (  # noqa: F401 - public names of c2.envs.container
    BASE_IMAGES,
    BASES,
    KEYRING_HINTS,
    UV_TOOL_REPO,
    UV_VERSION,
    BaseRecipe,
    _build_error,
    build_base_image,
    build_image,
    context_hash,
    copy_out_of_image,
    ensure_image,
    ensure_tool_images,
    from_images,
    map_from_lines,
    tool_image,
    transient_network_error,
)
from c2.envs.container_run import (  # noqa: F401 - public names of c2.envs.container
    CAPABILITIES,
    LABEL,
    SESSION_ENV,
    USERNS_BASE,
    USERNS_SIZE,
    ContainerSandbox,
    _conmon_cwd,
    _ulimits,
    collect_leftovers,
    engine_available,
    engine_command,
    image_exists,
    image_id,
    image_workdir,
    security_args,
)
from c2.envs.sandbox import SandboxError, SandboxLimits

_SANDBOXES: dict[tuple, ContainerSandbox] = {}
_SANDBOXES_LOCK = threading.Lock()


def container_sandbox(
    image: str,
    *,
    engine: str = "podman",
    network: bool = False,
    limits: SandboxLimits | None = None,
    context: str | os.PathLike | None = None,
    dockerfile: str = "Dockerfile",
    build_timeout_s: float = 3600,
) -> ContainerSandbox:
    """The shared ContainerSandbox of `image` (one per image, engine and network policy), so a
    task's tools and its grading find the same episode containers. When the image is missing
    and `context` is given, it is built from there first."""
    key = (image, engine, network)
    with _SANDBOXES_LOCK:
        sb = _SANDBOXES.get(key)
        if sb is None:
            if not image_exists(image, engine):
                if context is None:
                    raise SandboxError(f"image {image} is missing and no build context was given")
                r = build_image(
                    context, image, engine=engine, dockerfile=dockerfile, timeout_s=build_timeout_s
                )
                if r.returncode != 0:
                    raise SandboxError(f"building {image} failed: {_build_error(r)}")
            sb = _SANDBOXES[key] = ContainerSandbox(
                image, engine=engine, limits=limits, network=network
            )
    return sb


@atexit.register
def close_all() -> None:
    """Remove every episode container this process started."""
    for sb in list(_SANDBOXES.values()):
        with contextlib.suppress(Exception):
            sb.close()


# ---------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m c2.envs.container",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base", help="build local base images (default: every one of BASES)")
    b.add_argument("tags", nargs="*")
    b.add_argument("--missing", action="store_true", help="only those not built yet")
    bd = sub.add_parser("build")
    bd.add_argument("--context", required=True)
    bd.add_argument("--tag", default=None, help="default: localhost/c2-image:<content hash>")
    r = sub.add_parser("run")
    r.add_argument("--image", required=True)
    r.add_argument("--workdir", required=True)
    r.add_argument("--mount_at", default="/workspace")
    r.add_argument("--timeout", type=float, default=30)
    r.add_argument("--memory_mb", type=int, default=1024)
    r.add_argument("--network", action="store_true")
    r.add_argument("command", nargs="+")
    g = sub.add_parser("gc", help="remove episode containers whose workspace is gone")
    for x in (b, bd, r, g):
        x.add_argument("--engine", default="podman", choices=("podman", "docker"))
    args = p.parse_args(argv)
    try:
        if args.cmd == "base":
            tags = args.tags or list(BASES)
            if args.missing:
                tags = [t for t in tags if not image_exists(t, args.engine)]
            for tag in tags:
                t0 = time.monotonic()
                build_base_image(tag, engine=args.engine)
                print(json.dumps({"built": tag, "seconds": round(time.monotonic() - t0, 1)}))
        elif args.cmd == "build":
            if args.tag:
                res = build_image(args.context, args.tag, engine=args.engine)
                tag = args.tag
            else:
                tag, res = ensure_image(args.context, repo="localhost/c2-image", engine=args.engine)
            if res is not None and res.returncode != 0:
                print(_build_error(res), file=sys.stderr)
                return res.returncode
            print(tag)
        elif args.cmd == "gc":
            print(json.dumps({"removed": collect_leftovers(args.engine)}))
        else:
            lim = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb)
            sb = ContainerSandbox(args.image, engine=args.engine, limits=lim, network=args.network)
            sb.give_workspace(args.workdir)
            try:
                print(sb.run(args.command, args.workdir, mount_at=args.mount_at).to_json())
            finally:
                sb.close()
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
