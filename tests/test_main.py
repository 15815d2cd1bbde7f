"""The entry point: config errors through the real flag parsing (before anything is built), and
THE MAIN JOB end to end in its quick form, as a subprocess like `make run`."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _support import xla_flags
from absl import flags
from ml_collections import config_flags

from c2 import main as c2_main
from c2.eval import correlation
from c2.train.metrics import read_metrics

# ml_collections' config_flags still loads config files with importlib's load_module
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

ROOT = Path(__file__).parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def run_cli(*args):
    """`python -m c2.main ARGS` in this process (8 simulated devices): the same config-file flag,
    defined afresh (config_flags reads the override names from argv when the flag is defined)."""
    argv = ["c2.main", *args]
    fv = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "", flag_values=fv)
    fv(argv)
    return c2_main.run(config.value, fv.workdir)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["--config.mesh.data=3"],
            "config error: config.mesh: axis sizes {'data': 3, 'fsdp': 1, 'expert': 1, "
            "'context': 1, 'tensor': 1} multiply to 3, but there are 8 devices",
        ),
        (
            ["--config.mesh.data=2", "--config.mesh.context=4", "--config.data.seq_len=130"],
            "config error: config.data.seq_len=130 is not divisible by the context axis "
            "(config.mesh.context=4)",
        ),
        (
            ["--config.model.preset=gpt5"],
            "config error: config.model.preset='gpt5': unknown; known: ['deepseek_v3', 'kimi_k2', "
            "'qwen3_30b_a3b', 'tiny_deepseek_v3', 'tiny_kimi_k2', 'tiny_qwen3_moe']",
        ),
    ],
)
def test_bad_config_fails_before_anything_is_built(tmp_path, overrides, message):
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        run_cli("--config=experiments/cpt_tiny.py", f"--workdir={workdir}", *overrides)
    assert str(e.value.code) == message
    assert not workdir.exists()  # failed before the run started: nothing written or compiled


def test_unknown_override_names_the_field(tmp_path):
    """A real process: config_flags resolves overrides differently on a first parse."""
    cmd = [
        sys.executable,
        "-m",
        "c2.main",
        "--config=experiments/cpt_tiny.py",
        f"--workdir={tmp_path / 'run'}",
        "--config.train.stepz=3",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "config error: unknown field in an override ['--config.train.stepz'] "
        '(Did you mean "steps"?)'
    )
    assert not (tmp_path / "run").exists()


def test_wrong_type_is_a_flag_error_naming_the_field(tmp_path):
    with pytest.raises(flags.IllegalFlagValueError, match=r"--config\.train\.steps=x"):
        run_cli(
            "--config=experiments/cpt_tiny.py", f"--workdir={tmp_path}", "--config.train.steps=x"
        )


def test_pipeline_stage_errors_name_the_stage(tmp_path):
    with pytest.raises(SystemExit) as e:
        run_cli(
            "--config=experiments/pipeline_tiny.py",
            f"--workdir={tmp_path / 'main'}",
            "--config.stages.cpt.data.kind=rl",
        )
    assert str(e.value.code) == (
        "config error: config.stages.cpt.data.kind: 'rl' is not one of ('pretrain', 'sft')"
    )
    assert not (tmp_path / "main" / "cpt").exists()


def test_a_missing_sandbox_stops_the_job_before_the_first_stage(tmp_path, monkeypatch):
    """The RL stage needs bubblewrap to grade: said in the first seconds, naming the fix, not
    after the stages before it have trained (the pipeline checks it with every stage's config;
    a single RL stage before it builds anything)."""
    from c2.envs import isolation
    from c2.pipeline import validate_pipeline
    from c2.train.config import ConfigError, load_config

    weak = isolation.probe("rlimit")
    monkeypatch.setattr(isolation, "probe", lambda backend="auto": weak)
    pipeline = load_config(str(ROOT / "experiments/pipeline_tiny.py"))
    with pytest.raises(ConfigError, match="stage 'rl' \\(RL\\) grades its episodes in a bubbl"):
        validate_pipeline(pipeline, tmp_path / "main", num_devices=1)
    workdir = tmp_path / "rl"
    with pytest.raises(SystemExit) as e:
        run_cli("--config=experiments/rl_tiny.py", f"--workdir={workdir}")
    message = str(e.value.code)
    assert message.startswith("config error: the RL stage grades its episodes in a bubblewrap"), (
        message
    )
    assert "make system-deps" in message and "rlimit" in message
    assert not workdir.exists()  # nothing built, nothing written


@pytest.mark.slow
def test_main_job_quick_end_to_end(tmp_path):
    """`python -m c2.main --config=experiments/pipeline_tiny.py:quick` on one CPU device."""
    workdir = tmp_path / "main"
    env = dict(os.environ, XLA_FLAGS=xla_flags(None), PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "c2.main",
        "--config=experiments/pipeline_tiny.py:quick",
        f"--workdir={workdir}",
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]

    # DIR/metrics.jsonl: every step of every stage, `step` counted across stages
    records = read_metrics(workdir / "metrics.jsonl")
    stages = ["cpt"] * 24 + ["long_context"] * 4 + ["sft"] * 8 + ["sft_agent"] * 4 + ["rl"] * 2
    assert [r["step"] for r in records] == list(range(1, len(stages) + 1))
    assert [r["stage"] for r in records] == stages
    assert all(math.isfinite(r["loss"]) for r in records)
    rl = [r for r in records if r["stage"] == "rl"]
    for key in ("reward/total", "reward/task", "reward/kl", "mismatch_p99", "pass_rate"):
        assert all(math.isfinite(r[key]) for r in rl), key

    # the RL stage: rollouts of both steps, held-out evaluations at its start and end
    rollouts = sorted(p.name for p in (workdir / "rl" / "rollouts").glob("*.jsonl"))
    assert rollouts == [
        "eval_000000.jsonl", "eval_000002.jsonl", "step_000001.jsonl", "step_000002.jsonl"
    ]  # fmt: skip
    final = json.loads((workdir / "rl" / "final_metrics.json").read_text())
    assert set(final["evaluations"]) == {"0", "2"} and "gain" in final
    # what the CPT-loss vs RL-accuracy study (experiments/cpt_rl_correlation.py) reads of a run
    point = correlation.read_point(workdir)
    cpt_final = json.loads((workdir / "cpt" / "final_metrics.json").read_text())
    assert point["cpt_steps"] == 24 and point["heldout_ce_bpb"] == cpt_final["eval_bpb"] > 0
    assert point["cpt_flops"] > 0 and point["rl_pass@1"] == final["evaluations"]["2"]["pass@1"]

    results = json.loads((workdir / "eval.json").read_text())
    rows = {r["model"]: r for r in results["rows"]}
    assert list(rows) == [
        "untrained",
        "after cpt",
        "cpt + YaRN, no training",
        "after long_context",
        "after sft",
        "after sft_agent",
        "after rl",
    ]
    untrained = rows["untrained"]
    # an untrained 320-way byte model: about log2(320) = 8.32 bits per byte
    assert abs(untrained["bpb_short"] - math.log2(320)) < 0.4
    assert rows["after cpt"]["bpb_short"] < untrained["bpb_short"] - 1.5  # it learned
    assert not rows["after cpt"]["yarn"] and rows["after long_context"]["yarn"]
    assert rows["after sft"]["sft_bpb"] < untrained["sft_bpb"]
    for r in rows.values():  # the reading probes of every row (a fresh model reads nothing)
        assert 0 <= r["reads_operation"] <= 1 and 0 <= r["reads_constant"] <= 1
        assert r["call_head_nats"] < 0
    assert rows["after sft_agent"]["call_head_nats"] > untrained["call_head_nats"] + 1

    report = (workdir / "report.md").read_text()
    for label in rows:
        assert f"| {label} |" in report
    assert f"fell from {untrained['bpb_short']:.2f} (untrained)" in report
    assert "## RL stage `rl`" in report and "![rl rewards](rl/rewards.png)" in report
    for png in ("training_curves.png", "eval_bpb.png", "cpt/loss.png", "sft/mtp.png",
                "rl/rewards.png", "rl/heldout.png", "rl/mismatch.png"):  # fmt: skip
        assert (workdir / png).read_bytes()[:8] == PNG, png
