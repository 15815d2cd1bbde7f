"""pass@k with the unbiased estimator (Chen et al. 2021, "Evaluating Large Language Models Trained
on Code"): from n samples of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k); and the
Wilson score interval of a rate over tasks. Below c2/rl and c2/eval, which both report them
(RL's held-out evaluation and the pipeline's); it imports nothing of c2."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn without replacement from n (c of
    them correct) is correct."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"pass_at_k: {name}={v!r}: expected an int >= 0")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must lie in [1, n={n}]")
    if c > n:
        raise ValueError(f"pass_at_k: c={c} correct of n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(mean: float, n: int, z: float = Z95) -> list[float]:
    """The Wilson score interval (95% by default) of a rate `mean` observed over n independent
    units (tasks). It stays inside [0, 1] and keeps a width at 0 and 1, where mean +- z * sd
    collapses or leaves [0, 1]. Exact in form for 0/1 outcomes (best-of-k, or pass@k from one
    sample); for per-task rates in [0, 1] (pass@k from several samples) it is conservative: it
    uses mean * (1 - mean), the largest variance values in [0, 1] with that mean can have."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"wilson_interval: n={n!r}: expected an int >= 1")
    if not 0.0 <= mean <= 1.0:
        raise ValueError(f"wilson_interval: mean={mean!r}: expected a rate in [0, 1]")
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (mean + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(mean * (1.0 - mean) / n + z2 / (4 * n * n))
    # It holds the mean (and 0 or 1 exactly at 0 or 1); min/max keep rounding from moving it.
    return [max(0.0, min(mean, center - half)), min(1.0, max(mean, center + half))]
