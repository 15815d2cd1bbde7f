"""The lockstep protocol of a multi-host engine, in one process (the channel a queue, leader and
follower each with an engine of its own on one device): the follower ends in the leader's
state, device arrays included; the leader answers as a plain engine does; a follower that
missed a message stops with a LockstepError instead of decoding from another state.
tests/infer/test_engine_multihost.py runs it across two processes on one mesh."""

import queue
import threading

import jax
import numpy as np
import pytest
from conftest import ENGINE

from c2.infer.engine import Engine
from c2.infer.lockstep import LockstepEngine, LockstepError, follow, host_state

PROMPTS = [[1, 5, 9, 13], [2, 4, 6, 8, 10, 12], [7, 7, 7]]


def _session(engine, new_weights) -> list:
    """Prompts, a multi-turn request extended with tool output, a new version mid-way, a bad
    release (rejected) and a good one; the completions in order."""
    out = []

    def run():
        while engine.has_work():
            out.extend((c.request_id, c.turn, c.tokens.tolist(), c.versions.tolist())
                       for c in engine.step())  # fmt: skip

    for prompt in PROMPTS[:2]:
        engine.submit(prompt, 5)
    multi = engine.submit(PROMPTS[2], 3, multi_turn=True)
    run()
    engine.update_weights(new_weights, 1)
    engine.extend(multi, [3, 4], 3)
    with pytest.raises(ValueError, match="extend needs a paused"):
        engine.extend(multi, [5], 3)  # rejected on the leader: never sent
    run()
    with pytest.raises(KeyError):
        engine.release(999)  # sent, and rejected by the follower too
    out.append(engine.release(multi).token_ids.tolist())
    return out


def _follower(kimi, messages, drop_first=False):
    engine = Engine(kimi.params, kimi.cfg, temperature=0.0, **ENGINE)
    result = {}

    def receive(timeout_s):
        try:
            record = messages.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if drop_first and not result.get("dropped"):
            result["dropped"] = True
            return receive(timeout_s)
        return record

    def run():
        try:
            result["counts"] = follow(engine, receive, lambda v: new_weights(kimi, v))
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return engine, thread, result


def new_weights(kimi, version):
    return jax.tree.map(lambda x: x * (1 + 0.1 * version), kimi.params)


def test_a_follower_replays_the_leader_into_the_same_state(kimi):
    messages = queue.Queue()
    follower, thread, result = _follower(kimi, messages)
    leader = LockstepEngine(Engine(kimi.params, kimi.cfg, temperature=0.0, **ENGINE), messages.put)
    got = _session(leader, new_weights(kimi, 1))
    leader.close()
    thread.join(60)
    want = _session(Engine(kimi.params, kimi.cfg, temperature=0.0, **ENGINE), new_weights(kimi, 1))
    assert got == want
    assert {v for c in got[:-1] for v in c[3]} == {0, 1}  # the update took effect mid-session
    counts = result["counts"]
    assert counts["messages"] == leader.messages and counts["weight_updates"] == 1
    assert counts["rejected"] == 1  # the bad release; the bad extend was never sent
    assert host_state(follower) == host_state(leader.engine)
    for a, b in zip(jax.tree.leaves(follower.state), jax.tree.leaves(leader.engine.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(AttributeError, match="every process"):
        leader.params  # noqa: B018  (a program on the leader's devices alone would hang)


def test_a_follower_that_missed_a_message_stops_naming_both_states(kimi):
    messages = queue.Queue()
    _, thread, result = _follower(kimi, messages, drop_first=True)
    leader = LockstepEngine(Engine(kimi.params, kimi.cfg, temperature=0.0, **ENGINE), messages.put)
    leader.submit(PROMPTS[0], 3)
    leader.step()  # the follower never sees this submit and step
    leader.submit(PROMPTS[1], 3)
    leader.step()
    thread.join(60)
    assert isinstance(result.get("error"), LockstepError)
    assert "the leader's in (2, 0" in str(result["error"])  # two requests issued, version 0
