"""The test harness (tests/conftest.py): a test whose xdist worker dies of a signal runs once more
in a fresh worker, the dead worker's stacks are printed, and a test that kills its second worker
too fails; the modules slowest in tests/durations.txt are collected first."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

CRASHING_TESTS = """
import os
import signal
from pathlib import Path


def test_crashes_once():
    flag = Path(os.environ["C2_CRASH_FLAG"])
    if not flag.exists():
        flag.write_text("crashed")
        os.kill(os.getpid(), signal.SIGSEGV)


def test_crashes_always():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_passes():
    pass
"""


def test_a_crashed_test_reruns_once_in_a_fresh_worker_and_its_stacks_are_printed(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(Path(__file__).parent / "conftest.py", tests / "conftest.py")
    (tests / "test_crashing.py").write_text(CRASHING_TESTS)
    env = dict(os.environ, C2_CRASH_FLAG=str(tmp_path / "flag"), JAX_COMPILATION_CACHE_DIR="")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(
        [*cmd, "-n", "2", "--dist", "worksteal"],  # as `make test` runs
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 2 passed, 2 rerun" in out, out
    assert "FAILED tests/test_crashing.py::test_crashes_always" in out, out
    assert "(twice, in two workers)" in out, out
    # each crash's worker stacks: the faulthandler dump names the signal and the test's line
    for name in ("test_crashes_once", "test_crashes_always"):
        assert f"worker crashed in tests/test_crashing.py::{name}" in out, out
    assert out.count("Fatal Python error: Segmentation fault") >= 3, out
    assert 'test_crashing.py", line 11 in test_crashes_once' in out, out


DURATIONS = """
============================= slowest 25 durations =============================
90.00s call     tests/test_c.py::test_one[x]
15.00s setup    tests/test_a.py::test_two
10.00s call     tests/test_a.py::test_one
20.00s call     tests/test_b.py::test_one
(2 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_modules_slowest_in_the_durations_file_are_collected_first_and_kept_together(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(Path(__file__).parent / "conftest.py", tests / "conftest.py")
    (tests / "durations.txt").write_text(DURATIONS)
    for name in "abcd":  # d: not in the file
        body = "def test_one(): pass\n\n\ndef test_two(): pass\n"
        (tests / f"test_{name}.py").write_text(body)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(
        [*cmd, "--collect-only", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    # c 90 s, a 25 s (setup and call), b 20 s, then d; each module's tests in file order
    assert ids == [f"tests/test_{m}.py::test_{n}" for m in "cabd" for n in ("one", "two")]
