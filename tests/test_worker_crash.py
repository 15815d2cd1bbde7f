"""The test harness (tests/conftest.py): a test whose xdist worker dies of a signal runs once more
in a fresh worker, the dead worker's stacks are printed, and a test that kills its second worker
too fails."""

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
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "tests"],
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
