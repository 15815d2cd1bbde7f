"""The "functions" grader's runner: plain pytest-style tests without pytest (~40 ms, not ~0.4 s).

Not imported by c2: grading.py mounts this file into the grading sandbox and runs

    python -I -S -B grading_runner.py TESTS_DIR WORKSPACE OUT_JSON

It writes the JSON the pytest plugin (grading_plugin.py) writes, with the same test ids
("tests/test_x.py::test_y", relative to TESTS_DIR's parent) and the same rules where they
overlap: test_*.py and *_test.py files under TESTS_DIR in sorted order, each imported as its
basename with its directory first on sys.path (pytest's "prepend" mode) and the workspace LAST
(no workspace file can shadow the standard library or this runner's imports). An import error
is a collection error of that file, and then, as in pytest, no test runs at all. Every
module-level function named test* is called: returning passes; raising (AssertionError,
SystemExit, ...) fails; a test that needs arguments fails (pytest: fixture not found), so does
an `async def`. Not supported: fixtures, classes, parametrize, marks, pytest itself (-S: no
site-packages, unless the task names an environment); a conftest.py is reported as a collection
error rather than silently ignored.
"""

import os
import sys


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


def _json_str(s):
    bad = '"\\'
    return (
        '"'
        + "".join(
            c if c >= " " and c not in bad and not "\ud800" <= c <= "\udfff" else f"\\u{ord(c):04x}"
            for c in s
        )
        + '"'
    )


_FUNCTION = type(_import)
# Code flags (inspect's CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR): importing inspect
# would cost more than running the tests.
_NOT_PLAIN = 0x20 | 0x80 | 0x200


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


def main(tests_dir, workspace, out):
    root = os.path.dirname(os.path.abspath(tests_dir).rstrip("/"))
    sys.path.append(workspace)
    tests, outcomes, collect_errors = [], {}, []
    for path in _test_files(tests_dir):  # collect everything first, as pytest does
        rel = os.path.relpath(path, root)
        try:
            if os.path.basename(path) == "conftest.py":
                raise ImportError("conftest.py is not supported")
            module = _import(path)
        except BaseException:
            collect_errors.append(rel)
            continue
        for name, obj in list(vars(module).items()):
            if name.startswith("test") and type(obj) is _FUNCTION:
                tests.append((f"{rel}::{name}", obj))
    if not collect_errors:  # pytest runs nothing after a collection error
        try:
            for test_id, fn in tests:
                outcomes[test_id] = _outcome(fn)
        except KeyboardInterrupt:
            pass  # pytest, interrupted, also reports what ran so far
    status = 2 if collect_errors else int(any(v == "failed" for v in outcomes.values()))
    # JSON by hand: the json module (and the re it imports) would double the runner's start-up.
    pairs = ", ".join(f"{_json_str(k)}: {_json_str(v)}" for k, v in outcomes.items())
    errors = ", ".join(_json_str(e) for e in collect_errors)
    with open(out, "w", encoding="utf-8") as f:
        f.write(f'{{"outcomes": {{{pairs}}}, "collect_errors": [{errors}], "exit": {status}}}')


if __name__ == "__main__":
    main(*sys.argv[1:4])
