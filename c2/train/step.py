"""The jitted train step, generic over the loss: grads, optimiser update, post-update rule."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from c2 import xla_cpu

# loss_fn(params, batch, rng) -> (loss, (metrics: dict of scalars, aux: pytree))
LossFn = Callable[..., tuple[jax.Array, tuple[dict, object]]]
# post_update(params, aux) -> params, applied after the optimiser (e.g. router-bias balancing)
PostUpdate = Callable[[object, object], object]

# A metric that counts (summed over micro-batches, and the weight of each micro-batch's mean).
WEIGHT_METRIC = "target_tokens"


def make_step_fn(
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    post_update: PostUpdate | None = None,
    micro_batches: int = 1,
):
    """step(params, opt_state, rng_key_data, step, batch) -> (params, opt_state, rng, metrics).

    `step` is the number of steps already taken (the schedule's argument); the RNG is carried as
    raw key data so it checkpoints as a plain uint32 array.

    `micro_batches` > 1 accumulates the gradient over that many slices of the batch (rows i,
    i + n, ... in slice i, so each device keeps its own rows) in a loop, then takes one optimiser
    step: the activations of one slice live at a time. Each slice's loss is a mean over its
    `metrics["target_tokens"]` (1 when the loss reports none), so slices are weighted by it and the
    token-mean loss and its gradient equal the whole batch's; a term that is a mean over the slice
    as a whole (the MoE balance loss) becomes the token-weighted mean of the slices' values.
    Metrics are token-weighted means except `target_tokens` (summed); `aux` (the expert loads of
    the router-bias rule) is summed. The gradient is accumulated in its own dtype.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r}: expected a positive int")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulated(params, batch, key):
        n = micro_batches

        def split(x):
            if x.shape[0] % n:
                raise ValueError(
                    f"batch of {x.shape[0]} rows is not divisible by micro_batches={n}"
                )
            return jnp.moveaxis(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 1, 0)

        slices = jax.tree.map(split, batch)
        keys = jax.random.split(key, n)

        def body(carry, xs):
            acc, w_sum = carry
            (loss, (metrics, aux)), grads = grad_fn(params, *xs)
            w = jnp.asarray(metrics.get(WEIGHT_METRIC, 1.0), jnp.float32)
            weighted = {"loss": loss, "metrics": metrics}
            acc = {
                "grads": jax.tree.map(
                    lambda a, g: a + (w * g).astype(a.dtype), acc["grads"], grads
                ),
                "values": jax.tree.map(lambda a, v: a + w * v, acc["values"], weighted),
                "aux": jax.tree.map(jnp.add, acc["aux"], aux),
            }
            return (acc, w_sum + w), None

        (loss0, (metrics0, aux0)) = jax.eval_shape(
            loss_fn, params, jax.tree.map(lambda x: x[0], slices), keys[0]
        )
        zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)  # noqa: E731
        acc0 = {
            # In the gradients' own dtype: a float32 copy of a bf16 model's gradient would add
            # twice its parameter bytes to the step (35 GB per device for Kimi-K2).
            "grads": jax.tree.map(jnp.zeros_like, params),
            "values": zeros({"loss": loss0, "metrics": metrics0}),
            "aux": jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), aux0),
        }
        (acc, w_sum), _ = jax.lax.scan(body, (acc0, jnp.zeros((), jnp.float32)), (slices, keys))
        grads = jax.tree.map(lambda a, p: (a / w_sum).astype(p.dtype), acc["grads"], params)
        values = jax.tree.map(lambda v: v / w_sum, acc["values"])
        metrics = dict(values["metrics"])
        if WEIGHT_METRIC in metrics:
            metrics[WEIGHT_METRIC] = w_sum
        return (values["loss"], (metrics, acc["aux"])), grads

    def step_fn(params, opt_state, rng, step, batch):
        key, step_key = jax.random.split(jax.random.wrap_key_data(rng))
        if micro_batches == 1:
            (loss, (metrics, aux)), grads = grad_fn(params, batch, step_key)
        else:
            (loss, (metrics, aux)), grads = accumulated(params, batch, step_key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if post_update is not None:
            params = post_update(params, aux)
        metrics = dict(metrics) | {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
            "lr": schedule(step),
        }
        return params, opt_state, jax.random.key_data(key), jax.tree.map(jnp.asarray, metrics)

    return step_fn


def compile_step(step_fn, params, opt_state, rng, batch, *, batch_sharding):
    """AOT-compiles the step for these (abstract or concrete) arguments, donating the state.

    Params and optimiser state keep their shardings; the batch is laid out by `batch_sharding`.
    """
    shard = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
    replicated = jax.sharding.NamedSharding(batch_sharding.mesh, jax.sharding.PartitionSpec())
    jitted = jax.jit(
        step_fn,
        in_shardings=(
            shard(params),
            shard(opt_state),
            replicated,
            replicated,
            jax.tree.map(lambda _: batch_sharding, batch),
        ),
        out_shardings=(shard(params), shard(opt_state), replicated, replicated),
        donate_argnums=(0, 1),
    )
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    return jitted.lower(
        abstract(params),
        abstract(opt_state),
        abstract(rng),
        jax.ShapeDtypeStruct((), jnp.int32),
        abstract(batch),
    ).compile(compiler_options=xla_cpu.train_options())
