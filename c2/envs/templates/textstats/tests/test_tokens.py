import pytest
from textstats.tokens import ngrams, sentences, words


def test_words_lowercase_and_punctuation():
    assert words("Hello, World! It's 2 AM.") == ["hello", "world", "it's", "2", "am"]


def test_words_strip_quotes():
    assert words("'quoted' text") == ["quoted", "text"]


def test_words_empty():
    assert words("  ...  ") == []


def test_sentences():
    text = "One fish. Two fish! Red fish? Blue fish"
    assert sentences(text) == ["One fish.", "Two fish!", "Red fish?", "Blue fish"]


def test_sentences_skip_lone_punctuation():
    assert sentences("Wait... what?") == ["Wait.", "what?"]


def test_ngrams_pairs():
    assert ngrams(["a", "b", "c", "d"], 2) == [("a", "b"), ("b", "c"), ("c", "d")]


def test_ngrams_whole_sequence():
    assert ngrams(["a", "b", "c"], 3) == [("a", "b", "c")]


def test_ngrams_too_short():
    assert ngrams(["a"], 2) == []


def test_ngrams_invalid_n():
    with pytest.raises(ValueError):
        ngrams(["a", "b"], 0)
