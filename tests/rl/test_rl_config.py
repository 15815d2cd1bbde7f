"""The RL stage config: the experiments validate, mistakes name the field before compiling."""

import json
import math
from pathlib import Path

import jax
import pytest

from c2.model.hf_config import config_to_hf
from c2.rl.config import (
    adopt_init_positions,
    packs_groups,
    reward_weights,
    rl_stage_defaults,
    validate_rl,
)
from c2.train.config import MESH_AXES, ConfigError, load_config, stage_defaults

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def test_rl_tiny_validates_with_the_recipe_objective():
    config = load_config(EXPERIMENTS / "rl_tiny.py")
    _, cfg, objective, rollout = validate_rl(config, num_devices=1)
    assert objective.advantage == "group_mean" and objective.kl_kind == "k1"
    assert objective.kl_placement == "reward" and objective.aggregation == "sum_constant"
    assert objective.loss_constant == 8 * 512  # group_size * the largest sequence bucket
    assert objective.mismatch_quantile == 0.99 and objective.importance_correction == "tis"
    assert objective.mismatch_threshold == 3.0  # judges stale tokens too (docs/recipe.md §2)
    assert rollout.temperature == 1.0 and cfg.dtype == "float32"
    weights = reward_weights(config)
    assert weights["length_penalty"] == 5e-4 and config.rl.rewards.length_k == 0.01


def test_reward_weights_follow_schedules_from_the_config():
    """rewards.schedule.<term> = ((step, factor), ...) multiplies rewards.<term>: linear
    between the points, flat outside; () is the number alone; a schedule on 0 stays 0."""
    config = rl_stage_defaults()
    config.rl.rewards.style = 0.2
    config.rl.rewards.schedule.style = ((10, 0.0), (30, 1.0), (40, 0.5))
    config.rl.rewards.communication = 0.0
    config.rl.rewards.schedule.communication = ((0, 1.0), (5, 2.0))
    validate_rl(config, num_devices=1)
    weights = reward_weights(config)
    style = jax.jit(weights["style"])
    for step, want in [(0, 0.0), (10, 0.0), (20, 0.1), (30, 0.2), (35, 0.15), (90, 0.1)]:
        assert float(style(step)) == pytest.approx(want, abs=1e-7), step
    assert weights["communication"] == 0.0 and weights["tool_call_penalty"] == 0.1


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("schedule.style", ((0, 1.0), (0, 2.0)), r"schedule\.style=.*: steps must increase"),
        ("schedule.style", ((-1, 1.0),), r"schedule\.style=.*: step -1 is not an int >= 0"),
        ("schedule.length_penalty", ((0, -1.0),), r"factor -1\.0 is not finite and >= 0"),
        ("schedule.tool_call_penalty", (1, 2), r"expected \(step, factor\) pairs"),
        ("schedule.style", ((0.5, 1.0),), r"step 0\.5 is not an int"),
        ("length_k", 0.0, r"config\.rl\.rewards\.length_k=0\.0: expected > 0 while"),
        ("length_penalty", -1.0, r"config\.rl\.rewards\.length_penalty: expected >= 0"),
    ],
)
def test_reward_mistakes_name_the_field(field, value, match):
    config = rl_stage_defaults()
    node = config.rl.rewards
    *parents, leaf = field.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ConfigError, match=match):
        validate_rl(config, num_devices=1)


def test_a_length_penalty_needs_an_effort_to_measure():
    config = rl_stage_defaults()
    for name in config.rl.effort:
        config.rl.effort[name] = 0.0
    with pytest.raises(ConfigError, match=r"config\.rl\.effort: every weight is 0"):
        validate_rl(config, num_devices=1)
    config.rl.rewards.length_penalty = 0.0  # off: nothing to measure
    validate_rl(config, num_devices=1)
    config.rl.effort.num_turns = -1.0
    config.rl.rewards.length_penalty = 1e-3
    with pytest.raises(ConfigError, match=r"config\.rl\.effort: EffortWeights\.num_turns=-1"):
        validate_rl(config, num_devices=1)


def test_rl_kimi_k2_validates_on_its_256_device_layout():
    config = load_config(EXPERIMENTS / "rl_kimi_k2.py")
    n = math.prod(config.mesh[a] for a in MESH_AXES)
    mesh, cfg, objective, _ = validate_rl(config, num_devices=n, load_files=False)
    assert n == 256 and mesh["expert"] == 8 and mesh["context"] == 8 and cfg.n_experts == 384
    assert objective.group_size == 16
    assert all(b % config.train.loss_chunk_tokens == 0 for b in config.rl.seq_buckets)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("rl.group_size", 0, r"config\.rl\.group_size: expected > 0"),
        ("rl.micro_batch_size", 3, r"config\.rl\.micro_batch_size=3 does not divide"),
        ("rl.seq_buckets", (512, 256), r"config\.rl\.seq_buckets"),
        ("rl.rollout.max_tokens", 4096, r"config\.rl\.rollout\.max_tokens=4096 exceeds"),
        ("train.loss_chunk_tokens", 384, r"loss_chunk_tokens=384 \(the RL step's LM head"),
        ("rl.objective.advantage", "nope", r"config\.rl\.objective: advantage='nope'"),
        ("rl.objective.kl_kind", "k9", r"config\.rl\.objective: kl_kind"),
        ("rl.max_staleness", -1, r"config\.rl\.max_staleness: expected >= 0"),
        ("rl.eval.tasks", 1, r"config\.rl\.eval\.tasks=1: the held-out gain's paired"),
        ("rl.rewards.style", -1.0, r"config\.rl\.rewards\.style: expected >= 0"),
        ("rl.rollout.temperature", "hot", r"config\.rl\.rollout\.temperature: expected float"),
        ("train.stop_at", 10, r"config\.train\.stop_at=10: the RL stage runs to"),
        ("rl.mismatch_tokens", "old", r"config\.rl\.mismatch_tokens='old': expected one of"),
        ("rl.rollout_mesh", "experts=4", r"config\.rl\.rollout_mesh: mesh spec 'experts=4'"),
        (
            "rl.rewards.tool_call_credit",
            "token",
            r"config\.rl\.rewards\.tool_call_credit='token': expected one of",
        ),
    ],
)
def test_mistakes_name_the_field(field, value, match):
    config = rl_stage_defaults()
    node = config
    *parents, leaf = field.split(".")
    for p in parents:
        node = node[p]
    with node.ignore_type():
        node[leaf] = value
    with pytest.raises(ConfigError, match=match):
        validate_rl(config, num_devices=1)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("pack_buckets", (2048, 1024), r"config\.rl\.pack_buckets=\(2048, 1024\): expected incr"),
        ("pack_attention_block", 0, r"config\.rl\.pack_attention_block=0: expected a positive"),
    ],
)
def test_packing_mistakes_name_the_field(field, value, match):
    config = rl_stage_defaults()
    config.rl.pack_groups = True
    validate_rl(config, num_devices=1)
    config.rl[field] = value
    with pytest.raises(ConfigError, match=match):
        validate_rl(config, num_devices=1)


def test_context_management_keeps_the_rows_plain():
    """Chains' later segments start from their summaries: no prompt to share, rows stay plain."""
    config = rl_stage_defaults()
    assert packs_groups(config)
    config.rl.context_management = "self_summary"
    validate_rl(config, num_devices=1)
    assert not packs_groups(config)


def test_a_gang_needs_ray_and_an_equal_share_of_the_mesh_a_host():
    config = rl_stage_defaults()
    config.rl.rollout_hosts = 2
    with pytest.raises(
        ConfigError, match=r"rollout_hosts=2 needs config\.rl\.rollout_backend='ray'"
    ):
        validate_rl(config, num_devices=1)
    config.rl.rollout_backend = "ray"
    config.rl.rollout_mesh = "expert=3"
    with pytest.raises(ConfigError, match=r"rollout_hosts=2 must divide the 3 devices"):
        validate_rl(config, num_devices=1)
    config.rl.rollout_mesh = "expert=2,tensor=2"
    validate_rl(config, num_devices=1)


def test_unknown_rl_field_is_named():
    config = rl_stage_defaults()
    config.rl.grop_size = 8
    with pytest.raises(ConfigError, match=r"config\.rl\.grop_size: unknown field"):
        validate_rl(config, num_devices=1)


def test_positions_must_be_the_ones_the_start_policy_was_trained_with(tmp_path):
    """A policy trained without YaRN and played with it (or the reverse) is refused, naming the
    setting to use, for a stage workdir and for an hf: directory alike."""
    config = load_config(EXPERIMENTS / "rl_tiny.py")
    for key, value in load_config(EXPERIMENTS / "sft_agent_tiny.py").model.yarn.items():
        config.model.yarn[key] = value  # the main job's agent SFT: YaRN 8x over 128 positions
    _, cfg, _, _ = validate_rl(config, num_devices=1, load_files=False)
    trained = stage_defaults()
    trained.model.preset = config.model.preset
    for key, value in config.model.yarn.items():
        trained.model.yarn[key] = value
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text(trained.to_json())
    (tmp_path / "hf").mkdir()
    hf = config_to_hf(cfg.replace(rope_scaling=None))
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf))

    config.model.yarn.factor = 0.0
    config.init_from = str(tmp_path / "sft")
    with pytest.raises(ConfigError, match=r"was trained with rope_theta=.*YaRN YarnConfig\(fac"):
        validate_rl(config, num_devices=1)
    with pytest.raises(ConfigError, match=r"--config\.model\.yarn\.factor=8\.0 "):
        validate_rl(config, num_devices=1)
    config.init_from = f"hf:{tmp_path / 'hf'}"
    validate_rl(config, num_devices=1)  # trained and played without YaRN
    config.model.yarn.factor = 8.0
    with pytest.raises(ConfigError, match=r"YaRN None; .*Set --config\.model\.yarn\.factor=0\."):
        validate_rl(config, num_devices=1)
    config.init_from = str(tmp_path / "sft")
    validate_rl(config, num_devices=1)
    config.model.yarn.mscale_all_dim = 0.0  # any YaRN setting counts
    with pytest.raises(ConfigError, match=r"mscale_all_dim=1\.0.*mscale_all_dim=0\.0"):
        validate_rl(config, num_devices=1)
    # what the benchmarks do with any start policy: take its positions
    adopt_init_positions(config)
    assert config.model.yarn.to_dict() == trained.model.yarn.to_dict()
    config.init_from = f"hf:{tmp_path / 'hf'}"
    adopt_init_positions(config)
    assert config.model.yarn.factor == 0.0
    validate_rl(config, num_devices=1)
