"""The rollout fleet's driver (`RayRollouts`, in the trainer's process; c2/rl/fleet.py tells the
whole design): one thread per worker exchanges requests for samples, admission per worker by the
version it holds, and a worker that dies, raises or hangs has its episodes played again
elsewhere, exactly once, and is replaced. How workers are started is the launcher's business
(`fleet_ray.ray_launcher`; tests pass their own), so this module never imports Ray.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import os
import tarfile
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import zstandard

from c2.rl import orchestrator
from c2.rl.episodes import EpisodeRequest, error_metrics

log = logging.getLogger(__name__)

WAIT_S = 0.5  # how long an exchange waits for a finished sample before returning empty-handed


# Worker faults: what a launcher's `call` raises; each costs the worker its incarnation ---------


class WorkerFault(RuntimeError):
    """A worker can go on no longer: its requests are played again elsewhere, and it is
    replaced while restarts are left."""

    counter = "worker_faults"  # the `fleet/...` metric that counts this kind
    what = "failed"


class WorkerLost(WorkerFault):
    """A worker's process or node is gone."""

    counter, what = "worker_deaths", "died"


class WorkerFailed(WorkerFault):
    """A worker raised: its engine, episode runner or weight fetcher failed, or a remote method
    did."""

    counter, what = "worker_errors", "raised"


class WorkerHung(WorkerFault):
    """A remote call passed its deadline (the launcher has killed the worker)."""

    counter, what = "worker_hangs", "hung"


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


class RayRollouts(orchestrator.Collector):
    """The rollouts of a run on a fleet of workers (see c2/rl/fleet.py); the same interface as
    `orchestrator.AsyncRollouts`: start, next_groups, publish, counters, metrics, close.

    launch(index, incarnation) -> _Handle starts a worker (`ray_launcher`; tests pass their own);
    a launcher with a `put(bytes) -> ref` method stores each task's files once (Ray's object
    store) and workers receive the ref; one with `close()` has it called at the end.
    weights: the run's `StoreWeights` (the driver publishes; workers subscribe).
    max_restarts: replacements in a run for workers that die, raise or hang; a fault past it
    fails the run, naming the worker and its error."""

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
        self._put = getattr(launch, "put", lambda blob: blob)
        self._blobs: dict[str, object] = {}  # task id -> its packed files (or their ref), once
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
            self._close_launcher()
            raise RuntimeError(
                f"{len(failed)} of {self.workers} rollout workers failed to start: {failed[0]}"
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
        except WorkerFault as e:
            self._fault(h, e)
        except BaseException as e:  # a bug of the driver's own: the run stops with it
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
        """A request as sent: a task's files go once per worker, packed (and put) once a run."""
        task_id = req.task.task_id
        blob = None
        if task_id not in h.shipped:
            with self._cond:  # driver threads pack and put a task once between them
                if task_id not in self._blobs:
                    self._blobs[task_id] = self._put(pack_task(req.task.root))
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

    def _fault(self, h: _Handle, fault: WorkerFault) -> None:
        """Worker `h` died, raised or hung: it is killed, the requests it held (and the samples
        of the reply that never came) go back to the queue, and a replacement starts while
        restarts are left; past them the run fails, naming the worker and its error.

        Replacement is the driver's, not Ray's (`max_restarts=0` on the actors): Ray restarts
        only dead processes, not ones that raise or hang, and a restarted actor would not know
        which episodes it lost. One mechanism for the three faults."""
        log.warning(
            "rollout worker %d.%d %s (%s); its %d episodes are played again",
            h.index, h.incarnation, fault.what, fault, len(h.inflight),
        )  # fmt: skip
        with contextlib.suppress(Exception):  # a dead worker is already gone
            h.kill()
        with self._cond:
            self.counts[fault.counter] += 1
            self.counts["replayed"] += len(h.inflight)
            self._lost_errors.update(h.errors)
            self._retry.extend(h.inflight.values())
            h.inflight.clear()
            self._handles.remove(h)
            replace = self.counts["restarts"] < self.max_restarts and not self._stop.is_set()
            if replace:
                self.counts["restarts"] += 1
                self.counts["starting"] += 1  # until its engine is built (can take minutes)
            elif not self._stop.is_set():
                error = RuntimeError(
                    f"rollout worker {h.index} (incarnation {h.incarnation}) {fault.what} with "
                    f"no restart left ({self.counts['restarts']} used of max_restarts="
                    f"{self.max_restarts}, config.rl.ray_max_restarts): {fault}"
                )
                error.__cause__ = fault
                self._error = error
            self._cond.notify_all()
        if replace:
            self._replace(h)

    def _replace(self, h: _Handle) -> None:
        """Start the next incarnation of worker `h.index`. One whose start is itself a worker
        fault (its constructor raised, its process died) costs a restart like any other and the
        next is tried while restarts are left; any other failure (no placement, no answer within
        the start deadline: trying again would only wait again) fails the run."""
        incarnation = h.incarnation + 1
        while True:
            try:
                new = self.launch(h.index, incarnation)
                break
            except WorkerFault as fault:
                log.warning("rollout worker %d.%d %s starting (%s)", h.index, incarnation,
                            fault.what, fault)  # fmt: skip
                with self._cond:
                    self.counts[fault.counter] += 1
                    if self.counts["restarts"] < self.max_restarts and not self._stop.is_set():
                        self.counts["restarts"] += 1
                        incarnation += 1
                        continue
                    error = RuntimeError(
                        f"rollout worker {h.index} (incarnation {incarnation}) {fault.what} "
                        f"while starting, with no restart left ({self.counts['restarts']} used "
                        f"of max_restarts={self.max_restarts}, config.rl.ray_max_restarts): "
                        f"{fault}"
                    )
                    error.__cause__ = fault
                    self._fail_start(error)
                return
            except BaseException as e:
                with self._cond:
                    self._fail_start(e)
                return
        with self._cond:
            self.counts["starting"] -= 1
        self._drive_in_thread(new)

    def _fail_start(self, error: BaseException) -> None:
        """(Under the lock.) A replacement could not be started: the run stops with `error`."""
        self.counts["starting"] -= 1
        if not self._stop.is_set():
            self._error = error
        self._cond.notify_all()

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
            stat = lambda name: sum(h.stats.get(name, 0) for h in self._handles)  # noqa: E731
            return error_metrics(errors) | {
                "fleet/workers": float(len(self._handles)),
                "fleet/worker_deaths": float(self.counts["worker_deaths"]),
                "fleet/worker_errors": float(self.counts["worker_errors"]),  # workers that raised
                "fleet/worker_hangs": float(self.counts["worker_hangs"]),  # calls past deadline
                # episodes a faulted worker held, played again elsewhere
                "fleet/replayed": float(self.counts["replayed"]),
                "fleet/restarts": float(self.counts["restarts"]),
                "fleet/starting": float(self.counts["starting"]),  # replacements being built
                "fleet/regenerated": float(self.counts["regenerated"]),
                "fleet/refreshed": float(stat("refreshed")),
                # a gang's followers' weight reads: ahead of their leader's, or when it came
                "fleet/follower_prefetched": float(stat("follower_prefetched")),
                "fleet/follower_read_on_demand": float(stat("follower_read_on_demand")),
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
            with contextlib.suppress(Exception):  # a worker already gone, or past its deadline
                h.call("close")
            h.kill()
        self._close_launcher()
        self.weights.close()
        if self._on_close is not None:
            self._on_close()

    def _close_launcher(self) -> None:
        close = getattr(self.launch, "close", None)
        if close is not None:
            close()
