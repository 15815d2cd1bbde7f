"""Counting words."""

from textstats.tokens import words


def frequencies(text: str) -> dict[str, int]:
    freq: dict[str, int] = {}
    for w in words(text):
        freq[w] = freq.get(w, 0) + 1
    return freq


def top_k(freq: dict[str, int], k: int) -> list[tuple[str, int]]:
    """The k most frequent words, most frequent first, ties alphabetical."""
    ranked = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:k]


def type_token_ratio(text: str) -> float:
    """Distinct words over all words (0.0 for empty text)."""
    ws = words(text)
    if not ws:
        return 0.0
    return len(set(ws)) / len(ws)
