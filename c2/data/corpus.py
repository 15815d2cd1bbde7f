"""Corpora: the embedded default (the Python standard library's source), any directory of source
files, a JSONL file or an ArrayRecord file.

A corpus hands out splits ("train", "heldout", "all"); a split is a random-access, deterministic
sequence of documents {"text": str, "path": str} that grain reads directly. A document goes to
"heldout" when the SHA-1 of its key, read as a fraction in [0, 1), is below `heldout_fraction`:
the key is the file path relative to the corpus root (directories), the record's "path" field or
else its line number (JSONL), the record index (ArrayRecord). The split of a file therefore never
changes when other files are added or removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Iterable, Sequence
from typing import Any

SPLITS = ("train", "heldout", "all")
STDLIB_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")
STDLIB_TEST_DIRS = ("test", "tests", "idle_test")


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob relative to the root ("**/" any directories, "*" and "?" within one name)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def heldout_score(key: str) -> float:
    """Stable pseudo-random number in [0, 1) for a document key (the same on every machine)."""
    return int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _check_fraction(heldout_fraction: float) -> float:
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1), got {heldout_fraction}")
    return float(heldout_fraction)


def select_split(keys: Sequence[str], split: str, heldout_fraction: float) -> list[int]:
    """Indices of the documents of `split`, in corpus order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "all":
        return list(range(len(keys)))
    want_heldout = split == "heldout"
    return [i for i, k in enumerate(keys) if (heldout_score(k) < heldout_fraction) == want_heldout]


class Documents(Sequence):
    """One split of a corpus: `docs[i] -> {"text", "path"}`; a grain data source."""

    def __init__(self, name: str, paths: Sequence[str], read):
        self.name = name
        self.paths = list(paths)
        self._read = read  # i -> text, i indexes self.paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i):
        if isinstance(i, slice):
            raise TypeError("Documents does not support slicing; use grain's MapDataset slices")
        if not -len(self) <= i < len(self):
            raise IndexError(f"document index {i} out of range for {len(self)} documents")
        i = i % len(self)
        return {"text": self._read(i), "path": self.paths[i]}

    def __repr__(self) -> str:
        return f"Documents({self.name}, {len(self)} documents)"


@dataclasses.dataclass(frozen=True)
class DirectoryCorpus:
    """Source files under `root` matching `patterns` (globs relative to root), sorted by path.

    Files are decoded as UTF-8; undecodable bytes become U+FFFD (deterministic, and what the
    model then sees and is scored on).
    """

    root: str
    patterns: tuple[str, ...] = ("**/*.py",)
    exclude_dirs: tuple[str, ...] = ("__pycache__",)
    heldout_fraction: float = 0.02

    def __post_init__(self):
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"corpus root {self.root!r} is not a directory")
        if isinstance(self.patterns, str):
            object.__setattr__(self, "patterns", (self.patterns,))
        _check_fraction(self.heldout_fraction)

    @property
    def name(self) -> str:
        return f"dir:{self.root}"

    def relative_paths(self) -> list[str]:
        """Every matching file, relative to root with '/' separators, sorted."""
        matchers = [_glob_regex(p) for p in self.patterns]
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in self.exclude_dirs]  # prune the walk
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if any(m.fullmatch(rel) for m in matchers):
                    found.append(rel)
        return sorted(found)

    def documents(self, split: str = "train") -> Documents:
        paths = self.relative_paths()
        chosen = [paths[i] for i in select_split(paths, split, self.heldout_fraction)]
        root = self.root

        def read(i: int) -> str:
            with open(os.path.join(root, chosen[i]), "rb") as f:
                return f.read().decode("utf-8", errors="replace")

        return Documents(f"{self.name}[{split}]", chosen, read)


def stdlib_root() -> str:
    """The directory of this interpreter's standard library source."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_corpus(
    heldout_fraction: float = 0.02, *, include_tests: bool = False
) -> DirectoryCorpus:
    """The embedded default: every *.py of the standard library, site-packages skipped.

    Test directories (test/, tests/, idle_test/) are dropped by default: they are 60% of the bytes,
    mostly repetitive assertions, and hold deliberately malformed files (bad encodings, syntax
    errors); the remaining ~12 MB of library code is more than a tiny run consumes.
    """
    skip = STDLIB_SKIP_DIRS + (() if include_tests else STDLIB_TEST_DIRS)
    return DirectoryCorpus(
        stdlib_root(), ("**/*.py",), exclude_dirs=skip, heldout_fraction=heldout_fraction
    )


def _check_text(record: Any, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f"{where}: expected a JSON object with a string field 'text'")
    return record["text"]


@dataclasses.dataclass(frozen=True)
class JsonlCorpus:
    """One document per line: {"text": ..., "path"?: ...}; held in memory after the first read."""

    path: str
    heldout_fraction: float = 0.02

    def __post_init__(self):
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"JSONL corpus {self.path!r} does not exist")
        _check_fraction(self.heldout_fraction)

    @property
    def name(self) -> str:
        return f"jsonl:{self.path}"

    def _records(self) -> tuple[list[str], list[str]]:
        texts, keys = [], []
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{self.path}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not valid JSON ({e})") from e
                texts.append(_check_text(record, where))
                keys.append(str(record.get("path") or where))
        return texts, keys

    def documents(self, split: str = "train") -> Documents:
        texts, keys = self._records()
        chosen = select_split(keys, split, self.heldout_fraction)
        return Documents(
            f"{self.name}[{split}]", [keys[i] for i in chosen], lambda i: texts[chosen[i]]
        )


@dataclasses.dataclass(frozen=True)
class ArrayRecordCorpus:
    """Records are UTF-8 JSON objects {"text": ..., "path"?: ...} (see `write_array_record`)."""

    path: str
    heldout_fraction: float = 0.02

    def __post_init__(self):
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"ArrayRecord corpus {self.path!r} does not exist")
        _check_fraction(self.heldout_fraction)

    @property
    def name(self) -> str:
        return f"array_record:{self.path}"

    def documents(self, split: str = "train") -> Documents:
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        source = ArrayRecordDataSource([self.path])
        keys = [f"{self.path}#{i}" for i in range(len(source))]
        chosen = select_split(keys, split, self.heldout_fraction)

        def read(i: int) -> str:
            where = f"{self.path} record {chosen[i]}"
            try:
                record = json.loads(source[chosen[i]].decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{where}: not a UTF-8 JSON object ({e})") from e
            return _check_text(record, where)

        return Documents(f"{self.name}[{split}]", [keys[i] for i in chosen], read)


def write_array_record(documents: Iterable[dict], path: str) -> int:
    """Writes documents ({"text", "path"?}) as JSON records; returns how many were written."""
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(os.fspath(path), "group_size:1")
    n = 0
    try:
        for doc in documents:
            _check_text(doc, f"document {n}")
            writer.write(json.dumps(doc, ensure_ascii=False).encode("utf-8"))
            n += 1
    finally:
        writer.close()
    return n


Corpus = DirectoryCorpus | JsonlCorpus | ArrayRecordCorpus


def load_corpus(spec: str | Corpus, heldout_fraction: float = 0.02) -> Corpus:
    """ "stdlib" | a directory (its *.py files) | *.jsonl | *.array_record / *.arrayrecord."""
    if not isinstance(spec, str):
        if not hasattr(spec, "documents"):
            raise TypeError(f"corpus must be a spec string or a corpus, got {type(spec)}")
        return spec
    if spec == "stdlib":
        return stdlib_corpus(heldout_fraction)
    if os.path.isdir(spec):
        return DirectoryCorpus(spec, heldout_fraction=heldout_fraction)
    if spec.endswith(".jsonl"):
        return JsonlCorpus(spec, heldout_fraction)
    if spec.endswith((".array_record", ".arrayrecord")):
        return ArrayRecordCorpus(spec, heldout_fraction)
    raise ValueError(
        f"corpus spec {spec!r}: expected 'stdlib', a directory, a .jsonl file or an "
        ".array_record file"
    )
