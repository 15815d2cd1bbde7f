"""The cluster simulator: the closed form of a synchronous step, the staleness bound the real
Scheduler keeps inside it, and the gain asynchrony brings when episodes are long-tailed."""

import dataclasses

import pytest

from c2.rl.simulate import SimConfig, cluster_config, simulate

# Deterministic: every episode 50 tokens, every test run 2 s, 16 samples on 16 slots.
FIXED = SimConfig(
    slots=16, decode_floor_s=0.01, decode_per_seq_s=0.001, tokens_median=50, tokens_sigma=0.0,
    test_scale_s=2.0, test_alpha=1e12, train_fixed_s=3.0, train_per_token_s=0.0,
    prompts_per_step=2, group_size=8, max_staleness=0, steps=6,
)  # fmt: skip


def test_a_synchronous_step_is_generation_then_tests_then_training():
    r = simulate(FIXED)
    generation = 50 * (0.01 + 0.001 * 16)  # 16 episodes decode together, one token per step
    step = generation + 2.0 + 3.0
    assert r["steps"] == 6 and r["step_s"] == pytest.approx(step, rel=1e-9)
    assert r["samples_per_s"] == pytest.approx(16 / step, rel=1e-9)
    assert r["staleness_hist"] == [1.0]


def test_one_step_of_staleness_overlaps_generation_with_training():
    """S = 1: the next batch generates and is tested while the trainer computes, so a step
    costs little more than training alone (3 s), far from the synchronous sum (6.3 s)."""
    r = simulate(dataclasses.replace(FIXED, max_staleness=1, slots=32))
    assert 3.0 <= r["step_s"] < 0.55 * 6.3
    assert 0 < r["staleness_mean"] <= 1


@pytest.mark.parametrize("S", [0, 1, 2, 4])
def test_staleness_stays_within_the_bound_at_cluster_scale(S):
    r = simulate(dataclasses.replace(cluster_config(128, S), steps=8))
    assert len(r["staleness_hist"]) == S + 1 and r["staleness_mean"] <= S
    assert r["steps"] == 8


def test_asynchrony_pays_when_episodes_are_long_tailed():
    sync = simulate(dataclasses.replace(cluster_config(128, 0), steps=10))
    async_ = simulate(dataclasses.replace(cluster_config(128, 2), steps=10))
    assert async_["samples_per_s"] > 1.5 * sync["samples_per_s"]
    assert async_["trainer_idle_frac"] < sync["trainer_idle_frac"]
