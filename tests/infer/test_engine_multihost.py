"""The engine on a mesh that spans hosts, simulated: two processes (4 CPU devices each,
jax.distributed with gloo collectives) run the same engine on one expert=4 x tensor=2 mesh over
all 8 devices, in lockstep on the same requests (what a multi-host engine is: no device holds a
whole model). Each process's greedy tokens, logprobs and recorded experts equal the one-device
engine's in this process (float32; logprobs to 1e-5: the tensor axis sums in another order).
Every read-back crosses the processes (`engine_layout.to_host`)."""

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


def _generate(mesh):
    """{request id: (tokens, logprobs, routed experts)} of the tiny Kimi-K2 engine, greedy."""
    import jax

    from c2 import model
    from c2.infer.engine import Engine

    c = model.presets.get("tiny_kimi_k2", dtype="float32", mtp_depth=0)
    params = model.init_params(c, jax.random.key(0))  # host values: the same in every process
    engine = Engine(params, c, max_slots=4, max_len=64, temperature=0.0, mesh=mesh)
    for prompt in PROMPTS:
        engine.submit(prompt, max_new_tokens=NEW_TOKENS)
    out = {}
    while engine.has_work():
        for done in engine.step():
            out[done.request_id] = (
                done.tokens.tolist(),
                done.logprobs.tolist(),
                done.routed_experts.tolist(),
            )
    return out


def _worker(process_id: int, port: int, out: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
    from c2 import sharding

    assert jax.device_count() == 8 and jax.local_device_count() == 4
    mesh = sharding.make_mesh(expert=4, tensor=2)  # both processes' devices
    Path(out).write_text(json.dumps(_generate(mesh)))


@pytest.mark.slow
def test_an_engine_over_two_processes_equals_one_device(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    procs = []
    for i in range(2):
        log = (tmp_path / f"{i}.log").open("w")
        cmd = [sys.executable, __file__, str(i), str(port), str(tmp_path / f"{i}.json")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    want = _generate(None)  # meanwhile, here: one device
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = "\n".join((tmp_path / f"{i}.log").read_text()[-3000:] for i in range(2))
    assert codes == [0, 0], logs
    assert len(want) == len(PROMPTS)
    for i in range(2):
        got = {int(k): v for k, v in json.loads((tmp_path / f"{i}.json").read_text()).items()}
        assert sorted(got) == sorted(want), i
        for rid, (tokens, logprobs, experts) in want.items():
            assert got[rid][0] == tokens, (i, rid)
            np.testing.assert_allclose(got[rid][1], logprobs, rtol=1e-5, atol=1e-5)
            assert got[rid][2] == experts, (i, rid)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
