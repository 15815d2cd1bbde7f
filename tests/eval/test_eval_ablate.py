"""The ablation harness (c2/eval/ablate.py): valid overrides, clear refusals, a resumable table."""

import json

import jax
import pytest

from c2.eval import ablate
from c2.rl import config as rl_config
from c2.rl.config import rl_stage_defaults


def _config(steps=2):
    """The tiny RL setting of tests/rl/test_trainer.py."""
    c = rl_stage_defaults()
    c.name = "ablate_test"
    o = c.model.overrides
    o.d_model, o.n_layers, o.n_heads, o.d_ff, o.d_ff_expert = 32, 2, 2, 64, 16
    o.n_experts, o.n_experts_per_token, o.q_lora_rank, o.kv_lora_rank = 4, 2, 16, 16
    o.qk_nope_head_dim, o.qk_rope_head_dim, o.v_head_dim, o.mtp_depth = 8, 8, 8, 0
    c.train.steps, c.train.checkpoint_every, c.train.progress_bar = steps, 1, False
    c.optimizer.warmup_steps = 1
    r = c.rl
    r.tasks = r.heldout_tasks = "functions:basic"
    r.group_size, r.prompts_per_step, r.micro_batch_size = 4, 2, 8
    r.seq_buckets = (384,)
    r.rollout.max_tokens, r.rollout.max_turn_tokens, r.rollout.engine_slots = 384, 16, 8
    r.eval.tasks, r.eval.samples = 2, 2
    return c


@pytest.mark.parametrize("name", [n for n, a in ablate.ABLATIONS.items() if not a.unavailable])
def test_every_available_ablation_is_a_valid_change(name):
    base = _config()
    for k, v in ablate.ABLATIONS[name].requires.items():
        ablate.set_field(base, k, v)
    ablate.check_ablations([name], base)
    config = ablate.run_config(base, name, 1)
    _, _, objective, _ = rl_config.validate_rl(config, jax.device_count())
    changed = [
        k for k, v in ablate.ABLATIONS[name].overrides.items() if ablate.get_field(base, k) != v
    ]
    assert changed, name
    assert config.train.seed == base.train.seed + 1
    base_obj = rl_config.objective_config(base)
    assert (
        objective != base_obj
        or config.rl.max_staleness != base.rl.max_staleness
        or config.rl.router_replay != base.rl.router_replay
        or config.rl.mismatch_tokens != base.rl.mismatch_tokens
        or config.rl.rewards != base.rl.rewards
        or rl_config.rollout_config(config) != rl_config.rollout_config(base)
    )


def test_refusals_name_what_is_wrong():
    c = _config()
    with pytest.raises(ValueError, match="'compaction'.*baseline with .*self_summary"):
        ablate.check_ablations(["compaction"], c)  # rl_tiny has no context management
    with pytest.raises(ValueError, match="unknown ablation 'nope'"):
        ablate.check_ablations(["nope"], c)
    c.rl.max_staleness = 0
    with pytest.raises(ValueError, match="'synchronous' changes nothing"):
        ablate.check_ablations(["synchronous"], c)
    with pytest.raises(KeyError, match="rl.objective.nope"):
        ablate.set_field(c, "rl.objective.nope", 1)


@pytest.mark.slow
def test_two_ablations_one_seed_table_and_no_retraining(tmp_path, sandbox_ok):
    out = tmp_path / "abl"
    table = ablate.run_all(_config(), ["std_norm", "tis_off"], 1, out)
    names = [r["ablation"] for r in table["rows"]]
    assert names == ["baseline", "std_norm", "tis_off"]
    for r in table["rows"]:
        for m in ablate.MEASURES:
            assert m in r
        assert 0.0 <= r["pass@1"]["mean"] <= 1.0 and r["pass@1"]["ci95"] is not None
        assert r["nonfinite_loss_steps"]["mean"] == 0
        assert len(r["reward_curves"][0]) == 2  # one reward per step
        final = json.loads((out / r["ablation"] / "seed_0" / "final_metrics.json").read_text())
        assert final["steps"] == 2
    saved = json.loads((out / "std_norm" / "seed_0" / "ablation.json").read_text())
    assert saved["rl"]["objective"]["advantage"] == "group_mean_std"
    saved = json.loads((out / "tis_off" / "seed_0" / "ablation.json").read_text())
    assert saved["rl"]["objective"]["importance_correction"] == "none"
    assert json.loads((out / "ablations.json").read_text()) == table
    md = (out / "ablations.md").read_text()
    assert "| std_norm |" in md and "pass@1 vs baseline" in md
    assert (out / "ablations.png").is_file() and (out / "reward.png").is_file()

    def never(config, workdir):
        raise AssertionError(f"{workdir} was trained again")

    assert ablate.run_all(_config(), ["std_norm", "tis_off"], 1, out, train=never) == table
