import pytest
from textstats.counts import frequencies, top_k, type_token_ratio


def test_frequencies():
    assert frequencies("the cat and the hat. The end") == {
        "the": 3,
        "cat": 1,
        "and": 1,
        "hat": 1,
        "end": 1,
    }


def test_top_k_orders_by_count_then_word():
    freq = {"b": 2, "a": 2, "c": 5, "d": 1}
    assert top_k(freq, 3) == [("c", 5), ("a", 2), ("b", 2)]


def test_top_k_more_than_available():
    assert top_k({"x": 1}, 5) == [("x", 1)]


def test_type_token_ratio():
    assert type_token_ratio("a b a b c") == pytest.approx(3 / 5)


def test_type_token_ratio_empty():
    assert type_token_ratio("") == 0.0
