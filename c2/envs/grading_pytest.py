"""The pytest grader's trusted parent: starts pytest as a child and decides what reaches c2.

Not imported by c2: grading.py mounts this file into the grading sandbox and runs

    python -I -S -B grading_pytest.py OUT BUDGET_S KILL -- python -P -m pytest ...

This process never imports pytest or workspace code. It makes itself non-dumpable (no process
of its uid can ptrace it or reopen its descriptors through /proc), draws a random key and hands
it to the child on a pipe the plugin (grading_plugin.py) reads, and closes, before any test
module is imported. The plugin sends each test's outcome as it is decided on a second pipe,
each message prefixed with the key; a line without it is ignored, the first outcome per test id
stands, and reading stops at the plugin's session-end message (so exit hooks and forked
survivors change nothing), when pytest exits, or at the deadline. Then pytest and whatever the
tests started are killed (KILL: "kill-all", "kill-new" or "keep", grading.py's _kill_mode) and
the outcomes go to OUT ("fd:N", a pipe only this process holds, CLOEXEC so pytest never
inherits it) in the runner's format (grading_runner.py): ["outcome", id, outcome, null],
["collect_error", id, null], ["note", text], ["end", exit status]. A test never reported is
failed by c2.

What this cannot defend against (tests and tested code share pytest's process): code that knows
the plugin's internals and digs the key out of memory, or that replaces the test functions
themselves before they run; a returned object whose __eq__ is always true; code that reads the
hidden tests (files pytest imports) and returns what they assert. The "functions" grader
(grading_runner.py) has none of these gaps.
"""

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's dir out
from grading_runner import _emit, _passed_fd, _protect  # noqa: E402

_MAX_BYTES = 16 << 20  # of messages read from pytest
_OUTCOMES = ("passed", "failed", "skipped")


def _messages(buf, prefix):
    """Complete lines of `buf` that carry the key, parsed; the incomplete tail."""
    *lines, rest = buf.split(b"\n")
    parsed = []
    for line in lines:
        if not line.startswith(prefix):
            continue
        fields = line[len(prefix) :].split(b" ")
        try:
            parsed.append([bytes.fromhex(f.decode()).decode() for f in fields])
        except ValueError:
            continue
    return parsed, rest


class Session:
    """What the plugin reported, first word per test id."""

    def __init__(self):
        self.outcomes, self.collect_errors, self.exit, self.ended = {}, [], None, False

    def take(self, message):
        kind, *args = message
        if kind == "outcome" and len(args) == 2 and args[1] in _OUTCOMES:
            self.outcomes.setdefault(args[0], args[1])
        elif kind == "collect_error" and len(args) == 1:
            self.collect_errors.append(args[0])
        elif kind == "end" and len(args) == 1 and args[0].isdigit():
            self.exit, self.ended = int(args[0]), True


def _read(fd, child, deadline, prefix, session):
    buf, total = b"", 0
    while not session.ended:
        left = deadline - time.monotonic()
        if left <= 0:
            return "pytest passed the deadline"
        if not select.select([fd], [], [], min(left, 0.2))[0]:
            if child.poll() is not None and not select.select([fd], [], [], 0)[0]:
                return f"pytest exited (code {child.returncode}) before the session ended"
            continue
        chunk = os.read(fd, 1 << 16)
        total += len(chunk)
        if not chunk:
            try:
                child.wait(timeout=max(0.1, min(2.0, left)))
            except subprocess.TimeoutExpired:
                return "pytest closed its channel before the session ended"
            return f"pytest exited (code {child.returncode}) before the session ended"
        if total > _MAX_BYTES:
            return "pytest sent too much"
        messages, buf = _messages(buf + chunk, prefix)
        for m in messages:
            if m:
                session.take(m)
                if session.ended:
                    break
    return None


def _pids():
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _live(pid):
    """Whether `pid` is alive (a zombie, killed already, waits only to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _kill_new(before, rounds=1000):
    """SIGKILL every live process not in `before` (nor this one) until none is left: a
    process forked while one round ran is caught by the next. False when some outlived it."""
    for _ in range(rounds):
        left = [p for p in _pids() - before - {os.getpid()} if _live(p)]
        if not left:
            return True
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return False


def _kill_tree(child, kill, before):
    """End pytest and, per `kill`, everything else the tests started (grading.py's
    _kill_mode): "kill-all" every process this one can signal (in a bwrap pid namespace
    that spares init and this one), "kill-new" every process not alive when this one started
    (in a container, whose init and its sleep must live). Returns a note when some survived."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    note = None
    if kill == "kill-all":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(-1, signal.SIGKILL)
    elif kill == "kill-new" and not _kill_new(before):
        note = "processes the tests started outlived every round of SIGKILL"
    child.wait()
    return note


def main(argv):
    out, budget_s, kill, cmd = argv[0], float(argv[1]), argv[2], argv[4:]
    _protect()
    out_fd = _passed_fd(out)
    before = _pids() if kill == "kill-new" else set()
    deadline = time.monotonic() + budget_s
    key = os.urandom(16).hex().encode()
    key_r, key_w = os.pipe()
    os.write(key_w, key)
    os.close(key_w)
    msg_r, msg_w = os.pipe()
    env = {**os.environ, "C2_GRADING_KEY_FD": str(key_r), "C2_GRADING_OUT_FD": str(msg_w)}
    child = subprocess.Popen(cmd, env=env, pass_fds=(key_r, msg_w), start_new_session=True)
    os.close(key_r)
    os.close(msg_w)
    session = Session()
    note = _read(msg_r, child, deadline, key + b" ", session)
    note = _kill_tree(child, kill, before) or note
    for test_id, outcome in session.outcomes.items():
        _emit(out_fd, "outcome", test_id, outcome, None)
    for nodeid in session.collect_errors:
        _emit(out_fd, "collect_error", nodeid, None)
    if note:
        _emit(out_fd, "note", note)
    _emit(out_fd, "end", session.exit if session.ended else 3)


if __name__ == "__main__":
    main(sys.argv[1:])
