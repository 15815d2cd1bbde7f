"""The "functions" grader's runner: plain pytest-style tests without pytest, sound by construction.

Not imported by c2: grading.py mounts this file and grading_worker.py, which it imports (the
factory, the workers, the wire between them and this process), with their bytecode (compiled
once per c2 process: compiling them costs more than running the tests) read-only into the
grading sandbox at /grading, and runs

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

Nor does this process ever load a module the sandbox could have written. Once grading_worker
(and through it every module the runner itself loads from a file) is imported, /grading leaves
sys.path and the path finder is replaced by one that refuses, as an ImportError with a note, a
module whose file (source, bytecode or extension) lies on a filesystem mounted writable: the
sandbox writes only such ones (the workspace, /tmp), while the interpreter, its packages and
the runner's own files are mounted read-only (bubblewrap; a container's grading has a read-only
root). So a module planted by workspace code (in /grading, in the standard library or its
__pycache__) for a hidden test to import later never runs here, and a hidden test cannot
import one from /tmp either. grading_pytest.py, importing this module, is sealed the same way.

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

import _signal as signal  # the signal module imports enum: 20 ms of start-up
import os
import sys
import time

from grading_worker import (
    _MAX_TEXT,
    _SIGNALS,
    Worker,
    WorkerError,
    _Factory,
    _is_plain,
    _literal,
    _prctl_dumpable,
    _recv,
)

_MAX_TESTS = 64 << 20  # bytes of the hidden tests, as sent
_TESTS_ROOT = "/grading/"  # test ids are relative to it; nothing is mounted at /grading/tests
_FUNCTION = type(lambda: None)
_ModuleSpec = type(sys.__spec__)  # importlib.machinery.ModuleSpec, without importing importlib
# Code flags (inspect's CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR): importing inspect
# would cost more than running the tests.
_NOT_PLAIN = 0x20 | 0x80 | 0x200


# ---------------------------------------------------------------- what the runner imports

_PATH_FINDER = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")


def _on_writable_fs(path):
    """Whether `path` (where it does not exist, the nearest existing directory above it) lies
    on a filesystem mounted writable."""
    while True:
        try:
            return not os.statvfs(path).f_flag & os.ST_RDONLY
        except OSError:
            if path in ("/", ""):
                return True
            path = path.rpartition("/")[0] or "/"


class _ReadOnlyPathFinder:
    """The path finder, in its place on sys.meta_path: a module whose file (source, bytecode or
    extension) lies on a filesystem mounted writable is an ImportError, never loaded. The
    sandbox writes only such filesystems (the workspace, /tmp), so nothing it planted (in
    /grading, in the standard library or its __pycache__, beside a package) runs here; an honest
    run loses nothing: its interpreter, its packages and /grading are mounted read-only."""

    refused = []  # "module: file", for the notes

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = _PATH_FINDER.find_spec(name, path, target)
        for file in (spec.origin if spec.has_location else None, spec.cached) if spec else ():
            if file and _on_writable_fs(file):
                cls.refused.append(f"{name}: {file}")
                raise ImportError(f"{name}: {file} is on a writable filesystem: not imported")
        return spec


def _seal_imports():
    """From here on, this process imports nothing the sandbox could have written: the runner's
    own directory leaves sys.path (it served its imports), every later import goes through
    _ReadOnlyPathFinder."""
    here = os.path.dirname(__file__)
    sys.path[:] = [p for p in sys.path if p != here]
    sys.path_importer_cache.pop(here, None)
    sys.meta_path[sys.meta_path.index(_PATH_FINDER)] = _ReadOnlyPathFinder


_seal_imports()


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
    sys.meta_path.insert(sys.meta_path.index(_ReadOnlyPathFinder), finder)
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
    for refused in _ReadOnlyPathFinder.refused[:3]:
        _emit(out_fd, "note", f"not imported, on a writable filesystem: {refused}"[:_MAX_TEXT])
    _emit(out_fd, "end", 2 if collect_errors else int(failed))


if __name__ == "__main__":
    main(*sys.argv[1:5])
