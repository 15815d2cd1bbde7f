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


def _write_run(run: Path, steps, bpb, flops, pass1, ci95):
    """The two files of a pipeline workdir that `correlation.read_point` reads."""
    (run / "cpt").mkdir(parents=True)
    (run / "rl").mkdir()
    cpt = {"step": steps, "eval_bpb": bpb, "cum_flops": flops}
    (run / "cpt" / "final_metrics.json").write_text(json.dumps(cpt))
    ev = {"pass@1": pass1, "pass@1_ci95": ci95}
    rl = {"steps": 2, "evaluations": {"0": ev, "2": ev}}
    (run / "rl" / "final_metrics.json").write_text(json.dumps(rl))


def test_points_read_from_run_dirs_and_plotted(tmp_path):
    runs = []
    for steps, bpb, p in ((100, 4.0, 0.1), (200, 3.5, 0.2), (400, 3.2, 0.25)):
        run = tmp_path / f"steps_{steps}"
        _write_run(run, steps, bpb, steps * 1e9, p, [p - 0.05, p + 0.05])
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


def test_the_driver_runs_each_point_then_fits(tmp_path, monkeypatch):
    """The driver as a user runs it (`python experiments/cpt_rl_correlation.py --quick`), each
    point's pipeline stood in by one that writes the files a pipeline writes: every scale's config
    at its CPT steps and the quick stages, in a workdir of its own, read and fitted. A real quick
    pipeline's workdir is read by `correlation.read_point` in tests/test_main.py."""
    import importlib.util

    from c2 import main as c2_main

    spec = importlib.util.spec_from_file_location("cpt_rl_correlation", CONFIG)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    ran = []

    def pipeline(config, workdir):
        steps = config.train.steps
        ran.append((steps, config.stages.rl.train.steps, Path(workdir).name))
        _write_run(Path(workdir), steps, 8.0 / steps**0.5, steps * 1e6, 0.01 * steps,
                   [0.0, 0.02 * steps])  # fmt: skip

    monkeypatch.setattr(c2_main, "run", pipeline)
    assert driver.main(["--out", str(tmp_path), "--scales", "4,8,12", "--quick"]) == 0
    quick_rl_steps = load_config(CONFIG, "4,quick").stages.rl.train.steps
    assert ran == [(s, quick_rl_steps, f"steps_{s}") for s in (4, 8, 12)]
    result = json.loads((tmp_path / "correlation.json").read_text())
    assert [p["cpt_steps"] for p in result["points"]] == [4, 8, 12]
    assert [p["rl_pass@1"] for p in result["points"]] == pytest.approx([0.04, 0.08, 0.12])
    assert result["fit"]["n"] == 3 and result["fit"]["slope"] < 0
    assert (tmp_path / "correlation.png").is_file()
    with pytest.raises(SystemExit):
        driver.main(["--out", str(tmp_path), "--scales", "4,8"])  # a fit needs 3 points
