"""Patches: a git-style unified diff of an episode's final workspace against its task's files
(episodes.jsonl's "patch", predictions.jsonl's "model_patch")."""

from __future__ import annotations

import difflib
import os
from pathlib import Path


def _text_files(root: Path) -> dict[str, Path]:
    out = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".pytest_cache"))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file() or name.endswith(".pyc"):
                continue
            out[str(p.relative_to(root))] = p
    return out


def _read(path: Path | None) -> list[str] | None:
    """Lines of a text file; None if absent, binary or over 1 MiB."""
    if path is None:
        return []
    if path.stat().st_size > 1 << 20:
        return None
    try:
        return path.read_text().splitlines(keepends=True)
    except (UnicodeDecodeError, OSError):
        return None


def workspace_patch(original: str | Path, final: str | Path) -> str:
    """A git-style unified diff turning `original` into `final` (added, modified and deleted
    text files; binary or >1 MiB files are named only). `git apply` / `patch -p1` apply it."""
    a_files, b_files = _text_files(Path(original)), _text_files(Path(final))
    out = []
    for rel in sorted(set(a_files) | set(b_files)):
        a_path, b_path = a_files.get(rel), b_files.get(rel)
        a, b = _read(a_path), _read(b_path)
        if a is None or b is None:
            if a_path is None or b_path is None or a_path.read_bytes() != b_path.read_bytes():
                out.append(f"diff --git a/{rel} b/{rel}\nBinary files differ\n")
            continue
        if a == b and a_path is not None and b_path is not None:
            continue
        for lines in (a, b):  # a last line without a newline, as diff marks it
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n\\ No newline at end of file\n"
        header = [f"diff --git a/{rel} b/{rel}\n"]
        if a_path is None:
            header.append("new file mode 100644\n")
        elif b_path is None:
            header.append("deleted file mode 100644\n")
        diff = difflib.unified_diff(
            a,
            b,
            fromfile="/dev/null" if a_path is None else f"a/{rel}",
            tofile="/dev/null" if b_path is None else f"b/{rel}",
        )
        out.append("".join(header) + "".join(diff))
    return "".join(out)
