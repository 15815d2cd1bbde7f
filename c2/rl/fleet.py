"""A rollout fleet on Ray (`config.rl.rollout_backend = "ray"`): the RL stage's episodes played
by `num_rollout_workers` engines, in processes of this machine or across a Ray cluster.

Workers. Each is a Ray actor (`RolloutWorker`) holding its own `Engine`, sandbox pool and
`EpisodeRunner`, streaming episodes exactly as the in-process backend does (continuous batching,
tools and grading off the engine's thread). Weights reach a worker only through the weight store
(c2/rl/weight_sync.py): its `WeightSubscriber` follows the store in a background thread and each
new version takes effect at the engine's next decode step. Tasks travel with the requests (a task
directory is packed once per worker, zstd tar), so workers need no shared filesystem; the weight
store's URL must be reachable from every worker (s3://, gs://, or file:// on a filesystem they
share; on one machine, any file://). Samples come back as `Sample`s: per-token arrays and the
routed experts as one compact [T, L, k] integer array each, never Python lists.

Driver. `RayRollouts` lives in the trainer's process and keeps the one `Scheduler`, so the
ledger and the staleness rules are those of the in-process backend (c2/rl/orchestrator.py). One
driver thread per worker calls the worker's `exchange(requests, published, hungry, wait_s)`: it
hands over new episode requests and gets back the samples finished since, the version the
worker's engine holds and how many more episodes it can start. Admission is per worker, by the
version it holds: a group is admitted for a worker only under `Scheduler.quota(held version)`,
and all of a group's episodes go to that worker, so every token of a group comes from a version
>= the one it was admitted at, as in process.

Faults.
  a worker dies   (its process killed, its node lost: Ray's ActorDiedError): the requests it held
                  are played again by the other workers, but only by one holding at least the
                  group's admission version (so the bound still holds); a replacement actor is
                  started, up to `max_restarts` in a run. Samples it returned before dying stand.
  a stale worker  one whose held version is more than max_staleness behind the newest published
                  version fetches that version synchronously before playing on (`refreshed`);
                  and a returned sample with a token older than its group's admission version is
                  never trained: it is played again (`regenerated`), and counted, by another
                  worker while one holds a new enough version (a worker whose tokens come out
                  older than it reports may keep doing so: given its own stale episodes back
                  first, it could replay them forever).
Every fault is counted in `metrics()` (`fleet/...`), which the trainer logs each step.

`ray` is an optional extra (`pip install -e '.[distributed]'`); this module imports it only when
a fleet starts. Connect to a cluster with `config.rl.ray_address` ("auto", "ray://host:10001");
empty starts a local one, whose workers run at the trainer's priority (Ray's default niceness of
15 for workers starves them wherever they share cores with the trainer; on a cluster of your own,
`ray start --system-config='{"worker_niceness": 0}'` does the same).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import tarfile
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import zstandard

from c2.rl import orchestrator
from c2.rl.episodes import EpisodeRequest, RolloutConfig, error_metrics
from c2.rl.records import Sample

log = logging.getLogger(__name__)

WAIT_S = 0.5  # how long an exchange waits for a finished sample before returning empty-handed
# Environment variables a local cluster's workers take from the driver (same compiled-program
# cache keys, the same task-environment cache).
PASS_ENV = (
    "XLA_FLAGS",
    "JAX_PLATFORMS",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "C2_ENV_CACHE",
)


class WorkerLost(RuntimeError):
    """A worker's process or node is gone (its requests are played again elsewhere)."""


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


# Tasks on the wire ---------------------------------------------------------------------------


def pack_task(root: str | os.PathLike) -> bytes:
    """A task directory as zstd-compressed tar bytes (`unpack_task` restores it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(root), arcname=".")
    return zstandard.ZstdCompressor(level=3).compress(buf.getvalue())


def unpack_task(blob: bytes, dest: Path) -> Path:
    """Restore a packed task under `dest` (written to a temporary name, then renamed: a worker
    killed part-way leaves no half task that looks whole)."""
    if dest.exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    data = zstandard.ZstdDecompressor().decompress(blob, max_output_size=1 << 34)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp, dest)
    return dest


# The worker ----------------------------------------------------------------------------------


class RolloutWorker:
    """One engine, sandbox pool and episode runner, fed by `exchange` (a Ray actor in a fleet;
    a plain object works the same in process)."""

    def __init__(self, spec: WorkerSpec, index: int, incarnation: int = 0):
        import jax

        if spec.compilation_cache:
            jax.config.update("jax_compilation_cache_dir", spec.compilation_cache)
        from c2.data.chat import AgentChat
        from c2.data.tokenizer import load_tokenizer
        from c2.envs.sandbox import Sandbox
        from c2.infer.engine import Engine
        from c2.rl.episodes import EpisodeRunner
        from c2.rl.weight_sync import BackgroundFetcher, WeightSubscriber

        self.spec, self.index = spec, index
        # Named by process: what a worker holds on disk (its live episodes' workspaces) is found
        # from its pid.
        self.scratch = Path(tempfile.mkdtemp(prefix=f"c2-rollout-worker{index}-{os.getpid()}-"))
        (self.scratch / "tasks").mkdir()
        self.subscriber = WeightSubscriber(
            spec.weight_url, subscriber_id=f"rollout-worker-{index}-{os.getpid()}"
        )
        self.version, params = self.subscriber.fetch()
        seed = spec.seed + 7919 * (index + 1) + 104729 * incarnation  # distinct draws per worker
        self.engine = Engine(
            params, spec.model, seed=seed, version=self.version, **spec.engine_args
        )
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
                "stats": dict(self.stats),
            }

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join()
        self._fetcher.stop()
        self.subscriber.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # Inside the worker -----------------------------------------------------------------------

    def _want(self) -> int:
        return int(self.spec.engine_args["max_slots"]) - self._active - len(self._queue)

    def _task(self, task_id: str, blob: bytes | None):
        from c2.envs.tasks import load_task

        if task_id not in self._tasks:
            if blob is None:
                raise ValueError(f"task {task_id!r} arrived without its files")
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
        """Raised to the driver at its next exchange (the run stops with it)."""
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


# The driver ----------------------------------------------------------------------------------


def _key(req: EpisodeRequest) -> tuple[str, int]:
    return req.group_id, req.sample_index


class _Handle:
    """One worker as the driver sees it: how to call it, and what it holds."""

    def __init__(self, index: int, incarnation: int, call: Callable, kill: Callable, want: int):
        self.index, self.incarnation = index, incarnation
        self.call, self.kill = call, kill
        self.version = -1  # the version its engine holds (known after the first exchange)
        self.want = want
        self.inflight: dict[tuple[str, int], EpisodeRequest] = {}
        self.shipped: set[str] = set()  # tasks whose files it has
        self.errors: dict[str, int] = {}  # its episode runner's error counts
        self.stats: dict[str, int] = {}
        self.pid: int | None = None


def ray_launcher(spec: WorkerSpec, *, num_cpus: float = 1.0, num_gpus: float = 0.0):
    """`launch(index, incarnation) -> _Handle` for Ray actors (ray imported here only)."""
    import ray

    remote = ray.remote(RolloutWorker)

    def launch(index: int, incarnation: int) -> _Handle:
        actor = remote.options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_concurrency=2
        ).remote(spec, index, incarnation)

        def call(method: str, *args):
            try:
                return ray.get(getattr(actor, method).remote(*args))
            except ray.exceptions.RayActorError as e:  # the process or node is gone
                raise WorkerLost(f"rollout worker {index}.{incarnation}: {e}") from e

        def kill() -> None:
            ray.kill(actor, no_restart=True)

        handle = _Handle(index, incarnation, call, kill, int(spec.engine_args["max_slots"]))
        handle.pid = call("pid")  # waits for the actor to be built (engine compiled)
        return handle

    return launch


class RayRollouts(orchestrator.Collector):
    """The rollouts of a run on a fleet of workers (see the module doc); the same interface as
    `orchestrator.AsyncRollouts`: start, next_groups, publish, counters, metrics, close.

    launch(index, incarnation) -> _Handle starts a worker (`ray_launcher`; tests pass their own);
    weights: the run's `StoreWeights` (the driver publishes; workers subscribe)."""

    def __init__(
        self,
        launch: Callable[[int, int], _Handle],
        scheduler: orchestrator.Scheduler,
        prompts: Sequence[str],
        request: Callable[[str, int], EpisodeRequest],
        *,
        version: int,
        limit: int,
        weights,
        workers: int,
        max_restarts: int | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        if workers < 1:
            raise ValueError(f"num_rollout_workers={workers}: need at least 1")
        super().__init__(scheduler)
        self.launch, self.request, self.weights = launch, request, weights
        self.workers = workers
        self.max_restarts = 2 * workers if max_restarts is None else max_restarts
        self._prompts = collections.deque(prompts)
        self._left = limit
        self._published = version
        self._retry: collections.deque[EpisodeRequest] = collections.deque()
        self._handles: list[_Handle] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._on_close = on_close
        self.counts: Counter = Counter()  # fleet events: deaths, restarts, regenerated, ...
        # (group, sample) -> the workers, (index, incarnation), that returned it stale
        self._stale_from: dict[tuple[str, int], set[tuple[int, int]]] = {}
        self._blobs: dict[str, bytes] = {}
        self._lost_errors: Counter = Counter()  # episode error counts of workers since lost

    def start(self) -> RayRollouts:
        """Launch the workers (in parallel) and their driver threads."""
        launched: list[_Handle | BaseException] = [None] * self.workers  # type: ignore[list-item]

        def one(i: int) -> None:
            try:
                launched[i] = self.launch(i, 0)
            except BaseException as e:
                launched[i] = e

        starters = [threading.Thread(target=one, args=(i,)) for i in range(self.workers)]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        failed = [x for x in launched if isinstance(x, BaseException)]
        if failed:
            for h in launched:
                if isinstance(h, _Handle):
                    h.kill()
            raise RuntimeError(
                f"{len(failed)} of {self.workers} rollout workers failed to start"
            ) from failed[0]
        for h in launched:
            self._drive_in_thread(h)
        return self

    def _drive_in_thread(self, h: _Handle) -> None:
        t = threading.Thread(target=self._drive, args=(h,), name=f"drive-{h.index}", daemon=True)
        with self._cond:
            self._handles.append(h)
            self._threads.append(t)
        t.start()

    # One thread per worker -------------------------------------------------------------------

    def _drive(self, h: _Handle) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    sends = self._assign(h)
                    hungry = self._could_assign(h)
                    if (
                        not sends
                        and not h.inflight
                        and self._all_admitted()
                        and not any(x.inflight for x in self._handles)
                    ):
                        return  # all admitted, none in flight anywhere: no retry can come
                    published = self._published
                wire = [self._wire(h, r) for r in sends]
                reply = h.call("exchange", wire, published, hungry, WAIT_S)
                with self._cond:
                    self._receive(h, reply)
        except WorkerLost as e:
            self._lost(h, e)
        except BaseException as e:  # a bug or a worker's own error: the run stops with it
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _assign(self, h: _Handle) -> list[EpisodeRequest]:
        """Requests for worker `h` (lock held): eligible retries first, then whole new groups
        admitted at the version it holds."""
        if h.version < 0:
            return []  # its held version is not known yet: the first exchange tells
        out: list[EpisodeRequest] = []
        for req in list(self._retry):
            if len(out) >= h.want:
                break
            if self._may_retry(h, req):
                self._retry.remove(req)
                out.append(req)
        while (
            len(out) < h.want
            and self._left
            and self._prompts
            and self.scheduler.quota(h.version) >= 1
        ):
            prompt_id = self._prompts.popleft()
            self.scheduler.admit(prompt_id, h.version)
            self._left -= 1
            out.extend(self.request(prompt_id, k) for k in range(self.scheduler.G))
        for req in out:
            h.inflight[_key(req)] = req
        h.want -= len(out)
        return out

    def _could_assign(self, h: _Handle) -> bool:
        """Whether `h` would get work if it had room (else its exchange waits for samples or a
        new version, instead of returning at once to ask again)."""
        if h.version < 0:
            return True  # the first reply tells its version
        retry = any(self._may_retry(h, r) for r in self._retry)
        fresh = self._left and self._prompts and self.scheduler.quota(h.version) >= 1
        return retry or bool(fresh)

    def _may_retry(self, h: _Handle, req: EpisodeRequest) -> bool:
        """Whether worker `h` may play `req` again (lock held): it holds at least the group's
        admission version, and it did not return `req` stale before, unless no other worker
        holds such a version now."""
        admitted = self.scheduler.groups[req.prompt_id].admitted_at
        if h.version < admitted:
            return False
        if (h.index, h.incarnation) not in self._stale_from.get(_key(req), ()):
            return True
        return not any(x is not h and x.version >= admitted for x in self._handles)

    def _all_admitted(self) -> bool:
        return not self._retry and not (self._left and self._prompts)

    def _wire(self, h: _Handle, req: EpisodeRequest) -> tuple:
        task_id = req.task.task_id
        blob = None
        if task_id not in h.shipped:
            if task_id not in self._blobs:
                self._blobs[task_id] = pack_task(req.task.root)
            blob = self._blobs[task_id]
            h.shipped.add(task_id)
        return (task_id, blob, req.prompt_id, req.group_id, req.sample_index)

    def _receive(self, h: _Handle, reply: dict) -> None:
        """A worker's reply (lock held): its state, and its samples into their groups."""
        h.version, h.want = int(reply["version"]), int(reply["want"])
        h.errors, h.stats = reply["errors"], reply["stats"]
        for sample in reply["samples"]:
            req = h.inflight.pop((sample.group_id, sample.sample_index), None)
            if req is None:
                self.counts["unexpected_samples"] += 1
                continue
            group = self.scheduler.groups[sample.prompt_id]
            oldest = orchestrator.oldest_version(sample)
            if oldest is not None and oldest < group.admitted_at:
                # Generated with weights older than the group allows: never trained.
                self.counts["regenerated"] += 1
                self._stale_from.setdefault(_key(req), set()).add((h.index, h.incarnation))
                self._retry.append(req)
                continue
            self._stale_from.pop(_key(req), None)
            self._finished(sample)  # re-entrant: the Condition's lock is an RLock
        self._cond.notify_all()

    def _lost(self, h: _Handle, error: BaseException) -> None:
        """Worker `h` died: its requests go back to the queue; start a replacement."""
        log.warning("%s; its %d episodes are played again", error, len(h.inflight))
        with self._cond:
            self.counts["worker_deaths"] += 1
            self.counts["replayed"] += len(h.inflight)
            self._lost_errors.update(h.errors)
            self._retry.extend(h.inflight.values())
            h.inflight.clear()
            self._handles.remove(h)
            replace = self.counts["restarts"] < self.max_restarts and not self._stop.is_set()
            if replace:
                self.counts["restarts"] += 1
                self.counts["starting"] += 1  # until its engine is built (can take minutes)
            elif not self._handles:
                self._error = RuntimeError(
                    f"every rollout worker died ({self.counts['worker_deaths']} deaths, "
                    f"{self.counts['restarts']} restarts allowed)"
                )
            self._cond.notify_all()
        if replace:
            try:
                new = self.launch(h.index, h.incarnation + 1)
            except BaseException as e:
                with self._cond:
                    self.counts["starting"] -= 1
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self.counts["starting"] -= 1
            self._drive_in_thread(new)

    # The trainer's side ----------------------------------------------------------------------

    def _generating(self) -> bool:
        with self._cond:
            return any(t.is_alive() for t in self._threads)

    def publish(self, params, version: int) -> None:
        """Publish to the store; workers fetch it themselves (and are refreshed if they lag)."""
        self.weights.publish(params, version)
        with self._cond:
            self._published = max(self._published, version)

    def metrics(self) -> dict[str, float]:
        with self._cond:
            errors = sum((Counter(h.errors) for h in self._handles), Counter(self._lost_errors))
            refreshed = sum(h.stats.get("refreshed", 0) for h in self._handles)
            return error_metrics(errors) | {
                "fleet/workers": float(len(self._handles)),
                "fleet/worker_deaths": float(self.counts["worker_deaths"]),
                # episodes a dead worker held, played again elsewhere
                "fleet/replayed": float(self.counts["replayed"]),
                "fleet/restarts": float(self.counts["restarts"]),
                "fleet/starting": float(self.counts["starting"]),  # replacements being built
                "fleet/regenerated": float(self.counts["regenerated"]),
                "fleet/refreshed": float(refreshed),
                "fleet/versions_behind_max": float(
                    max((self._published - h.version for h in self._handles), default=0)
                ),
            }

    def close(self) -> None:
        """Stop every worker (episodes in flight are dropped; their prompts stay untrained)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in list(self._threads):
            t.join()
        for h in list(self._handles):
            with contextlib.suppress(Exception):  # a worker already gone
                h.call("close")
            h.kill()
        self.weights.close()
        if self._on_close is not None:
            self._on_close()


def start_ray(address: str, workers: int, cpus_per_worker: float) -> Callable[[], None]:
    """Connect to the cluster at `address`, or start a local one sized for `workers`; returns
    what shuts down what this call started."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "config.rl.rollout_backend='ray' needs Ray: pip install -e '.[distributed]'"
        ) from e
    if ray.is_initialized():
        return lambda: None
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=True)
    else:
        cpus = max(os.cpu_count() or 1, int(workers * cpus_per_worker + 0.999))
        ray.init(
            num_cpus=cpus,
            include_dashboard=False,
            runtime_env={"env_vars": env},
            log_to_driver=True,
            # Ray starts workers at niceness 15: sharing cores with the trainer, the engines
            # would then get what is left. Rollouts are the work here, not background.
            _system_config={"worker_niceness": 0},
        )
    return ray.shutdown
