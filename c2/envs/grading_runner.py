"""The "functions" grader's runner: plain pytest-style tests without pytest, sound by construction.

Not imported by c2: grading.py mounts this file (and its bytecode, compiled once per c2 process:
compiling it costs more than running the tests) into the grading sandbox at /grading and runs

    python -I -S -B -c "...import grading_runner; grading_runner.main(...)" fd:TESTS WORKSPACE
        OUT BUDGET_S

Three kinds of process. This one, the trusted runner, runs the hidden tests and never runs
workspace code. The hidden tests are not in any file the sandbox can open: c2 sends them on a
pipe (TESTS, "fd:N"; grading_channel.tests_payload) that only this process holds, read after it
has forked the worker factory, a process that never has them and from which every worker is
forked (the runner passes it each worker's pipes over a socket). So no process that runs
workspace code finds the tests' text in a file, in /proc, or in memory it inherited; the test
modules are compiled from that text in memory, under their /grading/tests/... names. A
workspace module a test imports is, here, a proxy whose functions send (module, name, args,
kwargs) to the worker and get back only plain literal data (parsed from a bounded repr without
evaluating anything) or an exception's (type name, message). So each assertion is evaluated
here: a result that is not plain data (an object whose __eq__ is always true) fails the test, a
worker that exits or hangs fails the call it was in (then a fresh worker is forked), and
whatever the workspace code does to its own process (exit hooks, signal handlers, patching this
module) does not reach the outcomes. This process and the factory are non-dumpable, so no
process of the same uid can ptrace them, read their memory or environment, or reopen their
descriptors through /proc; OUT ("fd:N", a pipe only this process holds) gets one JSON line per
message: ["outcome", id, "passed"|"failed", note], ["collect_error", path, note], ["note",
text], ["end", exit status].

Same test ids ("tests/test_x.py::test_y") and rules as pytest where they overlap: test_*.py and
*_test.py files of the tests in os.walk's sorted order, each imported as its basename with its
directory searched first (pytest's "prepend" mode), workspace modules LAST (no workspace file can
shadow the standard library or the test files' imports). An import error (in the test file or in
the workspace code it imports) is a collection error of that file, and then, as in pytest, no
test runs at all. Every module-level function named test* is called: returning passes; raising
(AssertionError, SystemExit, ...) fails; a test that needs arguments fails (pytest: fixture not
found), so does an `async def`. Not supported: fixtures, classes, parametrize, marks, pytest
itself; files beside the tests other than .py (only those are sent); workspace values that are
not plain data (a class instance returned, a workspace exception type: it arrives as
Exception("TypeName: message")); a conftest.py is reported as a collection error rather than
silently ignored.
"""

import _ast
import _signal as signal  # the signal module imports enum: 20 ms of start-up
import os
import select
import sys
import time

_MAX_REPLY = 8 << 20  # bytes of one worker reply
_MAX_TESTS = 64 << 20  # bytes of the hidden tests, as sent
_TESTS_ROOT = "/grading/"  # test ids are relative to it; nothing is mounted at /grading/tests
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


class _Factory:
    """The process every worker is forked from. The runner forks it before the hidden tests
    arrive (so it, and each worker, never had them in memory) and hands it, over a socket,
    the worker's ends of two fresh pipes; it forks the worker and answers its pid, and reaps it
    when asked ("stop"), answering its exit code."""

    def __init__(self, workspace, keep_out, deadline):
        import _socket

        self._s, self.deadline = _socket, deadline
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                for fd in keep_out:
                    os.close(fd)
                ours.close()
                _factory_loop(_socket, theirs, workspace)
            finally:
                os._exit(70)
        theirs.close()
        self.sock = ours

    def ask(self, message, fds=()):
        """The factory's answer (an int) to `message`; WorkerError when it is gone or stuck."""
        if self.sock is None:
            raise WorkerError("the worker factory is gone")
        s = self._s
        data = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        try:
            self.sock.sendmsg([message], [(s.SOL_SOCKET, s.SCM_RIGHTS, data)] if fds else [])
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


def _factory_loop(_socket, sock, workspace):
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


# ---------------------------------------------------------------- the hidden tests, in memory


def _read_tests(fd, deadline):
    """{path under /grading: source} of the hidden tests, as c2 sent them on `fd`."""
    try:
        files = _literal(_recv(fd, deadline, limit=_MAX_TESTS))
    finally:
        os.close(fd)
    ok = type(files) is dict
    if not ok or not all(type(k) is str and type(v) is bytes for k, v in files.items()):
        raise ValueError("the hidden tests arrived malformed")
    return {_TESTS_ROOT + rel: source for rel, source in files.items()}


class _TestsFinder:
    """Before the path finder: modules of the hidden tests, compiled from memory. A directory
    of theirs is searched once a test file in it was imported, the latest first (pytest's
    "prepend" mode); a package of theirs finds its submodules among them."""

    def __init__(self, files):
        self.files, self.dirs = files, []

    def find_spec(self, name, path=None, target=None):
        parent, _, last = name.rpartition(".")
        dirs = self.dirs
        if parent:
            module = sys.modules.get(parent)
            if getattr(module, "__loader__", None) is not self:
                return None
            dirs = module.__path__
        for d in dirs:  # a package before a module of the same name, as the path finder does
            for origin, package in ((f"{d}/{last}/__init__.py", True), (f"{d}/{last}.py", False)):
                if origin in self.files:
                    spec = _ModuleSpec(name, self, origin=origin, is_package=package)
                    spec.has_location = True
                    if package:
                        spec.submodule_search_locations.append(f"{d}/{last}")
                    return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        origin = module.__spec__.origin
        exec(compile(self.files[origin], origin, "exec", dont_inherit=True), module.__dict__)


def _test_files(files):
    """The test files (and conftest.py files) in os.walk's sorted order: a directory's own
    files before its subdirectories'."""
    found = []
    for path in files:
        name = path.rpartition("/")[2]
        test = name.startswith("test_") or name.endswith("_test.py")
        # conftest.py: reported as a collection error (see the module doc)
        if name.endswith(".py") and test or name == "conftest.py":
            parts = path.split("/")
            found.append(([(1, d) for d in parts[:-1]] + [(0, parts[-1])], path))
    return [path for _, path in sorted(found)]


def _import(finder, path):
    """pytest's "prepend" import: the file's directory searched first, then a plain import of
    its basename, which must resolve to this very file."""
    name = path.rpartition("/")[2][:-3]
    d = path.rpartition("/")[0]
    if d not in finder.dirs:
        finder.dirs.insert(0, d)
    __import__(name)
    module = sys.modules[name]
    if getattr(module, "__file__", None) != path:
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


def _passed_fd(arg):
    """The descriptor "fd:N" names (a pipe c2 passed in), kept from every child (CLOEXEC)."""
    if not arg.startswith("fd:"):
        raise ValueError(f"{arg!r}: expected fd:N, a pipe c2 passed in")
    fd = int(arg[3:])
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


def main(tests, workspace, out, budget_s):
    _protect()
    out_fd, tests_fd = _passed_fd(out), _passed_fd(tests)
    deadline = time.monotonic() + float(budget_s)
    # Forked before the tests are read: no worker can find them in memory it inherited.
    factory = _Factory(workspace, (out_fd, tests_fd), deadline)
    worker = Worker(factory, deadline)
    try:
        worker._start()
        finder = _TestsFinder(_read_tests(tests_fd, deadline))
    except (WorkerError, EOFError, TimeoutError, OverflowError, ValueError, SyntaxError) as e:
        _emit(out_fd, "note", f"the grading did not start: {type(e).__name__}: {e}"[:_MAX_TEXT])
        _emit(out_fd, "end", 3)
        return
    sys.meta_path.insert(sys.meta_path.index(_PATH_FINDER), finder)
    sys.meta_path.append(_WorkspaceFinder(worker))
    root = _TESTS_ROOT
    tests, collect_errors = [], 0
    for path in _test_files(finder.files):  # collect everything first, as pytest does
        rel = path[len(root) :]
        start = len(worker.events)
        try:
            if path.endswith("/conftest.py"):
                raise ImportError("conftest.py is not supported")
            module = _import(finder, path)
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
    factory.close()
    _emit(out_fd, "end", 2 if collect_errors else int(failed))


_PRCTL = None
_BASE_MODULES = set(sys.modules)
_BASE_META_PATH = list(sys.meta_path)
_BASE_PATH = list(sys.path)
_PATH_FINDER = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")

if __name__ == "__main__":
    main(*sys.argv[1:5])
