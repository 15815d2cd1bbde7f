"""c2.bench.async_rl's settings: rl_tiny's RL stage with the bench's workload, and `--set`."""

import numpy as np
import pytest
from scipy import stats

from c2.bench import async_rl
from c2.train.config import load_config


def test_settings_differ_only_in_staleness_and_overrides():
    start = load_config(async_rl.CONFIG).init_from
    s0 = async_rl.bench_config(start, 5, 0, (1.5, 1.5))
    s2 = async_rl.bench_config(start, 5, 2, (1.5, 1.5), {"rl.recompute_kv": True})
    assert (s0.rl.max_staleness, s2.rl.max_staleness) == (0, 2)
    assert (s0.rl.recompute_kv, s2.rl.recompute_kv) == (False, True)
    assert s2.rl.rollout.test_latency_pareto == (1.5, 1.5)
    # rl_tiny's update, as the main job trains it, on 4 prompts of the basic level
    tiny = load_config(async_rl.CONFIG)
    assert s0.optimizer.lr == tiny.optimizer.lr and s0.rl.single_forward == tiny.rl.single_forward
    assert (s0.rl.tasks, s0.rl.prompts_per_step, s0.train.steps) == ("functions:basic", 4, 5)


def test_a_bad_override_names_the_field(capsys):
    with pytest.raises(SystemExit):
        async_rl.main(["--set", "rl.no_such_field=1"])
    assert "rl.no_such_field" in capsys.readouterr().err


def test_settings_are_paired_within_rounds():
    def run(samples_per_s, reward):
        return {"samples_per_s": samples_per_s, "reward_common_prompts": reward}

    rounds = [
        {0: run(2.0, 0.50), 2: run(4.0, 0.45)},
        {0: run(2.5, 0.40), 2: run(4.5, 0.42)},
        {0: run(3.0, 0.45), 2: run(6.0, 0.40)},
    ]
    paired = async_rl.paired_over_rounds(rounds, base=0)
    assert list(paired) == [2]
    speedup, gap = paired[2]["speedup"], paired[2]["reward_gap"]
    np.testing.assert_allclose(speedup["rounds"], [2.0, 1.8, 2.0])
    np.testing.assert_allclose(gap["rounds"], [-0.05, 0.02, -0.05])
    # mean +- t(0.975, 2) * sd / sqrt(3): scipy's t quantile, the formula written out
    sd = np.std([-0.05, 0.02, -0.05], ddof=1)
    half = stats.t.ppf(0.975, 2) * sd / np.sqrt(3)
    np.testing.assert_allclose(gap["mean"], -0.08 / 3)
    np.testing.assert_allclose(gap["ci95"], [-0.08 / 3 - half, -0.08 / 3 + half])
    assert speedup["n"] == 3 and speedup["ci95"][0] < 1.9333 < speedup["ci95"][1]
