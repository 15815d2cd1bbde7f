"""The training-stage config schema and its validation (fails before anything compiles).

Every stage config (experiments/*.py) starts from `stage_defaults()` and overrides fields; the
defaults double as the schema: a field that is not in them is unknown, and a value whose type
differs from the default's is wrong. `validate_stage` adds the checks that need the whole config
(mesh against devices, sequence length against the context axis, batch against data parallelism).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path

import ml_collections

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
SCHEDULES = ("cosine", "linear", "constant", "wsd")
MTP_DISTILL = ("kl", "ce")
DATA_KINDS = ("pretrain", "sft")
QUANT = ("bf16", "mxfp8")
MU_DTYPES = ("", "bfloat16", "float32")
# Sections whose keys are not fixed here: checked against the model / sharding rules instead.
FREE_FORM = {"overrides": "ModelConfig fields", "rules": "logical axis -> mesh axes"}


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or inconsistent; the message names the field."""


def stage_defaults() -> ml_collections.ConfigDict:
    """Every field a training stage understands, at its default value."""
    c = ml_collections.ConfigDict()
    c.name = "stage"
    # Where the weights come from: "" (fresh init), a previous stage's workdir (its latest
    # checkpoint), or "hf:DIR" (a Hugging Face checkpoint imported by c2.model).
    c.init_from = ""

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "bfloat16"  # compute dtype; master weights stay in param_dtype
    c.model.param_dtype = "float32"
    c.model.quant = "bf16"
    # Any other c2.model.ModelConfig field, by name (checked against the dataclass).
    c.model.overrides = ml_collections.ConfigDict()
    # YaRN RoPE scaling; factor 0 keeps the preset's own (none for the tiny presets).
    c.model.yarn = ml_collections.ConfigDict()
    c.model.yarn.factor = 0.0
    c.model.yarn.original_max_position_embeddings = 0
    c.model.yarn.beta_fast = 32.0
    c.model.yarn.beta_slow = 1.0
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 0.0

    c.data = ml_collections.ConfigDict()
    c.data.kind = "pretrain"
    c.data.corpus = "stdlib"  # the embedded default, or a directory / JSONL / ArrayRecord path
    c.data.tokenizer = "byte"  # or a tokenizer.json path
    c.data.seq_len = 256
    c.data.batch_size = 8
    c.data.seed = 0
    c.data.eval_batches = 4  # held-out batches per evaluation (fixed, ordered)
    # Pretraining only: SFT examples (a c2.data.sft.load_sft_examples spec, e.g.
    # "recall:12000:agent") mixed in as this fraction of the rows, loss on their responses, to
    # keep what the starting model was trained for (c2.data.pipeline.make_pretrain_dataset).
    c.data.replay = ""
    c.data.replay_fraction = 0.0

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # -1: all devices left over by the other axes
    c.mesh.fsdp = 1
    c.mesh.expert = 1
    c.mesh.context = 1
    c.mesh.tensor = 1
    # Overrides of c2.sharding.RULES (logical axis -> mesh axis, tuple of axes, or None) for
    # weights and activations alike, e.g. {"expert_embed": ("fsdp", "context")} to FSDP-shard
    # expert weights at real scale.
    c.mesh.rules = ml_collections.ConfigDict()

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.lr = 1e-3
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 10
    c.optimizer.decay_fraction = 0.2  # wsd only: the final fraction of steps that decays
    c.optimizer.end_lr_ratio = 0.1
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.95
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.1
    c.optimizer.clip_norm = 1.0
    # Adam's first moment in this dtype ("" = the parameters'); "bfloat16" halves its bytes, as
    # DeepSeek-V3 keeps its moments (the second moment stays float32: optax's own `mu_dtype`).
    c.optimizer.mu_dtype = ""
    # Parameters the optimiser never touches (regex on the "/"-joined path): the router's
    # balancing bias is moved by the aux-loss-free rule after each step instead.
    c.optimizer.frozen = "router_bias|e_score_correction_bias"

    c.train = ml_collections.ConfigDict()
    c.train.steps = 100
    # Stop this run after this step (0: at train.steps), checkpointing there; the schedule still
    # spans train.steps, so the checkpoint is the one a full run passes through, and rerunning
    # with a larger value (or 0) goes on from it.
    c.train.stop_at = 0
    c.train.checkpoint_every = 50
    c.train.keep_checkpoints = 3
    c.train.async_checkpoints = True
    c.train.log_every = 1
    c.train.eval_every = 0  # 0: held-out evaluation only at the end
    c.train.seed = 0
    c.train.mtp_weight = 0.3
    c.train.mtp_distill = "kl"
    c.train.balance_weight = 0.0
    c.train.router_bias_rate = 1e-3
    # Sequence positions per chunk of the LM head + cross-entropy + MTP distillation (0: off,
    # the whole [batch, seq, vocab] float32 logits at once). On, the loss runs over chunks of
    # positions with each chunk's logits recomputed in the backward pass, so the step never
    # holds the whole logits, their softmax or their gradient: at Kimi-K2's vocabulary of
    # 163,840 and 65,536 tokens per device that is 43 GB per copy (c2.bench.plan). Must divide
    # data.seq_len; the same values as off, one more head matmul per MTP depth.
    c.train.loss_chunk_tokens = 0
    # Gradient accumulation: the batch runs as this many micro-batches, one at a time, then one
    # optimiser step (c2.train.step.make_step_fn): activations of one micro-batch at a time.
    # data.batch_size must be a multiple of it times the batch axes (data x fsdp x expert).
    c.train.micro_batches = 1
    c.train.progress_bar = True
    c.train.measure_peak = True  # measure the matmul peak once, for MFU
    return c


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _check_structure(
    config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str
) -> None:
    """Unknown fields, missing fields and wrong types, recursively, naming the field."""
    known = set(schema.keys())
    for key in config:
        if key not in known:
            raise ConfigError(
                f"config.{_path(prefix, key)}: unknown field; known fields here: {sorted(known)}"
            )
    for key in schema:
        name = f"config.{_path(prefix, key)}"
        if key not in config:
            raise ConfigError(f"{name}: missing field")
        want, got = schema[key], config[key]
        if key in FREE_FORM:
            if not isinstance(got, Mapping | ml_collections.ConfigDict):
                raise ConfigError(f"{name}: expected a ConfigDict of {FREE_FORM[key]}")
            continue
        if isinstance(want, ml_collections.ConfigDict):
            if not isinstance(got, ml_collections.ConfigDict):
                raise ConfigError(f"{name}: expected a ConfigDict, got {type(got).__name__}")
            _check_structure(got, want, _path(prefix, key))
            continue
        want_type = schema.get_ref(key).get_type()
        ok = isinstance(got, want_type) and not (want_type is int and isinstance(got, bool))
        if want_type is float and isinstance(got, int) and not isinstance(got, bool):
            ok = True
        if not ok:
            raise ConfigError(
                f"{name}: expected {want_type.__name__}, got {type(got).__name__} ({got!r})"
            )


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"config.{name}: {value!r} is not one of {choices}")


def check_positive(config: ml_collections.ConfigDict, *names: str, allow_zero=False) -> None:
    for name in names:
        value = config
        for part in name.split("."):
            value = value[part]
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ConfigError(f"config.{name}: expected {bound}, got {value!r}")


def resolve_mesh(mesh: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """Mesh axis sizes with a -1 axis filled in; their product must equal the device count."""
    sizes = {axis: int(mesh[axis]) for axis in MESH_AXES}
    free = [axis for axis, size in sizes.items() if size == -1]
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"config.mesh.{axis}: expected a positive size or -1, got {size}")
    if len(free) > 1:
        raise ConfigError(f"config.mesh: only one axis may be -1, got {free}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if num_devices % fixed:
            raise ConfigError(
                f"config.mesh.{free[0]}=-1: the other axes' product {fixed} does not divide "
                f"the {num_devices} devices"
            )
        sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ConfigError(
            f"config.mesh: axis sizes {sizes} multiply to {fixed}, but there are "
            f"{num_devices} devices"
        )
    return sizes


def check_rules(rules) -> None:
    """Sharding-rule overrides: known logical axes mapped to mesh axes (or None)."""
    from c2.sharding import RULES

    for logical, target in rules.items():
        if logical not in RULES:
            raise ConfigError(
                f"config.mesh.rules.{logical}: not a logical axis; known: {sorted(RULES)}"
            )
        targets = target if isinstance(target, tuple | list) else (target,)
        for axis in targets:
            if axis is not None and axis not in MESH_AXES:
                raise ConfigError(
                    f"config.mesh.rules.{logical}={target!r}: {axis!r} is not a mesh axis "
                    f"{MESH_AXES}"
                )


def sharding_rules(config: ml_collections.ConfigDict) -> dict:
    """c2.sharding.RULES with the config's overrides (tuples kept as tuples)."""
    from c2.sharding import RULES

    over = {k: tuple(v) if isinstance(v, list) else v for k, v in config.mesh.rules.items()}
    return dict(RULES) | over


def check_structure(config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict) -> None:
    """Unknown fields, missing fields and wrong types against `schema` (a stage kind's defaults,
    e.g. the RL stage's), naming the field."""
    _check_structure(config, schema, "")


def validate_stage(config: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """Checks a stage config completely; returns the resolved mesh axis sizes."""
    _check_structure(config, stage_defaults(), "")
    _check_choice("optimizer.schedule", config.optimizer.schedule, SCHEDULES)
    _check_choice("train.mtp_distill", config.train.mtp_distill, MTP_DISTILL)
    _check_choice("data.kind", config.data.kind, DATA_KINDS)
    _check_choice("model.quant", config.model.quant, QUANT)
    check_positive(
        config,
        "train.steps",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.log_every",
        "data.seq_len",
        "data.batch_size",
        "data.eval_batches",
    )
    check_positive(
        config,
        "train.eval_every",
        "train.stop_at",
        "train.mtp_weight",
        "train.balance_weight",
        "train.router_bias_rate",
        "train.loss_chunk_tokens",
        "optimizer.lr",
        "optimizer.warmup_steps",
        "optimizer.weight_decay",
        "optimizer.clip_norm",
        "optimizer.end_lr_ratio",
        "model.yarn.factor",
        allow_zero=True,
    )
    chunk = config.train.loss_chunk_tokens
    if chunk and config.data.seq_len % chunk:
        raise ConfigError(
            f"config.train.loss_chunk_tokens={chunk}: must divide config.data.seq_len="
            f"{config.data.seq_len} (0 turns chunking off)"
        )
    _check_choice("optimizer.mu_dtype", config.optimizer.get("mu_dtype", ""), MU_DTYPES)
    if not 0.0 < config.optimizer.decay_fraction <= 1.0:
        raise ConfigError(
            f"config.optimizer.decay_fraction: expected in (0, 1], got "
            f"{config.optimizer.decay_fraction}"
        )
    if config.optimizer.warmup_steps > config.train.steps:
        raise ConfigError(
            f"config.optimizer.warmup_steps: {config.optimizer.warmup_steps} is more than "
            f"config.train.steps={config.train.steps}"
        )
    if config.train.stop_at > config.train.steps:
        raise ConfigError(
            f"config.train.stop_at={config.train.stop_at} is past config.train.steps="
            f"{config.train.steps} (0 stops at train.steps)"
        )
    if config.model.yarn.factor and config.model.yarn.original_max_position_embeddings <= 0:
        raise ConfigError(
            "config.model.yarn.original_max_position_embeddings: expected > 0 when "
            f"config.model.yarn.factor={config.model.yarn.factor}"
        )
    replay, fraction = config.data.get("replay", ""), config.data.get("replay_fraction", 0.0)
    if not 0.0 <= fraction < 1.0 or bool(replay) != (fraction > 0):
        raise ConfigError(
            f"config.data.replay={replay!r}, config.data.replay_fraction={fraction}: give an SFT "
            "examples spec and a fraction in (0, 1), or neither"
        )
    if replay and config.data.kind != "pretrain":
        raise ConfigError(
            f"config.data.replay={replay!r}: only a pretraining stage mixes in replay "
            f"(config.data.kind={config.data.kind!r})"
        )
    if config.train.keep_checkpoints < 2:
        raise ConfigError(
            "config.train.keep_checkpoints: expected >= 2 so a corrupted latest checkpoint "
            f"can fall back to the previous one, got {config.train.keep_checkpoints}"
        )
    mesh = resolve_mesh(config.mesh, num_devices)
    check_rules(config.mesh.rules)
    from c2 import sharding

    rules = sharding_rules(config)
    try:
        sharding.logical_to_spec(("batch", "seq"), rules)
    except ValueError as e:
        raise ConfigError(f"config.mesh.rules: {e}") from None
    seq_axes = sharding.rule_axes(rules["seq"])
    if config.data.seq_len % math.prod(mesh[a] for a in seq_axes):
        sizes = ", ".join(f"config.mesh.{a}={mesh[a]}" for a in seq_axes)
        raise ConfigError(
            f"config.data.seq_len={config.data.seq_len} is not divisible by the "
            f"{' x '.join(seq_axes)} axis ({sizes})"
        )
    batch_axes = sharding.rule_axes(rules["batch"])
    n_batch = math.prod(mesh[a] for a in batch_axes)
    if config.data.batch_size % n_batch:
        raise ConfigError(
            f"config.data.batch_size={config.data.batch_size} is not divisible by the batch "
            f"axes {'*'.join(batch_axes)}={n_batch}"
        )
    return mesh


def load_config(path: str | Path, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of a config file, as `--config=path[:arg]` would load it."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"c2_config_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--config={path}: not a Python config file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg is not None else module.get_config()
