"""pytest plugin loaded inside the grading sandbox: sends each test's outcome to the trusted
parent (grading_pytest.py), keyed.

Not imported by c2: the parent runs `python -P -m pytest -p grading_plugin`. On import, before
any test module, the plugin reads the parent's random key from a pipe and closes it, takes the
two descriptor numbers out of the environment, and keeps the key only inside the closure of its
hooks. A test is "passed" only if the test function returned from a call this plugin made itself
(a tryfirst pytest_pyfunc_call) and no setup, call or teardown report failed: patching pytest's
runner or its reports can turn a failure into "never reported" (= failed), not into a pass.
Each message is one line, the key then the fields hex-encoded (str.encode and bytes.hex: no
patchable module sits between a verdict and the pipe). The workspace goes at the END of
sys.path, so a file in it cannot shadow pytest or the standard library.
"""

import contextlib
import inspect
import os
import sys

import pytest

sys.path.append(os.environ.get("C2_WORKSPACE", "/workspace"))


def _hooks():
    try:
        out_fd = int(os.environ.pop("C2_GRADING_OUT_FD"))
        key_fd = int(os.environ.pop("C2_GRADING_KEY_FD"))
    except (KeyError, ValueError):
        raise RuntimeError("grading_plugin runs only under c2's grading_pytest.py") from None
    prefix = os.read(key_fd, 64) + b" "  # written whole before pytest started
    os.close(key_fd)
    os.set_inheritable(out_fd, False)
    write = os.write

    def send(*fields):
        line = b" ".join(f.encode("utf-8", "surrogatepass").hex().encode() for f in fields)
        with contextlib.suppress(OSError):
            write(out_fd, prefix + line + b"\n")

    collected, returned, failed, skipped = {}, set(), set(), set()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(session, config, items):
        for item in items:
            collected[item.nodeid] = item

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(pyfuncitem):
        fn = pyfuncitem.obj
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            return None  # pytest (or an async plugin) runs it; it is never counted as passed
        result = fn(**{a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames})
        if hasattr(result, "__await__") or hasattr(result, "__aiter__"):
            pytest.fail(f"{pyfuncitem.nodeid}: async test without an async plugin")
        if collected.get(pyfuncitem.nodeid) is pyfuncitem:
            returned.add(pyfuncitem.nodeid)
        return True

    def pytest_runtest_logreport(report):
        nodeid = report.nodeid
        if report.failed:
            failed.add(nodeid)
        elif report.skipped:
            skipped.add(nodeid)
        if report.when == "teardown":
            outcome = "passed" if nodeid in returned else "failed"
            if nodeid in failed:
                outcome = "failed"
            elif outcome == "failed" and nodeid in skipped:
                outcome = "skipped"
            send("outcome", nodeid, outcome)

    def pytest_collectreport(report):
        if report.failed:
            send("collect_error", report.nodeid or "<collection>")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(session, exitstatus):
        send("end", str(int(exitstatus)))

    return {
        "pytest_collection_modifyitems": pytest_collection_modifyitems,
        "pytest_pyfunc_call": pytest_pyfunc_call,
        "pytest_runtest_logreport": pytest_runtest_logreport,
        "pytest_collectreport": pytest_collectreport,
        "pytest_sessionfinish": pytest_sessionfinish,
    }


globals().update(_hooks())
