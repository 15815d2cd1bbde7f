"""The RL stage with its rollouts on a Ray fleet (a local cluster started by the run): two
worker actors, each with its own engine and sandbox pool, weights through the store; one worker
process is SIGKILLed mid-run. The run finishes, a replacement worker plays what was lost, the
ledger stays exact (every prompt trained once, every group whole) and no sample is staler than
the bound."""

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_trainer import _config

from c2.rl import trainer
from c2.rl.records import read_rollouts
from c2.train.metrics import read_metrics


def _worker_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::RolloutWorker"):
                pids.append(int(proc.name))
    return pids


def _live_episodes(pid: int) -> list[Path]:
    """The workspaces of the episodes worker `pid` is playing (each exists from the episode's
    start until it is graded, so while the driver counts it in flight)."""
    root = Path(tempfile.gettempdir())
    return [p for d in root.glob(f"c2-rollout-worker*-{pid}-*") for p in (d / "episodes").glob("*")]


@pytest.mark.slow
def test_ray_fleet_survives_a_killed_worker(tmp_path, sandbox, ray_installed):
    steps, S = 4, 1
    c = _config(steps)
    r = c.rl
    r.rollout_backend, r.num_rollout_workers, r.max_staleness = "ray", 2, S
    r.weight_store_dtype = "float32"
    workdir = tmp_path / "rl"
    killed: list[tuple[int, int]] = []  # (pid, episodes it was playing)

    def kill_one_mid_episode_after_step_1():
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            if (workdir / "metrics.jsonl").exists() and read_metrics(workdir / "metrics.jsonl"):
                for pid in _worker_pids():
                    playing = _live_episodes(pid)
                    if playing:
                        os.kill(pid, signal.SIGKILL)
                        killed.append((pid, len(playing)))
                        break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_mid_episode_after_step_1, daemon=True)
    killer.start()
    summary = trainer.run(c, workdir)
    killer.join()
    assert killed, "no worker was playing an episode after step 1"
    assert "gain" in summary

    metrics = read_metrics(workdir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    last = metrics[-1]
    assert last["fleet/worker_deaths"] == 1 and last["fleet/restarts"] == 1
    # It died with episodes in flight, and the driver gave them to another worker.
    assert killed[0][1] >= 1 and last["fleet/replayed"] >= 1
    # The replacement joined, or is still building its engine (a loaded machine can finish the
    # 4 steps on one worker first); it is never lost.
    assert last["fleet/workers"] + last["fleet/starting"] == 2
    prompts = []
    for s in range(1, steps + 1):
        records = read_rollouts(workdir / "rollouts" / f"step_{s:06d}.jsonl", with_routing=False)
        assert {x["trained_step"] for x in records} == {s}
        by_prompt = {}
        for x in records:
            by_prompt.setdefault(x["prompt_id"], []).append(x["sample_index"])
            gen = [v for v, m in zip(x["versions"], x["loss_mask"]) if m]
            if gen:  # bounded staleness, none ahead of the weights being trained
                assert s - 1 - S <= min(gen) and max(gen) <= s - 1
        assert len(by_prompt) == r.prompts_per_step
        assert all(sorted(k) == list(range(r.group_size)) for k in by_prompt.values())
        prompts += sorted(by_prompt)
    assert len(prompts) == len(set(prompts)) == steps * r.prompts_per_step  # each prompt once
    assert _worker_pids() == []  # the fleet is gone with the run
