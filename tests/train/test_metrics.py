"""metrics.jsonl records, resume truncation, torn lines, TensorBoard events and PNG plots."""

import json

import numpy as np

from c2.train.metrics import MetricsWriter, plot_curves, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_records_hold_step_and_plain_values(tmp_path):
    w = MetricsWriter(tmp_path)
    w.write(1, {"loss": np.float32(2.5), "bpb": np.asarray(3.0), "stage": "cpt"})
    w.write(2, {"loss": 2.0})
    w.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 1, "loss": 2.5, "bpb": 3.0, "stage": "cpt"},
        {"step": 2, "loss": 2.0},
    ]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    for s in range(1, 8):
        w.write(s, {"loss": float(s)})
    w.close()
    w = MetricsWriter(tmp_path, resume_step=4, tensorboard=False)
    w.write(5, {"loss": 50.0})
    w.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["loss"] == 50.0


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 1.0}]
    w = MetricsWriter(tmp_path, resume_step=1, tensorboard=False)
    w.write(2, {"loss": 0.5})
    w.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_plot_curves_writes_png_of_present_keys(tmp_path):
    records = [{"step": s, "loss": 1.0 / s, "lr": 0.1} for s in range(1, 6)]
    out = plot_curves(records, ["loss", "missing", "lr"], tmp_path / "c.png", log_y=True)
    assert out == tmp_path / "c.png" and out.read_bytes()[:8] == PNG_MAGIC
    assert plot_curves(records, ["missing"], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
