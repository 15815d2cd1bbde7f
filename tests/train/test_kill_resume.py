"""A real SIGKILL in the middle of a run (subprocess, `kill -9`), then a restart on the same
workdir: the per-step losses equal an uninterrupted run's, bit for bit."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support import xla_flags

from c2.train.metrics import read_metrics

ROOT = Path(__file__).parents[2]
STEPS, EVERY = 40, 4

CONFIG = f"""
from c2.train.config import stage_defaults


def get_config(arg=None):
    c = stage_defaults()
    c.name = "kill_test"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.overrides.d_model = 32
    c.model.overrides.n_layers = 2
    c.model.overrides.n_heads = 2
    c.model.overrides.d_ff = 64
    c.model.overrides.d_ff_expert = 16
    c.model.overrides.n_experts = 4
    c.model.overrides.n_experts_per_token = 2
    c.model.overrides.q_lora_rank = 16
    c.model.overrides.kv_lora_rank = 16
    c.model.overrides.qk_nope_head_dim = 8
    c.model.overrides.qk_rope_head_dim = 8
    c.model.overrides.v_head_dim = 8
    c.data.seq_len = 32
    c.data.batch_size = 4
    c.data.eval_batches = 1
    c.optimizer.warmup_steps = 4
    c.train.steps = {STEPS}
    c.train.checkpoint_every = {EVERY}
    c.train.progress_bar = False
    c.train.measure_peak = False
    return c
"""


def _env(cache_dir):
    env = dict(os.environ)
    # two simulated devices: the run is data-parallel, so restores are sharded
    env["XLA_FLAGS"] = xla_flags(2)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # the three processes compile the same programs once (JAX's persistent compilation cache)
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
    return env


def _cmd(config: Path, workdir: Path) -> list[str]:
    return [sys.executable, "-m", "c2.main", f"--config={config}", f"--workdir={workdir}"]


def _run(config, workdir):
    env = _env(config.parent / "jax_cache")
    out = subprocess.run(
        _cmd(config, workdir), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(workdir / "metrics.jsonl")}


@pytest.mark.slow
def test_sigkill_and_restart_reproduce_the_uninterrupted_losses(tmp_path):
    config = tmp_path / "kill_test.py"
    config.write_text(CONFIG)
    reference = tmp_path / "reference"
    _run(config, reference)
    want = _losses(reference)
    assert sorted(want) == list(range(1, STEPS + 1))

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(config, killed),
        env=_env(tmp_path / "jax_cache"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # kill -9 once a few checkpoints exist and steps are still running
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if len(read_metrics(killed / "metrics.jsonl")) >= STEPS // 2 + 1:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    logged_before_kill = max(_losses(killed))
    assert STEPS // 2 < logged_before_kill < STEPS

    out = _run(config, killed)
    resumed = [line for line in out.stderr.splitlines() if "resumed" in line]
    assert resumed, "the restart did not resume from a checkpoint"
    step = int(resumed[0].rsplit("step", 1)[1])
    assert 0 < step <= logged_before_kill and step % EVERY == 0
    assert _losses(killed) == want
