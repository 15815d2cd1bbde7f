"""The rollout fleet's driver (c2/rl/fleet_driver.py) against scripted workers: per-worker
admission keeps the staleness bound, the episodes of a worker that dies, raises or hangs are
played again elsewhere exactly once (never by a worker holding older weights than their group's
admission) and it is replaced within the restart budget, stale samples are regenerated and never
trained, every prompt trains exactly once, a task's files are put once. Also what the Ray side
builds without a cluster (runtime_env, resource asks). The real thing on Ray:
tests/rl/test_fleet_ray.py."""

import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from c2 import sharding
from c2.rl import fleet, fleet_ray, orchestrator
from c2.rl.episodes import EpisodeRequest
from c2.rl.records import Sample


class _Weights:
    url = "unused"

    def publish(self, params, version):
        pass

    def close(self):
        pass


class _Worker:
    """Plays each request it was handed by the next exchange, with the version it holds, which
    follows the published one `lag` exchanges late. `die_at`: the exchange, once it holds work,
    that raises `fault` (as a Ray launcher's call does when the worker died, raised in the actor,
    or passed its deadline); `stale`: tokens one version older than the one reported when the
    request came (a broken weight path)."""

    def __init__(
        self, name, lag=0, die_at=None, stale=False, slots=4, errors=None, fault=fleet.WorkerLost
    ):
        self.name, self.lag, self.die_at, self.stale, self.slots = name, lag, die_at, stale, slots
        self.fault = fault
        self.errors = errors or {}  # what its episode runner reports (EpisodeRunner.error_counts)
        self.version, self.reported, self.calls, self.held, self.seen = 0, 0, 0, [], []
        self.shipped, self.blobs, self.killed = set(), [], False

    def exchange(self, requests, published, hungry, wait_s):
        time.sleep(0.01)  # a round trip: the driver threads take turns
        self.calls += 1
        if self.die_at is not None and self.calls >= self.die_at and (self.held or requests):
            self.lost = [wire for wire, _ in self.held] + list(requests)
            raise self.fault(f"worker {self.name}: injected {self.fault.__name__}")
        self.seen.append(published)
        self.version = self.seen[max(0, len(self.seen) - 1 - self.lag)]
        for task_id, blob, *_ in requests:
            assert (blob is None) == (task_id in self.shipped)  # files once per worker
            self.shipped.add(task_id)
            if blob is not None:
                self.blobs.append(blob)
        done = [self._play(r, v) for r, v in self.held]
        # Requests arrive admitted at the version the last reply reported.
        self.held = [(r, self.reported) for r in requests]
        self.reported = self.version
        return {
            "samples": done,
            "version": self.version,
            "want": self.slots - len(self.held),
            "errors": dict(self.errors),
            "stats": {},
        }

    def _play(self, wire, version):
        _, _, prompt_id, group_id, k = wire
        v = version - 1 if self.stale and version > 0 else version
        n = 3
        return Sample(
            prompt_id, group_id, k, prompt_id,
            tokens=np.arange(n, dtype=np.int32), loss_mask=np.array([0, 1, 1], np.uint8),
            logprobs=np.zeros(n, np.float32), versions=np.array([-1, v, v], np.int32),
            routing=np.zeros((n, 1, 2), np.uint8), temperature=1.0, top_p=1.0, top_k=0,
            reward_terms={"task": 0.0}, effort={}, passed=False, stop_reason="stop",
            info={"worker": self.name},
        )  # fmt: skip


class _Launcher:
    """Scripted workers by (index, incarnation); `put` stores a task's files as Ray's would."""

    def __init__(self, workers, launched):
        self.workers, self.launched, self.puts = workers, launched, []

    def __call__(self, index, incarnation):
        w = self.workers[(index, incarnation)]
        self.launched.append((index, incarnation))
        if isinstance(w, BaseException):  # its start fails (constructor raised, no placement)
            raise w

        def call(method, *args):
            return getattr(w, method)(*args)

        def kill():
            w.killed = True

        return fleet._Handle(index, incarnation, call, kill, w.slots)

    def put(self, blob):
        self.puts.append(blob)
        return f"ref-{len(self.puts)}"


def _launcher(workers, launched):
    return _Launcher(workers, launched)


def _run(tmp_path, workers, *, n_workers, P=2, G=2, S=1, steps=6, max_restarts=None):
    """The trainer's loop against the fleet; returns (trained groups per step, rollouts)."""
    task = types.SimpleNamespace(task_id="t", root=tmp_path)
    (tmp_path / "metadata.json").write_text("{}")
    prompts = [f"p{i}" for i in range(P * steps)]
    launched = []
    rollouts = fleet.RayRollouts(
        _launcher(workers, launched),
        orchestrator.Scheduler(P, G, S),
        prompts,
        lambda p, k: EpisodeRequest(task, p, f"g-{p}", k),
        version=0,
        limit=P * steps,
        weights=_Weights(),
        workers=n_workers,
        max_restarts=max_restarts,
    )
    trained = []
    rollouts.start()
    try:
        for s in range(steps):
            groups, _ = rollouts.next_groups(s)
            trained.append(groups)
            for g in groups:  # the staleness bound, on what is trained
                assert all(s - orchestrator.oldest_version(x) <= S for x in g.samples)
                assert sorted(x.sample_index for x in g.samples) == list(range(G))
            rollouts.publish(None, s + 1)
    finally:
        rollouts.close()
    flat = [g.prompt_id for step in trained for g in step]
    assert sorted(flat) == sorted(prompts)  # each prompt once, none skipped
    return trained, rollouts, launched


def test_two_workers_share_the_prompts_within_the_bound(tmp_path):
    workers = {(0, 0): _Worker("a"), (1, 0): _Worker("b", lag=1)}
    trained, rollouts, _ = _run(tmp_path, workers, n_workers=2)
    by = {x.info["worker"] for step in trained for g in step for x in g.samples}
    assert by == {"a", "b"}  # both played
    for step in trained:  # a group's episodes all come from the worker that admitted it
        for g in step:
            assert len({x.info["worker"] for x in g.samples}) == 1
    m = rollouts.metrics()
    assert m["fleet/worker_deaths"] == 0 and m["fleet/regenerated"] == 0


def test_a_dead_workers_episodes_are_played_again_by_a_replacement(tmp_path):
    dying = _Worker("a", die_at=4, errors={"errors/grade": 3, "gave_up": 1})
    b = _Worker("b", lag=2, errors={"errors/tools": 2})
    workers = {(0, 0): dying, (0, 1): _Worker("a2"), (1, 0): b}
    trained, rollouts, launched = _run(tmp_path, workers, n_workers=2, S=2)
    assert (0, 1) in launched  # the replacement
    m = rollouts.metrics()
    assert m["fleet/worker_deaths"] == 1 and m["fleet/workers"] == 2
    assert m["fleet/restarts"] == 1 and m["fleet/starting"] == 0  # built and joined
    lost = {(wire[3], wire[4]) for wire in dying.lost}  # what it held when it died
    assert lost and m["fleet/replayed"] == len(lost)
    # the dead worker's errors still count; its given-up episode once, not also as an error
    assert m["rollout_errors"] == 3 + 2 and m["rollout_gave_up"] == 1
    played = {(x.group_id, x.sample_index): x for step in trained for g in step for x in g.samples}
    assert all(played[key].info["worker"] in ("a2", "b") for key in lost)


def test_a_dead_worker_without_restarts_stops_the_run_with_the_reason(tmp_path):
    workers = {(0, 0): _Worker("a", die_at=3)}
    with pytest.raises(RuntimeError, match="the rollouts failed") as e:
        _run(tmp_path, workers, n_workers=1, max_restarts=0)
    assert "rollout worker 0 (incarnation 0) died with no restart left" in str(e.value.__cause__)
    assert "worker a: injected WorkerLost" in str(e.value.__cause__)


def test_workers_that_raise_hang_and_die_are_replaced_and_their_episodes_played_once(tmp_path):
    """Each fault a launcher reports costs the worker its incarnation: it is killed, what it
    held is played again by others (exactly once: each prompt trains once, each group whole),
    and a replacement joins; each kind is counted."""
    faulty = {
        0: _Worker("a", die_at=3, fault=fleet.WorkerFailed),
        1: _Worker("b", die_at=4, fault=fleet.WorkerHung),
        2: _Worker("c", die_at=5, fault=fleet.WorkerLost),
    }
    workers = {(i, 0): w for i, w in faulty.items()}
    workers |= {(i, 1): _Worker(f"{w.name}2") for i, w in faulty.items()}
    trained, rollouts, launched = _run(tmp_path, workers, n_workers=3, P=3, S=2)
    assert sorted(launched) == [(i, k) for i in range(3) for k in range(2)]
    assert all(w.killed for w in faulty.values())  # a raising or hung actor is killed too
    m = rollouts.metrics()
    assert (m["fleet/worker_errors"], m["fleet/worker_hangs"], m["fleet/worker_deaths"]) == (
        1,
        1,
        1,
    )
    assert m["fleet/restarts"] == 3 and m["fleet/workers"] == 3 and m["fleet/starting"] == 0
    lost = [(wire[3], wire[4]) for w in faulty.values() for wire in w.lost]
    # (an episode lost twice, given to a worker that then failed too, is replayed twice)
    assert len(lost) >= 3 and m["fleet/replayed"] == len(lost)
    played = [
        (x.group_id, x.sample_index, x.info["worker"])
        for s in trained
        for g in s
        for x in g.samples
    ]
    assert len(played) == len({p[:2] for p in played}) == 3 * 6 * 2  # no episode twice
    by_key = {p[:2]: p[2] for p in played}
    assert all(by_key[key] not in ("a", "b", "c") for key in lost)
    assert rollouts.counts["unexpected_samples"] == 0


def test_a_fault_past_the_restart_budget_fails_the_run_naming_the_worker_and_error(tmp_path):
    workers = {
        (0, 0): _Worker("a", die_at=2, fault=fleet.WorkerFailed),
        (0, 1): _Worker("a2", die_at=2, fault=fleet.WorkerFailed),
        (1, 0): _Worker("b"),
    }
    with pytest.raises(RuntimeError, match="the rollouts failed") as e:
        _run(tmp_path, workers, n_workers=2, max_restarts=1)
    cause = str(e.value.__cause__)
    assert "rollout worker 0 (incarnation 1) raised with no restart left" in cause
    assert "1 used of max_restarts=1" in cause and "worker a2: injected WorkerFailed" in cause


def test_a_replacement_whose_start_fails_costs_a_restart_and_the_next_one_plays(tmp_path):
    """A replacement that raises while starting is a fault like any other: counted, a restart
    spent, the next incarnation started; the run finishes with every prompt once."""
    workers = {
        (0, 0): _Worker("a", die_at=2, fault=fleet.WorkerLost),
        (0, 1): fleet.WorkerFailed("worker a2: its engine raised while building"),
        (0, 2): _Worker("a3"),
        (1, 0): _Worker("b"),
    }
    _, rollouts, launched = _run(tmp_path, workers, n_workers=2, max_restarts=2)
    assert sorted(launched) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    m = rollouts.metrics()
    assert (m["fleet/worker_deaths"], m["fleet/worker_errors"], m["fleet/restarts"]) == (1, 1, 2)
    assert m["fleet/workers"] == 2 and m["fleet/starting"] == 0


def test_a_replacement_that_cannot_start_fails_the_run_when_no_restart_is_left(tmp_path):
    workers = {
        (0, 0): _Worker("a", die_at=2, fault=fleet.WorkerLost),
        (0, 1): fleet.WorkerFailed("worker a2: its engine raised while building"),
        (1, 0): _Worker("b"),
    }
    with pytest.raises(RuntimeError, match="the rollouts failed") as e:
        _run(tmp_path, workers, n_workers=2, max_restarts=1)
    cause = str(e.value.__cause__)
    assert "rollout worker 0 (incarnation 1) raised while starting, with no restart left" in cause
    assert "its engine raised while building" in cause


def test_a_tasks_files_are_put_once_and_each_worker_gets_the_ref(tmp_path):
    workers = {(0, 0): _Worker("a"), (1, 0): _Worker("b")}
    launcher = _Launcher(workers, [])
    rollouts = fleet.RayRollouts(
        launcher, orchestrator.Scheduler(2, 2, 1), ["p0", "p1", "p2", "p3"],
        lambda p, k: EpisodeRequest(types.SimpleNamespace(task_id="t", root=tmp_path), p,
                                    f"g-{p}", k),
        version=0, limit=4, weights=_Weights(), workers=2,
    )  # fmt: skip
    rollouts.start()
    try:
        for s in range(2):
            rollouts.next_groups(s)
            rollouts.publish(None, s + 1)
    finally:
        rollouts.close()
    assert len(launcher.puts) == 1 and launcher.puts[0] == fleet.pack_task(tmp_path)
    assert workers[(0, 0)].blobs == workers[(1, 0)].blobs == ["ref-1"]


def test_samples_older_than_their_group_are_regenerated_never_trained(tmp_path):
    # Worker b's tokens come from one version before the one it reports: its samples of groups
    # admitted at v >= 1 violate the admission rule and are played again, by worker a, which
    # holds a new enough version (given back to b first, b could replay them forever: this
    # test hung once in CI that way, before the rule).
    workers = {(0, 0): _Worker("a"), (1, 0): _Worker("b", stale=True)}
    trained, rollouts, _ = _run(tmp_path, workers, n_workers=2, S=1)
    assert rollouts.metrics()["fleet/regenerated"] > 0
    for step in trained:
        for g in step:
            assert all(orchestrator.oldest_version(x) >= g.admitted_at for x in g.samples)
            if g.admitted_at >= 1:  # b's samples of these groups are always stale
                assert {x.info["worker"] for x in g.samples} == {"a"}


@pytest.mark.parametrize("rollout_mesh", ["", "expert=2,tensor=2"])
def test_a_worker_behind_the_bound_refreshes_before_playing(tmp_path, sandbox, rollout_mesh):
    """A worker whose background fetcher has not kept up (here: it polls once an hour) and whose
    held version is more than max_staleness behind the published one fetches the newest version
    itself at the next exchange, before taking work; within the bound it does not. On a mesh,
    what it fetches arrives in its engine's layout (it reads the shards its devices hold)."""
    import jax
    import jax.numpy as jnp

    from c2 import model
    from c2.data.chat import AgentChat
    from c2.data.tokenizer import ByteTokenizer
    from c2.envs.sandbox import Sandbox
    from c2.rl.episodes import RolloutConfig
    from c2.rl.weight_sync import WeightPublisher

    del sandbox  # RolloutWorker makes its own; the fixture says whether this machine can
    cfg = model.presets.get("tiny_kimi_k2", dtype="float32", d_model=64, n_layers=2, n_heads=2,
                            d_ff=128, d_ff_expert=32, n_experts=4, n_experts_per_token=2,
                            max_seq_len=128, mtp_depth=0)  # fmt: skip
    rng = np.random.default_rng(0)
    shapes = model.abstract_params(cfg)
    versions = [
        jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), shapes)
        for _ in range(3)
    ]
    pub = WeightPublisher(tmp_path / "store", full_every=8, dtype="float32")
    pub.publish(versions[0], 0)
    im_end = AgentChat(ByteTokenizer()).im_end
    spec = fleet.WorkerSpec(
        model=cfg, tokenizer="byte", rollout=RolloutConfig(),
        engine_args={"max_slots": 2, "max_len": 128, "stop_tokens": (im_end,)},
        weight_url=str(tmp_path / "store"), seed=0, max_staleness=1, poll_s=3600.0,
        rollout_mesh=rollout_mesh,
    )  # fmt: skip
    assert Sandbox().isolated
    worker = fleet.RolloutWorker(spec, 0)
    layout = None
    if rollout_mesh:
        from c2.infer.engine import weight_shardings

        layout = weight_shardings(cfg, worker.mesh)
        assert dict(worker.mesh.mesh.shape) == sharding.parse_mesh(rollout_mesh)
    try:
        pub.publish(versions[1], 1)
        pub.publish(versions[2], 2)
        reply = worker.exchange([], 1, False, 0.0)  # one behind: within the bound
        assert reply["version"] == 0 and reply["stats"] == {}
        reply = worker.exchange([], 2, False, 0.0)  # two behind: refreshed first
        assert reply["version"] == 2 and reply["stats"] == {"refreshed": 1}
        held, version = worker.engine._pending_update  # the engine swaps it in at its next step
        assert version == 2
        for got, want in zip(jax.tree.leaves(held), jax.tree.leaves(versions[2])):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        if layout is not None:
            for got, want in zip(jax.tree.leaves(held), jax.tree.leaves(layout)):
                assert got.sharding.is_equivalent_to(want, got.ndim)
    finally:
        worker.close()
    assert not worker.scratch.exists()  # its episodes' files go with it


def test_packed_tasks_round_trip(tmp_path):
    src = tmp_path / "task"
    (src / "workspace" / "pkg").mkdir(parents=True)
    (src / "workspace" / "pkg" / "a.py").write_text("x = 1\n")
    (src / "metadata.json").write_text('{"task_id": "t"}')
    out = fleet.unpack_task(fleet.pack_task(src), tmp_path / "copy")
    assert (out / "workspace" / "pkg" / "a.py").read_text() == "x = 1\n"
    assert (out / "metadata.json").read_text() == '{"task_id": "t"}'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".unpack")] == []


def test_code_that_does_not_use_ray_never_imports_it():
    code = "import sys, c2.rl.trainer, c2.rl.fleet; assert 'ray' not in sys.modules, 'ray'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_workers_get_c2_through_rays_runtime_env_when_the_cluster_is_remote():
    shipped = fleet.runtime_env("auto", "ray://head:10001")
    (package,) = shipped["py_modules"]
    assert Path(package).name == "c2" and (Path(package) / "rl" / "fleet.py").is_file()
    assert {".venv", ".git", "runs", "__pycache__"} <= set(shipped["excludes"])
    assert fleet.runtime_env("ship", "")["py_modules"] == [package]
    # A local cluster shares this machine's install; "none": the nodes have c2 installed.
    assert "py_modules" not in fleet.runtime_env("auto", "")
    assert "py_modules" not in fleet.runtime_env("none", "ray://head:10001")
    with pytest.raises(ValueError, match="ray_runtime_env='always'"):
        fleet.runtime_env("always", "")


def test_a_worker_reserves_its_gpus_per_device_of_its_mesh_on_one_node():
    spec = types.SimpleNamespace(rollout_mesh="expert=4,tensor=2")
    assert fleet_ray.worker_resources(spec, 2, 1) == {"CPU": 2.0, "GPU": 8.0}
    one_device = types.SimpleNamespace(rollout_mesh="")
    assert fleet_ray.worker_resources(one_device, 1, 0) == {"CPU": 1.0}
    nodes = [
        {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 4.0}},
        {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 8.0}},
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # gone: no room
    ]
    fleet_ray.check_fits(0, {"CPU": 2.0, "GPU": 8.0}, nodes)
    with pytest.raises(RuntimeError) as e:  # 8 GPUs on one node with 4 CPUs: none has both
        fleet_ray.check_fits(3, {"CPU": 4.0, "GPU": 8.0}, nodes)
    assert "rollout worker 3 asks for {'CPU': 4.0, 'GPU': 8.0} but the cluster has at most " in (
        str(e.value)
    )


def test_a_gang_reserves_a_hosts_share_of_the_engine_in_each_bundle(monkeypatch):
    """rl_kimi_k2's engine: 32 GPUs over 4 hosts, 8 a bundle. On CPU each member process is
    given its share of the devices (replacing the driver's count in XLA_FLAGS)."""
    spec = types.SimpleNamespace(rollout_mesh="expert=8,tensor=4", rollout_hosts=4)
    assert fleet_ray.worker_resources(spec, 8, 1) == {"CPU": 8.0, "GPU": 8.0}
    assert fleet_ray.host_env(spec, gpus=8.0) == {}  # Ray's CUDA_VISIBLE_DEVICES does it
    monkeypatch.setenv(
        "XLA_FLAGS", "--xla_cpu_enable_fast_math=false " + fleet_ray.DEVICE_FLAG + "=8"
    )
    flags = fleet_ray.host_env(spec, gpus=0.0)["env_vars"]["XLA_FLAGS"].split()
    assert flags == ["--xla_cpu_enable_fast_math=false", fleet_ray.DEVICE_FLAG + "=8"]
    spec.rollout_hosts = 2
    flags = fleet_ray.host_env(spec, gpus=0.0)["env_vars"]["XLA_FLAGS"].split()
    assert flags[-1] == fleet_ray.DEVICE_FLAG + "=16"


def test_ray_fleet_config_fields_are_validated():
    from c2.rl.config import rl_stage_defaults, validate_rl
    from c2.train.config import ConfigError

    c = rl_stage_defaults()
    c.rl.ray_runtime_env = "always"
    with pytest.raises(ConfigError, match="config.rl.ray_runtime_env='always': expected one of"):
        validate_rl(c, 8, load_files=False)
    c.rl.ray_runtime_env, c.rl.ray_call_timeout_s = "auto", 0.0
    with pytest.raises(ConfigError, match=r"config.rl.ray_call_timeout_s: expected > 0, got 0.0"):
        validate_rl(c, 8, load_files=False)
