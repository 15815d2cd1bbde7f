"""Asynchronous rollouts with bounded staleness (docs/recipe.md §2): the engine generates without
waiting for the trainer, and the trainer takes complete groups without waiting for a whole batch.

Versions: the weights after w optimiser steps are version w; optimiser step s (0-based) updates
version s. A sample trained by step s whose oldest generated token came from version v has
staleness s - v, and `max_staleness` = S bounds it. The bound is kept by admission, never by
throwing finished work away (`Scheduler`, pure bookkeeping, also what the simulator in
c2/rl/simulate.py runs):

  admission   at published version w, groups may start while the groups ever admitted number
              at most (w + S + 1) * P (P groups per step); a group's tokens come from versions
              >= the version it was admitted at.
  selection   step s trains on P finished groups: first every group admitted at a version
              <= s - S (its deadline; the trainer waits for them), then the earliest admitted
              of the other finished groups, as long as the groups left behind can still be
              trained by their deadlines (a newer group may overtake an older one only while
              there is slack; otherwise the trainer waits for the older one).

So s - v <= s - (admitted at) <= S for every sample. S = 0 is synchronous, on-policy training:
step s's groups are admitted only once version s is published, and the trainer waits for all of
them. Larger S lets generation run up to S versions ahead, so long episodes (slow test suites,
many turns) no longer hold the trainer, and the trainer's steps no longer hold generation.

`AsyncRollouts` runs one `EpisodeRunner` (engine + sandbox pool) in a background thread under a
`Scheduler`; the trainer calls `next_groups(step)` and `publish(params, version)`. Weights go to
the engine in process (`InProcessWeights`) or through the weight store (`StoreWeights`: a delta
per version, fetched and decoded off the engine's path); either way they take effect at the
engine's next decode step (KV caches kept, or rebuilt with `recompute_kv`), and admission uses
the version the engine was handed, so a lagging engine admits less, never staler work.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from c2.rl.episodes import EpisodeRequest, EpisodeRunner, error_metrics
from c2.rl.records import Sample


@dataclasses.dataclass
class Group:
    """One prompt's samples: admitted at a weights version, complete at `size` samples."""

    prompt_id: str
    admitted_at: int
    size: int
    samples: list = dataclasses.field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.samples) == self.size


class Scheduler:
    """Admission and selection under a staleness bound (see the module doc). Not thread-safe;
    `AsyncRollouts` holds a lock around it. `trained` counts the groups trained before this
    process (a resumed run), so admission continues the same sequence."""

    def __init__(
        self, prompts_per_step: int, group_size: int, max_staleness: int, trained: int = 0
    ):
        if prompts_per_step < 1 or group_size < 1 or max_staleness < 0:
            raise ValueError(
                f"Scheduler: prompts_per_step={prompts_per_step} and group_size={group_size} "
                f"must be >= 1 and max_staleness={max_staleness} >= 0"
            )
        self.P, self.G, self.S = prompts_per_step, group_size, max_staleness
        self.admitted = trained  # groups ever admitted, those trained before a resume included
        self.groups: dict[str, Group] = {}  # admitted and not yet trained, in admission order

    def quota(self, version: int) -> int:
        """Groups that may be admitted now, at published weights `version`."""
        return max(0, (version + self.S + 1) * self.P - self.admitted)

    def admit(self, prompt_id: str, version: int) -> Group:
        if self.quota(version) < 1:
            raise RuntimeError(f"admitting {prompt_id!r} at version {version} exceeds the quota")
        if prompt_id in self.groups:
            raise ValueError(f"prompt {prompt_id!r} is already in flight")
        self.admitted += 1
        group = self.groups[prompt_id] = Group(prompt_id, version, self.G)
        return group

    def add(self, sample: Sample) -> None:
        group = self.groups[sample.prompt_id]
        if len(group.samples) >= group.size:
            raise ValueError(f"group {sample.prompt_id!r} already has {group.size} samples")
        group.samples.append(sample)

    def due(self, step: int) -> list[Group]:
        """Groups step `step` must train on: admitted at a version <= step - S."""
        return [g for g in self.groups.values() if g.admitted_at + self.S <= step]

    def select(self, step: int) -> list[Group] | None:
        """The P groups optimiser step `step` trains on, or None while it must wait: the due
        groups, then the earliest admitted finished ones, provided the groups left behind can
        still each be trained by their deadline (see `feasible`)."""
        due = self.due(step)
        if len(due) > self.P:
            raise RuntimeError(f"{len(due)} groups are due at step {step}; at most {self.P} can be")
        if not all(g.done for g in due):
            return None
        others = [g for g in self.groups.values() if g.done and g not in due]
        chosen = due + others[: self.P - len(due)]
        if len(chosen) < self.P:
            return None
        left = [g for g in self.groups.values() if g not in chosen]
        return chosen if self.feasible(left, step + 1) else None

    def feasible(self, groups: Sequence[Group], step: int) -> bool:
        """Whether `groups` (in admission order, which is deadline order) all meet their
        deadlines when trained P per step in that order from `step` on. Groups admitted later
        have later deadlines and fit behind them (the admission quota), so taking a newer
        finished group before an older running one is allowed only while this holds."""
        return all(step + i // self.P <= g.admitted_at + self.S for i, g in enumerate(groups))

    def consume(self, groups: Sequence[Group]) -> None:
        for g in groups:
            del self.groups[g.prompt_id]


def oldest_version(sample: Sample) -> int | None:
    """The version of the oldest generated token of the sample's chain (None: it generated
    nothing)."""
    versions = np.concatenate([x.versions[x.loss_mask > 0] for x in sample.chain])
    return int(versions.min()) if len(versions) else None


class InProcessWeights:
    """New weights go straight to the engine (one process: the default)."""

    def initial(self, params, version: int):
        return params

    def start(
        self, deliver: Callable[[object, int], None], fail: Callable[[BaseException], None]
    ) -> None:
        self._deliver = deliver

    def publish(self, params, version: int) -> None:
        self._deliver(params, version)

    def close(self) -> None:
        pass


def store_url(url: str, start: int) -> str:
    """Where a run (re)started at step `start` publishes: versions a crash undid never mix with
    the resumed run's."""
    return f"{str(url).rstrip('/')}/from_step_{start:06d}"


class StoreWeights:
    """New weights travel through the weight store (c2/rl/weight_sync.py): the trainer publishes
    each version (a delta in the serving dtype, shard by shard: with several trainer processes
    every one publishes the shards it holds, `subscribe=False` on all but process 0); a
    background fetcher decodes it off the engine's path and hands it to the engine, laid out by
    `shardings` (the engine's layout; None: one device). A (re)started run writes under
    `store_url(url, start)`. A fetch that keeps failing (the fetcher's retries spent) is handed
    to `fail`: it stops the run. Every `prune_every` versions process 0 prunes the store, keeping
    the `keep` newest and what live subscribers' leases pin."""

    def __init__(
        self,
        url: str,
        *,
        dtype: str,
        full_every: int,
        start: int,
        prune_every: int = 0,
        keep: int = 2,
        shardings=None,
        subscribe: bool = True,
    ):
        from c2.rl import weight_sync

        self.prune_every, self.keep = prune_every, keep  # prune_every 0: never prune
        self.url = store_url(url, start)
        self.publisher = weight_sync.WeightPublisher(self.url, full_every=full_every, dtype=dtype)
        self.subscriber = (
            weight_sync.WeightSubscriber(self.url, shardings=shardings) if subscribe else None
        )
        self._fetcher = None
        self._sync = weight_sync

    def initial(self, params, version: int):
        """Publish the starting weights and load them back: the engine serves exactly the
        published bits, the base of the first delta."""
        self.publisher.publish(params, version)
        got, served = self.subscriber.fetch(version)
        if got != version:
            raise self._sync.WeightSyncError(
                f"published version {version} but the store gave {got}", version=version
            )
        return served

    def start(
        self, deliver: Callable[[object, int], None], fail: Callable[[BaseException], None]
    ) -> None:
        self._fetcher = self._sync.BackgroundFetcher(
            self.subscriber, deliver, poll_s=0.02, on_fatal=fail
        )
        self._fetcher.start()

    def publish(self, params, version: int) -> None:
        """Publish `params` (every trainer process calls it: a collective with several)."""
        self.publisher.publish(params, version)
        pruning = self.prune_every and version % self.prune_every == 0
        if pruning and jax.process_index() == 0:  # off the subscribers' path
            self.publisher.prune(keep=self.keep)

    def close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.stop()
        if self.subscriber is not None:
            self.subscriber.close()
        self.publisher.close()


class Collector:
    """The trainer's side of rollouts, whatever generates them: finished samples join their
    groups in the `Scheduler` under one lock, and `next_groups(step)` hands the trainer the
    groups a step trains on. A backend calls `_finished` for each sample, sets `_error` (under
    the lock) when generation fails, and says in `_generating()` whether more may come."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._finished_tokens = 0  # generated tokens of finished samples
        self._finished_samples = 0

    def _generating(self) -> bool:
        raise NotImplementedError

    def _finished(self, sample: Sample) -> None:
        with self._cond:
            self.scheduler.add(sample)
            self._finished_tokens += sum(x.generated_tokens for x in sample.chain)
            self._finished_samples += 1
            self._cond.notify_all()

    def next_groups(self, step: int) -> tuple[list[Group], float]:
        """The groups optimiser step `step` trains on (blocking) and the seconds it waited."""
        t0 = time.perf_counter()
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"the rollouts failed: {self._error}") from self._error
                chosen = self.scheduler.select(step)
                if chosen is not None:
                    self.scheduler.consume(chosen)
                    return chosen, time.perf_counter() - t0
                if not self._generating():
                    raise RuntimeError(
                        f"step {step} needs {self.scheduler.P} groups but the rollouts ended "
                        f"with {sum(g.done for g in self.scheduler.groups.values())} finished"
                    )
                self._cond.wait(0.5)

    def counters(self) -> dict[str, float]:
        """Generated tokens and samples finished so far (for rates)."""
        with self._cond:
            return {"tokens": self._finished_tokens, "samples": self._finished_samples}


class AsyncRollouts(Collector):
    """Continuous generation for the trainer: `EpisodeRunner.stream` in a background thread,
    admission by `Scheduler`. `prompts` lists the ids still to train, in ledger order;
    `request(prompt_id, sample_index)` makes an episode request; `limit`: groups to admit in
    all (the run's remaining steps x P)."""

    def __init__(
        self,
        runner: EpisodeRunner,
        scheduler: Scheduler,
        prompts: Sequence[str],
        request: Callable[[str, int], EpisodeRequest],
        *,
        version: int,
        limit: int,
        weights: InProcessWeights | StoreWeights | None = None,
    ):
        super().__init__(scheduler)
        self.runner, self.request = runner, request
        self.weights = InProcessWeights() if weights is None else weights
        self._prompts = collections.deque(prompts)
        self._left = limit
        self._pending: collections.deque[EpisodeRequest] = collections.deque()
        self._version = version
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rollouts", daemon=True)

    # The rollout thread ----------------------------------------------------------------------

    def start(self) -> AsyncRollouts:
        self.weights.start(self._deliver, self._fail)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self.runner.stream(self._take, self._finished, idle=self._idle, stop=self._stop)
        except BaseException as e:
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        """Generation cannot go on (the rollout thread raised, or new weights cannot reach the
        engine): the trainer's `next_groups` raises it."""
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()

    def _generating(self) -> bool:
        return self._thread.is_alive()

    def _take(self, n: int) -> list[EpisodeRequest] | None:
        with self._cond:
            while len(self._pending) < n and self._left and self._prompts:
                if self.scheduler.quota(self._version) < 1:
                    break
                prompt_id = self._prompts.popleft()
                self.scheduler.admit(prompt_id, self._version)
                self._left -= 1
                self._pending.extend(self.request(prompt_id, k) for k in range(self.scheduler.G))
            if not self._pending and not (self._left and self._prompts):
                return None  # every group this run needs is admitted and started
            return [self._pending.popleft() for _ in range(min(n, len(self._pending)))]

    def _idle(self) -> None:
        with self._cond:  # woken by a new version (more quota) or by stop
            self._cond.wait(0.05)

    # The trainer's side ----------------------------------------------------------------------

    def publish(self, params, version: int) -> None:
        """New weights: in process, or through the store (`weights`)."""
        self.weights.publish(params, version)

    def _deliver(self, params, version: int) -> None:
        """The engine uses `params` from its next decode step; admission opens for `version`."""
        self.runner.engine.update_weights(params, version)
        with self._cond:
            self._version = max(self._version, version)
            self._cond.notify_all()

    def metrics(self) -> dict[str, float]:
        """Per-step counters for the trainer's record: episode errors so far."""
        return error_metrics(self.runner.error_counts())

    def close(self) -> None:
        """Stop generating; episodes in flight are dropped (their prompts stay untrained)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        self.weights.close()


def staleness_metrics(groups: Sequence[Group], step: int, per_sample: dict) -> dict[str, float]:
    """Per-step staleness histogram and the train/behaviour mismatch by staleness.
    per_sample: the learner's per-sample arrays, in the order of the groups' samples."""
    samples = [s for g in groups for s in g.samples]
    stale = np.array(
        [step - v if (v := oldest_version(s)) is not None else -1 for s in samples], np.int64
    )
    out: dict[str, float] = {}
    generated = stale >= 0
    if generated.any():
        out["staleness_mean"] = float(stale[generated].mean())
        out["staleness_max"] = float(stale[generated].max())
    for d in np.unique(stale[generated]):
        at = stale == d
        out[f"staleness/{d}"] = float(at.sum() / len(samples))
        out[f"mismatch_mean/staleness_{d}"] = float(np.mean(per_sample["mismatch_mean"][at]))
    return out
