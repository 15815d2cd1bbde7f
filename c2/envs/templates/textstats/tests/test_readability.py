import pytest
from textstats.readability import (
    LONG_WORD,
    WORDS_PER_MINUTE,
    average_word_length,
    long_words,
    reading_time,
    words_per_sentence,
)


def test_average_word_length():
    assert average_word_length("ab abcd") == 3.0


def test_average_word_length_empty():
    assert average_word_length("") == 0.0


def test_long_words_threshold_and_order():
    exact = "x" * LONG_WORD
    longer = "y" * (LONG_WORD + 2)
    short = "z" * (LONG_WORD - 1)
    text = f"{longer} {short} {exact} {longer}"
    assert long_words(text) == [longer, exact]


def test_words_per_sentence():
    assert words_per_sentence("One two three. Four five!") == pytest.approx(2.5)


def test_words_per_sentence_empty():
    assert words_per_sentence("") == 0.0


def test_reading_time_rounds_up():
    assert reading_time("word " * (WORDS_PER_MINUTE + 1)) == 2
    assert reading_time("word " * WORDS_PER_MINUTE) == 1


def test_reading_time_empty():
    assert reading_time("") == 0
