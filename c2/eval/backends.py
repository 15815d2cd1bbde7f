"""Where a task set's episodes run: the bubblewrap sandbox for plain tasks, a container engine
for tasks imported with their image (`Task.sandbox` picks per task). The pass@k runner checks
only the backends its tasks use, so a container-only set needs no bubblewrap."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable


def task_backends(tasks) -> dict[str, list[str]]:
    """The backends a task set runs in ("bwrap", or a container engine) -> their task ids."""
    out: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        out["bwrap" if t.container is None else t.container.get("engine", "podman")].append(
            t.task_id
        )
    return dict(out)


class IsolationMissing(RuntimeError):
    """A backend the task set runs in does not work on this machine."""


def describe_isolation(tasks, sandbox) -> str:
    """What runs the task set's episodes: the sandbox's isolation and/or container engines."""
    return "; ".join(
        sandbox.isolation.describe() if b == "bwrap" else f"{b} containers"
        for b in sorted(task_backends(tasks))
    )


def check_isolation(tasks, sandbox, engine_available: Callable | None = None) -> None:
    """Raises IsolationMissing naming each backend the tasks need that this machine lacks
    (bubblewrap namespaces only when a task runs in the sandbox; a container engine only when a
    task runs in its containers)."""
    if engine_available is None:
        from c2.envs.container import engine_available
    missing = []
    for backend, ids in sorted(task_backends(tasks).items()):
        some = f"{len(ids)} task(s) ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''})"
        if backend == "bwrap" and not sandbox.isolated:
            missing.append(
                f"{some} run in the namespace sandbox; this machine has "
                f"{sandbox.isolation.describe()} (`make system-deps` installs bubblewrap)"
            )
        elif backend != "bwrap" and (why := engine_available(backend)) is not None:
            missing.append(f"{some} run in {backend} containers: {why}")
    if missing:
        raise IsolationMissing("episodes cannot run here: " + "; ".join(missing))


class _NoIsolation:
    def describe(self) -> str:
        return "none (every task runs in its container)"


class ContainersOnly:
    """The default sandbox of a task set that runs only in containers. Each task runs in its
    image (Task.sandbox reads only `limits` from here); a command that would run here instead is
    refused, so nothing runs unisolated and bubblewrap is not needed."""

    isolated = True  # nothing runs here

    def __init__(self, limits):
        self.limits = limits
        self.isolation = _NoIsolation()

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("a container-only task set reached the host sandbox")

    run = give_workspace = _refuse


def default_sandbox(tasks):
    """A new Sandbox; for a container-only task set on a machine where none can be made (no
    prlimit), the stand-in whose limits the containers start from."""
    from c2.envs.sandbox import Sandbox, SandboxLimits

    try:
        return Sandbox()
    except RuntimeError:
        if "bwrap" in task_backends(tasks):
            raise
        return ContainersOnly(SandboxLimits())
