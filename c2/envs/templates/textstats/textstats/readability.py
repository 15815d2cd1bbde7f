"""Simple readability measures."""

import math

from textstats.tokens import sentences, words

LONG_WORD = 7
WORDS_PER_MINUTE = 200


def average_word_length(text: str) -> float:
    ws = words(text)
    if not ws:
        return 0.0
    return sum(len(w) for w in ws) / len(ws)


def long_words(text: str) -> list[str]:
    """Distinct words of at least LONG_WORD letters, in order of first appearance."""
    seen = []
    for w in words(text):
        if len(w) >= LONG_WORD and w not in seen:
            seen.append(w)
    return seen


def words_per_sentence(text: str) -> float:
    n = len(sentences(text))
    if n == 0:
        return 0.0
    return len(words(text)) / n


def reading_time(text: str) -> int:
    """Whole minutes needed at WORDS_PER_MINUTE, rounded up; 0 for empty text."""
    return math.ceil(len(words(text)) / WORDS_PER_MINUTE)
