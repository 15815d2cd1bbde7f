"""pass@k against brute-force enumeration of every k-subset; the Wilson interval by hand."""

import itertools

import pytest

from c2.eval.passk import pass_at_k, wilson_interval


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


def test_wilson_interval_by_hand():
    # 3 of 10, z = 1.96: centre (0.3 + z^2/20) / (1 + z^2/10) = 0.355507, half-width
    # z / (1 + z^2/10) * sqrt(0.021 + z^2/400) = 0.247715 (the textbook [0.108, 0.603]).
    assert wilson_interval(0.3, 10) == pytest.approx(
        [0.355507 - 0.247715, 0.355507 + 0.247715], abs=2e-6
    )
    # All pass / all fail over 5 tasks: [1 / (1 + z^2/5), 1] and its mirror, never [1, 1].
    assert wilson_interval(1.0, 5) == pytest.approx([1 / (1 + 1.959963984540054**2 / 5), 1.0])
    assert wilson_interval(0.0, 5) == pytest.approx([0.0, 1 - 1 / (1 + 1.959963984540054**2 / 5)])
    for n in (1, 2, 7, 100):
        for mean in (0.0, 0.01, 0.5, 0.99, 1.0):
            lo, hi = wilson_interval(mean, n)
            assert 0.0 <= lo <= mean <= hi <= 1.0


@pytest.mark.parametrize(
    "mean, n, match", [(1.2, 4, "mean=1.2"), (0.5, 0, "n=0"), (0.5, True, "n=True")]
)
def test_wilson_bad_arguments_are_named(mean, n, match):
    with pytest.raises(ValueError, match=match):
        wilson_interval(mean, n)
