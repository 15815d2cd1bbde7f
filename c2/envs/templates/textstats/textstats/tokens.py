"""Splitting text into words, sentences and n-grams."""

import re

_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """Lower-cased words (letters, digits and apostrophes)."""
    return [w.strip("'") for w in _WORD.findall(text.lower()) if w.strip("'")]


def sentences(text: str) -> list[str]:
    """Sentences ending in . ! or ?, stripped; a trailing fragment counts as one."""
    out = []
    current = []
    for ch in text:
        current.append(ch)
        if ch in ".!?":
            sentence = "".join(current).strip()
            if len(sentence) > 1:
                out.append(sentence)
            current = []
    rest = "".join(current).strip()
    if rest:
        out.append(rest)
    return out


def ngrams(items: list[str], n: int) -> list[tuple[str, ...]]:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]
