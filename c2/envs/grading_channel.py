"""The pipes between c2 and the trusted process inside the grading sandbox (grading_runner.py,
grading_pytest.py): per-test outcomes come out on one, read by c2 while the tests run; the
"functions" grader's hidden tests go in on another (`tests_payload`), so no file in the
sandbox holds them.

Both are passed into the sandbox as descriptors (`Sandbox.run(pass_fds=...)`; the command is
told the numbers it sees them under, `sandbox.inner_fds`): bwrap's pid 1 closes descriptors it
does not use, a container's command is exec'd with them and nothing else holds them there, the
trusted process marks them close-on-exec, never hands them to the worker or to pytest, and is
non-dumpable, so no sandboxed process can write, read or reopen them through /proc. Nothing is
read back from a file the sandbox can write: a sandbox that cannot pass descriptors (docker:
`docker exec` has no --preserve-fds) is refused, naming the backend that can.

Messages are JSON lines: ["outcome", id, outcome, note], ["collect_error", id, note],
["note", text], ["end", exit status]; reading stops at "end", the first outcome per id stands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from pathlib import Path

from c2.envs.sandbox import SandboxError

_MAX_BYTES = 16 << 20
_MAX_TESTS = 64 << 20  # grading_runner's bound on the tests it reads
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
    """`out` (and, given `tests`, `tests_in`) are what the trusted process is told to use;
    `run_kwargs` go to `sandbox.run`; `read()` after the run returns what arrived."""

    def __init__(self, sandbox, tests: bytes | None = None):
        if not getattr(sandbox, "passes_fds", False):
            raise SandboxError(
                f"grading over {sandbox.isolation.describe()} needs a sandbox that passes "
                "descriptors (bubblewrap, or podman: --backend podman); this one could hand "
                "the outcomes back only through a file the tested code can rewrite"
            )
        self._r, self._w = os.pipe()
        self._tests_r = self._writer = None
        fds = [self._w]
        if tests is not None:
            self._tests_r, tests_w = os.pipe()
            fds.append(self._tests_r)
            # From a thread: the tests may not fit the pipe before the runner reads them.
            self._writer = threading.Thread(target=_write_all, args=(tests_w, tests), daemon=True)
        inner = sandbox.inner_fds(fds)
        self.out = f"fd:{inner[0]}"
        self.tests_in = f"fd:{inner[1]}" if tests is not None else None
        self.run_kwargs = {"pass_fds": tuple(fds)}
        self._data = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        if self._writer is not None:
            self._writer.start()

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
        self._close_ours()
        # Every holder of the write end is gone once the sandbox's run returned: EOF is near.
        self._reader.join(timeout=10)
        return parse(bytes(self._data))

    def _close_ours(self) -> None:
        """Close c2's copies of the sandbox's ends (a writer still blocked gets EPIPE)."""
        for name in ("_w", "_tests_r"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def __enter__(self) -> ResultsChannel:
        return self

    def __exit__(self, *exc) -> None:
        self._close_ours()
        self._reader.join(timeout=10)
        if self._writer is not None:
            self._writer.join(timeout=10)
        if not self._reader.is_alive():
            os.close(self._r)


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the runner ended without reading them all
        pass
    finally:
        os.close(fd)


def tests_payload(tests_dir: str | os.PathLike) -> bytes:
    """The hidden tests as the functions runner reads them: one frame (4-byte length, then the
    repr of {"tests/<path>": source bytes} for every regular .py file under `tests_dir`)."""
    files = {}
    root = Path(tests_dir)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(".py") and path.is_file():
                files["tests/" + path.relative_to(root).as_posix()] = path.read_bytes()
    text = repr(files).encode()
    if len(text) > _MAX_TESTS:
        raise SandboxError(
            f"{tests_dir}: the hidden tests are {len(text)} bytes as sent; "
            f"the runner takes at most {_MAX_TESTS}"
        )
    return len(text).to_bytes(4, "big") + text
