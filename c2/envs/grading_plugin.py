"""pytest plugin loaded inside the grading sandbox: writes each test's outcome as JSON.

Not imported by c2: grading.py mounts this file into the sandbox and runs
`python -P -m pytest -p grading_plugin`. The workspace goes at the END of sys.path, so a file in
it cannot shadow pytest or the standard library.
"""

import json
import os
import sys

sys.path.append(os.environ.get("C2_WORKSPACE", "/workspace"))
_OUT = os.environ.get("C2_GRADING_OUT", "/grading/out/results.json")
_outcomes: dict[str, str] = {}
_collect_errors: list[str] = []


def pytest_runtest_logreport(report):
    # A test passes only if setup, call and teardown all pass; the first failure sticks.
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.nodeid not in _outcomes:
        _outcomes[report.nodeid] = "passed"


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid or "<collection>")


def pytest_sessionfinish(session, exitstatus):
    with open(_OUT, "w") as f:
        json.dump(
            {"outcomes": _outcomes, "collect_errors": _collect_errors, "exit": int(exitstatus)}, f
        )
