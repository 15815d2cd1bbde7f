"""The rollout fleet on Ray (c2/rl/fleet.py tells the design): connecting to a cluster or
starting a local one (`start_ray`), shipping c2 to its nodes (`runtime_env`), and starting
workers as actors in placement groups, every remote call under a deadline (`ray_launcher`).
Ray is imported only inside these functions, when a fleet starts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from c2 import distributed, sharding
from c2.rl.fleet_driver import (
    WAIT_S,
    WorkerFailed,
    WorkerFault,
    WorkerHung,
    WorkerLost,
    _Handle,
)

# Environment variables a local cluster's workers take from the driver (same compiled-program
# cache keys, the same task-environment cache).
PASS_ENV = (
    "XLA_FLAGS",
    "JAX_PLATFORMS",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "C2_ENV_CACHE",
)
# What never ships with c2 to a cluster's nodes (gitignore patterns; Ray also honours .gitignore).
SHIP_EXCLUDES = (".git", ".venv", "runs", "__pycache__", "*.pyc", "*.egg-info")
CLOSE_TIMEOUT_S = 60.0  # a worker's close: stop its episode thread and fetcher, free its disk
TASK_FETCH_TIMEOUT_S = 300.0  # a worker reading a task's files from the object store
DEVICE_FLAG = distributed.DEVICE_FLAG  # CPU devices of a process
FOLLOWER_GRACE_S = 5.0  # a gang's leader failed: the wait for a follower's end, its likely cause


def c2_package_dir() -> Path:
    import c2

    return Path(c2.__file__).resolve().parent


def runtime_env(mode: str, address: str) -> dict:
    """Ray's runtime_env for the fleet's workers: the driver's JAX/cache variables, and, when
    `mode` says so ("ship"; "auto" when `address` names a cluster rather than "" for a local
    one), the c2 package itself, so the nodes need only its Python dependencies."""
    if mode not in ("auto", "ship", "none"):
        raise ValueError(f"ray_runtime_env={mode!r}: expected 'auto', 'ship' or 'none'")
    env: dict = {"env_vars": {k: os.environ[k] for k in PASS_ENV if k in os.environ}}
    if mode == "ship" or (mode == "auto" and address):
        env["py_modules"] = [str(c2_package_dir())]
        env["excludes"] = list(SHIP_EXCLUDES)
    return env


def start_ray(
    address: str, workers: int, cpus_per_worker: float, ship: str = "auto"
) -> Callable[[], None]:
    """Connect to the cluster at `address`, or start a local one sized for `workers`; returns
    what shuts down what this call started. `ship`: config.rl.ray_runtime_env."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "config.rl.rollout_backend='ray' needs Ray: pip install -e '.[distributed]'"
        ) from e
    if ray.is_initialized():
        return lambda: None
    env = runtime_env(ship, address)
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
    else:
        cpus = max(os.cpu_count() or 1, int(workers * cpus_per_worker + 0.999))
        ray.init(
            num_cpus=cpus,
            include_dashboard=False,
            runtime_env=env,
            log_to_driver=True,
            # Ray starts workers at niceness 15: sharing cores with the trainer, the engines
            # would then get what is left. Rollouts are the work here, not background.
            _system_config={"worker_niceness": 0},
        )
    return ray.shutdown


def worker_resources(spec, num_cpus: float, num_gpus: float) -> dict[str, float]:
    """What one host of a worker reserves: its CPUs, and `num_gpus` for each of its devices
    (`spec.rollout_mesh`'s devices, one when empty, shared by `spec.rollout_hosts` hosts)."""
    devices = math.prod(sharding.parse_mesh(spec.rollout_mesh).values())
    hosts = getattr(spec, "rollout_hosts", 1)
    asked = {"CPU": float(num_cpus), "GPU": float(num_gpus) * devices / hosts}
    return {k: v for k, v in asked.items() if v > 0}


def host_env(spec, gpus: float) -> dict:
    """A gang member's runtime_env: on CPU (no GPUs asked), XLA_FLAGS making its share of the
    engine's devices (`rollout_mesh`'s over `rollout_hosts`); on GPU, Ray's CUDA_VISIBLE_DEVICES
    does that, and nothing is added."""
    if gpus > 0:
        return {}
    devices = math.prod(sharding.parse_mesh(spec.rollout_mesh).values()) // spec.rollout_hosts
    return {"env_vars": {"XLA_FLAGS": distributed.cpu_xla_flags(devices)}}


def check_fits(index: int, asked: Mapping[str, float], nodes: list[dict]) -> None:
    """Fail at once when no node of the cluster could ever hold worker `index`'s bundle (a
    worker's devices are on one node)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", n.get("alive", True))]
    if any(all(node.get(k, 0.0) >= v for k, v in asked.items()) for node in alive):
        return
    most = {k: max((node.get(k, 0.0) for node in alive), default=0.0) for k in asked}
    raise RuntimeError(
        f"rollout worker {index} asks for {dict(asked)} but the cluster has at most {most} on "
        f"one node ({len(alive)} nodes; config.rl.ray_worker_cpus, ray_worker_gpus and "
        "rollout_mesh set the ask)"
    )


class RayLauncher:
    """`launch(index, incarnation) -> _Handle`: worker `index` in its placement group (made once,
    kept across its incarnations so a replacement lands on the devices its predecessor freed):
    one `RolloutWorker` actor, or with `spec.rollout_hosts` > 1 a gang of `GangMember`s, one a
    host (c2/rl/fleet_gang.py). Every remote call has a deadline; past it the worker is killed
    and the call raises `WorkerHung`. `worker` / `follower`: the classes the actors run (tests
    pass faulty ones)."""

    def __init__(
        self,
        spec,
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        place_timeout_s: float = 60.0,
        start_timeout_s: float = 1800.0,
        call_timeout_s: float = 600.0,
        worker: type | None = None,
        follower: type | None = None,
    ):
        import ray

        from c2.rl.fleet import RolloutWorker

        self.spec, self.resources = spec, worker_resources(spec, num_cpus, num_gpus)
        self.hosts = getattr(spec, "rollout_hosts", 1)
        self.place_timeout_s, self.start_timeout_s = place_timeout_s, start_timeout_s
        self.deadlines = {"exchange": call_timeout_s + WAIT_S, "close": CLOSE_TIMEOUT_S}
        self.worker, self.follower = worker or RolloutWorker, follower
        if self.hosts == 1:
            self.remote = ray.remote(self.worker)
        else:
            from c2.rl.fleet_gang import GangMember

            self.remote = ray.remote(GangMember)
        self.groups: dict[int, object] = {}  # worker index -> its placement group

    def put(self, blob: bytes):
        """A task's files into the object store, once a run; workers get the ref."""
        import ray

        return ray.put(blob)

    def _placement(self, index: int):
        """Worker `index`'s placement group (a bundle a host), reserved within place_timeout_s."""
        import ray
        from ray.util import placement_group, remove_placement_group

        if index in self.groups or not self.resources:
            return self.groups.get(index)
        check_fits(index, self.resources, ray.nodes())
        # One host's bundle is on one node; a gang's hosts pack onto as few nodes as hold them.
        strategy = "STRICT_PACK" if self.hosts == 1 else "PACK"
        group = placement_group([dict(self.resources)] * self.hosts, strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=self.place_timeout_s)
        if not ready:
            remove_placement_group(group)
            ask = f"{self.hosts} hosts of " if self.hosts > 1 else ""
            raise RuntimeError(
                f"rollout worker {index} asks for {ask}{self.resources} but the cluster could not "
                f"place it within {self.place_timeout_s:.0f}s (config.rl.ray_place_timeout_s); "
                f"free now: {ray.available_resources()}"
            )
        self.groups[index] = group
        return group

    def _options(self, group, bundle: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options: dict = {"max_restarts": 0, "max_concurrency": 2}  # see RayRollouts._fault
        options["num_cpus"] = self.resources.get("CPU", 0.0)
        options["num_gpus"] = self.resources.get("GPU", 0.0)
        if group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, bundle)
        return options

    def __call__(self, index: int, incarnation: int) -> _Handle:
        import ray

        group = self._placement(index)
        name = f"rollout worker {index}.{incarnation}"
        if self.hosts == 1:
            actors = [
                self.remote.options(**self._options(group, 0)).remote(self.spec, index, incarnation)
            ]
        else:
            actors = self._gang(group, index, incarnation)
        watched: list = []  # a gang's followers' serve calls: one that ends fails the worker

        def kill() -> None:
            for actor in actors:
                ray.kill(actor, no_restart=True)

        def call(method: str, *args, timeout: float | None = None):
            ref = getattr(actors[0], method).remote(*args)
            deadline = self.deadlines.get(method, CLOSE_TIMEOUT_S) if timeout is None else timeout
            watch = [] if method == "close" else watched
            try:
                ready, _ = ray.wait([ref, *watch], num_returns=1, timeout=deadline)
                if not ready:
                    kill()
                    raise WorkerHung(f"{name}: {method} passed its {deadline:.0f}s deadline")
                if ready[0] is not ref:
                    stopped(ready[0])
                try:
                    return ray.get(ref)
                except ray.exceptions.RayError:
                    # A gang's leader fails when a follower has gone: name the cause.
                    if watch:
                        done, _ = ray.wait(watch, num_returns=1, timeout=FOLLOWER_GRACE_S)
                        if done:
                            stopped(done[0])
                    raise
            except ray.exceptions.RayActorError as e:  # a process or node is gone
                raise WorkerLost(f"{name}: {e}") from e
            except ray.exceptions.RayError as e:  # its own exception, raised in an actor
                raise WorkerFailed(f"{name}: {e}") from e

        def stopped(serving) -> None:
            """A follower's serve call ended: its error, or one saying it ended unasked."""
            ray.get(serving)
            rank = 1 + watched.index(serving)
            raise WorkerFailed(f"{name}: its follower {rank} stopped serving unasked")

        handle = _Handle(index, incarnation, call, kill, int(self.spec.engine_args["max_slots"]))
        try:  # its first answer waits for the actor to be built (weights fetched, engine made)
            if self.hosts == 1:
                handle.pid = call("pid", timeout=self.start_timeout_s)
            else:
                handle.pid = self._start_gang(actors, name, call)
                watched.extend(actor.serve.remote() for actor in actors[1:])
        except WorkerHung as e:
            kill()
            raise RuntimeError(
                f"{name} was not ready within {self.start_timeout_s:.0f}s "
                "(config.rl.ray_start_timeout_s)"
            ) from e
        except WorkerFault:
            kill()
            raise
        return handle

    def _gang(self, group, index: int, incarnation: int) -> list:
        """A gang's actors, member r in bundle r; each process gets its share of the devices."""
        env = host_env(self.spec, self.resources.get("GPU", 0.0))
        roles = {"leader": self.worker} | ({"follower": self.follower} if self.follower else {})
        return [
            self.remote.options(**self._options(group, rank), runtime_env=env).remote(
                self.spec, index, incarnation, rank, self.start_timeout_s, **roles
            )
            for rank in range(self.hosts)
        ]

    def _start_gang(self, actors: list, name: str, call) -> int:
        """Every member joins the gang's jax.distributed group at member 0's coordinator and
        builds its role, within start_timeout_s; the leader's pid."""
        import ray

        address = call("address", timeout=self.start_timeout_s)
        started = [actor.start.remote(address) for actor in actors]
        _, pending = ray.wait(started, num_returns=len(started), timeout=self.start_timeout_s)
        if pending:
            raise WorkerHung(f"{name}: {len(pending)} of its {len(actors)} hosts did not start")
        try:
            return ray.get(started)[0]
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"{name}: {e}") from e
        except ray.exceptions.RayError as e:
            raise WorkerFailed(f"{name}: {e}") from e

    def close(self) -> None:
        """Free the placement groups (the actors are killed by then)."""
        from ray.util import remove_placement_group

        for group in self.groups.values():
            remove_placement_group(group)
        self.groups.clear()


def ray_launcher(spec, **kwargs) -> RayLauncher:
    """`launch(index, incarnation) -> _Handle` for Ray actors (`RayLauncher`'s arguments)."""
    return RayLauncher(spec, **kwargs)
