"""Held-out pass@1 / best-of-K summaries and the paired gain, by hand."""

import math

import numpy as np
import pytest

from c2.rl.evaluation import Z95, compare, summarize
from c2.rl.records import Sample


def _sample(task, passed):
    z = np.zeros(3)
    return Sample(
        prompt_id=task, group_id=task, sample_index=0, task_id=task,
        tokens=z.astype(np.int32), loss_mask=z.astype(np.uint8), logprobs=z.astype(np.float32),
        versions=z.astype(np.int32), routing=np.zeros((3, 1, 2), np.uint8), temperature=1.0,
        top_p=1.0, top_k=0, reward_terms={"task": float(passed)}, effort={}, passed=passed,
        stop_reason="submit",
    )  # fmt: skip


def _run(passes):
    return [_sample(t, p) for t, ps in passes.items() for p in ps]


def test_summary_by_hand():
    s = summarize(_run({"a": [1, 1, 0, 0], "b": [0, 0, 0, 0], "c": [1, 1, 1, 1]}))
    per_task = np.array([0.5, 0.0, 1.0])
    assert s["k"] == 4 and s["tasks"] == 3 and s["samples"] == 12
    assert s["pass@1"] == pytest.approx(0.5)
    half = Z95 * per_task.std(ddof=1) / math.sqrt(3)
    assert s["pass@1_ci95"] == pytest.approx([0.5 - half, 0.5 + half])
    assert s["best_of_4"] == pytest.approx(2 / 3)
    assert s["per_task_passes"] == {"a": 2, "b": 0, "c": 4}


def test_paired_gain_by_hand():
    before = summarize(_run({"a": [0, 0], "b": [1, 0], "c": [0, 0]}))
    after = summarize(_run({"a": [1, 1], "b": [1, 1], "c": [0, 1]}))
    g = compare(before, after)
    d = np.array([1.0, 0.5, 0.5])
    half = Z95 * d.std(ddof=1) / math.sqrt(3)
    assert g["pass@1_delta"] == pytest.approx(d.mean())
    assert g["pass@1_delta_ci95"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert g["best_of_k_delta"] == pytest.approx(2 / 3)  # a and c gained a success


def test_unequal_samples_per_task_are_refused():
    with pytest.raises(ValueError, match="different sample counts"):
        summarize(_run({"a": [1, 0], "b": [1]}))
