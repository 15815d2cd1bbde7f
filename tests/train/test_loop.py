"""The generic loop on a toy task (8 simulated devices): learning, accounting, exact resume after
a crash, fallback from a damaged checkpoint, init_from, frozen parameters and post-update."""

import json
import logging
import shutil

import chex
import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from c2.train.config import stage_defaults
from c2.train.loop import Task, train
from c2.train.losses import next_token_loss
from c2.train.metrics import read_metrics
from c2.train.optimizer import make_schedule

V, H, B, T = 16, 16, 8, 12
BIAS_RATE = 0.25


def _example(i):
    start = (i * 7) % V
    seq = (start + np.arange(T + 1)) % V
    return {
        "inputs": seq[:-1].astype(np.int32),
        "targets": seq[1:].astype(np.int32),
        "loss_mask": np.ones(T, np.float32),
    }


class CrashingIterator:
    """Delegates to a grain iterator and raises on the `crash_at`-th batch (a simulated crash)."""

    def __init__(self, it, crash_at=None):
        self.it, self.crash_at, self.n = it, crash_at, 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        if self.crash_at is not None and self.n == self.crash_at:
            raise RuntimeError("simulated crash")
        return next(self.it)

    def get_state(self):
        return self.it.get_state()

    def set_state(self, state):
        self.it.set_state(state)


def toy_task(crash_at=None) -> Task:
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    rep = NamedSharding(mesh, P())
    abstract = {
        "embed": jax.ShapeDtypeStruct((V, H), jnp.float32, sharding=rep),
        "out": jax.ShapeDtypeStruct((H, V), jnp.float32, sharding=rep),
        "router_bias": jax.ShapeDtypeStruct((V,), jnp.float32, sharding=rep),
    }

    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "embed": jax.random.normal(k1, (V, H)) * 0.5,
            "out": jax.random.normal(k2, (H, V)) * 0.5,
            "router_bias": jnp.zeros(V),
        }

    def loss_fn(params, batch, rng):
        logits = params["embed"][batch["inputs"]] @ params["out"] + params["router_bias"]
        loss, _, n = next_token_loss(logits, batch["targets"], batch["loss_mask"])
        return loss, ({"target_tokens": n}, {"bias_step": jnp.float32(BIAS_RATE)})

    def post_update(params, aux):
        return dict(params, router_bias=params["router_bias"] + aux["bias_step"])

    def make_iter():
        ds = grain.MapDataset.range(10_000).shuffle(seed=3).repeat(None).map(_example).batch(B)
        return CrashingIterator(iter(ds.to_iter_dataset()), crash_at)

    return Task(
        mesh=mesh,
        abstract_params=abstract,
        init_params=jax.jit(init, out_shardings=rep),
        loss_fn=loss_fn,
        make_train_iter=make_iter,
        batch_sharding=NamedSharding(mesh, P("data")),
        post_update=post_update,
        evaluate=lambda params: {"bias_mean": float(jnp.mean(params["router_bias"]))},
        flops_per_token=6.0 * 2 * V * H,
    )


def toy_config(steps=8, every=2, lr=0.05, schedule="cosine", warmup=2):
    c = stage_defaults()
    c.name = "toy"
    c.data.batch_size, c.data.seq_len = B, T
    c.train.steps, c.train.checkpoint_every, c.train.keep_checkpoints = steps, every, 3
    c.train.progress_bar = False
    c.optimizer.lr, c.optimizer.schedule, c.optimizer.warmup_steps = lr, schedule, warmup
    c.optimizer.weight_decay = 0.0
    return c


def losses(workdir):
    return [(r["step"], r["loss"]) for r in read_metrics(workdir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 8-step run: the losses every other run must reproduce."""
    workdir = tmp_path_factory.mktemp("reference")
    train(toy_config(), workdir, toy_task())
    return workdir


def test_learns_logs_every_step_and_accounts_compute(tmp_path):
    c = toy_config(steps=30, every=15, lr=0.1)
    last = train(c, tmp_path, toy_task())
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 31))
    assert records[-1]["loss"] < 0.5 * records[0]["loss"]
    sched = make_schedule(c.optimizer, c.train.steps)
    for r in records:
        assert r["cum_tokens"] == r["step"] * B * T
        assert r["cum_target_tokens"] == r["step"] * B * T
        np.testing.assert_allclose(r["cum_flops"], r["cum_tokens"] * 6.0 * 2 * V * H)
        np.testing.assert_allclose(r["lr"], sched(r["step"] - 1), rtol=1e-6)
        assert r["tokens_per_s"] > 0 and r["cum_device_seconds"] > 0
    # the frozen bias moved only by the post-update rule: 30 steps of +0.25
    np.testing.assert_allclose(last["eval_bias_mean"], 30 * BIAS_RATE, rtol=1e-6)
    assert json.loads((tmp_path / "final_metrics.json").read_text()) == last
    for png in ("loss.png", "optim.png", "throughput.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_crash_then_resume_gives_identical_losses(tmp_path, reference):
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(toy_config(), tmp_path, toy_task(crash_at=6))  # dies before step 6
    assert [s for s, _ in losses(tmp_path)] == [1, 2, 3, 4, 5]
    train(toy_config(), tmp_path, toy_task())
    assert losses(tmp_path) == losses(reference)


def test_stop_at_checkpoints_there_and_a_rerun_goes_on_to_the_same_losses(tmp_path, reference):
    c = toy_config()
    c.train.stop_at = 5  # not a checkpoint step: it checkpoints there anyway
    train(c, tmp_path, toy_task())
    assert [s for s, _ in losses(tmp_path)] == [1, 2, 3, 4, 5]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir())[-1] == 5
    train(c, tmp_path, toy_task(crash_at=1))  # complete at stop_at: draws no batch
    train(toy_config(), tmp_path, toy_task())  # on to train.steps, on the same schedule
    assert losses(tmp_path) == losses(reference)


def test_damaged_latest_checkpoint_falls_back_and_still_matches(tmp_path, reference, caplog):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    # damage the final checkpoint and pretend the run stopped there (step 8 must be redone)
    for f in (tmp_path / "checkpoints" / "8").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        train(toy_config(), tmp_path, toy_task())
    assert any("checkpoint 8 is damaged" in r.getMessage() for r in caplog.records)
    assert losses(tmp_path) == losses(reference)


def test_complete_run_is_not_repeated(tmp_path, reference):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    train(toy_config(), tmp_path, toy_task(crash_at=1))  # would crash if it drew a batch
    assert losses(tmp_path) == losses(reference)


def test_init_from_starts_from_the_previous_stage(tmp_path, reference):
    from c2.train.checkpoint import Checkpointer

    c = toy_config(steps=3, every=3, lr=0.0, schedule="constant", warmup=0)
    c.init_from = str(reference)
    train(c, tmp_path, toy_task())
    task = toy_task()
    abstract = task.abstract_params

    def final_params(workdir):
        ckpt = Checkpointer(workdir / "checkpoints")
        out = ckpt.restore_latest(abstract, None, set_aside=False)[1]
        ckpt.close()
        return out

    before, after = final_params(reference), final_params(tmp_path)
    # lr 0: the optimiser moved nothing; the bias moved 3 post-update steps
    chex.assert_trees_all_equal(after["embed"], before["embed"])
    chex.assert_trees_all_equal(after["out"], before["out"])
    np.testing.assert_allclose(after["router_bias"], before["router_bias"] + 3 * BIAS_RATE)


def test_init_from_missing_is_a_config_error(tmp_path):
    from c2.train.config import ConfigError

    c = toy_config()
    c.init_from = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config\.init_from=.*nowhere.*no checkpoints"):
        train(c, tmp_path / "run", toy_task())
