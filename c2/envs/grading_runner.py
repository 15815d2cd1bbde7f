"""The "functions" grader's runner: plain pytest-style tests without pytest, sound by construction.

Not imported by c2: grading.py mounts this file (and its bytecode, compiled once per c2 process:
compiling it costs more than running the tests) into the grading sandbox at /grading and runs

    python -I -S -B -c "...import grading_runner; grading_runner.main(...)" TESTS_DIR WORKSPACE
        OUT BUDGET_S

Two processes. This one, the trusted runner, imports and runs the hidden test files and never
runs workspace code: it forks a worker first (before anything of the workspace exists), and a
workspace module a test imports is, here, a proxy whose functions send (module, name, args,
kwargs) to the worker and get back only plain literal data (parsed from a bounded repr without
evaluating anything) or an exception's (type name, message). So each assertion is evaluated here:
a result that is not plain data (an object whose __eq__ is always true) fails the test, a worker
that exits or hangs fails the call it was in (then a fresh worker is forked), and whatever the
workspace code does to its own process (exit hooks, signal handlers, patching this module) does
not reach the outcomes. This process is made non-dumpable, so no process of the same uid can
ptrace it or reopen its descriptors through /proc; OUT ("fd:N", a pipe only this process holds,
or a file path where the sandbox cannot pass descriptors) gets one JSON line per message:
["outcome", id, "passed"|"failed", note], ["collect_error", path, note], ["end", exit status].

Same test ids ("tests/test_x.py::test_y", relative to TESTS_DIR's parent) and rules as pytest
where they overlap: test_*.py and *_test.py files under TESTS_DIR in sorted order, each imported
as its basename with its directory first on sys.path (pytest's "prepend" mode), workspace modules
LAST (no workspace file can shadow the standard library or the test files' imports). An import
error (in the test file or in the workspace code it imports) is a collection error of that file,
and then, as in pytest, no test runs at all. Every module-level function named test* is called:
returning passes; raising (AssertionError, SystemExit, ...) fails; a test that needs arguments
fails (pytest: fixture not found), so does an `async def`. Not supported: fixtures, classes,
parametrize, marks, pytest itself; workspace values that are not plain data (a class instance
returned, a workspace exception type: it arrives as Exception("TypeName: message")); a
conftest.py is reported as a collection error rather than silently ignored.
"""

import _ast
import _signal as signal  # the signal module imports enum: 20 ms of start-up
import os
import select
import sys
import time

_MAX_REPLY = 8 << 20  # bytes of one worker reply
_MAX_TEXT = 2000  # characters of an exception message kept
_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2")
_FUNCTION = type(lambda: None)
_ModuleSpec = type(sys.__spec__)  # importlib.machinery.ModuleSpec, without importing importlib
# Code flags (inspect's CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR): importing inspect
# would cost more than running the tests.
_NOT_PLAIN = 0x20 | 0x80 | 0x200


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


class Worker:
    """The runner's side: forks the worker, calls it with a deadline, re-forks after a death."""

    def __init__(self, workspace, deadline, keep_out):
        self.workspace, self.deadline, self.keep_out = workspace, deadline, keep_out
        self.pid = None
        self.events = []  # what went wrong, for the outcome's note

    def _start(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: nothing of the runner's may be left reachable
            try:
                for fd in (req_w, rep_r, *self.keep_out):
                    os.close(fd)
                _forget_runner()
                _serve(req_r, rep_w, self.workspace)
            finally:
                os._exit(70)
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
        end = time.monotonic() + wait_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= end:
                os.kill(pid, signal.SIGKILL)
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            time.sleep(0.002)

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
    """In a fresh worker: drop the runner's test modules, proxies, finder and signal choices,
    and be an ordinary (dumpable) process again: its own /proc entries readable, as usual."""
    _prctl_dumpable(1)
    for name in set(sys.modules) - _BASE_MODULES:
        del sys.modules[name]
    sys.meta_path[:] = _BASE_META_PATH
    sys.path[:] = _BASE_PATH
    for name in _SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------- proxies in the runner


def _repr_call(name, args, kwargs):
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = f"{name}({', '.join(parts)})"
    return text if len(text) <= 120 else text[:117] + "..."


def _plain_args(args, kwargs, what):
    if not _is_plain(tuple(args)) or not _is_plain(dict(kwargs)):
        raise TypeError(f"{what}: only plain data can be passed to workspace code")


class _Function:
    """A workspace function as the runner sees it: calls go to the worker."""

    def __init__(self, worker, module, name):
        self._worker, self._module, self._name = worker, module, name
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        what = _repr_call(self._name, args, kwargs)
        _plain_args(args, kwargs, what)
        return self._worker.ask("call", self._module, self._name, args, kwargs, what)[0]

    def __repr__(self):
        return f"<workspace function {self._module}.{self._name}>"


def _proxy_module(worker, loader, name, kind):
    module = type(sys)(name)
    module.__file__ = None
    module.__loader__ = loader
    if kind == "package":
        module.__path__ = []

    def attribute(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        got = worker.ask("get", name, attr, what=f"{name}.{attr}")
        value = _Function(worker, name, attr) if got == "callable" else got[0]
        setattr(module, attr, value)
        return value

    module.__getattr__ = attribute
    return module


class _WorkspaceFinder:
    """Last on sys.meta_path: a module nothing else provides is asked of the worker."""

    def __init__(self, worker):
        self.worker = worker

    def find_spec(self, name, path=None, target=None):
        parent = sys.modules.get(name.rpartition(".")[0])
        if "." in name and getattr(parent, "__loader__", None) is not self:
            return None  # a submodule of a real package is not the workspace's
        return _ModuleSpec(name, self)

    def create_module(self, spec):
        kind = self.worker.ask("import", spec.name, what=f"import of {spec.name}")
        return _proxy_module(self.worker, self, spec.name, kind)

    def exec_module(self, module):
        pass


# ---------------------------------------------------------------- running the tests


def _test_files(tests_dir):
    found = []
    for dirpath, dirnames, filenames in os.walk(tests_dir):
        dirnames.sort()
        for name in sorted(filenames):
            test = name.startswith("test_") or name.endswith("_test.py")
            # conftest.py: reported as a collection error (see the module doc)
            if name.endswith(".py") and test or name == "conftest.py":
                found.append(os.path.join(dirpath, name))
    return found


def _import(path):
    """pytest's "prepend" import: the file's directory first on sys.path, then a plain import
    of its basename, which must resolve to this very file."""
    name = os.path.basename(path)[:-3]
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    __import__(name)
    module = sys.modules[name]
    if os.path.realpath(getattr(module, "__file__", None) or "") != os.path.realpath(path):
        raise ImportError(f"{name} resolves to {module!r}, not {path}")
    return module


def _outcome(fn):
    code = fn.__code__
    required = code.co_argcount + code.co_kwonlyargcount
    required -= len(fn.__defaults__ or ()) + len(fn.__kwdefaults__ or {})
    if required > 0 or code.co_flags & _NOT_PLAIN:
        return "failed"  # pytest: fixture not found / yield tests / async without a plugin
    try:
        fn()
    except KeyboardInterrupt:
        raise
    except BaseException:
        return "failed"
    return "passed"


def _json(v):
    """JSON by hand: the json module (and the re it imports) would double the start-up."""
    if v is None:
        return "null"
    if type(v) is int:
        return str(v)
    if type(v) is list:
        return "[" + ", ".join(_json(x) for x in v) + "]"
    bad = '"\\'
    return (
        '"'
        + "".join(
            c if c >= " " and c not in bad and not "\ud800" <= c <= "\udfff" else f"\\u{ord(c):04x}"
            for c in str(v)
        )
        + '"'
    )


def _open_out(out):
    fd = int(out[3:]) if out.startswith("fd:") else os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    os.set_inheritable(fd, False)
    return fd


def _emit(fd, *message):
    data = (_json(list(message)) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _prctl_dumpable(flag):
    """prctl(PR_SET_DUMPABLE, flag) through _ctypes (the ctypes package costs 10 ms)."""
    import _ctypes

    global _PRCTL
    if _PRCTL is None:
        _PRCTL = _prctl(_ctypes)
    prctl, ulong = _PRCTL
    if prctl(*(ulong(x) for x in (4, flag, 0, 0, 0))) != 0:  # 4: PR_SET_DUMPABLE
        raise OSError(_ctypes.get_errno(), f"prctl(PR_SET_DUMPABLE, {flag}) failed")
    if prctl(*(ulong(x) for x in (3, 0, 0, 0, 0))) != flag:  # 3: PR_GET_DUMPABLE
        raise OSError(f"prctl(PR_SET_DUMPABLE, {flag}) did not take")


def _prctl(_ctypes):

    class ULong(_ctypes._SimpleCData):
        _type_ = "L"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = ULong

    class Libc:
        _handle = _ctypes.dlopen(None)

    return Function(("prctl", Libc())), ULong


def _protect():
    """No process of this uid may ptrace this one or reopen its descriptors via /proc."""
    _prctl_dumpable(0)
    for name in _SIGNALS:  # the worker shares our uid: its signals must not steer this process
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def _note(worker, start):
    return "; ".join(worker.events[start:])[:_MAX_TEXT] or None


def main(tests_dir, workspace, out, budget_s):
    _protect()
    out_fd = _open_out(out)
    root = os.path.dirname(os.path.abspath(tests_dir).rstrip("/"))
    worker = Worker(workspace, time.monotonic() + float(budget_s), (out_fd,))
    worker._start()  # forked before any test file (or workspace code) is loaded
    sys.meta_path.append(_WorkspaceFinder(worker))
    tests, collect_errors = [], 0
    for path in _test_files(tests_dir):  # collect everything first, as pytest does
        rel = os.path.relpath(path, root)
        start = len(worker.events)
        try:
            if os.path.basename(path) == "conftest.py":
                raise ImportError("conftest.py is not supported")
            module = _import(path)
        except BaseException:
            collect_errors += 1
            _emit(out_fd, "collect_error", rel, _note(worker, start))
            continue
        for name, obj in list(vars(module).items()):
            if name.startswith("test") and type(obj) is _FUNCTION:
                tests.append((f"{rel}::{name}", obj))
    failed = False
    if not collect_errors:  # pytest runs nothing after a collection error
        try:
            for test_id, fn in tests:
                start = len(worker.events)
                outcome = _outcome(fn)
                failed |= outcome == "failed"
                _emit(out_fd, "outcome", test_id, outcome, _note(worker, start))
        except KeyboardInterrupt:
            pass  # pytest, interrupted, also reports what ran so far
    worker.stop()
    _emit(out_fd, "end", 2 if collect_errors else int(failed))


_PRCTL = None
_BASE_MODULES = set(sys.modules)
_BASE_META_PATH = list(sys.meta_path)
_BASE_PATH = list(sys.path)

if __name__ == "__main__":
    main(*sys.argv[1:5])
