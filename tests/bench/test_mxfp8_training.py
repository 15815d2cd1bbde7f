"""The bf16-vs-MXFP8 proof's arithmetic: final losses, seed means and their spreads."""

import numpy as np
import pytest

from c2.bench.mxfp8_training import final_loss, summarize


def test_final_loss_is_the_mean_of_the_last_tenth_of_steps():
    records = [{"step": i, "loss": float(i)} for i in range(1, 101)] + [{"step": 100, "eval": 1}]
    assert final_loss(records) == pytest.approx(np.mean(np.arange(91, 101)))
    assert final_loss(records[:5]) == 5.0  # at least one step


def test_summarize_compares_seed_means_and_reports_the_noise_floor():
    out = summarize({"bf16": [2.0, 2.2], "mxfp8": [2.02, 2.2]})
    assert out["bf16_mean"] == pytest.approx(2.1)
    assert out["relative_difference_of_means"] == pytest.approx(0.01 / 2.1)
    np.testing.assert_allclose(out["per_seed_relative_difference"], [0.01, 0.0], atol=1e-12)
    assert out["bf16_seed_std_relative"] == pytest.approx(np.std([2.0, 2.2], ddof=1) / 2.1)
    assert out["per_seed_difference_stderr"] == pytest.approx(np.std([0.01, 0.0], ddof=1) / 2**0.5)
    assert "bf16_seed_std_relative" not in summarize({"bf16": [2.0], "mxfp8": [2.1]})
