"""The training loop shared by every stage: resume, step, log, evaluate, checkpoint, plot.

`train(config, workdir, task)` knows nothing about the model: a `Task` brings the parameters,
the loss, the data iterator and the held-out evaluation (c2/train/lm.py builds the language-model
one). A run started on a workdir that holds checkpoints resumes from the newest good one,
including the data iterator's position, so its per-step losses equal an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from c2.train import metrics as metrics_lib
from c2.train.checkpoint import Checkpointer
from c2.train.config import ConfigError, validate_stage
from c2.train.optimizer import make_optimizer
from c2.train.step import LossFn, PostUpdate, compile_step, make_step_fn

log = logging.getLogger(__name__)

CURVES = {
    "loss": ("loss", "ce_loss", "bpb", "eval_bpb"),
    "mtp": ("mtp_loss", "mtp1_acceptance", "eval_mtp1_acceptance"),
    "optim": ("lr", "grad_norm", "update_norm"),
    "router": ("router_max_over_mean", "router_dropped_frac"),
    "throughput": ("tokens_per_s", "mfu", "cum_flops"),
}


@dataclasses.dataclass
class Task:
    """What one stage trains. Every callable is pure except `make_train_iter`."""

    mesh: jax.sharding.Mesh
    abstract_params: object  # pytree of jax.ShapeDtypeStruct carrying shardings
    init_params: Callable[[jax.Array], object]  # rng key -> sharded params
    loss_fn: LossFn
    make_train_iter: Callable[[], Iterator[dict]]  # has get_state()/set_state() (grain)
    batch_sharding: jax.sharding.NamedSharding
    post_update: PostUpdate | None = None
    evaluate: Callable[[object], dict] | None = None  # params -> held-out metrics
    flops_per_token: float = 0.0  # training (fwd+bwd) FLOPs per token, for compute accounting
    peak_flops_per_device: float = 0.0  # measured matmul peak, for MFU (0: not reported)
    import_params: Callable[[str], object] | None = None  # "hf:DIR" -> params


@dataclasses.dataclass
class Counters:
    """Compute accounting, carried in checkpoints so resumed runs keep counting."""

    tokens: float = 0.0  # tokens processed (including padding: compute is spent on them)
    target_tokens: float = 0.0  # tokens with a loss
    flops: float = 0.0
    device_seconds: float = 0.0


def _to_json_state(state):
    """A grain iterator state as JSON (DataLoader iterators give bytes, datasets give dicts)."""
    if isinstance(state, bytes):
        return {"__bytes__": state.decode()}
    return state


def _from_json_state(state):
    if isinstance(state, dict) and set(state) == {"__bytes__"}:
        return state["__bytes__"].encode()
    return state


def _sharded(abstract):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), abstract
    )


def load_init_params(init_from: str, task: Task, step: int | None = None):
    """Parameters a stage starts from: a previous stage's workdir (its newest good checkpoint, or
    the one after `step` steps), or an HF import ("hf:DIR")."""
    if init_from.startswith("hf:"):
        if step is not None:
            raise ConfigError(f"init_from={init_from!r}: an HF directory has no steps to choose")
        if task.import_params is None:
            raise ConfigError(f"config.init_from={init_from!r}: this task cannot import HF weights")
        return task.import_params(init_from[3:])
    ckpt_dir = Path(init_from) / "checkpoints"
    if not ckpt_dir.is_dir():
        raise ConfigError(
            f"config.init_from={init_from!r}: no checkpoints directory at {ckpt_dir}; run the "
            "previous stage first or point init_from at its workdir"
        )
    ckpt = Checkpointer(ckpt_dir)
    try:
        if step is not None:
            params = ckpt.restore_step(step, _sharded(task.abstract_params))
            log.info("initialised from %s step %d", init_from, step)
            return params
        found = ckpt.restore_latest(_sharded(task.abstract_params), None, set_aside=False)
    finally:
        ckpt.close()
    if found is None:
        raise ConfigError(f"config.init_from={init_from!r}: no readable checkpoint in {ckpt_dir}")
    log.info("initialised from %s step %d", init_from, found[0])
    return found[1]


def init_key(seed: int) -> jax.Array:
    """The key a fresh run initialises its parameters from (the other half seeds the steps)."""
    return jax.random.split(jax.random.key(seed))[0]


def _host_metrics(metrics: dict) -> dict:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def opt_state_shardings(abstract_opt, abstract_params, mesh):
    """Each optimiser-state leaf takes the sharding of the parameter it mirrors (found by key-path
    suffix and shape, as optax's mu/nu trees mirror the params); counters are replicated."""
    by_path = {
        tuple(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    }
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path, leaf):
        for k in range(len(path)):
            param = by_path.get(tuple(path[k:]))
            if param is not None and param.shape == leaf.shape:
                return param.sharding
        return replicated

    return jax.tree_util.tree_map_with_path(pick, abstract_opt)


def abstract_state(tx, task: Task):
    """Sharded abstract params and optimiser state (the restore targets), and the latter's
    shardings."""
    abstract_params = _sharded(task.abstract_params)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_shardings = opt_state_shardings(abstract_opt, abstract_params, task.mesh)
    abstract_opt = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_opt, opt_shardings
    )
    return abstract_params, abstract_opt, opt_shardings


def train(config: ml_collections.ConfigDict, workdir: str | Path, task: Task) -> dict:
    """Runs (or resumes) one stage to `config.train.steps` (or `config.train.stop_at`); returns
    the last logged record."""
    validate_stage(config, task.mesh.devices.size)
    workdir = Path(workdir)
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    tc = config.train
    tx, schedule = make_optimizer(config.optimizer, tc.steps, task.abstract_params)
    abstract_params, abstract_opt, opt_shardings = abstract_state(tx, task)
    ckpt = Checkpointer(
        workdir / "checkpoints", keep=tc.keep_checkpoints, async_save=tc.async_checkpoints
    )
    try:
        train_iter = task.make_train_iter()
        restored = ckpt.restore_latest(abstract_params, abstract_opt)
        if restored is not None:
            start, params, opt_state, meta = restored
            rng = jnp.asarray(np.asarray(meta["rng"], np.uint32))
            train_iter.set_state(_from_json_state(meta["data_state"]))
            counters = Counters(**meta["counters"])
            log.info("resumed %s from step %d", workdir, start)
        else:
            start, counters = 0, Counters()
            key = jax.random.split(jax.random.key(tc.seed))[1]
            if config.init_from:
                params = load_init_params(config.init_from, task)
            else:
                params = task.init_params(init_key(tc.seed))
            opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
            rng = jax.random.key_data(key)
        primary = jax.process_index() == 0
        writer = metrics_lib.MetricsWriter(workdir, resume_step=start, enabled=primary)
        try:
            if start >= (tc.stop_at or tc.steps):
                log.info("%s is already complete at step %d", workdir, start)
            else:
                step_fn = make_step_fn(
                    task.loss_fn, tx, schedule, task.post_update, micro_batches=tc.micro_batches
                )
                state = (params, opt_state, rng)
                _run_steps(config, task, step_fn, state, start, train_iter, counters, ckpt, writer)
        finally:
            writer.close()
    finally:
        ckpt.close()
    if jax.process_index() != 0:
        return {}
    plot_run(workdir, title=config.name)
    records = metrics_lib.read_metrics(workdir / metrics_lib.METRICS_FILE)
    record = records[-1] if records else {}
    (workdir / "final_metrics.json").write_text(json.dumps(record, indent=2))
    return record


def _run_steps(config, task: Task, step_fn, state, start, train_iter, counters, ckpt, writer):
    """Steps start+1 .. config.train.steps (or stop_at): log, evaluate and checkpoint on schedule,
    and at the last step."""
    tc = config.train
    last = tc.stop_at or tc.steps
    params, opt_state, rng = state
    put = lambda b: jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(task.batch_sharding, x), b
    )
    batch = put(next(train_iter))
    tokens_per_step = float(np.prod(batch["inputs"].shape)) if "inputs" in batch else 0.0
    t0 = time.perf_counter()
    compiled = compile_step(
        step_fn, params, opt_state, rng, batch, batch_sharding=task.batch_sharding
    )
    log.info("compiled the train step in %.1fs", time.perf_counter() - t0)
    n_devices = task.mesh.devices.size
    show = tc.progress_bar and jax.process_index() == 0
    bar = tqdm(total=last, initial=start, disable=not show, desc=config.name)
    t_last, last_logged = time.perf_counter(), start
    target_tokens = jnp.float32(0.0)  # summed on device; read at log steps only
    for step in range(start + 1, last + 1):
        if step > start + 1:
            batch = put(next(train_iter))
        params, opt_state, rng, step_metrics = compiled(
            params, opt_state, rng, np.int32(step - 1), batch
        )
        target_tokens = target_tokens + step_metrics.get("target_tokens", 0.0)
        counters.tokens += tokens_per_step
        counters.flops += tokens_per_step * task.flops_per_token
        if step % tc.log_every == 0 or step == last:
            host = _host_metrics(step_metrics)  # waits for the step
            counters.target_tokens += float(target_tokens)
            target_tokens = jnp.float32(0.0)
            now = time.perf_counter()
            dt = (now - t_last) / (step - last_logged)
            counters.device_seconds += (now - t_last) * n_devices
            host |= {
                "step_time_s": dt,
                "tokens_per_s": tokens_per_step / dt,
                "cum_tokens": counters.tokens,
                "cum_target_tokens": counters.target_tokens,
                "cum_flops": counters.flops,
                "cum_device_seconds": counters.device_seconds,
            }
            if task.peak_flops_per_device:
                achieved = tokens_per_step * task.flops_per_token / dt
                host["mfu"] = achieved / (task.peak_flops_per_device * n_devices)
            if task.evaluate and (step == last or (tc.eval_every and step % tc.eval_every == 0)):
                host |= {f"eval_{k}": v for k, v in task.evaluate(params).items()}
            writer.write(step, host)
            bar.set_postfix(loss=f"{host['loss']:.3f}")
            t_last, last_logged = time.perf_counter(), step  # evaluation is not train time
        bar.update(1)
        if step % tc.checkpoint_every == 0 or step == last:
            meta = {
                "rng": np.asarray(jax.device_get(rng)).tolist(),
                "counters": dataclasses.asdict(counters),
            }
            data_state = _to_json_state(train_iter.get_state())
            ckpt.save(step, params, opt_state, meta, data_state, force=True)
    bar.close()


def plot_run(workdir: str | Path, title: str = "", curves: dict = CURVES) -> list[Path]:
    """PNG plots of a run's metrics.jsonl beside it (one file per group of `curves`)."""
    workdir = Path(workdir)
    records = metrics_lib.read_metrics(workdir / metrics_lib.METRICS_FILE)
    out = []
    for group, keys in curves.items():
        png = metrics_lib.plot_curves(
            records, keys, workdir / f"{group}.png", title=f"{title} {group}"
        )
        if png:
            out.append(png)
    return out
