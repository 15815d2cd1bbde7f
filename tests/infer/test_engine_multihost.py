"""The engine on a mesh that spans hosts, simulated: two processes (4 CPU devices each,
jax.distributed with gloo collectives) run one engine on an expert=4 x tensor=2 mesh over all 8
devices (what a multi-host engine is: no device holds a whole model). Process 0 leads: it plays a
multi-turn session (prompts, a new weights version mid-way, tool output, a rejected release)
through a `LockstepEngine`; process 1 only follows (`lockstep.follow`, messages through the
coordination service). The leader's greedy tokens, logprobs, versions and recorded experts equal
the one-device engine's in this process (float32; logprobs to 1e-5: the tensor axis sums in
another order); the follower replayed every message. Every read-back crosses the processes
(`engine_layout.to_host`)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
PROMPTS = [[1, 5, 9, 13], [2, 4, 6, 8, 10, 12], [7, 7, 7], list(range(20, 40))]
NEW_TOKENS = 10


def _weights(version: int) -> dict:
    """The tiny Kimi-K2's weights of `version` (host values: the same in every process)."""
    import jax

    from c2 import model

    c = model.presets.get("tiny_kimi_k2", dtype="float32", mtp_depth=0)
    return model.init_params(c, jax.random.key(version))


def _play(engine, weights) -> dict:
    """A multi-turn session on `engine`: three prompts and a multi-turn one; a new version
    mid-way; the multi-turn request extended with tool output, a bad release, then its release.
    Returns {request id: (tokens, logprobs, routed experts, version)} and the trajectory."""
    out = {}

    def run():
        while engine.has_work():
            for done in engine.step():
                out[f"{done.request_id}.{done.turn}"] = (
                    done.tokens.tolist(),
                    done.logprobs.tolist(),
                    done.routed_experts.tolist(),
                    [int(v) for v in done.versions],
                )

    for prompt in PROMPTS[:3]:
        engine.submit(prompt, max_new_tokens=NEW_TOKENS)
    multi = engine.submit(PROMPTS[3], max_new_tokens=4, multi_turn=True)
    run()
    engine.update_weights(weights(1), 1)
    engine.extend(multi, [3, 4, 5], max_new_tokens=4)
    run()
    try:
        engine.release(12345)
    except KeyError:
        out["rejected"] = True
    trajectory = engine.release(multi)
    out["trajectory"] = (trajectory.token_ids.tolist(), trajectory.routed_experts.tolist())
    return out


def _engine(mesh):
    from c2 import model
    from c2.infer.engine import Engine

    c = model.presets.get("tiny_kimi_k2", dtype="float32", mtp_depth=0)
    return Engine(_weights(0), c, max_slots=4, max_len=64, temperature=0.0, mesh=mesh)


def _worker(process_id: int, port: int, out: str) -> None:
    """Process 0 leads (runs the session through a LockstepEngine); process 1 follows."""
    import jax

    from c2 import distributed, sharding
    from c2.infer import lockstep

    distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id
    )
    assert jax.device_count() == 8 and jax.local_device_count() == 4
    mesh = sharding.make_mesh(expert=4, tensor=2)  # both processes' devices
    distributed.warm_collectives(mesh)
    channel = distributed.Channel("engine")
    if process_id == 0:
        leader = lockstep.LockstepEngine(_engine(mesh), channel.send)
        result = _play(leader, _weights)
        leader.close()
        result["messages"] = leader.messages
    else:
        result = lockstep.follow(_engine(mesh), channel.receive, _weights)
    Path(out).write_text(json.dumps(result))
    distributed.barrier("done")


@pytest.mark.slow
def test_an_engine_over_two_processes_equals_one_device(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    from _support import xla_flags  # not at the top: the processes import this module

    env["XLA_FLAGS"] = xla_flags(4)
    procs = []
    for i in range(2):
        log = (tmp_path / f"{i}.log").open("w")
        cmd = [sys.executable, __file__, str(i), str(port), str(tmp_path / f"{i}.json")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    want = _play(_engine(None), _weights)  # meanwhile, here: one device
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = "\n".join((tmp_path / f"{i}.log").read_text()[-3000:] for i in range(2))
    assert codes == [0, 0], logs
    got = json.loads((tmp_path / "0.json").read_text())
    follower = json.loads((tmp_path / "1.json").read_text())
    messages = got.pop("messages")
    assert want.pop("rejected") and got.pop("rejected")
    assert got.pop("trajectory") == [list(x) for x in want.pop("trajectory")]
    assert sorted(got) == sorted(want)
    for key, (tokens, logprobs, experts, versions) in want.items():
        assert got[key][0] == tokens, key
        np.testing.assert_allclose(got[key][1], logprobs, rtol=1e-5, atol=1e-5)
        assert got[key][2] == experts and got[key][3] == versions, key
    assert {0, 1} == {v for x in want.values() for v in x[3]}  # the update took effect
    # The follower replayed every message: each step, the update, the rejected release.
    assert follower["messages"] == messages and follower["weight_updates"] == 1
    assert follower["rejected"] == 1 and follower["steps"] >= NEW_TOKENS


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
