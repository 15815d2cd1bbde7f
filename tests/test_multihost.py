"""Several hosts, simulated: two `python -m c2.main` processes on localhost (4 CPU devices each,
jax.distributed with gloo collectives) against one process on 8 devices, for a few CPT steps and a
few RL steps. The per-step losses agree, and only process 0 writes records and metrics.

The meshes put parameters across the two processes (fsdp 4 x expert 2: fsdp pairs straddle the
process boundary), so the update's reductions cross processes, and each process publishes its
own shards of the RL engine's weights through the weight store. Tolerance: the gradient sums
over devices run in another order through gloo than inside one process, so a loss may differ in
its last float32 bit (relative 1e-7 seen); rtol 1e-5 allows that and nothing more (a different
batch or a missed update moves the loss by > 1e-3).
Wall time: the two runs of each stage go at once (3 processes); 580 s measured with the 2 cores
shared with other jobs (load average ~17), compilation dominating.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _support import xla_flags

from c2 import distributed
from c2.rl.records import read_rollouts

ROOT = Path(__file__).parent.parent
RTOL = 1e-5

MODEL = """
    o = c.model.overrides
    o.d_model, o.n_layers, o.n_heads, o.d_ff, o.d_ff_expert = 32, 2, 2, 64, 16
    o.n_experts, o.n_experts_per_token, o.q_lora_rank, o.kv_lora_rank = 4, 2, 16, 16
    o.qk_nope_head_dim, o.qk_rope_head_dim, o.v_head_dim, o.mtp_depth = 8, 8, 8, 0
    c.mesh.data, c.mesh.fsdp, c.mesh.expert = 1, 4, 2
    c.train.measure_peak, c.train.progress_bar, c.train.log_every = False, False, 1
"""

CPT_CONFIG = f"""
from c2.train.config import stage_defaults


def get_config(arg=None):
    c = stage_defaults()
    c.name = "cpt_multihost"
    c.model.preset, c.model.dtype = "tiny_kimi_k2", "float32"
{MODEL}
    c.data.seq_len, c.data.batch_size, c.data.eval_batches = 64, 8, 1
    c.optimizer.lr, c.optimizer.warmup_steps = 3e-3, 1
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = 3, 2, 0
    return c
"""

RL_CONFIG = f"""
from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    c = rl_stage_defaults()
    c.name = "rl_multihost"
{MODEL}
    c.train.steps, c.train.checkpoint_every = 2, 1
    r = c.rl
    r.max_staleness = 0  # synchronous: the rollouts of step s use exactly the weights of s
    # two processes publish through DIR/weight_store: in float32, the one process's engine's bits
    r.weight_store_dtype = "float32"
    r.group_size, r.prompts_per_step, r.micro_batch_size = 4, 2, 8
    r.seq_buckets = (384,)
    r.rollout.max_tokens, r.rollout.max_turn_tokens, r.rollout.engine_slots = 384, 16, 8
    r.eval.tasks, r.eval.samples = 2, 1
    r.rewards.length_penalty = 1.0  # the untrained model passes nothing: lengths vary the reward
    return c
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(config: Path, workdir: Path, processes: int) -> list:
    """`python -m c2.main` as `processes` processes of 8 // processes CPU devices each."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = xla_flags(8 // processes)
    for name in distributed.ENV.values():
        env.pop(name, None)
    cmd = [sys.executable, "-m", "c2.main", f"--config={config}", f"--workdir={workdir}"]
    if processes > 1:
        cmd += [f"--coordinator_address=localhost:{_free_port()}", f"--num_processes={processes}"]
    out = []
    for i in range(processes):
        log = workdir.parent / f"{workdir.name}.{i}.log"
        proc = subprocess.Popen(
            cmd + ([f"--process_id={i}"] if processes > 1 else []),
            cwd=ROOT,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        out.append((proc, log))
    return out


def _run(config: Path, tmp_path: Path, name: str, timeout: float = 900) -> float:
    """The two-process run and the one-process run at once (XLA compiles on one core per
    process: together they keep both cores busy); wall seconds."""
    t0 = time.perf_counter()
    started = _start(config, tmp_path / f"{name}2", 2) + _start(config, tmp_path / f"{name}1", 1)
    try:
        codes = [proc.wait(timeout=timeout) for proc, _ in started]
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                proc.kill()
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in started)
    assert codes == [0] * len(started), tails
    return time.perf_counter() - t0


def _records(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _written_once(workdir: Path, steps: int) -> None:
    """Process 0 alone wrote the records: each step once, one TensorBoard event file."""
    assert [r["step"] for r in _records(workdir)] == list(range(1, steps + 1))
    assert len(list((workdir / "tensorboard").glob("events.*"))) == 1
    # every process saved its own data state into the shared, collectively written checkpoint
    names = sorted(p.name for p in (workdir / "checkpoints" / str(steps) / "data").iterdir())
    assert [n for n in names if n.startswith("process_")] == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]


def _episodes(workdir: Path, step: int) -> list:
    """(group, sample, tokens) of every episode a step trained on, in order."""
    records = read_rollouts(workdir / "rollouts" / f"step_{step:06d}.jsonl", with_routing=False)
    return sorted((r["group_id"], r["sample_index"], list(r["tokens"])) for r in records)


def _assert_same(two: list[dict], one: list[dict], keys, atol: float = 0.0) -> None:
    for key in keys:
        a, b = [r[key] for r in two], [r[key] for r in one]
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=atol, err_msg=key)


def test_settings_are_checked():
    assert distributed.settings(environ={}) == {}
    env = {"JAX_COORDINATOR_ADDRESS": "h:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert distributed.settings(environ=env) == {
        "coordinator_address": "h:1234",
        "num_processes": 2,
        "process_id": 1,
    }
    assert distributed.settings("h:9", 4, 3, environ=env)["process_id"] == 3  # flags first
    with pytest.raises(ValueError, match=r"num_processes=2 given but not \['coordinator_address'"):
        distributed.settings(num_processes=2, environ={})
    with pytest.raises(ValueError, match=r"process_id=2: expected an int in \[0, num_processes=2"):
        distributed.settings("h:1", 2, 2, environ={})
    with pytest.raises(ValueError, match=r"coordinator_address='h': expected HOST:PORT"):
        distributed.settings("h", 2, 0, environ={})
    with pytest.raises(ValueError, match=r"JAX_PROCESS_ID='x': expected an int"):
        distributed.settings("h:1", 2, environ={"JAX_PROCESS_ID": "x"})


def test_rows_split_gives_each_host_its_block_of_the_single_host_batches():
    from c2.data import pipeline

    kw = dict(seed=3, prefetch=0, shuffle_window=8, host_split="rows")
    make = lambda i, n: iter(  # noqa: E731
        pipeline.make_pretrain_dataset("stdlib", "byte", 32, 4, shard_index=i, shard_count=n, **kw)
    )
    whole, halves = make(0, 1), [make(0, 2), make(1, 2)]
    for _ in range(3):
        batch, parts = next(whole), [next(h) for h in halves]
        assert parts[0]["inputs"].shape == (2, 32)
        for key in pipeline.BATCH_KEYS:
            np.testing.assert_array_equal(batch[key], np.concatenate([p[key] for p in parts]))
    with pytest.raises(ValueError, match="host_split='hosts': expected one of"):
        pipeline.make_pretrain_dataset("stdlib", "byte", 32, 4, 0, host_split="hosts")


def test_one_process_holds_every_row():

    from c2 import sharding

    mesh = sharding.make_mesh(fsdp=4, expert=2)
    assert distributed.process_rows(sharding.batch_sharding(mesh), (8, 16)) == (0, 1)
    assert distributed.share({"a": 1}) == {"a": 1}  # one process: the object itself


def test_bad_flags_exit_with_one_line(tmp_path):
    cmd = [sys.executable, "-m", "c2.main", "--config=experiments/cpt_tiny.py"]
    cmd += [f"--workdir={tmp_path / 'run'}", "--num_processes=2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("flag error: distributed settings: num_processes=2 given but not "), last
    assert "['coordinator_address', 'process_id']" in last


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path):
    cpt, rl = tmp_path / "cpt.py", tmp_path / "rl.py"
    cpt.write_text(CPT_CONFIG)
    rl.write_text(RL_CONFIG)
    times = {name: _run(config, tmp_path, name) for name, config in (("cpt", cpt), ("rl", rl))}
    print("wall seconds", times)
    _compare(tmp_path)


def _compare(tmp_path: Path) -> None:
    # CPT: 3 steps, identical global batches (every host packs the stream, keeps its block)
    two, one = _records(tmp_path / "cpt2"), _records(tmp_path / "cpt1")
    _written_once(tmp_path / "cpt2", 3)
    _assert_same(two, one, ("loss", "ce_loss", "grad_norm", "bpb"))
    _assert_same(two[-1:], one[-1:], ("eval_bpb",))
    print("cpt losses", [r["loss"] for r in two], [r["loss"] for r in one])

    # RL: process 0's engine (same seed, same weights) samples the same episodes; every process
    # trains on process 0's batch
    two, one = _records(tmp_path / "rl2"), _records(tmp_path / "rl1")
    _written_once(tmp_path / "rl2", 2)
    _assert_same(two, one, ("loss", "pg_loss", "grad_norm", "reward/total"))
    # k1 KL: a sum of differences of near-equal log-probs, ~4e-4 here: its last bits cancel
    # (6e-8 apart seen), so an absolute tolerance of float32 log-prob rounding
    _assert_same(two, one, ("kl",), atol=1e-6)
    print("rl losses", [r["loss"] for r in two], [r["loss"] for r in one])
    for step in (1, 2):
        two, one = (_episodes(tmp_path / f"rl{n}", step) for n in (2, 1))
        assert two == one and len(two) == 8
    evals = (tmp_path / "rl2" / "eval.jsonl").read_text().splitlines()
    assert [json.loads(e)["step"] for e in evals] == [0, 2]  # written once each, by process 0
