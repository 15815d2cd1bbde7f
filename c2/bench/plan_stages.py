"""Each stage of a config planned as it runs (c2.bench.plan): its programs compiled whole, every
layer of the real model, from abstract inputs; the rollout engine planned by its arrays.

  LM stage (cpt, long_context, sft)  the train step (`lm.lm_loss`, the config's micro-batches),
      compiled once: per device = its arguments (parameters, optimiser state, batch) + outputs
      not aliased to the donated state + temporaries, XLA's own memory analysis.
  RL trainer  the programs `c2.rl.step.RLLearner` runs each step, built by the trainer's own
      `_learner`: the reference's log-prob forward, the policy's (router replay) and the update
      (RL loss over micro-batches, one Adam step), or the single-forward update. What stays on
      the devices across them (parameters, optimiser state, the frozen reference, the batch and
      the log-probs the update reads) is counted once from its shard shapes; a program adds its
      temporaries and the outputs not aliased to a donated input. Per device: the state plus
      the largest program.
  rollout engine  `c2.infer.Engine` on `config.rl.rollout_mesh` (`engine_layout`): its weights
      (in the store's `rl.weight_store_dtype` for Ray workers, else the trainer's masters) and
      its state (the KV cache of `rl.rollout.engine_slots` slots of max(`rl.seq_buckets`)
      tokens) by their shard shapes, plus one MoE layer's local experts gathered whole (the
      expert exchange's `shard_map` takes them over `expert` only). The decode step is not
      compiled: its other temporaries (one token a slot) are not counted.
"""

from __future__ import annotations

import math

# A stage entry's fields: the breakdown ("bytes": part -> per-device bytes), its total, the
# budget it is checked against and the verdict.


def shard_bytes(tree) -> int:
    """Bytes one device holds of a tree of (abstract) arrays: each leaf's shard shape."""
    import jax
    import jax.numpy as jnp

    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def program_memory(compiled) -> dict:
    """XLA's memory analysis of a compiled program, per device; `extra`: what it needs beyond
    its arguments (temporaries + outputs not aliased to a donated argument)."""
    m = compiled.memory_analysis()
    out = {
        "argument": int(m.argument_size_in_bytes),
        "output": int(m.output_size_in_bytes),
        "alias": int(m.alias_size_in_bytes),
        "temp": int(m.temp_size_in_bytes),
    }
    out["extra"] = out["temp"] + max(out["output"] - out["alias"], 0)
    return out


def entry(name: str, devices: int, parts: dict, device_memory_gb: float, **extra) -> dict:
    """One stage's (or engine's) plan: parts -> bytes, their sum, and whether it fits."""
    total = int(sum(parts.values()))
    return {
        "stage": name,
        "devices": int(devices),
        "bytes": {k: int(v) for k, v in parts.items()},
        "per_device_bytes": total,
        "device_memory_gb": device_memory_gb,
        "fits": total <= device_memory_gb * 1e9,
        **extra,
    }


# LM stages ---------------------------------------------------------------------------------------


def plan_lm(name, cfg, config, mesh, batch: int, seq: int, device_memory_gb: float) -> dict:
    """The LM train step of `config` compiled whole on `mesh` (see the module doc)."""
    import time

    from c2.bench.plan_compile import abstract_state, collectives, compile_step
    from c2.model.params import flops_per_token

    t0 = time.perf_counter()
    compiled = compile_step(cfg, config, mesh, batch, seq)
    mem = program_memory(compiled)
    params, opt, _, _ = abstract_state(cfg, config, mesh)
    param_bytes, opt_bytes = shard_bytes(params), shard_bytes(opt)
    parts = {
        "parameters": param_bytes,
        "optimiser state": opt_bytes,
        "batch": mem["argument"] - param_bytes - opt_bytes,
        "temporaries": mem["temp"],
        "outputs not aliased": mem["extra"] - mem["temp"],
    }
    n_dev = mesh.devices.size
    return entry(
        name,
        n_dev,
        parts,
        device_memory_gb,
        program=mem,
        # Analytic (c2.model.flops_per_token): XLA counts a layer loop's body once.
        flops_per_device=flops_per_token(cfg, seq) * batch * seq / n_dev,
        # In the program's text: a layer loop's body (and its collectives) appears once.
        collectives_in_program=collectives(compiled.as_text()),
        compile_s=time.perf_counter() - t0,
    )


# The RL trainer ----------------------------------------------------------------------------------


def abstract_rl_batch(learner, cfg, rows: int, chains: int, seq: int, packed=None) -> dict:
    """The update's batch (c2.rl.batching.make_batch's fields) as sharded abstract arrays:
    `rows` rows of `seq` tokens, `chains` chains, and with `packed` = (R, W) the packed
    groups' R rows of W tokens; dtypes from a make_batch of one small group."""
    import jax
    from jax.sharding import NamedSharding

    from c2.rl.batching import (
        CHAIN_KEYS,
        PACKED_TOKEN_KEYS,
        ROW_KEYS,
        TOKEN_KEYS,
        make_batch,
    )

    small = make_batch(
        [],
        batch_size=1,
        seq_buckets=(16,),
        cfg=cfg.replace(max_seq_len=64),
        pad_id=0,
        group_size=1,
        pack_buckets=(32,),
        pack_rows=1,
    )
    L, k = cfg.n_moe_layers, cfg.n_experts_per_token
    shapes = {key: (rows, seq) for key in TOKEN_KEYS}
    shapes |= {key: (rows,) for key in ROW_KEYS} | {key: (chains,) for key in CHAIN_KEYS}
    shapes["routing"] = (L, rows, seq, k)
    if packed is not None:
        R, W = packed
        shapes |= {key: (R, W) for key in PACKED_TOKEN_KEYS}
        shapes["packed_routing"] = (L, R, W, k)
        shapes["packed_index"] = (rows, seq)
    mesh = learner.mesh
    return {
        key: jax.ShapeDtypeStruct(
            shape, small[key].dtype, sharding=NamedSharding(mesh, learner.forwards.specs[key])
        )
        for key, shape in shapes.items()
    }


def _abstract_like(tree):
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def rl_learner(config, cfg, layout):
    """The trainer's own RLLearner for `config` on `layout` (c2.rl.trainer.make_learner)."""
    from c2 import model as model_lib
    from c2.rl import config as rl_config
    from c2.rl import trainer
    from c2.train.optimizer import make_optimizer

    objective = rl_config.objective_config(config)
    tx, schedule = make_optimizer(
        config.optimizer, config.train.steps, model_lib.abstract_params(cfg)
    )
    return trainer.make_learner(config, cfg, objective, tx, schedule, layout)


def plan_rl_trainer(name, config, cfg, layout, device_memory_gb: float) -> dict:
    """The RL trainer's step, each program compiled whole (see the module doc)."""
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from c2.model.params import frozen_copy
    from c2.rl import config as rl_config
    from c2.rl.objectives import EFFORT_TERMS
    from c2.rl.step_inputs import is_zero

    r = config.rl
    t0 = time.perf_counter()
    learner = rl_learner(config, cfg, layout)
    chains = int(r.prompts_per_step) * int(r.group_size)
    seq = int(max(r.seq_buckets))
    params = learner.abstract_params
    opt = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(learner.tx.init, params),
        learner.opt_shardings,
    )
    packed = None
    if rl_config.packs_groups(config):  # a row per group, padded to the batch devices (trainer)
        devices = learner.batch_devices
        packed = (-(-int(r.prompts_per_step) // devices) * devices, int(max(r.pack_buckets)))
    batch = abstract_rl_batch(learner, cfg, chains, chains, seq, packed)
    # The reward terms the weights read and, with the length penalty, the effort counts: [B].
    rows = NamedSharding(learner.mesh, learner.forwards.row_spec)
    per_row = lambda: jax.ShapeDtypeStruct((chains,), jnp.float32, sharding=rows)  # noqa: E731
    terms = {n: per_row() for n, w in learner.reward_weights.items() if not is_zero(w)}
    effort = {n: per_row() for n in EFFORT_TERMS} if learner.use_length_penalty else {}
    step = jax.ShapeDtypeStruct((), jnp.int32)
    programs, logps = {}, []
    ref_params = jax.eval_shape(lambda p: frozen_copy(p, cfg), params)
    ref_params = jax.tree.map(  # the reference keeps the policy's shardings
        lambda r, p: jax.ShapeDtypeStruct(r.shape, r.dtype, sharding=p.sharding), ref_params, params
    )
    if learner.needs_ref:
        ref = learner._ref_logp_jit.lower(ref_params, batch).compile()
        programs["reference log-probs"] = program_memory(ref)
        ref_kl = _abstract_like(ref.out_info)
        logps.append(ref_kl)
    else:
        ref_kl = None
    if learner.single_forward:
        update = learner._update_single_forward_jit.lower(
            params, opt, batch, ref_kl, terms, effort, step
        )
    else:
        policy = learner._logp_jit.lower(params, batch).compile()
        programs["policy log-probs"] = program_memory(policy)
        out = _abstract_like(policy.out_info)
        logps.append(out)
        update = learner._update_jit.lower(params, opt, batch, *out, ref_kl, terms, effort, step)
    programs["update"] = program_memory(update.compile())
    largest = max(programs, key=lambda k: programs[k]["extra"])
    param_bytes = shard_bytes(params)
    parts = {
        "parameters": param_bytes,
        "optimiser state": shard_bytes(opt),
        "reference parameters": shard_bytes(ref_params) if learner.needs_ref else 0,
        "batch, rewards and log-probs": shard_bytes((batch, terms, effort, logps)),
        f"largest program ({largest}): temporaries + outputs": programs[largest]["extra"],
    }
    return entry(
        name,
        learner.mesh.devices.size,
        parts,
        device_memory_gb,
        programs=programs,
        batch=chains,
        seq_len=seq,
        packed_rows=packed,
        micro_batch_size=int(r.micro_batch_size),
        compile_s=time.perf_counter() - t0,
    )


# The rollout engine ------------------------------------------------------------------------------


def engine_layout_of(config, devices=None):
    """The rollout engine's layout: `config.rl.rollout_mesh` (one device when "") under the
    stage's rules, on an abstract mesh unless `devices` are given."""
    from jax.sharding import AbstractMesh

    from c2 import sharding
    from c2.train.config import MESH_AXES, sharding_rules

    sizes = sharding.parse_mesh(config.rl.rollout_mesh)
    if devices is not None:
        mesh = sharding.make_mesh(**sizes, devices=list(devices)[: math.prod(sizes.values())])
    else:
        mesh = AbstractMesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES)
    return sharding.Layout(mesh, sharding_rules(config))


def engine_weight_dtype(config):
    """What the engine's weights arrive as: the store's dtype on Ray workers, else the
    trainer's masters (model.param_dtype)."""
    r = config.rl
    return r.weight_store_dtype if r.rollout_backend == "ray" else config.model.param_dtype


def plan_engine(name, config, cfg, device_memory_gb: float, layout=None) -> dict:
    """The rollout engine's weights, KV cache and state per device (see the module doc)."""
    import jax
    import jax.numpy as jnp

    from c2 import model as model_lib
    from c2.infer import engine_layout, steps
    from c2.infer.engine import MIN_BUCKET

    r = config.rl
    layout = layout or engine_layout_of(config)
    slots, max_len = int(r.rollout.engine_slots), int(max(r.seq_buckets))
    engine_layout.check_layout(cfg, layout, slots)
    dtype = jnp.dtype(engine_weight_dtype(config))
    shardings = engine_layout.weight_shardings(cfg, layout)
    weights = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, dtype, sharding=s),
        model_lib.abstract_params(cfg),
        shardings,
    )
    spec = steps.StepSpec(
        cfg=cfg,
        n_slots=slots,
        cache_len=max_len + MIN_BUCKET,
        n_stop=8,
        speculative=False,
        num_draft=0,
        steps_per_call=1,
        layout=layout,
    )
    state = jax.eval_shape(lambda: steps.init_state(spec))
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        state,
        engine_layout.state_shardings(state, layout),
    )
    cache = shard_bytes(state["cache"])
    parts = {
        "weights": shard_bytes(weights),
        "KV cache": cache,
        "slot state": shard_bytes(state) - cache,
        "one MoE layer's local experts gathered": _gathered_experts(weights, cfg, layout, dtype),
    }
    return entry(
        name,
        math.prod(dict(layout.mesh.shape).values()),
        parts,
        device_memory_gb,
        mesh=dict(layout.mesh.shape),
        slots=slots,
        context=max_len,
        weight_dtype=str(dtype),
    )


def _gathered_experts(weights, cfg, layout, dtype) -> int:
    """One MoE layer's experts on a device of the `expert` axis, whole (what the exchange's
    shard_map takes), less what the device already holds of them."""
    import jax.numpy as jnp

    from c2 import sharding

    if not cfg.n_moe_layers:
        return 0
    mlp = weights["moe_layers"]["mlp"]
    experts = [mlp[k] for k in ("w_gate", "w_up", "w_down")]
    whole = sum(math.prod(a.shape[1:]) for a in experts) * jnp.dtype(dtype).itemsize
    per_device = whole // sharding.axis_size(layout, "expert")
    held = shard_bytes(experts) // cfg.n_moe_layers
    return max(per_device - held, 0)
