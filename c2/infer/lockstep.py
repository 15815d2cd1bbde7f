"""One engine over several processes (a multi-host engine): a leader and followers in lockstep.

An `Engine` on a mesh that spans processes (`Engine(..., mesh=)` with devices of every process,
after `jax.distributed` is initialized) runs its compiled programs on all of them at once: each
process must make the same calls, in the same order, with the same arguments. Only one process
(the leader, process 0) runs the episodes, sandboxes and tools that decide those calls. So:

    leader:    engine = LockstepEngine(Engine(...), channel.send)    # use it as an Engine
    follower:  follow(Engine(...), channel.receive, weights)          # until the leader closes

`LockstepEngine` records every call that changes the engine (`submit`, `extend`,
`update_weights`: host-side only, recorded once they succeed) and sends the record to the
followers just before each call that runs programs on the devices (`step`, `release`), which it
then runs itself. `follow` replays each record on the follower's own engine, so every process's
host state (queue, slots, turns, request ids) is the same and their programs meet. Reads
(`has_work`, `free_slots`, `stats`, `trajectory`, ...) are answered by the leader alone.
Weights are never sent: the leader records only a new version's number, and each follower gets
that version's shards for its own devices from `weights(version)` (its weight store
subscriber). Each `step` carries the leader's host state (`host_state`); a follower whose own
differs stops with a `LockstepError` rather than decode from another state.

A call the leader's engine rejects (a bad argument: ValueError / KeyError before any device
work) is rejected the same way on every follower, which goes on. The channel is
`c2.distributed.Channel` (the coordination service's key-value store) in a real group; any
ordered `send(message)` / `receive(timeout_s) -> message | None` pair works (tests use a queue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from c2.infer.engine import Engine
from c2.infer.records import Completion, Trajectory

CHANGES = ("submit", "extend", "update_weights")  # change the host state only
RUNS = ("step", "release")  # run programs on every process's devices
RECEIVE_S = 1.0  # a follower's wait for the next message before checking whether to stop


class LockstepError(RuntimeError):
    """The processes of a multi-host engine are out of step (a follower's state is not the
    leader's, or a call failed on some of them): going on would decode garbage or hang."""


def host_state(engine: Engine) -> tuple:
    """What decides an engine's next programs: request ids issued, the weights' version, each
    slot's request and its progress, the queue."""
    slots = tuple(
        None if s is None else (s.rid, s.status, s.fed, len(s.tokens)) for s in engine._slots
    )
    return engine._next_rid, engine.version, slots, tuple(s.rid for s in engine._queue)


class LockstepEngine:
    """The leader's side: an `Engine` whose state-changing calls are replayed by followers (the
    module doc). `send(message)` delivers a list of calls, in order, to every follower."""

    def __init__(self, engine: Engine, send: Callable[[list], None]):
        self.engine, self._send = engine, send
        self._lock = threading.RLock()  # a weight update never lands between a send and its step
        self._record: list[tuple] = []
        self.messages = 0

    def __getattr__(self, name):  # reads: the leader's engine answers alone
        if name in ("params", "state"):  # would run a program on the leader's devices only
            raise AttributeError(f"LockstepEngine.{name}: runs on every process; not here")
        return getattr(self.engine, name)

    def submit(self, prompt, max_new_tokens: int, **options) -> int:
        with self._lock:
            rid = self.engine.submit(prompt, max_new_tokens, **options)
            self._record.append(("submit", (list(map(int, prompt)), max_new_tokens), options))
            return rid

    def extend(self, request_id: int, tokens, max_new_tokens: int) -> None:
        with self._lock:
            self.engine.extend(request_id, tokens, max_new_tokens)
            args = (request_id, list(map(int, tokens)), max_new_tokens)
            self._record.append(("extend", args, {}))

    def update_weights(self, params, version: int) -> None:
        with self._lock:
            self.engine.update_weights(params, version)
            self._record.append(("update_weights", (int(version),), {}))

    def step(self) -> list[Completion]:
        with self._lock:
            self._flush(("step", (), {"state": host_state(self.engine)}))
            return self._run("step")

    def release(self, request_id: int) -> Trajectory:
        with self._lock:
            self._flush(("release", (request_id,), {}))
            return self._run("release", request_id)

    def _run(self, name: str, *args):
        """A call that runs on every process's devices. Its failure (a follower gone, a
        collective broken) leaves the processes out of step: a `LockstepError`, which no
        caller may retry on this engine."""
        try:
            return getattr(self.engine, name)(*args)
        except (ValueError, KeyError):  # a bad argument, rejected before any program
            raise
        except Exception as e:
            raise LockstepError(f"the engine's {name} failed; the gang cannot go on: {e}") from e

    generate = Engine.generate  # through this class's submit and step

    def close(self) -> None:
        """Tell the followers to stop (after replaying what is recorded)."""
        with self._lock:
            self._flush(("close", (), {}))

    def _flush(self, call: tuple) -> None:
        record, self._record = [*self._record, call], []
        self._send(record)
        self.messages += 1


def follow(
    engine: Engine,
    receive: Callable[[float], list | None],
    weights: Callable[[int], dict],
    *,
    stop: threading.Event | None = None,
    receive_s: float = RECEIVE_S,
) -> dict:
    """The follower's side: replay the leader's calls on `engine` until the leader closes (or
    `stop` is set); returns counts of what was replayed. `weights(version)`: that version's
    params laid out for `engine` (this process's shards). Raises `LockstepError` when the
    engine's state departs from the leader's."""
    counts = {"messages": 0, "calls": 0, "steps": 0, "rejected": 0, "weight_updates": 0}
    while stop is None or not stop.is_set():
        record = receive(receive_s)
        if record is None:
            continue
        counts["messages"] += 1
        for name, args, kwargs in record:
            if name == "close":
                return counts
            counts["calls"] += 1
            if name == "step":
                mine = host_state(engine)
                if mine != kwargs["state"]:
                    raise LockstepError(
                        f"after {counts['steps']} steps this follower's engine is in state "
                        f"{mine}, the leader's in {kwargs['state']} (request id, version, "
                        "slots, queue)"
                    )
                engine.step()
                counts["steps"] += 1
            elif name == "update_weights":
                (version,) = args
                engine.update_weights(weights(version), version)
                counts["weight_updates"] += 1
            elif name in CHANGES or name in RUNS:
                try:
                    getattr(engine, name)(*args, **kwargs)
                except (ValueError, KeyError):  # rejected on the leader too, before any program
                    counts["rejected"] += 1
            else:
                raise LockstepError(f"unknown call {name!r} from the leader")
    return counts
