"""The staleness scheduler: admission and selection keep s - v <= S for every trained sample
(v from the weights the engine actually held), whatever order episodes finish in and however late
new weights reach the engine; S = 0 is synchronous; nothing is trained twice or lost; new weights
that cannot be fetched stop the run."""

import threading

import numpy as np
import pytest

from c2.rl.episodes import EpisodeRequest
from c2.rl.orchestrator import (
    AsyncRollouts,
    Scheduler,
    StoreWeights,
    oldest_version,
    staleness_metrics,
)
from c2.rl.records import Sample
from c2.rl.weight_sync import WeightSyncError


class _Sample:
    def __init__(self, prompt_id, version, index=0):
        self.prompt_id, self.sample_index = prompt_id, index
        self.versions = np.array([-1, version, version + 1], np.int32)
        self.loss_mask = np.array([0, 1, 1], np.uint8)
        self.chain = [self]  # one segment


class _Engine:
    """What the orchestrator hands new weights to: the version its next token comes from."""

    version = 0

    def update_weights(self, params, version):
        self.version = version


class _LaggingWeights:
    """Weights that reach the engine `lag` ticks of the rollout loop after the trainer publishes
    them (a fetcher that takes a while)."""

    def __init__(self, lag):
        self.lag, self._queue, self._lock = lag, [], threading.Lock()

    def start(self, deliver, fail):
        self._deliver = deliver

    def publish(self, params, version):
        with self._lock:
            self._queue.append([self.lag, version])

    def tick(self):
        with self._lock:
            for item in self._queue:
                item[0] -= 1
            ready = [v for t, v in self._queue if t <= 0]
            self._queue = [item for item in self._queue if item[0] > 0]
        for v in ready:
            self._deliver(None, v)

    def close(self):
        pass


class _TickRunner:
    """EpisodeRunner.stream's contract, one token per live episode per tick, each token stamped
    with the version the engine holds at that tick; episode lengths heavy-tailed."""

    def __init__(self, tick, seed, slots=6):
        self.engine, self.tick, self.slots = _Engine(), tick, slots
        self.rng = np.random.default_rng(seed)

    def error_counts(self):
        return {}

    def stream(self, take, on_sample, *, idle, stop):
        live, no_more = [], False
        while not stop.is_set():
            if not no_more and len(live) < self.slots:
                more = take(self.slots - len(live))
                no_more = more is None
                live += [[r, 1 + min(int(5 * self.rng.pareto(1.2)), 60), []] for r in more or []]
            if no_more and not live:
                return
            self.tick()
            if not live:
                idle()
                continue
            for ep in live:
                ep[1] -= 1
                ep[2].append(self.engine.version)
            for ep in [ep for ep in live if ep[1] <= 0]:
                live.remove(ep)
                on_sample(_played(ep[0], ep[2]))


def _played(req, versions):
    n = len(versions) + 1
    return Sample(
        req.prompt_id, req.group_id, req.sample_index, req.prompt_id,
        tokens=np.zeros(n, np.int32), loss_mask=np.array([0] + [1] * (n - 1), np.uint8),
        logprobs=np.zeros(n, np.float32), versions=np.array([-1, *versions], np.int32),
        routing=np.zeros((n, 1, 2), np.uint8), temperature=1.0, top_p=1.0, top_k=0,
        reward_terms={}, effort={}, passed=False, stop_reason="submit",
    )  # fmt: skip


def _train(S, seed, *, P=3, G=4, steps=20, lag=3):
    """The trainer's loop on AsyncRollouts over a _TickRunner whose weights lag: per step,
    [(prompt, admitted at, oldest version of its tokens)]; each sample's versions are the
    engine's at the ticks that made its tokens."""
    weights = _LaggingWeights(lag)
    request = lambda p, k: EpisodeRequest(None, p, f"g-{p}", k)  # noqa: E731
    prompts = [f"p{i}" for i in range(P * steps)]
    rollouts = AsyncRollouts(
        _TickRunner(weights.tick, seed), Scheduler(P, G, S), prompts, request,
        version=0, limit=P * steps, weights=weights,
    ).start()  # fmt: skip
    trained = []
    try:
        for s in range(steps):
            groups, _ = rollouts.next_groups(s)
            trained.append([(g.prompt_id, g.admitted_at, min(oldest_version(x) for x in g.samples))
                            for g in groups])  # fmt: skip
            rollouts.publish(None, s + 1)
    finally:
        rollouts.close()
    return trained


@pytest.mark.parametrize("S", [0, 1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_staleness_is_bounded_and_every_prompt_trains_once(S, seed):
    """The bound holds on the versions the engine actually sampled with, while new weights
    reach it a few ticks after they are published (admission must follow the engine's version,
    not the trainer's: admitting at the published version breaks S = 0 at once)."""
    P, steps = 3, 20
    trained = _train(S, seed, P=P, steps=steps)
    flat = [p for step in trained for p, _, _ in step]
    assert len(flat) == len(set(flat)) == P * steps
    for s, step in enumerate(trained):
        assert len(step) == P
        for _, admitted, oldest in step:
            assert admitted <= oldest and s - oldest <= S
    if S == 0:  # synchronous: step s trains exactly the groups admitted at version s
        assert all(
            admitted == oldest == s for s, st in enumerate(trained) for _, admitted, oldest in st
        )
    else:  # asynchronous: some step trains off-policy data
        assert any(s - oldest > 0 for s, st in enumerate(trained) for _, _, oldest in st)


def test_a_weight_fetch_that_keeps_failing_stops_the_trainer_naming_the_version(
    tmp_path, monkeypatch
):
    """Through the weight store: once the fetcher's retries are spent, the trainer's wait for
    groups that need the new version raises, naming it (before: it waited forever)."""
    weights = StoreWeights(tmp_path, dtype="float32", full_every=4, start=0)
    params = {"w": np.ones((2, 2), np.float32)}
    runner = _TickRunner(lambda: None, 0)
    weights.initial(params, 0)

    def fetch(version=None):
        raise OSError("connection reset by peer")

    monkeypatch.setattr(weights.subscriber, "fetch", fetch)
    rollouts = AsyncRollouts(
        runner, Scheduler(1, 2, 0), ["a", "b"], lambda p, k: EpisodeRequest(None, p, p, k),
        version=0, limit=2, weights=weights,
    ).start()  # fmt: skip
    outcome = []

    def trainer():
        try:
            rollouts.next_groups(0)
            rollouts.publish(params, 1)
            rollouts.next_groups(1)  # needs version 1, which never arrives
        except RuntimeError as e:
            outcome.append(e)

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    t.join(300)  # a hang detector: the fetcher gives up after about ten seconds
    rollouts.close()
    assert not t.is_alive(), "the trainer still waits for a version that will never come"
    (error,) = outcome
    assert "the rollouts failed" in str(error) and "fetching version 1 of" in str(error)
    assert isinstance(error.__cause__, WeightSyncError) and error.__cause__.version == 1
    assert "OSError: connection reset by peer" in str(error) and runner.engine.version == 0


def test_the_trainers_store_prunes_every_n_versions_keeping_what_subscribers_hold(tmp_path):
    """StoreWeights(prune_every=3, keep=2): the trainer's publications prune at versions 3 and 6,
    never a version its own subscriber (a live lease) still holds, and a fresh subscriber still
    reaches the newest version bit for bit."""
    from c2.rl.weight_sync import WeightSubscriber

    weights = StoreWeights(tmp_path, dtype="float32", full_every=2, start=0, prune_every=3, keep=2)
    rng = np.random.default_rng(0)
    versions = [{"w": rng.standard_normal((4, 4)).astype(np.float32)} for _ in range(8)]
    weights.initial(versions[0], 0)
    stored = lambda: weights.publisher.store.versions()  # noqa: E731
    for v in (1, 2):
        weights.publish(versions[v], v)
    assert stored() == [0, 1, 2]  # nothing pruned before version 3
    held, _ = weights.subscriber.fetch(2)  # the trainer's subscriber holds 2 (its lease)
    for v in range(3, 8):
        weights.publish(versions[v], v)
    assert 2 in stored() and stored()[-1] == 7 and 0 not in stored()  # pruned at 3 and 6
    got, params = WeightSubscriber(weights.url).fetch()
    assert got == 7 and np.array_equal(np.asarray(params["w"]), versions[7]["w"])
    weights.close()


def test_quota_continues_after_a_resume():
    sched = Scheduler(2, 4, 1, trained=10)  # 5 steps done: version 5
    assert sched.quota(5) == (5 + 1 + 1) * 2 - 10 == 4
    for i in range(4):
        sched.admit(f"p{i}", 5)
    assert sched.quota(5) == 0 and sched.quota(6) == 2
    with pytest.raises(RuntimeError, match="exceeds the quota"):
        sched.admit("p9", 5)
    with pytest.raises(ValueError, match="already in flight"):
        sched.admit("p0", 7)
    assert sched.select(5) is None  # nothing finished yet
    with pytest.raises(ValueError, match="prompts_per_step=0"):
        Scheduler(0, 4, 1)


def test_select_waits_for_due_groups_and_prefers_them():
    sched = Scheduler(1, 1, 1)
    sched.admit("old", 0)
    sched.admit("new", 0)
    sched.add(_Sample("new", 0))
    chosen = sched.select(0)
    assert [g.prompt_id for g in chosen] == ["new"]  # neither is due at step 0
    sched.consume(chosen)
    assert sched.select(1) is None  # "old" is due at step 1 and still running
    sched.add(_Sample("old", 0))
    assert [g.prompt_id for g in sched.select(1)] == ["old"]


def test_staleness_metrics():
    sched = Scheduler(2, 2, 2)
    for pid in ("a", "b"):
        sched.admit(pid, 0)
    for k, v in enumerate((3, 4)):
        sched.add(_Sample("a", v, k))
        sched.add(_Sample("b", 4, k))
    groups = sched.select(5)
    per_sample = {
        "mismatch_mean": np.array([0.1, 0.3, 0.2, 0.2]),
        "advantage": np.array([1, -1, 0, 0]),
    }
    m = staleness_metrics(groups, 5, per_sample)
    assert m["staleness/2"] == 0.25 and m["staleness/1"] == 0.75 and m["staleness_max"] == 2
    assert m["mismatch_mean/staleness_2"] == pytest.approx(0.1)
    assert m["mismatch_mean/staleness_1"] == pytest.approx(0.7 / 3)
    assert "groups_zero_advantage" not in m  # the learner's: groups with equal task rewards
