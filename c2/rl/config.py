"""The RL stage's config: a training stage (`c2.train.config.stage_defaults`) plus `rl`.

`rl_stage_defaults()` is the schema (a field not in it is unknown; a value of another type is
wrong); `validate_rl` checks everything before anything compiles and returns the typed pieces:
the model config, the `ObjectiveConfig`, the `RolloutConfig`, the reward weights and effort
weights. Messages name the field (`config.rl.group_size`, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import jax.numpy as jnp
import ml_collections

from c2 import sharding
from c2.rl.episodes import RolloutConfig
from c2.rl.objectives import EFFORT_TERMS, EffortWeights, ObjectiveConfig
from c2.rl.objectives.rewards import Weight
from c2.rl.step import MISMATCH_TOKENS, TOOL_CALL_CREDITS
from c2.train import lm
from c2.train.config import (
    ConfigError,
    check_positive,
    check_structure,
    sharding_rules,
    stage_defaults,
)

# How Ray workers get c2 (config.rl.ray_runtime_env; c2/rl/fleet_ray.py).
RAY_RUNTIME_ENVS = ("auto", "ship", "none")
# Terms whose weight the config sets (rewards.<term>), each with an optional schedule.
SCHEDULED_TERMS = ("style", "communication", "tool_call_penalty", "length_penalty")
OBJECTIVE_FIELDS = tuple(
    f.name for f in dataclasses.fields(ObjectiveConfig) if f.name != "group_size"
)


def rl_stage_defaults() -> ml_collections.ConfigDict:
    """Every field an RL stage understands, at its default value."""
    c = stage_defaults()
    c.name = "rl"
    c.model.dtype = "float32"  # recorded and recomputed logprobs agree to ~1e-6 in float32
    c.optimizer.lr = 1e-4
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 0  # a warmup from 0 would waste the first steps' episodes
    c.optimizer.weight_decay = 0.0
    c.train.steps = 60
    c.train.checkpoint_every = 10
    c.train.measure_peak = False
    r = c.rl = ml_collections.ConfigDict()
    # Prompts: "functions" (generated function tasks, c2.envs.functions, train split) or a
    # directory of task directories; every prompt is used once (single epoch).
    r.tasks = "functions"
    r.heldout_tasks = "functions"  # the held-out split of the same source, or a directory
    r.task_seed = 0
    r.group_size = 8
    r.prompts_per_step = 4
    r.micro_batch_size = 8
    r.seq_buckets = (256, 512)  # padded lengths (fixed shapes: no recompilation per step)
    # Asynchrony (c2/rl/orchestrator.py): a sample trained by optimiser step s has no token
    # older than version s - max_staleness; 0 is synchronous, on-policy training.
    r.max_staleness = 2
    r.router_replay = True  # train forwards replay the engine's recorded experts (off: ablation)
    # The tokens the mismatch filter (objective.mismatch_*) judges: "fresh", those sampled by the
    # weights the step updates, or "all". An older token's train-inference difference is mostly
    # the policy's own change since it was sampled; a quantile over those drops the tokens the
    # updates moved most, the ones the next update would correct (BENCHMARKS.md, "Asynchronous
    # RL"). Older tokens keep their importance weights (objective.importance_correction).
    r.mismatch_tokens = "fresh"
    # The current policy's log-probs and the gradient from one forward (jax.vjp keeps the whole
    # batch's activations, not one micro-batch's): the same update, 6-17% less time on CPU.
    r.single_forward = False
    # Each group's prompt once in the learner's forwards: a row per group, the shared prompt as a
    # trunk and every sample's rest as a branch that sees it (c2.rl.batching, "packed groups";
    # blockwise attention of `pack_attention_block`, which skips branch-to-branch blocks). The
    # same log-probs and update; W from pack_buckets (one compile per bucket). With two forwards
    # (single_forward False) only the log-prob passes are packed, not the gradients' forwards.
    # Only without context management: a chain's later segments start from their summaries, so
    # with "self_summary" or "compaction" the rows stay plain (`packs_groups`).
    r.pack_groups = True
    r.pack_buckets = (1024, 2048, 3072, 4096)
    r.pack_attention_block = 128
    # Compile the update for every batch shape the buckets allow (each of seq_buckets, times
    # each of pack_buckets when groups are packed) at the first step, rather than at the step
    # whose batch first needs it: no later step stalls on XLA (~20-30 s a shape for the tiny
    # model on 2 cores, while an asynchronous run's rollouts race ahead to the staleness bound;
    # with the compilation cache on, a later run loads them). Costs the compiles of shapes the
    # run would never have used. Chains' extra rows (context management) compile when seen.
    r.precompile = False
    r.recompute_kv = False  # new weights mid-episode: keep the KV caches (or rebuild them)
    # Let the engine dispatch its next decode call before reading the last one back (Engine
    # run_ahead: the same episodes, new weights landing one decode call later). Off: the RL
    # stage is trainer-bound on CPU (12.7 s a step either way), and the two runs of rl_tiny with
    # it on gained -0.088 and +0.008 where seed 1 without it gained +0.053 to +0.095
    # (BENCHMARKS.md, "RL stage"): not shown to be the cause, not shown harmless.
    r.run_ahead = False
    # New weights reach the engine in process (""), or through the weight store at this kvstore
    # URL (a path, file://, s3://bucket/prefix, gs://...; c2/rl/weight_sync.py): a delta per
    # version in the serving dtype, an anchor every `full_every` versions.
    r.weight_store = ""
    r.weight_store_dtype = "bfloat16"
    r.weight_store_full_every = 16
    # Every prune_every versions the trainer deletes old versions, keeping the `keep` newest and
    # what live workers (unexpired leases) still need.
    r.weight_store_prune_every = 16
    r.weight_store_keep = 2
    # Where episodes are played (c2/rl/fleet.py): "local" (one engine in the trainer's process)
    # or "ray" (num_rollout_workers Ray actors, each with its own engine and sandbox pool, fed by
    # the same scheduler; weights through the weight store, which defaults to DIR/weight_store).
    # ray_address: a cluster ("auto", "ray://head:10001"); "" starts a local one.
    r.rollout_backend = "local"
    r.num_rollout_workers = 1
    r.ray_address = ""
    r.ray_worker_cpus = 1.0  # Ray resources each worker actor asks for
    r.ray_worker_gpus = 0.0
    # replacements for workers that die, raise or hang, in a run (then the run fails); -1: 2 x
    # the workers
    r.ray_max_restarts = -1
    # How workers get c2: "auto" ships the c2 package with Ray's runtime_env when ray_address
    # names a cluster (its nodes need only the Python deps), not to a local one; "ship" always;
    # "none": the nodes have c2 installed.
    r.ray_runtime_env = "auto"
    # Deadlines on the fleet's remote calls: a worker not placed or built in time fails the run;
    # one whose exchange passes its deadline is hung (killed and replaced). A worker's ask is
    # checked against the live nodes first: an autoscaling cluster's nodes not yet up count not.
    r.ray_place_timeout_s = 60.0  # the cluster to reserve a worker's CPUs/GPUs
    r.ray_start_timeout_s = 1800.0  # a worker to fetch the weights and compile its engine
    # an exchange: WAIT_S, plus a synchronous weight refresh when the worker lags (minutes at
    # Kimi-K2 scale)
    r.ray_call_timeout_s = 600.0
    # The mesh of each rollout engine (local, and each Ray worker, which reserves that many
    # devices): "expert=4,tensor=2" lays experts over 4 devices and heads over 2; "" is one device.
    r.rollout_mesh = ""
    # Processes (hosts) each Ray worker's engine spans: > 1 makes a worker a gang of that many
    # actors, one a host with its share of rollout_mesh's devices, in one jax.distributed group
    # (c2/rl/fleet_gang.py; Kimi-K2's 32-GPU engine is 4 hosts of 8).
    r.rollout_hosts = 1
    r.rollout = ml_collections.ConfigDict()
    r.rollout.engine_slots = 16
    r.rollout.max_turns = 4
    r.rollout.max_tokens = 512
    r.rollout.max_turn_tokens = 192
    r.rollout.temperature = 1.0
    r.rollout.top_p = 1.0
    r.rollout.top_k = 0
    r.rollout.tool_workers = 4
    r.rollout.run_timeout_s = 20.0
    r.rollout.max_attempts = 3  # an episode that raises is played again, then given up
    # Simulated test-suite runtimes (benchmarks): Pareto (scale_s, alpha) per task; (0, 0) off.
    r.rollout.test_latency_pareto = (0.0, 0.0)
    # Long episodes (c2/rl/episodes.py): "self_summary" (the model summarises at the trigger and
    # goes on from its summary in a new sequence), "compaction" (a digest written without the
    # model) or "none" (the context ends the episode). Tokens; 0: the defaults (trigger:
    # rollout.max_tokens - summary budget - max_turn_tokens; summary budget: max_tokens // 8).
    r.context_management = "none"
    r.summary = ml_collections.ConfigDict()
    r.summary.trigger_tokens = 0
    r.summary.trigger_tokens_max = 0  # above trigger_tokens: drawn per prompt (a group shares it)
    r.summary.max_tokens = 0
    r.summary.max_segments = 4  # the chain's budget
    r.objective = ml_collections.ConfigDict()
    o = ObjectiveConfig(group_size=1, loss_constant=1.0)
    for name in OBJECTIVE_FIELDS:
        value = getattr(o, name)
        r.objective[name] = -1.0 if value is None else value
    r.objective.loss_constant = 0.0  # 0: group_size * the largest sequence bucket
    r.objective.clip_low = -1.0  # -1: off (None)
    r.objective.clip_high = -1.0
    # The mismatch filter (-1: off): the p99 ranks the tokens `mismatch_tokens` names, the
    # threshold (nats) judges every token, stale ones included (docs/recipe.md §2, "In c2").
    # Reward weights ("task" is 1); the KL weight is objective.kl_beta. A term's weight may follow
    # a schedule: rewards.schedule.<term> = ((step, factor), ...) multiplies rewards.<term> by a
    # factor linear in the optimiser step between the points and flat outside them; () constant.
    r.rewards = ml_collections.ConfigDict()
    r.rewards.style = 0.1
    r.rewards.communication = 0.1
    r.rewards.tool_call_penalty = 0.1
    # Where the tool-call penalty lands: "episode" (a term of the episode's reward) or "turn"
    # (the tokens of the turn that made the calls, on top of the episode's advantage computed
    # without it: a passing episode no longer reinforces its malformed turn). c2.rl.step.
    r.rewards.tool_call_credit = "episode"
    # The nonlinear length penalty C_{k,q}(effort) (c2/rl/objectives/length_penalty.py): on
    # rl_tiny's ~220-token replies C is ~160 and a group's spread ~80, so 5e-4 moves an
    # advantage by ~0.04 against the task's 0.5: shorter among equals, never a fail over a pass.
    r.rewards.length_penalty = 5e-4
    r.rewards.length_k = 0.01
    r.rewards.length_q = 0.5
    r.rewards.schedule = ml_collections.ConfigDict()
    for term in SCHEDULED_TERMS:
        r.rewards.schedule[term] = ()
    r.effort = ml_collections.ConfigDict()
    for name in EFFORT_TERMS:
        r.effort[name] = getattr(EffortWeights(), name)
    r.eval = ml_collections.ConfigDict()
    r.eval.tasks = 50  # held-out tasks
    r.eval.samples = 4  # per task: pass@1 and best-of-K with K = samples
    r.eval.every = 0  # steps; 0: at the RL start and at the end only
    return c


def lm_part(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The training-stage part of an RL config (what c2.train.lm understands)."""
    base = copy.deepcopy(config)
    with base.unlocked():
        del base["rl"]
    base.data.seq_len = max(config.rl.seq_buckets)
    base.data.batch_size = config.rl.prompts_per_step * config.rl.group_size
    return base


def objective_config(config: ml_collections.ConfigDict) -> ObjectiveConfig:
    r = config.rl
    fields = {}
    for name in OBJECTIVE_FIELDS:
        value = r.objective[name]
        if name in ("clip_low", "clip_high", "mismatch_threshold", "mismatch_quantile"):
            value = None if value is not None and value < 0 else value
        fields[name] = value
    if not fields["loss_constant"]:
        fields["loss_constant"] = float(r.group_size * max(r.seq_buckets))
    try:
        return ObjectiveConfig(group_size=r.group_size, **fields)
    except ValueError as e:
        raise ConfigError(f"config.rl.objective: {e}") from e


_SUMMARY_FIELDS = {
    "context_management": "context_management",
    "summary_trigger_max": "summary.trigger_tokens_max",
    "summary_trigger": "summary.trigger_tokens",
    "summary_max_tokens": "summary.max_tokens",
    "max_segments": "summary.max_segments",
}


def rollout_config(config: ml_collections.ConfigDict) -> RolloutConfig:
    ro = config.rl.rollout
    fields = {k: ro[k] for k in ro if k != "engine_slots"}
    latency = fields["test_latency_pareto"]
    if len(latency) != 2:
        raise ConfigError(
            f"config.rl.rollout.test_latency_pareto={latency}: expected (scale_s, alpha)"
        )
    fields["test_latency_pareto"] = tuple(float(x) for x in latency)
    sm = config.rl.summary
    fields |= dict(
        context_management=config.rl.context_management,
        summary_trigger=sm.trigger_tokens,
        summary_trigger_max=sm.trigger_tokens_max,
        summary_max_tokens=sm.max_tokens,
        max_segments=sm.max_segments,
    )
    try:
        return RolloutConfig(**fields)
    except ValueError as e:  # named by the config's field, not RolloutConfig's
        message = str(e)
        for field, name in _SUMMARY_FIELDS.items():
            message = message.replace(f"RolloutConfig.{field}", f"config.rl.{name}")
        raise ConfigError(message.replace("RolloutConfig", "config.rl.rollout")) from e


def reward_weights(config: ml_collections.ConfigDict) -> dict[str, Weight]:
    """term -> weight: a number, or (with rewards.schedule.<term>) a function of the step."""
    w = config.rl.rewards
    out = {}
    for term in SCHEDULED_TERMS:
        points = _schedule_points(config, term)
        weight = float(w[term])
        out[term] = weight if not points or weight == 0 else _scheduled(weight, points)
    return out


def _scheduled(weight: float, points: tuple[tuple[int, float], ...]) -> Weight:
    steps = jnp.asarray([p[0] for p in points], jnp.float32)
    factors = jnp.asarray([p[1] for p in points], jnp.float32)
    return lambda step: weight * jnp.interp(jnp.asarray(step, jnp.float32), steps, factors)


def _schedule_points(config: ml_collections.ConfigDict, term: str):
    """rewards.schedule.<term> checked: ((step, factor), ...), steps increasing ints >= 0,
    factors finite >= 0; a ConfigError naming the field otherwise."""
    points = config.rl.rewards.schedule[term]
    field = f"config.rl.rewards.schedule.{term}={points!r}"
    try:
        pairs = tuple((p[0], p[1]) for p in points if len(p) == 2)
    except TypeError:
        pairs = ()
    if len(pairs) != len(points):
        raise ConfigError(f"{field}: expected (step, factor) pairs, e.g. ((0, 0.0), (20, 1.0))")
    for step, factor in pairs:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{field}: step {step!r} is not an int >= 0")
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise ConfigError(f"{field}: factor {factor!r} is not a number")
        if not (math.isfinite(factor) and factor >= 0):
            raise ConfigError(f"{field}: factor {factor!r} is not finite and >= 0")
    steps = [p[0] for p in pairs]
    if steps != sorted(set(steps)):
        raise ConfigError(f"{field}: steps must increase")
    return pairs


def effort_weights(config: ml_collections.ConfigDict) -> EffortWeights:
    try:
        return EffortWeights(**{k: float(v) for k, v in config.rl.effort.items()})
    except ValueError as e:
        raise ConfigError(f"config.rl.effort: {e}") from e


def validate_rl(config: ml_collections.ConfigDict, num_devices: int, *, load_files: bool = True):
    """The whole RL stage check: (mesh sizes, ModelConfig, ObjectiveConfig, RolloutConfig)."""
    check_structure(config, rl_stage_defaults())
    r = config.rl
    positive = ("group_size", "prompts_per_step", "micro_batch_size", "eval.tasks", "eval.samples")
    positive += ("rollout.engine_slots", "rollout.tool_workers", "weight_store_full_every")
    positive += ("weight_store_prune_every", "weight_store_keep")
    check_positive(config, *(f"rl.{name}" for name in positive))
    zero_ok = ("max_staleness", "eval.every", "rewards.length_k", "rewards.style")
    zero_ok += ("rewards.communication", "rewards.tool_call_penalty", "rewards.length_penalty")
    check_positive(config, *(f"rl.{name}" for name in zero_ok), allow_zero=True)
    _check_rewards(config)
    if config.train.stop_at:
        raise ConfigError(
            f"config.train.stop_at={config.train.stop_at}: the RL stage runs to config.train.steps "
            "(its prompts are drawn for that many steps); set stop_at=0"
        )
    if r.rollout_backend not in ("local", "ray"):
        raise ConfigError(
            f"config.rl.rollout_backend={r.rollout_backend!r}: expected 'local' or 'ray'"
        )
    check_positive(config, "rl.num_rollout_workers")
    check_positive(config, "rl.ray_worker_cpus", "rl.ray_worker_gpus", allow_zero=True)
    check_positive(
        config, "rl.ray_place_timeout_s", "rl.ray_start_timeout_s", "rl.ray_call_timeout_s"
    )
    if r.ray_runtime_env not in RAY_RUNTIME_ENVS:
        raise ConfigError(
            f"config.rl.ray_runtime_env={r.ray_runtime_env!r}: expected one of {RAY_RUNTIME_ENVS}"
        )
    if r.rollout_backend == "local" and r.num_rollout_workers != 1:
        raise ConfigError(
            f"config.rl.num_rollout_workers={r.num_rollout_workers} needs "
            "config.rl.rollout_backend='ray' (the local backend is one engine)"
        )
    if r.rollout_backend == "ray" and r.ray_address and not r.weight_store:
        raise ConfigError(
            f"config.rl.ray_address={r.ray_address!r}: set config.rl.weight_store to a URL "
            "every worker can reach (s3://, gs://, or file:// on a shared filesystem)"
        )
    try:
        devices = math.prod(sharding.parse_mesh(r.rollout_mesh).values())
    except ValueError as e:
        raise ConfigError(f"config.rl.rollout_mesh: {e}") from None
    check_positive(config, "rl.rollout_hosts")
    if r.rollout_hosts > 1 and r.rollout_backend != "ray":
        raise ConfigError(
            f"config.rl.rollout_hosts={r.rollout_hosts} needs config.rl.rollout_backend='ray' "
            "(the local backend's engine is in the trainer's process)"
        )
    if devices % r.rollout_hosts or devices < r.rollout_hosts:
        raise ConfigError(
            f"config.rl.rollout_hosts={r.rollout_hosts} must divide the {devices} devices of "
            f"config.rl.rollout_mesh={r.rollout_mesh!r} (each host holds an equal share)"
        )
    if r.mismatch_tokens not in MISMATCH_TOKENS:
        raise ConfigError(
            f"config.rl.mismatch_tokens={r.mismatch_tokens!r}: expected one of {MISMATCH_TOKENS}"
        )
    if r.rewards.tool_call_credit not in TOOL_CALL_CREDITS:
        raise ConfigError(
            f"config.rl.rewards.tool_call_credit={r.rewards.tool_call_credit!r}: expected one of "
            f"{TOOL_CALL_CREDITS}"
        )
    if r.weight_store_dtype not in ("bfloat16", "float32", "float16"):
        raise ConfigError(
            f"config.rl.weight_store_dtype={r.weight_store_dtype!r}: expected bfloat16, float16 "
            "or float32"
        )
    if r.eval.tasks < 2:
        raise ConfigError(
            f"config.rl.eval.tasks={r.eval.tasks}: the held-out gain's paired interval needs at "
            "least 2 tasks"
        )
    batch = r.prompts_per_step * r.group_size
    if batch % r.micro_batch_size:
        raise ConfigError(
            f"config.rl.micro_batch_size={r.micro_batch_size} does not divide the batch "
            f"prompts_per_step * group_size = {batch}"
        )
    buckets = tuple(r.seq_buckets)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 2:
        raise ConfigError(f"config.rl.seq_buckets={buckets}: expected increasing lengths >= 2")
    if r.pack_groups:
        _check_packing(r)
        buckets += tuple(r.pack_buckets)
    chunk = config.train.loss_chunk_tokens
    if chunk and any(b % chunk for b in buckets):
        raise ConfigError(
            f"config.train.loss_chunk_tokens={chunk} (the RL step's LM head and log-probs by "
            f"chunks of positions) must divide every sequence bucket {buckets} "
            "(config.rl.seq_buckets); 0 turns chunking off"
        )
    if r.rollout.max_tokens > max(buckets):
        raise ConfigError(
            f"config.rl.rollout.max_tokens={r.rollout.max_tokens} exceeds the largest "
            f"sequence bucket {max(buckets)} (config.rl.seq_buckets)"
        )
    mesh_sizes, cfg = lm.validate(lm_part(config), num_devices, load_files=load_files)
    # The batch axes of the stage's layout (config.mesh.rules), as RLLearner spreads them.
    batch_axes = sharding.rule_axes(sharding_rules(config)["batch"])
    batch_devices = math.prod(mesh_sizes[a] for a in batch_axes)
    if r.micro_batch_size % batch_devices:
        raise ConfigError(
            f"config.rl.micro_batch_size={r.micro_batch_size} is not divisible by the mesh's "
            f"batch axes {batch_axes} of total size {batch_devices}: every micro-batch "
            "is spread over all of them"
        )
    if r.rollout.max_tokens > cfg.max_seq_len:
        raise ConfigError(
            f"config.rl.rollout.max_tokens={r.rollout.max_tokens} exceeds the model's "
            f"max_seq_len={cfg.max_seq_len}"
        )
    if load_files and config.init_from:
        check_init_positions(config, cfg)
    return mesh_sizes, cfg, objective_config(config), rollout_config(config)


def _check_rewards(config: ml_collections.ConfigDict) -> None:
    """The schedules, and what a length penalty that is on needs."""
    r = config.rl
    for term in SCHEDULED_TERMS:
        _schedule_points(config, term)
    if r.rewards.length_penalty == 0:
        return
    if not r.rewards.length_k > 0:
        raise ConfigError(
            f"config.rl.rewards.length_k={r.rewards.length_k}: expected > 0 while "
            f"config.rl.rewards.length_penalty={r.rewards.length_penalty} (0 turns it off)"
        )
    if not math.isfinite(r.rewards.length_q):
        raise ConfigError(f"config.rl.rewards.length_q={r.rewards.length_q}: expected a number")
    effort_weights(config)  # each weight >= 0, named
    if not any(float(v) for v in r.effort.values()):
        raise ConfigError(
            f"config.rl.effort: every weight is 0, so the length penalty "
            f"(config.rl.rewards.length_penalty={r.rewards.length_penalty}) measures nothing"
        )


def packs_groups(config: ml_collections.ConfigDict) -> bool:
    """Whether the RL stage's learner packs groups: `config.rl.pack_groups`, and no context
    management (whose chains' later segments share no prompt)."""
    return bool(config.rl.pack_groups) and config.rl.context_management == "none"


def _check_packing(r: ml_collections.ConfigDict) -> None:
    buckets = tuple(r.pack_buckets)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 2:
        raise ConfigError(f"config.rl.pack_buckets={buckets}: expected increasing lengths >= 2")
    if isinstance(r.pack_attention_block, bool) or not r.pack_attention_block > 0:
        raise ConfigError(
            f"config.rl.pack_attention_block={r.pack_attention_block!r}: expected a positive int"
        )


def check_init_positions(config: ml_collections.ConfigDict, cfg) -> None:
    """The RL stage plays and trains the policy it starts from, so its positional encoding (RoPE
    theta and YaRN) must be the one `config.init_from` was trained with: weights trained without
    YaRN and run with it see every position moved and read nothing, silently."""
    saved = _init_model_config(config)
    if saved is None:  # nothing readable there: loading the weights names the problem
        return
    ours = (cfg.rope_theta, cfg.rope_scaling)
    if (saved.rope_theta, saved.rope_scaling) != ours:
        yarn, yarn_fields = saved.rope_scaling, list(config.model.yarn)
        hint = "--config.model.yarn.factor=0."
        if yarn:
            hint = " ".join(f"--config.model.yarn.{k}={getattr(yarn, k)}" for k in yarn_fields)
        raise ConfigError(
            f"config.model.yarn / rope_theta: config.init_from={config.init_from!r} was trained "
            f"with rope_theta={saved.rope_theta}, YaRN {yarn}; this config runs it with "
            f"rope_theta={cfg.rope_theta}, YaRN {cfg.rope_scaling}. Set {hint}"
        )


def adopt_init_positions(config: ml_collections.ConfigDict) -> None:
    """Sets `config.model.yarn` to the YaRN `config.init_from` was trained with (for tools that
    take any start policy, such as the RL benchmarks); unchanged when it cannot be read."""
    saved = _init_model_config(config)
    if saved is None:
        return
    yarn = saved.rope_scaling
    config.model.yarn.factor = yarn.factor if yarn else 0.0
    if yarn:
        for key in config.model.yarn:
            config.model.yarn[key] = getattr(yarn, key)


def _init_model_config(config: ml_collections.ConfigDict):
    """The ModelConfig `config.init_from` (a stage workdir or hf:DIR) was trained with, or None."""
    init = config.init_from
    if init.startswith("hf:"):
        saved = Path(init[3:]) / "config.json"
        if not saved.is_file():
            return None
        from c2.model.hf_config import config_from_hf

        return config_from_hf(json.loads(saved.read_text()), strict=False)
    from c2.rl.saved_config import stage_config  # with fields added since at defaults

    try:
        stage_dir, theirs = stage_config(init)
        if stage_dir != Path(init):  # a pipeline workdir: not a stage's weights
            return None
        return lm.model_config(theirs)
    except (FileNotFoundError, ConfigError):
        return None
