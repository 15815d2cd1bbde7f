"""A rollout worker whose engine spans several processes: a gang (config.rl.rollout_hosts > 1;
Kimi-K2's engine on 32 GPUs is four 8-GPU nodes).

Placement. Ray reserves a gang as one placement group of `rollout_hosts` bundles, each a host's
share of the engine's devices (ray_worker_gpus per device of rollout_mesh, divided by the
hosts) and ray_worker_cpus, and starts one `GangMember` actor in each (fleet_ray.RayLauncher).
Member 0 names the group's coordinator (its node's address, a free port); then every member
joins one jax.distributed group (`start`), so each sees the whole mesh and holds its own
devices' part of the weights and KV cache.

Roles. Member 0 leads: a `RolloutWorker` as on one host (episodes, sandboxes, tools, the
driver's `exchange`), whose engine is a `LockstepEngine` (c2/infer/lockstep.py). The others
follow (`EngineFollower`): each builds the same engine on the same mesh from the version the
leader names and replays the leader's calls in `serve`, with no sandbox and no episodes.

Weights. Each member's `WeightSubscriber` reads only the shards its own devices hold. The
leader posts each version its subscriber starts to read (`fleet.PREFETCH_KEY`), so the
followers read the same version meanwhile (`PrefetchedWeights`); when the leader puts a version
in force, its followers take it from there, or read it then.

Faults. A gang lives and dies as one worker. The driver waits on the leader's call and on every
follower's `serve` at once (fleet_ray.RayLauncher): a follower that dies, raises (a weight read
that keeps failing, a `LockstepError`) or stops unasked fails the call; the whole gang is killed
and started again in its placement group, its episodes played again elsewhere, as with a
one-process worker. A collective that hangs passes the call's deadline.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from collections.abc import Callable

from c2.rl.fleet import (
    FOLLOWER_STATS,
    GANG_CHANNEL,
    PREFETCH_KEY,
    RolloutWorker,
    WorkerSpec,
    engine_seed,
)

READ_TRIES = 5  # a follower's read of a version the leader put in force, before it gives up


class PrefetchedWeights:
    """A follower's `weights(version)` for `lockstep.follow`: the version the leader puts in
    force, read for this process's devices. A thread reads ahead the version the leader is
    reading (`hint()`, polled every `poll_s`), one at a time: a version read ahead is kept until
    the leader names it or a newer one. `stats`: versions read ahead and used (`prefetched`),
    read when named (`read_on_demand`)."""

    def __init__(self, subscriber, hint: Callable[[], int | None], poll_s: float = 0.05):
        self.subscriber, self.hint, self.poll_s = subscriber, hint, poll_s
        self.stats: collections.Counter = collections.Counter()
        self.errors: collections.deque[Exception] = collections.deque(maxlen=20)
        self._ready: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weight-prefetch", daemon=True)
        self._thread.start()

    def __call__(self, version: int) -> dict:
        from c2.infer.lockstep import LockstepError
        from c2.rl.weight_store import WeightSyncError

        with self._lock:  # waits for a read ahead in progress
            ready, self._ready = self._ready, None
            if ready is not None and ready[0] == version:
                self.stats["prefetched"] += 1
                return ready[1]
            if ready is not None and ready[0] > version:
                raise LockstepError(f"the leader put version {version} in force after {ready[0]}")
            self.stats["read_on_demand"] += 1
            for attempt in range(READ_TRIES):
                if attempt:
                    time.sleep(min(2 ** (attempt - 1), 8))
                try:
                    return self.subscriber.fetch(version)[1]
                except Exception as e:  # retried; the last one stops this follower
                    error = e
            raise WeightSyncError(
                f"follower: reading version {version} failed {READ_TRIES} times: "
                f"{type(error).__name__}: {error}",
                version=version,
            ) from error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.subscriber.renew()  # a live follower keeps its lease
                version = self.hint()
                with self._lock:
                    held = self.subscriber.version
                    if version is None or self._ready is not None or version <= (held or -1):
                        continue
                    self._ready = self.subscriber.fetch(version)
            except Exception as e:  # the leader's call reads it again, and fails there
                self.errors.append(e)


class EngineFollower:
    """A follower of a gang (the module doc): the leader's engine, replayed."""

    def __init__(self, spec: WorkerSpec, index: int, incarnation: int, start_timeout_s: float):
        import jax

        from c2 import distributed, sharding
        from c2.infer.engine import Engine, weight_shardings
        from c2.rl.weight_sync import WeightSubscriber

        if spec.compilation_cache:
            jax.config.update("jax_compilation_cache_dir", spec.compilation_cache)
        self.channel = distributed.Channel(GANG_CHANNEL)
        rules = sharding.RULES if spec.rollout_rules is None else spec.rollout_rules
        mesh = sharding.mesh_from_spec(spec.rollout_mesh, jax.devices())
        self.mesh = sharding.Layout(mesh, rules)
        distributed.warm_collectives(mesh)  # with the leader
        self.subscriber = WeightSubscriber(
            spec.weight_url,
            subscriber_id=f"rollout-worker-{index}-{jax.process_index()}-{os.getpid()}",
            shardings=weight_shardings(spec.model, self.mesh),
        )
        version = self.channel.receive(start_timeout_s)
        if version is None:
            raise TimeoutError(f"the leader named no version within {start_timeout_s:.0f}s")
        version, params = self.subscriber.fetch(version)
        self.engine = Engine(
            params,
            spec.model,
            seed=engine_seed(spec, index, incarnation),
            version=version,
            mesh=self.mesh,
            **spec.engine_args,
        )
        self.weights = PrefetchedWeights(
            self.subscriber, lambda: self.channel.peek(PREFETCH_KEY), spec.poll_s
        )
        self._stop = threading.Event()

    def serve(self) -> dict:
        """Replay the leader's calls until it closes; returns what was replayed."""
        from c2.infer.lockstep import follow

        counts = follow(self.engine, self.channel.receive, self._weights, stop=self._stop)
        return counts | dict(self.weights.stats)

    def _weights(self, version: int) -> dict:
        """The version the leader put in force; how it came is posted for the leader's stats."""
        import jax

        params = self.weights(version)
        self.channel.post(f"{FOLLOWER_STATS}{jax.process_index()}", dict(self.weights.stats))
        return params

    def close(self) -> None:
        self._stop.set()
        self.weights.stop()
        self.subscriber.close()


class GangMember:
    """One Ray actor of a gang: member `rank` of `spec.rollout_hosts`. `leader` / `follower`:
    the classes the roles use (tests pass faulty ones)."""

    def __init__(
        self,
        spec: WorkerSpec,
        index: int,
        incarnation: int,
        rank: int,
        start_timeout_s: float = 1800.0,
        leader: type = RolloutWorker,
        follower: type = EngineFollower,
    ):
        self.args = (spec, index, incarnation)
        self.rank, self.start_timeout_s = rank, start_timeout_s
        self.roles = (leader, follower)
        self.member = None

    def address(self) -> str:
        """Where the gang's coordinator will listen: this node's address and a free port."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def start(self, coordinator: str) -> int:
        """Join the gang's jax.distributed group and build this member's role; its pid."""
        from c2 import distributed

        spec = self.args[0]
        distributed.initialize(
            coordinator_address=coordinator,
            num_processes=spec.rollout_hosts,
            process_id=self.rank,
        )
        if self.rank == 0:
            self.member = self.roles[0](*self.args)
        else:
            self.member = self.roles[1](*self.args, self.start_timeout_s)
        return os.getpid()

    def serve(self) -> dict:
        return self.member.serve()

    def exchange(self, *args, **kwargs) -> dict:
        return self.member.exchange(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.member is not None:
            self.member.close()
