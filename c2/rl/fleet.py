"""A rollout fleet on Ray (`config.rl.rollout_backend = "ray"`): the RL stage's episodes played
by `num_rollout_workers` engines, in processes of this machine or across a Ray cluster.

Workers. Each is a Ray actor (`RolloutWorker`) holding its own `Engine`, sandbox pool and
`EpisodeRunner`, streaming episodes exactly as the in-process backend does (continuous batching,
tools and grading off the engine's thread). Weights reach a worker only through the weight store
(c2/rl/weight_sync.py): its `WeightSubscriber` follows the store in a background thread and each
new version takes effect at the engine's next decode step. Tasks travel with the requests (a task
directory is packed once, zstd tar, and put once in Ray's object store; each worker is sent its
ref the first time it plays the task), so workers need no shared filesystem; the weight
store's URL must be reachable from every worker (s3://, gs://, or file:// on a filesystem they
share; on one machine, any file://). Samples come back as `Sample`s: per-token arrays and the
routed experts as one compact [T, L, k] integer array each, never Python lists.

Gangs. An engine too large for one host (`config.rl.rollout_hosts` > 1) is a gang: one actor a
host in one placement group and one jax.distributed group, the leader a `RolloutWorker` whose
engine's calls its followers replay (c2/rl/fleet_gang.py; c2/infer/lockstep.py). To the driver a
gang is one worker: it exchanges with the leader, and a follower's end fails the gang.

Driver. `RayRollouts` lives in the trainer's process and keeps the one `Scheduler`, so the
ledger and the staleness rules are those of the in-process backend (c2/rl/orchestrator.py). One
driver thread per worker calls the worker's `exchange(requests, published, hungry, wait_s)`: it
hands over new episode requests and gets back the samples finished since, the version the
worker's engine holds and how many more episodes it can start. Admission is per worker, by the
version it holds: a group is admitted for a worker only under `Scheduler.quota(held version)`,
and all of a group's episodes go to that worker, so every token of a group comes from a version
>= the one it was admitted at, as in process.

Faults.
  a worker dies   (its process killed, its node lost: Ray's ActorDiedError), raises (its engine,
  raises, hangs   episode runner or weight fetcher fails: its exchange raises) or hangs (a call
                  passes its deadline, config.rl.ray_call_timeout_s; it is killed): the requests
                  it held are played again by the other workers, exactly once, but only by one
                  holding at least the group's admission version (so the bound still holds); a
                  replacement actor is started, up to config.rl.ray_max_restarts in a run, past
                  which the run fails naming the worker and its error. Samples it returned
                  before stand.
  no room         a worker whose CPUs/GPUs (ray_worker_cpus; ray_worker_gpus per device of
                  rollout_mesh, reserved in a placement group: each host's share on one node)
                  no node has fails the run at once, naming the resource; one the cluster
                  cannot place within ray_place_timeout_s fails it then. Building a worker
                  (weights, compile) has ray_start_timeout_s.
  a stale worker  one whose held version is more than max_staleness behind the newest published
                  version fetches that version synchronously before playing on (`refreshed`);
                  and a returned sample with a token older than its group's admission version is
                  never trained: it is played again (`regenerated`), and counted, by another
                  worker while one holds a new enough version (a worker whose tokens come out
                  older than it reports may keep doing so: given its own stale episodes back
                  first, it could replay them forever).
Every fault is counted in `metrics()` (`fleet/...`), which the trainer logs each step.

`ray` is an optional extra (`pip install -e '.[distributed]'`); c2 imports it only when a fleet
starts. Connect to a cluster with `config.rl.ray_address` ("auto", "ray://host:10001"; c2 itself
ships to its nodes through Ray's runtime_env, `config.rl.ray_runtime_env`); empty starts a local
one, whose workers run at the trainer's priority (Ray's default niceness of 15 for workers
starves them wherever they share cores with the trainer; on a cluster of your own,
`ray start --system-config='{"worker_niceness": 0}'` does the same).

Files: this one, the worker; c2/rl/fleet_driver.py, the driver; c2/rl/fleet_ray.py, Ray itself
(cluster, runtime_env, placement, deadlines); c2/rl/fleet_gang.py, a worker over several hosts.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from c2.rl.episodes import EpisodeRequest, RolloutConfig
from c2.rl.fleet_driver import (  # noqa: F401  (the fleet's public names, in one place)
    WAIT_S,
    RayRollouts,
    WorkerFailed,
    WorkerFault,
    WorkerHung,
    WorkerLost,
    _Handle,
    pack_task,
    unpack_task,
)
from c2.rl.fleet_ray import (  # noqa: F401
    PASS_ENV,
    TASK_FETCH_TIMEOUT_S,
    RayLauncher,
    ray_launcher,
    runtime_env,
    start_ray,
)
from c2.rl.records import Sample

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its engine and play episodes (pickled to the actor)."""

    model: object  # c2.model.config.ModelConfig
    tokenizer: str  # config.data.tokenizer
    rollout: RolloutConfig
    engine_args: Mapping  # Engine keyword arguments (slots, max_len, sampling, stop tokens)
    weight_url: str  # the weight store prefix this run publishes under
    seed: int
    max_staleness: int
    compilation_cache: str = ""  # jax_compilation_cache_dir for the worker ("" = none)
    poll_s: float = 0.05  # how often a worker asks the store for a newer version
    rollout_mesh: str = ""  # the engine's mesh (config.rl.rollout_mesh; "" = one device)
    rollout_rules: Mapping | None = None  # its sharding rules (None: c2.sharding.RULES)
    rollout_hosts: int = 1  # processes the engine spans (config.rl.rollout_hosts; a gang if > 1)


GANG_CHANNEL = "rollout-engine"  # a gang's messages, leader to followers (c2/rl/fleet_gang.py)
PREFETCH_KEY = "fetching"  # the version the leader's subscriber is reading
FOLLOWER_STATS = "weights-of-"  # + a follower's rank: how the versions it put in force came


def engine_seed(spec: WorkerSpec, index: int, incarnation: int) -> int:
    """Worker `index`'s sampling seed (distinct draws per worker and incarnation; the same in
    every process of a gang)."""
    return spec.seed + 7919 * (index + 1) + 104729 * incarnation


# The worker ----------------------------------------------------------------------------------


class RolloutWorker:
    """One engine, sandbox pool and episode runner, fed by `exchange` (a Ray actor in a fleet;
    a plain object works the same in process)."""

    def __init__(self, spec: WorkerSpec, index: int, incarnation: int = 0):
        import jax

        if spec.compilation_cache:
            jax.config.update("jax_compilation_cache_dir", spec.compilation_cache)
        from c2 import distributed, sharding
        from c2.data.chat import AgentChat
        from c2.data.tokenizer import load_tokenizer
        from c2.envs.sandbox import Sandbox
        from c2.infer.engine import Engine, weight_shardings
        from c2.infer.lockstep import LockstepEngine
        from c2.rl.episodes import EpisodeRunner
        from c2.rl.weight_sync import BackgroundFetcher, WeightSubscriber

        self.spec, self.index, self.incarnation = spec, index, incarnation
        # A gang's leader (c2/rl/fleet_gang.py) when jax.distributed spans several processes:
        # their engines replay this one's calls, told through `channel`.
        gang = jax.process_count() > 1
        self.channel = distributed.Channel(GANG_CHANNEL) if gang else None
        self.mesh = None  # the engine's: the devices Ray reserved for this worker (its gang's)
        if spec.rollout_mesh:
            rules = sharding.RULES if spec.rollout_rules is None else spec.rollout_rules
            mesh = sharding.mesh_from_spec(spec.rollout_mesh, jax.devices())
            self.mesh = sharding.Layout(mesh, rules)
            distributed.warm_collectives(mesh)  # a gang's followers do the same (else nothing)
        # Named by process: what a worker holds on disk (its live episodes' workspaces) is found
        # from its pid.
        self.scratch = Path(tempfile.mkdtemp(prefix=f"c2-rollout-worker{index}-{os.getpid()}-"))
        (self.scratch / "tasks").mkdir()
        # On a mesh, the worker reads only the shards its engine's devices hold.
        shardings = None if self.mesh is None else weight_shardings(spec.model, self.mesh)
        self.subscriber = WeightSubscriber(
            spec.weight_url,
            subscriber_id=f"rollout-worker-{index}-{os.getpid()}",
            shardings=shardings,
        )
        self.version, params = self.subscriber.fetch()
        if gang:  # the followers build their engines from this version
            self.channel.send(self.version)
        self.engine = Engine(
            params,
            spec.model,
            seed=engine_seed(spec, index, incarnation),
            version=self.version,
            mesh=self.mesh,
            **spec.engine_args,
        )
        if gang:  # and follow its calls
            self.subscriber.on_fetch = lambda version: self.channel.post(PREFETCH_KEY, version)
            self.engine = LockstepEngine(self.engine, self.channel.send)
        chat = AgentChat(load_tokenizer(spec.tokenizer))
        self.runner = EpisodeRunner(
            self.engine, chat, Sandbox(), self.scratch / "episodes", spec.rollout
        )
        self.stats: Counter = Counter()
        self._tasks: dict[str, object] = {}
        self._queue: collections.deque[EpisodeRequest] = collections.deque()
        self._done: list[Sample] = []
        self._active = 0  # episodes taken by the runner and not finished
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._fetcher = BackgroundFetcher(
            self.subscriber, self._deliver, poll_s=spec.poll_s, on_fatal=self._fail
        )
        self._fetcher.start()
        self._thread = threading.Thread(target=self._serve, name="episodes", daemon=True)
        self._thread.start()

    # Called by the driver --------------------------------------------------------------------

    def pid(self) -> int:
        return os.getpid()

    def exchange(
        self, requests: Sequence[tuple], published: int, hungry: bool, wait_s: float = WAIT_S
    ) -> dict:
        """Take `requests` ((task_id, task blob or None, prompt_id, group_id, sample_index)
        tuples); return the samples finished since the last call, the version held, and how
        many more episodes this worker can start (`want`). Waits up to `wait_s` for a finished
        sample, a new version, or (when the driver is `hungry` to hand out more) free room."""
        if published - self.version > self.spec.max_staleness:
            self._refresh(published)
        with self._cond:
            for task_id, blob, prompt_id, group_id, k in requests:
                task = self._task(task_id, blob)
                self._queue.append(EpisodeRequest(task, prompt_id, group_id, k))
            self._cond.notify_all()
            seen = self.version
            self._cond.wait_for(
                lambda: (
                    self._done
                    or self._error is not None
                    or self.version != seen
                    or (hungry and self._want() > 0)
                ),
                timeout=wait_s,
            )
            if self._error is not None:
                raise RuntimeError(f"rollout worker {self.index} failed") from self._error
            done, self._done = self._done, []
            return {
                "samples": done,
                "version": self.version,
                "want": self._want(),
                "errors": self.runner.error_counts(),
                "stats": dict(self.stats) | self._follower_stats(),
            }

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join()
        self._fetcher.stop()
        if self.channel is not None:
            self.engine.close()  # the followers stop
        self.subscriber.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # Inside the worker -----------------------------------------------------------------------

    def _follower_stats(self) -> dict:
        """A gang's followers' weight reads, summed: versions read ahead of the leader's call
        (`follower_prefetched`) or when it came (`follower_read_on_demand`)."""
        out: Counter = Counter()
        for rank in self.channel.receivers if self.channel is not None else ():
            out.update(self.channel.peek(f"{FOLLOWER_STATS}{rank}") or {})
        return {f"follower_{k}": v for k, v in out.items()}

    def _want(self) -> int:
        return int(self.spec.engine_args["max_slots"]) - self._active - len(self._queue)

    def _task(self, task_id: str, blob):
        """The task `task_id`, unpacked from `blob` (its packed files, or their object-store ref)
        the first time it comes."""
        from c2.envs.tasks import load_task

        if task_id not in self._tasks:
            if blob is None:
                raise ValueError(f"task {task_id!r} arrived without its files")
            if not isinstance(blob, bytes | bytearray):  # put once by the driver (RayLauncher.put)
                import ray

                blob = ray.get(blob, timeout=TASK_FETCH_TIMEOUT_S)
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)
            root = unpack_task(blob, self.scratch / "tasks" / f"{len(self._tasks):06d}-{name}")
            self._tasks[task_id] = load_task(root)
        return self._tasks[task_id]

    def _serve(self) -> None:
        try:
            self.runner.stream(self._take, self._finish, idle=self._idle, stop=self._stop)
        except BaseException as e:
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        """Raised to the driver at its next exchange (which replaces this worker)."""
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()

    def _take(self, n: int) -> list[EpisodeRequest]:
        with self._cond:
            out = [self._queue.popleft() for _ in range(min(n, len(self._queue)))]
            self._active += len(out)
            return out

    def _finish(self, sample: Sample) -> None:
        with self._cond:
            self._done.append(sample)
            self._active -= 1
            self._cond.notify_all()

    def _idle(self) -> None:
        with self._cond:
            self._cond.wait(0.05)

    def _deliver(self, params, version: int) -> None:
        with self._cond:
            if version <= self.version:
                return  # a refresh already brought this version or a newer one
            self.engine.update_weights(params, version)
            self.version = version
            self._cond.notify_all()

    def _refresh(self, published: int) -> None:
        """Behind by more than the staleness bound: fetch the newest version now."""
        held = self.version
        version, params = self.subscriber.fetch()
        if version > held:
            self._deliver(params, version)
            self.stats["refreshed"] += 1
            log.warning(
                "rollout worker %d held version %d with %d published: refreshed to %d",
                self.index,
                held,
                published,
                version,
            )
