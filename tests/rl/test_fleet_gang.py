"""A gang follower's weights (c2/rl/fleet_gang.py), against a weight store on disk: the versions
its leader puts in force, read ahead from the leader's hint or when named."""

import time

import pytest
from test_weight_sync import adam_like_steps, assert_holds, make_params, publish_all

from c2.infer.lockstep import LockstepError
from c2.rl import weight_sync as ws
from c2.rl.fleet_gang import PrefetchedWeights


@pytest.fixture
def versions():
    return [make_params()] + adam_like_steps(make_params(), 9)


def test_a_gang_follower_reads_ahead_the_version_its_leader_is_reading(tmp_path, versions):
    """fleet_gang.PrefetchedWeights: the version the leader posts as the one it is reading is
    read ahead, then handed over when the leader puts it in force; a version never posted is
    read when named; a version read ahead that the leader skipped gives way to the newer one;
    one read ahead past the version named means the gang has diverged."""
    publish_all(str(tmp_path), versions[:5], full_every=4)
    subscriber = ws.WeightSubscriber(str(tmp_path), register=False)
    subscriber.fetch(0)
    hint = {"version": None}
    weights = PrefetchedWeights(subscriber, lambda: hint["version"], poll_s=0.01)
    try:
        hint["version"] = 1
        deadline = time.monotonic() + 30
        while subscriber.version != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert subscriber.version == 1  # read ahead, before the leader names it
        assert_holds(weights(1), versions[1])
        assert dict(weights.stats) == {"prefetched": 1}
        assert_holds(weights(2), versions[2])  # never posted: read when named
        assert weights.stats["read_on_demand"] == 1
        hint["version"] = 3
        while subscriber.version != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert_holds(weights(4), versions[4])  # the leader skipped 3
        assert weights.stats == {"prefetched": 1, "read_on_demand": 2}
        ws.WeightPublisher(str(tmp_path)).publish(versions[5], 5)
        hint["version"] = 5
        while subscriber.version != 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(LockstepError, match="version 4 in force after 5"):
            weights(4)
    finally:
        weights.stop()
