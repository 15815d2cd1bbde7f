"""c2.bench.async_rl's settings: rl_tiny's RL stage with the bench's workload, and `--set`."""

import pytest

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
