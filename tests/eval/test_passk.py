"""pass@k against brute-force enumeration of every k-subset."""

import itertools

import pytest

from c2.eval.passk import pass_at_k


@pytest.mark.parametrize("n, c", [(5, 0), (5, 1), (5, 3), (6, 6), (7, 2)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_success(n, c):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(outcomes, k))
        want = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_1_is_the_success_rate():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "n, c, k, match",
    [
        (4, 5, 1, "c=5 correct of n=4"),
        (4, 1, 5, "k=5 must lie"),
        (4, 1, 0, "k=0"),
        (-1, 0, 1, "n=-1"),
    ],
)
def test_bad_arguments_are_named(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)
