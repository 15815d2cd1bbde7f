"""The jitted train step, generic over the loss: grads, optimiser update, post-update rule."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

# loss_fn(params, batch, rng) -> (loss, (metrics: dict of scalars, aux: pytree))
LossFn = Callable[..., tuple[jax.Array, tuple[dict, object]]]
# post_update(params, aux) -> params, applied after the optimiser (e.g. router-bias balancing)
PostUpdate = Callable[[object, object], object]


def make_step_fn(
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    post_update: PostUpdate | None = None,
):
    """step(params, opt_state, rng_key_data, step, batch) -> (params, opt_state, rng, metrics).

    `step` is the number of steps already taken (the schedule's argument); the RNG is carried as
    raw key data so it checkpoints as a plain uint32 array.
    """

    def step_fn(params, opt_state, rng, step, batch):
        key, step_key = jax.random.split(jax.random.wrap_key_data(rng))
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, (metrics, aux)), grads = grad_fn(params, batch, step_key)
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
    ).compile()
