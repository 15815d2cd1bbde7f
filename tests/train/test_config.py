"""Config validation: every bad value fails before compilation with a message naming the field."""

import ml_collections
import pytest

from c2.train.config import ConfigError, resolve_mesh, stage_defaults, validate_stage


def test_defaults_validate_and_fill_the_data_axis():
    mesh = validate_stage(stage_defaults(), num_devices=8)
    assert mesh == {"data": 8, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1}


def test_unknown_field_is_named():
    c = stage_defaults()
    c.train.stepz = 5
    with pytest.raises(ConfigError, match=r"config\.train\.stepz: unknown field"):
        validate_stage(c, 1)


def test_unknown_section_is_named():
    c = stage_defaults()
    c.trainer = ml_collections.ConfigDict({"steps": 3})
    with pytest.raises(ConfigError, match=r"config\.trainer: unknown field"):
        validate_stage(c, 1)


def test_missing_field_is_named():
    c = stage_defaults()
    del c.optimizer["lr"]
    with pytest.raises(ConfigError, match=r"config\.optimizer\.lr: missing field"):
        validate_stage(c, 1)


@pytest.mark.parametrize(
    "section, field, value, expected",
    [
        ("train", "steps", "ten", "expected int, got str"),
        ("train", "steps", 2.5, "expected int, got float"),
        ("train", "progress_bar", 1, "expected bool, got int"),
        ("optimizer", "lr", "fast", "expected float, got str"),
        ("data", "seq_len", True, "expected int, got bool"),
    ],
)
def test_wrong_type_is_named(section, field, value, expected):
    c = stage_defaults()
    # A config built by hand (not through ConfigDict's own type-safe assignment).
    c[section] = ml_collections.ConfigDict(c[section].to_dict() | {field: value})
    with pytest.raises(ConfigError, match=rf"config\.{section}\.{field}: {expected}"):
        validate_stage(c, 1)


def test_int_is_accepted_for_a_float_field():
    c = stage_defaults()
    c.optimizer = ml_collections.ConfigDict(c.optimizer.to_dict() | {"lr": 1})
    validate_stage(c, 1)


def test_mesh_product_must_equal_device_count():
    c = stage_defaults()
    c.mesh.data, c.mesh.expert = 2, 2
    with pytest.raises(ConfigError, match=r"config\.mesh: .* multiply to 4, but there are 8"):
        validate_stage(c, 8)


def test_mesh_free_axis_must_divide_devices():
    with pytest.raises(ConfigError, match=r"config\.mesh\.data=-1: .* 3 does not divide the 8"):
        resolve_mesh(
            ml_collections.ConfigDict(dict(data=-1, fsdp=3, expert=1, context=1, tensor=1)), 8
        )
    with pytest.raises(ConfigError, match=r"only one axis may be -1"):
        resolve_mesh(
            ml_collections.ConfigDict(dict(data=-1, fsdp=-1, expert=1, context=1, tensor=1)), 8
        )
    with pytest.raises(ConfigError, match=r"config\.mesh\.tensor: expected a positive size"):
        resolve_mesh(
            ml_collections.ConfigDict(dict(data=1, fsdp=1, expert=1, context=1, tensor=0)), 8
        )


def test_seq_len_must_divide_by_context_axis():
    c = stage_defaults()
    c.mesh.data, c.mesh.context = 2, 4
    c.data.seq_len = 250
    with pytest.raises(ConfigError, match=r"config\.data\.seq_len=250 .* context axis .*=4"):
        validate_stage(c, 8)
    c.data.seq_len = 256
    assert validate_stage(c, 8)["context"] == 4


def test_batch_must_divide_by_data_parallelism():
    c = stage_defaults()
    c.data.batch_size = 6
    with pytest.raises(ConfigError, match=r"config\.data\.batch_size=6 .* data\*fsdp\*expert=8"):
        validate_stage(c, 8)


@pytest.mark.parametrize(
    "section, field, value, pattern",
    [
        ("optimizer", "schedule", "exp", r"config\.optimizer\.schedule: 'exp' is not one of"),
        ("train", "mtp_distill", "l2", r"config\.train\.mtp_distill: 'l2' is not one of"),
        ("train", "steps", 0, r"config\.train\.steps: expected > 0, got 0"),
        ("optimizer", "lr", -1.0, r"config\.optimizer\.lr: expected >= 0, got -1.0"),
        ("train", "keep_checkpoints", 1, r"config\.train\.keep_checkpoints: expected >= 2"),
        ("optimizer", "warmup_steps", 500, r"config\.optimizer\.warmup_steps: 500 is more than"),
        ("optimizer", "decay_fraction", 0.0, r"config\.optimizer\.decay_fraction: expected in"),
        ("train", "stop_at", 200, r"config\.train\.stop_at=200 is past config\.train\.steps=100"),
        ("train", "stop_at", -1, r"config\.train\.stop_at: expected >= 0, got -1"),
        ("data", "replay", "recall:100", r"replay='recall:100', .*replay_fraction=0.0: give"),
        ("data", "replay_fraction", 0.5, r"config\.data\.replay='', .*replay_fraction=0.5: give"),
    ],
)
def test_bad_values_are_named(section, field, value, pattern):
    c = stage_defaults()
    c[section][field] = value
    with pytest.raises(ConfigError, match=pattern):
        validate_stage(c, 1)


def test_replay_is_for_pretraining():
    c = stage_defaults()
    c.data.kind, c.data.replay, c.data.replay_fraction = "sft", "recall:100", 0.5
    with pytest.raises(ConfigError, match=r"only a pretraining stage mixes in replay"):
        validate_stage(c, 1)


def test_yarn_needs_the_original_length():
    c = stage_defaults()
    c.model.yarn.factor = 8.0
    with pytest.raises(ConfigError, match=r"original_max_position_embeddings: expected > 0"):
        validate_stage(c, 1)
