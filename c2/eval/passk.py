"""pass@k with the unbiased estimator (Chen et al. 2021, "Evaluating Large Language Models Trained
on Code"): from n samples of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k)."""

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
