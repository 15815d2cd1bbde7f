"""How per-test outcomes leave the grading sandbox: a pipe whose write end only the trusted
process inside holds (grading_runner.py, grading_pytest.py), read by c2 while the tests run.

The write end is passed into the sandbox as a descriptor (`Sandbox.run(pass_fds=...)`): bwrap's
pid 1 closes descriptors it does not use, the trusted process marks it close-on-exec, never
hands it to the worker or to pytest, and is non-dumpable, so no sandboxed process can write it
or reopen it through /proc. Nothing is read back from a file the sandbox can write. A sandbox
that cannot pass descriptors (`passes_fds` false: the container backend today) gets a file under
a writable bind instead, which its tested code could rewrite.

Messages are JSON lines: ["outcome", id, outcome, note], ["collect_error", id, note],
["note", text], ["end", exit status]; reading stops at "end", the first outcome per id stands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

_MAX_BYTES = 16 << 20
_OUTCOMES = ("passed", "failed", "skipped")


@dataclasses.dataclass
class Messages:
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    collect_errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    ended: bool = False
    exit: int | None = None

    def _note(self, text) -> None:
        if isinstance(text, str) and text and text not in self.notes:
            self.notes.append(text[:500])

    def take(self, m) -> None:
        if not isinstance(m, list) or not m or self.ended:
            return
        kind, args = m[0], m[1:]
        if kind == "outcome" and len(args) == 3 and isinstance(args[0], str):
            if args[1] in _OUTCOMES:
                self.outcomes.setdefault(args[0], args[1])
                self._note(args[2])
        elif kind == "collect_error" and len(args) == 2 and isinstance(args[0], str):
            self.collect_errors.append(args[0])
            self._note(args[1])
        elif kind == "note" and len(args) == 1:
            self._note(args[0])
        elif kind == "end" and len(args) == 1 and isinstance(args[0], int):
            self.ended, self.exit = True, args[0]


def parse(data: bytes) -> Messages:
    got = Messages()
    for line in data.split(b"\n"):
        if got.ended:
            break
        with contextlib.suppress(ValueError):
            got.take(json.loads(line))
    return got


class ResultsChannel:
    """`out` is what the trusted process is told to write to; `binds` and `run_kwargs` go to
    `sandbox.run`; `read()` after the run returns what arrived."""

    def __init__(self, sandbox):
        self.binds: list = []
        self.run_kwargs: dict = {}
        self._dir = None
        if getattr(sandbox, "passes_fds", False):
            self._r, self._w = os.pipe()
            self.out = f"fd:{self._w}"
            self.run_kwargs = {"pass_fds": (self._w,)}
            self._data = bytearray()
            self._reader = threading.Thread(target=self._drain, daemon=True)
            self._reader.start()
        else:
            self._dir = tempfile.mkdtemp(prefix="c2-grade-")
            sandbox.give_workspace(self._dir)
            self.binds = [(self._dir, "/grading/out", True)]
            self.out = "/grading/out/messages"

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            room = _MAX_BYTES - len(self._data)
            self._data += chunk[: max(0, room)]  # beyond the bound: drained, not kept

    def read(self) -> Messages:
        if self._dir is not None:
            path = Path(self._dir) / "messages"
            ok = path.is_file() and not path.is_symlink() and path.stat().st_size <= _MAX_BYTES
            return parse(path.read_bytes() if ok else b"")
        self._close_write()
        # Every holder of the write end is gone once the sandbox's run returned: EOF is near.
        self._reader.join(timeout=10)
        return parse(bytes(self._data))

    def _close_write(self) -> None:
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def __enter__(self) -> ResultsChannel:
        return self

    def __exit__(self, *exc) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            return
        self._close_write()
        self._reader.join(timeout=10)
        if not self._reader.is_alive():
            os.close(self._r)
