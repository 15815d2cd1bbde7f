"""The staleness scheduler: admission and selection keep s - v <= S for every trained sample,
whatever order episodes finish in; S = 0 is synchronous; nothing is trained twice or lost."""

import numpy as np
import pytest

from c2.rl.orchestrator import Scheduler, staleness_metrics


class _Sample:
    def __init__(self, prompt_id, version, index=0):
        self.prompt_id, self.sample_index = prompt_id, index
        self.versions = np.array([-1, version, version + 1], np.int32)
        self.loss_mask = np.array([0, 1, 1], np.uint8)
        self.chain = [self]  # one segment


def _simulate(P, G, S, steps, seed):
    """Random episode durations (heavy-tailed); returns per-step [(prompt, admitted, oldest)]
    and the number of events the trainer had to wait."""
    rng = np.random.default_rng(seed)
    sched = Scheduler(P, G, S)
    version, next_prompt, running, trained = 0, 0, [], []
    for s in range(steps):
        while True:
            while sched.quota(version):  # admit at the published version
                pid = f"p{next_prompt}"
                next_prompt += 1
                group = sched.admit(pid, version)
                for k in range(G):  # each episode's first token: the version when it started
                    running.append((rng.pareto(1.2), pid, version, k))
                assert group.admitted_at == version
            chosen = sched.select(s)
            if chosen is not None:
                break
            running.sort()
            dt, pid, v, k = running.pop(0)  # the episode that finishes next
            running = [(t - dt, p, vv, kk) for t, p, vv, kk in running]
            sched.add(_Sample(pid, v, k))
        sched.consume(chosen)
        trained.append([(g.prompt_id, g.admitted_at, min(x.versions[1] for x in g.samples))
                        for g in chosen])  # fmt: skip
        version = s + 1  # the trainer publishes the new weights
    return trained


@pytest.mark.parametrize("S", [0, 1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_staleness_is_bounded_and_every_prompt_trains_once(S, seed):
    P, G, steps = 3, 4, 30
    trained = _simulate(P, G, S, steps, seed)
    flat = [p for step in trained for p, _, _ in step]
    assert len(flat) == len(set(flat)) == P * steps
    for s, step in enumerate(trained):
        assert len(step) == P
        for _, admitted, oldest in step:
            assert oldest >= admitted and s - oldest <= S
    if S == 0:  # synchronous: step s trains exactly the groups admitted at version s
        assert all(
            admitted == oldest == s for s, st in enumerate(trained) for _, admitted, oldest in st
        )
    else:  # asynchronous: some step trains off-policy data
        assert any(s - oldest > 0 for s, st in enumerate(trained) for _, _, oldest in st)


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
    assert m["groups_zero_advantage"] == 0.5
