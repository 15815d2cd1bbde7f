"""The "functions" grader's worker side (grading_runner.py's module doc says how the grading is
sound): the factory every worker is forked from, the worker's loop that imports and calls
workspace code, the runner's handle on a worker (Worker), and the plain-data wire between them.

Not imported by c2: grading.py mounts this file (and its bytecode) beside grading_runner.py,
which imports it as it starts, before any workspace code runs or any worker is forked. Every
module the runner loads from a file (_ctypes, _socket) is imported here, at the top: once this
is imported, the runner imports nothing from a writable filesystem (grading_runner's doc).
"""

import _ast
import _ctypes  # prctl (the ctypes package costs 10 ms)
import _signal as signal  # the signal module imports enum: 20 ms of start-up
import _socket
import os
import select
import sys
import time

_MAX_REPLY = 8 << 20  # bytes of one worker reply
_MAX_TEXT = 2000  # characters of an exception message kept
_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2")


class WorkerError(RuntimeError):
    """The worker died, hung, or answered with something that is not plain data."""


# ---------------------------------------------------------------- data across the boundary


def _literal(text):
    """The value of a repr of plain data; never evaluates anything (an AST walk, like
    ast.literal_eval, without ast's import cost)."""
    return _value(compile(text, "<worker>", "eval", _ast.PyCF_ONLY_AST).body)


def _value(node):
    t = type(node)
    if t is _ast.Constant and type(node.value) in _PLAIN:
        return node.value
    if t in (_ast.Tuple, _ast.List, _ast.Set):
        items = [_value(x) for x in node.elts]
        return tuple(items) if t is _ast.Tuple else list(items) if t is _ast.List else set(items)
    if t is _ast.Dict and None not in node.keys:
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if t is _ast.UnaryOp and type(node.op) in (_ast.USub, _ast.UAdd):
        v = _value(node.operand)
        if type(v) in (int, float, complex):
            return -v if type(node.op) is _ast.USub else v
    if t is _ast.BinOp and type(node.op) in (_ast.Add, _ast.Sub):  # complex: 1+2j
        a, b = _value(node.left), _value(node.right)
        if type(a) in (int, float) and type(b) is complex:
            return a + b if type(node.op) is _ast.Add else a - b
    if t is _ast.Name and node.id in ("inf", "nan"):
        return float(node.id)
    if t is _ast.Call and type(node.func) is _ast.Name and not node.keywords:
        if node.func.id in ("set", "frozenset") and not node.args:
            return set() if node.func.id == "set" else frozenset()
        if node.func.id == "frozenset" and len(node.args) == 1:
            return frozenset(_value(node.args[0]))
    raise ValueError(f"not plain data: {t.__name__}")


def _is_plain(v, depth=0):
    t = type(v)
    if t in _PLAIN:
        return True
    if depth > 50:
        return False
    if t in (list, tuple, set, frozenset):
        return all(_is_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(x, depth + 1) for k, x in v.items())
    return False


def _send(fd, text):
    data = text.encode("utf-8", "surrogatepass")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd, n, deadline, alive=None):
    """n bytes from fd; EOFError when it closes or the process behind `alive` (a pidfd) ends."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            ready = select.select([fd] if alive is None else [fd, alive], [], [], max(left, 0))[0]
            if not ready:
                raise TimeoutError
            if fd not in ready:  # the worker ended, and a child of its may hold the pipe
                raise EOFError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(fd, deadline=None, alive=None, limit=_MAX_REPLY):
    n = int.from_bytes(_read_exact(fd, 4, deadline, alive), "big")
    if n > limit:
        raise OverflowError(n)
    return _read_exact(fd, n, deadline, alive).decode("utf-8", "surrogatepass")


# ---------------------------------------------------------------- the untrusted worker


def _serve(requests, replies, workspace):
    """The worker's loop: import, look up and call workspace code for the runner."""
    sys.path.append(workspace)
    while True:
        try:
            op, module, name, args, kwargs = _literal(_recv(requests))
        except EOFError:
            os._exit(0)
        try:
            __import__(module)
            reply = ("ok", "package" if hasattr(sys.modules[module], "__path__") else "module")
            if op != "import":
                value = getattr(sys.modules[module], name)
                if op == "call":
                    value = value(*args, **kwargs)
                elif callable(value):
                    reply = ("ok", "callable")
                if reply[1] != "callable":
                    text = repr(value) if _is_plain(value) else None
                    reply = ("ok", text) if text is not None else ("notdata", type(value).__name__)
        except BaseException as e:  # SystemExit and KeyboardInterrupt cross too, as in pytest
            reply = ("raise", type(e).__name__, _message(e))
        try:
            _send(replies, repr(reply))
        except BaseException:
            _send(replies, repr(("notdata", "unprintable")))


def _message(e):
    try:
        return str(e)[:_MAX_TEXT]
    except BaseException:
        return "<unprintable message>"


class _Factory:
    """The process every worker is forked from. The runner forks it before the hidden tests
    arrive (so it, and each worker, never had them in memory) and hands it, over a socket,
    the worker's ends of two fresh pipes; it forks the worker and answers its pid, and reaps it
    when asked ("stop"), answering its exit code."""

    def __init__(self, workspace, keep_out, deadline):
        self.deadline = deadline
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                for fd in keep_out:
                    os.close(fd)
                ours.close()
                _factory_loop(theirs, workspace)
            finally:
                os._exit(70)
        theirs.close()
        self.sock = ours

    def ask(self, message, fds=()):
        """The factory's answer (an int) to `message`; WorkerError when it is gone or stuck."""
        if self.sock is None:
            raise WorkerError("the worker factory is gone")
        data = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)] if fds else []
        try:
            self.sock.sendmsg([message], rights)
            left = max(self.deadline - time.monotonic(), 0) + 2.0  # a stop may follow the end
            if not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError
            return int(self.sock.recv(64))
        except (OSError, ValueError, TimeoutError):
            self.close()
            raise WorkerError("the worker factory stopped answering") from None

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


def _factory_loop(sock, workspace):
    while True:
        try:
            data, ancillary, _, _ = sock.recvmsg(64, _socket.CMSG_SPACE(8))
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)
        fds = [
            int.from_bytes(raw[i : i + 4], sys.byteorder)
            for level, kind, raw in ancillary
            if (level, kind) == (_socket.SOL_SOCKET, _socket.SCM_RIGHTS)
            for i in range(0, len(raw) - 3, 4)
        ]
        op, *args = data.split()
        if op == b"fork" and len(fds) == 2:
            pid = os.fork()
            if pid == 0:  # the worker: nothing of the runner's or the factory's reachable
                try:
                    sock.close()
                    _forget_runner()
                    _serve(fds[0], fds[1], workspace)
                finally:
                    os._exit(70)
            answer = pid
        elif op == b"stop" and len(args) == 2:
            answer = _reap(int(args[0]), float(args[1]))
        else:
            answer = -1
        for fd in fds:
            os.close(fd)
        sock.send(str(answer).encode())


def _reap(pid, wait_s):
    """The exit code of child `pid`, killed after `wait_s` for it to exit by itself."""
    end = time.monotonic() + wait_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            os.kill(pid, signal.SIGKILL)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.002)


class Worker:
    """The runner's side: has the factory fork the worker, calls it with a deadline, has a
    fresh one forked after a death."""

    def __init__(self, factory, deadline):
        self.factory, self.deadline = factory, deadline
        self.pid = None
        self.events = []  # what went wrong, for the outcome's note

    def _start(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            pid = self.factory.ask(b"fork", (req_r, rep_w))
        except WorkerError as e:
            os.close(req_w)
            os.close(rep_r)
            raise self._fail(str(e)) from None
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.pid, self.requests, self.replies = pid, req_w, rep_r
        try:
            self.alive = os.pidfd_open(pid)
        except (AttributeError, OSError):  # before Linux 5.3: EOF on the pipe alone
            self.alive = None

    def stop(self, wait_s=0.0):
        """End the worker (after `wait_s` for it to exit by itself); its exit code."""
        if self.pid is None:
            return None
        for fd in (self.requests, self.replies, self.alive):
            if fd is not None:
                os.close(fd)
        pid, self.pid = self.pid, None
        try:
            return self.factory.ask(b"stop %d %g" % (pid, wait_s))
        except WorkerError:
            try:  # noqa: SIM105 - contextlib costs start-up; the factory is gone: end it here
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            return None

    def ask(self, op, module, name="", args=(), kwargs=None, what=""):
        if self.pid is None:
            self._start()
        try:
            _send(self.requests, repr((op, module, name, tuple(args), dict(kwargs or {}))))
            reply = _literal(_recv(self.replies, self.deadline, self.alive))
        except (EOFError, BrokenPipeError):
            code = self.stop(wait_s=1.0)
            raise self._fail(f"worker exited (code {code}) during {what}") from None
        except TimeoutError:
            self.stop()
            raise self._fail(f"worker did not answer {what} before the deadline") from None
        except (OverflowError, ValueError, SyntaxError, MemoryError, RecursionError):
            self.stop()
            raise self._fail(f"worker sent an unreadable reply to {what}") from None
        return self._result(reply, what)

    def _fail(self, event):
        self.events.append(event)
        return WorkerError(event)

    def _result(self, reply, what):
        if type(reply) is not tuple or not reply or not all(type(x) is str for x in reply):
            raise self._fail(f"worker sent an unreadable reply to {what}")
        if reply[0] == "raise" and len(reply) == 3:
            raise _exception(reply[1], reply[2])
        if reply[0] == "notdata" and len(reply) == 2:
            raise self._fail(f"{what} returned a {reply[1][:80]}, which is not plain data")
        if reply[0] == "ok" and len(reply) == 2:
            if reply[1] in ("module", "package", "callable"):
                return reply[1]
            try:
                return (_literal(reply[1]),)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                raise self._fail(f"{what} returned a value that is not plain data") from None
        raise self._fail(f"worker sent an unreadable reply to {what}")


def _exception(name, message):
    """A builtin exception type by name, else a plain Exception naming the type."""
    import builtins

    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            return cls(message)
        except Exception:
            pass
    return Exception(f"{name[:100]}: {message}")


def _forget_runner():
    """In a fresh worker: drop what the runner had set up (modules, finders, signal choices)
    and be an ordinary (dumpable) process again: its own /proc entries readable, as usual."""
    _prctl_dumpable(1)
    for name in set(sys.modules) - _BASE_MODULES:
        del sys.modules[name]
    sys.meta_path[:] = _BASE_META_PATH
    sys.path[:] = _BASE_PATH
    for name in _SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _prctl_dumpable(flag):
    """prctl(PR_SET_DUMPABLE, flag) through _ctypes."""
    global _PRCTL
    if _PRCTL is None:
        _PRCTL = _prctl()
    prctl, ulong = _PRCTL
    if prctl(*(ulong(x) for x in (4, flag, 0, 0, 0))) != 0:  # 4: PR_SET_DUMPABLE
        raise OSError(_ctypes.get_errno(), f"prctl(PR_SET_DUMPABLE, {flag}) failed")
    if prctl(*(ulong(x) for x in (3, 0, 0, 0, 0))) != flag:  # 3: PR_GET_DUMPABLE
        raise OSError(f"prctl(PR_SET_DUMPABLE, {flag}) did not take")


def _prctl():

    class ULong(_ctypes._SimpleCData):
        _type_ = "L"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = ULong

    class Libc:
        _handle = _ctypes.dlopen(None)

    return Function(("prctl", Libc())), ULong


_PRCTL = None
# What a fresh worker goes back to (_forget_runner): the runner's state as it started (it imports
# this module before anything the standard library's start-up has not loaded).
_BASE_MODULES = set(sys.modules)
_BASE_META_PATH = list(sys.meta_path)
_BASE_PATH = list(sys.path)
