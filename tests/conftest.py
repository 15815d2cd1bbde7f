"""Every test sees 8 simulated CPU devices and shares one compilation cache; this must run before
jax is imported anywhere. A pytest-xdist worker that dies in native code has its test run once
more in a fresh worker, with the dead worker's stacks printed (see `pytest_handlecrashitem`)."""

import collections
import faulthandler
import os
import re
from pathlib import Path

# LLVM's optimisation level 0 for XLA:CPU's generated code: tests are compile-bound on 2 cores
# (compiling tiny programs, running them briefly), and -O0 runs them 1.4-1.6x faster (the suite:
# 49 -> 40 min on the 2-core AMD machine, a 4-minute test added); the tests
# compare programs compiled the same way, or against references with tolerances.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
# One persistent compilation cache for the whole run, its xdist workers and the subprocesses the
# tests start (they inherit the environment): many tests compile the same tiny models' programs,
# and on 2 CPU cores compiling is most of their time. Entries are keyed by the program's HLO, the
# compile options, XLA flags and the jax/jaxlib versions, so a kept cache (`make test` again) only
# skips identical compiles. `JAX_COMPILATION_CACHE_DIR=` (empty) turns it off.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).parents[1] / ".cache" / "jax-tests")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    _slowest_modules_first(items)
    if jax.default_backend() == "gpu":
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# The xdist schedule (`make test`: -n 2 --dist worksteal): the modules whose tests took longest in
# the last CI run go first, so that a run ends on short tests on both workers instead of one
# worker running a 4-minute test alone; worksteal hands a worker that runs dry the back half of
# the other's queue. A module's tests stay together and in order (its module fixtures are built
# once per worker); modules not in the file keep their order after the known ones. The file holds
# the `slowest durations` lines of a CI log (`--durations`), pasted as pytest prints them.
DURATIONS = Path(__file__).parent / "durations.txt"
_DURATION_LINE = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(\S+)")


def known_seconds(text: str) -> dict[str, float]:
    """Seconds per test module in `--durations` lines (setup, call and teardown summed)."""
    seconds = collections.Counter()
    for line in text.splitlines():
        if m := _DURATION_LINE.match(line):
            seconds[m[2].split("::")[0]] += float(m[1])
    return dict(seconds)


def _slowest_modules_first(items) -> None:
    seconds = known_seconds(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable


# A worker killed by a signal. jaxlib 0.10's XLA:CPU registers its JIT-compiled kernels' unwind
# tables with libgcc (`__register_frame`); now and then the table of a freed executable is still
# registered, and the next C++ exception anywhere in the process (jaxlib throws one at the end of
# every iteration over a device list) segfaults in libgcc's unwinder. Which test it hits depends
# on what the worker compiled and freed before, not on the test (4 of 6 CI runs lost a worker in
# tests/rl/test_step.py, late in the run; it passes alone): so a crashed test runs once more in a
# fresh worker, and the dead worker's Python stacks (faulthandler, every thread) are printed at the
# end of the run.
# A test that crashes its fresh worker too fails. Without xdist a crash ends the run as usual.
FAULT_DIR = Path(__file__).parents[1] / ".cache" / "pytest-faults"
_crashes = {}  # nodeid -> the worker stacks of each crash, for the terminal summary


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler, which writes to stderr
def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # xdist workers' stderr does not reach the run's output: write to a file
        FAULT_DIR.mkdir(parents=True, exist_ok=True)
        config._c2_fault_log = open(FAULT_DIR / f"{worker}.log", "w")  # noqa: SIM115
        faulthandler.enable(config._c2_fault_log, all_threads=True)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    log = FAULT_DIR / f"{report.node.gateway.id}.log"
    stacks = log.read_text(errors="replace") if log.exists() else "(no faulthandler output)"
    first = crashitem not in _crashes
    _crashes.setdefault(crashitem, []).append(f"{report.node.gateway.id}:\n{stacks}")
    if first:
        sched.mark_test_pending(crashitem)
        report.outcome = "rerun"
    else:
        report.longrepr = f"{report.longrepr} (twice, in two workers)\n{stacks}"


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})


def pytest_terminal_summary(terminalreporter):
    for nodeid, dumps in _crashes.items():
        terminalreporter.section(f"worker crashed in {nodeid}", sep="-", yellow=True)
        for dump in dumps:
            terminalreporter.write_line(dump)
