"""CPT loss vs RL accuracy (c2/eval/correlation.py, experiments/cpt_rl_correlation.py): the fit,
reading runs, the plot, and the config's points differing only in CPT compute."""

import json
from pathlib import Path

import numpy as np
import pytest

from c2.eval import correlation
from c2.train.config import load_config

CONFIG = Path(__file__).parents[2] / "experiments" / "cpt_rl_correlation.py"


def test_fit_is_least_squares_with_r2_the_squared_correlation():
    rng = np.random.default_rng(0)
    x = rng.uniform(2, 5, 12)
    y = 0.9 - 0.15 * x + rng.normal(0, 0.02, 12)
    f = correlation.fit(x, y)
    A = np.stack([x, np.ones_like(x)], 1)
    slope, intercept = np.linalg.lstsq(A, y, rcond=None)[0]
    assert f["slope"] == pytest.approx(slope) and f["intercept"] == pytest.approx(intercept)
    assert f["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    assert correlation.fit([1, 2, 3], [3, 5, 7])["r2"] == pytest.approx(1.0)
    assert correlation.fit([1, 2, 3], [0, 0, 0])["r2"] is None  # RL at 0 everywhere: undefined
    with pytest.raises(ValueError, match=">= 3 paired points"):
        correlation.fit([1, 2], [1, 2])


def test_points_read_from_run_dirs_and_plotted(tmp_path):
    runs = []
    for steps, bpb, p in ((100, 4.0, 0.1), (200, 3.5, 0.2), (400, 3.2, 0.25)):
        run = tmp_path / f"steps_{steps}"
        (run / "cpt").mkdir(parents=True)
        (run / "rl").mkdir()
        (run / "cpt" / "final_metrics.json").write_text(
            json.dumps({"step": steps, "eval_bpb": bpb, "cum_flops": steps * 1e9})
        )
        ev = {"pass@1": p, "pass@1_ci95": [p - 0.05, p + 0.05]}
        (run / "rl" / "final_metrics.json").write_text(
            json.dumps({"steps": 2, "evaluations": {"0": ev, "2": ev}})
        )
        runs.append(correlation.read_point(run))
    result = correlation.write(runs, tmp_path / "out")
    assert [p["cpt_steps"] for p in result["points"]] == [100, 200, 400]
    assert result["fit"]["slope"] < 0 and (tmp_path / "out" / "correlation.png").is_file()
    assert json.loads((tmp_path / "out" / "correlation.json").read_text()) == result


def test_points_differ_only_in_cpt_steps():
    from c2.pipeline import validate_pipeline

    a, b = (load_config(CONFIG, s) for s in ("100", "400"))
    sa = validate_pipeline(a, Path("/tmp/unused"), num_devices=1)
    sb = validate_pipeline(b, Path("/tmp/unused"), num_devices=1)
    assert sa["cpt"].train.steps == 100 and sb["cpt"].train.steps == 400
    for name in ("long_context", "sft", "sft_agent", "rl"):
        assert sa[name].train.steps == sb[name].train.steps, name
        assert sa[name].optimizer.to_dict() == sb[name].optimizer.to_dict(), name
    with pytest.raises(ValueError, match="expected CPT steps"):
        load_config(CONFIG, "many")
    doc = CONFIG.read_text().split('"""')[1]
    assert "--config=experiments/cpt_rl_correlation.py" in doc
    assert "Runtime:" in doc and "Expected:" in doc


@pytest.mark.slow
def test_the_driver_end_to_end_on_quick_points(tmp_path):
    """Three pipelines (CPT at 4, 8 and 12 steps, the same later stages), read and fitted: the
    driver as a user runs it, on one device like `make run`."""
    import os
    import subprocess
    import sys

    root = CONFIG.parents[1]
    env = dict(os.environ, XLA_FLAGS="", PYTHONPATH=str(root))
    cmd = [sys.executable, str(CONFIG), "--out", str(tmp_path), "--scales", "4,8,12", "--quick"]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "correlation.json").read_text())
    points = result["points"]
    assert [p["cpt_steps"] for p in points] == [4, 8, 12]
    bpb = [p["heldout_ce_bpb"] for p in points]
    assert bpb[0] > bpb[1] > bpb[2] > 0  # more CPT compute, lower held-out CE
    flops = [p["cpt_flops"] for p in points]
    assert flops[1] == pytest.approx(2 * flops[0]) and flops[2] == pytest.approx(3 * flops[0])
    for p in points:
        assert 0.0 <= p["rl_pass@1"] <= 1.0
        lo, hi = p["rl_pass@1_ci95"]
        assert lo <= p["rl_pass@1"] <= hi
    assert result["fit"]["n"] == 3 and (tmp_path / "correlation.png").is_file()
