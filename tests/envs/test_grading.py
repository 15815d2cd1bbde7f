"""Grading dimensions: correctness details, code quality (new ruff findings), harbor rewards."""

import dataclasses
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from c2.envs.grading import _harbor_reward, changed_files, code_quality, grade, pytest_outcomes
from c2.envs.grading_channel import ResultsChannel
from c2.envs.sandbox import SandboxError, SandboxLimits
from c2.envs.tasks import write_task

TESTS = """from shop import price


def test_price():
    assert price(2, 3) == 6


def test_free():
    assert price(0, 3) == 0
"""


@pytest.fixture
def task(tmp_path):
    ok = "def price(n, each):\n    return n * each\n"
    return write_task(
        tmp_path / "task",
        instruction="price is wrong",
        metadata={
            "task_id": "shop",
            "fail_to_pass": ["tests/test_shop.py::test_price"],
            "pass_to_pass": ["tests/test_shop.py::test_free"],
            "difficulty": 1,
            "seed": 0,
            "source": "test",
        },
        workspace={"shop.py": ok.replace("n * each", "n + each - 3"), "README.md": "# shop\n"},
        tests={"test_shop.py": TESTS},
        solution={"shop.py": ok},
    )


def _final(task, tmp_path, sandbox, files):
    ws = tmp_path / "final"
    shutil.copytree(task.workspace_dir, ws)
    for rel, text in files.items():
        (ws / rel).write_text(text)
    sandbox.give_workspace(ws)
    return ws


def test_correct_fix_with_new_lint_findings(task, tmp_path, sandbox):
    sloppy = "import os\n\n\ndef price(n, each):\n    unused = 1\n    return n * each\n"
    ws = _final(task, tmp_path, sandbox, {"shop.py": sloppy, "extra.py": "import sys\n"})
    g = grade(task, ws, sandbox)
    assert g.passed and g.failure_reason is None
    assert g.correctness["fail_to_pass"] == {"tests/test_shop.py::test_price": True}
    assert g.quality["changed_py_files"] == ["extra.py", "shop.py"]
    assert g.quality["new_findings_by_rule"] == {"F401": 2, "F841": 1}
    assert g.quality["new_findings"] == 3
    assert g.efficiency["model_tokens"] is None and g.interaction["final_message"] is False


def test_fixing_a_finding_is_not_a_new_one(task, tmp_path, sandbox):
    ws = _final(task, tmp_path, sandbox, {})
    (task.workspace_dir / "shop.py").write_text(
        "import os\n" + (task.workspace_dir / "shop.py").read_text()
    )
    assert code_quality(task.workspace_dir, ws)["new_findings"] == 0


def test_broken_p2p_and_failure_reason(task, tmp_path, sandbox):
    ws = _final(task, tmp_path, sandbox, {"shop.py": "def price(n, each):\n    return 6\n"})
    g = grade(task, ws, sandbox)
    assert not g.passed
    assert g.correctness["f2p_passed"] == 1 and g.correctness["p2p_passed"] == 0
    assert g.failure_reason == "pass_to_pass broken: tests/test_shop.py::test_free"


def test_import_error_means_every_test_fails(task, tmp_path, sandbox):
    ws = _final(task, tmp_path, sandbox, {"shop.py": "def price(:\n"})
    g = grade(task, ws, sandbox)
    assert not g.passed and g.correctness["p2p_passed"] == 0
    assert "collection errors" in g.failure_reason


def test_hanging_code_is_stopped_and_reported(task, tmp_path, sandbox):
    ws = _final(
        task, tmp_path, sandbox, {"shop.py": "def price(n, each):\n    while True:\n        pass\n"}
    )
    run = pytest_outcomes(task.tests_dir, ws, sandbox, limits=SandboxLimits(timeout_s=3))
    assert "limit wall_time" in run.error and not any(v == "passed" for v in run.outcomes.values())


FORGER = """import json, os
ids = ["tests/test_shop.py::test_price", "tests/test_shop.py::test_free"]
for path in (os.environ.get("C2_GRADING_OUT", ""), "/grading/out/results.json"):
    try:
        json.dump({"outcomes": {i: "passed" for i in ids}, "collect_errors": []}, open(path, "w"))
    except OSError:
        pass
"""


def test_workspace_files_cannot_shadow_pytest(task, tmp_path, sandbox):
    # A pytest.py (or a package named like a pytest plugin) in the workspace that would forge
    # the results if Python imported it instead of the real pytest.
    files = {"pytest.py": FORGER, "grading_plugin.py": FORGER, "conftest.py": FORGER}
    ws = _final(task, tmp_path, sandbox, files)
    g = grade(task, ws, sandbox)
    assert not g.passed and g.correctness["f2p_passed"] == 0
    assert g.correctness["tests_error"] is None  # the real pytest ran and reported


def test_changed_files_never_follow_symlinks(task, tmp_path, sandbox):
    ws = _final(task, tmp_path, sandbox, {})
    outside = tmp_path / "outside.py"
    outside.write_text("import os\n")
    os.symlink(outside, ws / "sneaky.py")
    assert changed_files(task.workspace_dir, ws) == []


def test_harbor_reward_files(tmp_path):
    assert _harbor_reward(tmp_path) is None
    (tmp_path / "reward.json").write_text('{"reward": 0.5, "other": 1}')
    assert _harbor_reward(tmp_path) == 0.5
    (tmp_path / "reward.json").write_text('{"accuracy": 1}')
    assert _harbor_reward(tmp_path) == 1.0
    (tmp_path / "reward.json").write_text("[not a reward]")
    assert _harbor_reward(tmp_path) is None
    (tmp_path / "reward.txt").write_text("1\n")
    assert _harbor_reward(tmp_path) == 1.0
    (tmp_path / "reward.txt").write_text("lots\n")
    assert _harbor_reward(tmp_path) is None


def test_a_limit_hit_during_the_episode_fails_a_correct_fix(task, tmp_path, sandbox):
    ws = _final(task, tmp_path, sandbox, {"shop.py": "def price(n, each):\n    return n * each\n"})
    ok = sandbox.run("true", ws)
    flood = dataclasses.replace(ok, limit="processes", limits_hit=["processes"])
    episode = types.SimpleNamespace(
        episode_id="e", sandbox_results=[ok, flood], model_tokens=1, turns=1, tool_calls=2,
        wall_s=0.1, final_message="done", submitted=True, invalid_tool_calls=0, tool_errors=0,
        stop_reason="submit",
    )  # fmt: skip
    assert grade(task, ws, sandbox).passed  # the fix itself is correct
    g = grade(task, ws, sandbox, episode)
    assert not g.passed and all(g.correctness["fail_to_pass"].values())
    assert g.failure_reason == "sandbox limit hit during the episode: processes"
    assert g.interaction["sandbox_limits_hit"] == ["processes"]


def test_a_sandbox_that_cannot_pass_descriptors_is_refused_naming_it():
    """docker cannot pass the grading pipes: grading refuses it rather than read outcomes back
    from a file the tested code could rewrite."""
    docker = types.SimpleNamespace(passes_fds=False)
    docker.isolation = types.SimpleNamespace(describe=lambda: "d c")
    with pytest.raises(SandboxError, match=r"grading over d c needs a sandbox that passes"):
        ResultsChannel(docker)


def test_the_runner_bytecode_a_process_compiles_is_removed_when_it_exits():
    """Each grading process compiles the runner once into a scratch directory: gone at exit (a
    long run's workers must not leave one directory each behind in /tmp)."""
    code = "from c2.envs import grading; print(grading._runner_files()[1][0])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    pyc = Path(out.stdout.strip())
    assert pyc.name.startswith("grading_runner.") and pyc.parent.name.startswith("c2-runner-")
    assert not pyc.parent.exists()
