"""The Ray fleet on one local cluster per module. The RL stage with two worker actors, each with
its own engine and sandbox pool, weights through the store, where one worker raises, one hangs
and one dies mid-episode: the run finishes, replacements play what was lost, the ledger stays
exact (every prompt trained once, every group whole), no sample is staler than the bound, and
the fleet counts each fault. A worker the cluster cannot place fails the fleet naming the
resource."""

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_trainer import _config

from c2.rl import fleet, fleet_ray, orchestrator, trainer
from c2.rl.episodes import EpisodeRequest, RolloutConfig
from c2.rl.records import read_rollouts
from c2.train.metrics import read_metrics


@pytest.fixture(scope="module")
def ray_cluster(ray_installed):
    """One local cluster (2 CPUs at least) for the module; a run finds it started and keeps it."""
    import ray

    shutdown = fleet.start_ray("", workers=2, cpus_per_worker=1.0)
    yield ray
    shutdown()


def _worker_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            name = cmdline.split(b"\0")[0]
            if name.startswith(b"ray::") and (b"Worker" in name or b"GangMember" in name):
                pids.append(int(proc.name))
    return pids


def _faulty_worker(faults: dict):
    """A RolloutWorker whose (index, incarnation) in `faults`, once it holds episodes after
    version 1 is published, fails its runner ("raise": the exchange then raises, as when its
    engine fails), never answers ("hang"), or SIGKILLs its own process ("die"). Defined here, so
    Ray ships it to the workers by value."""

    class FaultyWorker(fleet.RolloutWorker):
        def exchange(self, requests, published, hungry, wait_s=fleet.WAIT_S):
            fault = faults.get((self.index, self.incarnation))
            if fault and published >= 1 and (self._active or self._queue):
                if fault == "raise":
                    self._fail(RuntimeError("injected: the engine failed"))
                elif fault == "hang":
                    threading.Event().wait()
                elif fault == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
            return super().exchange(requests, published, hungry, wait_s)

    return FaultyWorker


@pytest.mark.slow
def test_ray_fleet_survives_workers_that_raise_hang_and_die(
    tmp_path, sandbox, ray_cluster, monkeypatch
):
    steps, S = 4, 1
    c = _config(steps)
    r = c.rl
    r.rollout_backend, r.num_rollout_workers, r.max_staleness = "ray", 2, S
    r.weight_store_dtype = "float32"
    r.ray_call_timeout_s = 15.0  # the hung worker's exchange is given up after this
    faults = {(0, 0): "raise", (1, 0): "hang", (0, 1): "die"}
    worker = _faulty_worker(faults)
    monkeypatch.setattr(
        fleet, "ray_launcher", functools.partial(fleet_ray.ray_launcher, worker=worker)
    )
    puts = []
    real_put = fleet_ray.RayLauncher.put
    monkeypatch.setattr(
        fleet_ray.RayLauncher, "put", lambda self, blob: puts.append(blob) or real_put(self, blob)
    )
    workdir = tmp_path / "rl"
    summary = trainer.run(c, workdir)
    assert "gain" in summary

    metrics = read_metrics(workdir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    last = metrics[-1]
    assert last["fleet/worker_errors"] == 1  # (0, 0) raised
    assert last["fleet/worker_hangs"] == 1  # (1, 0) passed its deadline and was killed
    assert last["fleet/worker_deaths"] == 1  # (0, 1) died
    assert last["fleet/restarts"] == 3
    # Each held episodes when it failed, and the driver gave them to another worker.
    assert last["fleet/replayed"] >= 3
    # The last replacements joined, or one is still building its engine (a loaded machine can
    # finish the steps on one worker first); none is lost.
    assert last["fleet/workers"] + last["fleet/starting"] == 2
    prompts, tasks = [], set()
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
        # every group whole, no episode twice
        assert all(sorted(k) == list(range(r.group_size)) for k in by_prompt.values())
        prompts += sorted(by_prompt)
        tasks |= {x["task_id"] for x in records}
    assert len(prompts) == len(set(prompts)) == steps * r.prompts_per_step  # each prompt once
    # A task's files went to the object store once, however many workers played it.
    assert len(puts) == len(set(puts)) and len(puts) >= len(tasks)
    deadline = time.monotonic() + 60  # ray.kill is asynchronous: the processes exit shortly
    while _worker_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _worker_pids() == []  # the fleet is gone with the run


def _dying_follower(incarnation: int):
    """A gang follower that SIGKILLs its own process when the leader first puts a new version
    in force, in the given incarnation (shipped to the workers by value)."""
    from c2.rl import fleet_gang

    class DyingFollower(fleet_gang.EngineFollower):
        def __init__(self, spec, index, this, start_timeout_s):
            super().__init__(spec, index, this, start_timeout_s)
            if this == incarnation:
                weights = self.weights
                self.weights = lambda v: os.kill(os.getpid(), signal.SIGKILL) or weights(v)

    return DyingFollower


@pytest.mark.slow
def test_a_gang_engine_over_two_processes_plays_the_stage_and_survives_a_follower_death(
    tmp_path, sandbox, ray_cluster, monkeypatch
):
    """rollout_hosts=2: the worker's engine is one expert=2 mesh over two processes (a gang, one
    device each, jax.distributed over the coordination service), the leader playing episodes
    and the follower replaying its engine calls. The follower dies at the first new version: the
    gang is killed and started again, what it held is played again, and the run trains every
    prompt once with whole groups; the replacement gang's follower reads each version's shards
    itself (ahead, from the leader's hint) and the run ends without a hang."""
    steps, S = 3, 0  # step 3 needs version 2: the replacement gang puts it in force
    c = _config(steps, rollout_mesh="expert=2")
    r = c.rl
    r.rollout_backend, r.num_rollout_workers, r.max_staleness = "ray", 1, S
    r.rollout_hosts, r.ray_call_timeout_s = 2, 120.0
    monkeypatch.setattr(
        fleet, "ray_launcher",
        functools.partial(fleet_ray.ray_launcher, follower=_dying_follower(incarnation=0)),
    )  # fmt: skip
    workdir = tmp_path / "rl"
    trainer.run(c, workdir)
    last = read_metrics(workdir / "metrics.jsonl")[-1]
    assert last["step"] == steps
    assert last["fleet/worker_deaths"] == 1 and last["fleet/restarts"] == 1
    assert last["fleet/worker_hangs"] == 0 and last["fleet/worker_errors"] == 0
    assert last["fleet/follower_prefetched"] + last["fleet/follower_read_on_demand"] >= 1
    prompts = []
    for s in range(1, steps + 1):
        records = read_rollouts(workdir / "rollouts" / f"step_{s:06d}.jsonl", with_routing=False)
        by_prompt = {}
        for x in records:
            by_prompt.setdefault(x["prompt_id"], []).append(x["sample_index"])
            gen = [v for v, m in zip(x["versions"], x["loss_mask"]) if m]
            assert set(gen) <= {s - 1}  # on-policy (S = 0), from the version the gang held
        assert all(sorted(k) == list(range(r.group_size)) for k in by_prompt.values())
        prompts += sorted(by_prompt)
    assert len(prompts) == len(set(prompts)) == steps * r.prompts_per_step
    deadline = time.monotonic() + 60
    while _worker_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _worker_pids() == []  # both processes of each gang are gone with the run


def test_a_worker_the_cluster_cannot_place_fails_naming_the_resource(tmp_path, ray_cluster):
    ray = ray_cluster
    from ray.util import placement_group, remove_placement_group

    spec = fleet.WorkerSpec(
        model=None, tokenizer="byte", rollout=RolloutConfig(), engine_args={"max_slots": 1},
        weight_url="unused", seed=0, max_staleness=1,
    )  # fmt: skip
    # More GPUs than any node has: the fleet fails to start at once, naming them.
    task = type("Task", (), {"task_id": "t", "root": tmp_path})
    rollouts = fleet.RayRollouts(
        fleet.ray_launcher(spec, num_cpus=1, num_gpus=4),
        orchestrator.Scheduler(1, 1, 0), ["p0"],
        lambda p, k: EpisodeRequest(task, p, f"g-{p}", k),
        version=0, limit=1, weights=None, workers=1,
    )  # fmt: skip
    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(RuntimeError) as e:
        rollouts.start()
    assert (
        f"1 of 1 rollout workers failed to start: rollout worker 0 asks for "
        f"{{'CPU': 1.0, 'GPU': 4.0}} but the cluster has at most {{'CPU': {cpus}, 'GPU': 0.0}}"
    ) in str(e.value)
    # Room on a node, but taken: the wait for it is bounded (config.rl.ray_place_timeout_s).
    hog = placement_group([{"CPU": cpus}])
    ray.get(hog.ready(), timeout=60)
    try:
        with pytest.raises(RuntimeError, match="could not place it within 2s") as e:
            fleet.ray_launcher(spec, num_cpus=1, place_timeout_s=2.0)(1, 0)
        assert "rollout worker 1 asks for {'CPU': 1.0}" in str(e.value)
        gang = dataclasses.replace(spec, rollout_mesh="expert=2", rollout_hosts=2)
        with pytest.raises(RuntimeError, match="could not place it within 2s") as e:
            fleet.ray_launcher(gang, num_cpus=1, place_timeout_s=2.0)(2, 0)
        assert "rollout worker 2 asks for 2 hosts of {'CPU': 1.0}" in str(e.value)
    finally:
        remove_placement_group(hog)


_SHIPPED = """
import json, ray
from c2.rl import fleet

@ray.remote(num_cpus=0)
def c2_file():
    import c2
    return c2.__file__

ray.init(num_cpus=1, include_dashboard=False, runtime_env=fleet.runtime_env("ship", ""))
print(json.dumps(ray.get(c2_file.remote(), timeout=300)))
ray.shutdown()
"""


@pytest.mark.slow
def test_shipped_workers_import_c2_from_the_package_ray_sent(tmp_path, ray_installed):
    """runtime_env "ship" (what "auto" does for a remote cluster) on a cluster of its own: Ray
    packs the c2 package within its limits, and a worker imports c2 from that copy, not from
    this checkout (Ray uploads directories only for a job, so a process of its own)."""
    out = subprocess.run(
        [sys.executable, "-c", _SHIPPED], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env=os.environ | {"RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    path = Path(json.loads(out.stdout.strip().splitlines()[-1]))
    assert path.name == "__init__.py" and path.parent.name == "c2"
    assert not path.is_relative_to(fleet_ray.c2_package_dir().parent)
    assert "runtime_resources" in str(path)  # unpacked by Ray on the node
