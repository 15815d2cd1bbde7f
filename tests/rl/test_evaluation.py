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
    assert s["pass@1"] == pytest.approx(per_task.mean())
    # Wilson over 3 tasks at 1/2: center 1/2, half-width z / (1 + z^2/n) * sqrt(1/(4n) + z^2/(4n^2))
    z2, n = Z95**2, 3
    half = Z95 / (1 + z2 / n) * math.sqrt(0.25 / n + z2 / (4 * n * n))
    assert s["pass@1_ci95"] == pytest.approx([0.5 - half, 0.5 + half])
    assert s["best_of_4"] == pytest.approx(2 / 3)
    p = 2 / 3  # best-of-4: a and c
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    assert s["best_of_4_ci95"] == pytest.approx([center - half, center + half])
    assert s["per_task_passes"] == {"a": 2, "b": 0, "c": 4}


@pytest.mark.parametrize("passed", [0, 1])
def test_all_pass_and_all_fail_intervals_stay_in_the_unit_range_with_a_width(passed):
    """At 0 or 1 the normal interval collapses to a point; Wilson's is [0, z^2/(n+z^2)] at 0 and
    [n/(n+z^2), 1] at 1 (n tasks)."""
    s = summarize(_run({t: [passed] * 2 for t in "abcd"}))
    n, z2 = 4, Z95**2
    want = [n / (n + z2), 1.0] if passed else [0.0, z2 / (n + z2)]
    assert s["pass@1"] == passed and s["best_of_2"] == passed
    assert s["pass@1_ci95"] == pytest.approx(want) and s["best_of_2_ci95"] == pytest.approx(want)


def test_intervals_stay_inside_the_unit_range():
    """19 of 20 tasks solved: mean + z*sd/sqrt(n) passes 1; the Wilson interval does not."""
    s = summarize(_run({f"t{i}": [int(i > 0)] for i in range(20)}))
    lo, hi = s["pass@1_ci95"]
    assert 0.0 <= lo < 0.95 < hi <= 1.0


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
