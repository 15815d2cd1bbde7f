"""The task format, the Harbor/Terminal-Bench importer and the HumanEval source."""

import json
import re

import pytest

from c2.envs.agents import noop_policy, oracle_policy
from c2.envs.evaluate import evaluate
from c2.envs.sources import import_humaneval
from c2.envs.tasks import load_task, load_tasks, write_task

META = {
    "task_id": "t",
    "fail_to_pass": ["tests/test_a.py::test_x"],
    "pass_to_pass": [],
    "difficulty": 1,
    "seed": 3,
    "source": "test",
}


def test_roundtrip(tmp_path):
    t = write_task(
        tmp_path / "t",
        instruction="Do it.",
        metadata={**META, "extra": [1, 2]},
        workspace={"a.py": "x = 1\n", "pkg/b.py": b"y = 2\n"},
        tests={"test_a.py": "def test_x():\n    pass\n"},
        solution={"a.py": "x = 2\n"},
    )
    again = load_task(tmp_path / "t")
    assert again.metadata == t.metadata and again.metadata["extra"] == [1, 2]
    assert again.instruction == "Do it.\n" and again.grader == "pytest"
    assert again.mount_at == "/workspace" and again.fail_to_pass == ["tests/test_a.py::test_x"]
    assert (again.workspace_dir / "pkg/b.py").read_text() == "y = 2\n"
    assert [x.task_id for x in load_tasks(tmp_path)] == ["t"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": None}, "missing ['seed']"),
        ({"fail_to_pass": []}, "['fail_to_pass'] is empty"),
        ({"pass_to_pass": "tests/x"}, "expected a list of test ids"),
        ({"grader": "docker"}, "grader']='docker'"),
        ({"mount_at": "/usr"}, "mount_at']='/usr': expected an absolute path outside"),
        ({"mount_at": "app"}, "mount_at']='app'"),
    ],
)
def test_metadata_validation(tmp_path, change, message):
    meta = {k: v for k, v in {**META, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(message)):
        write_task(tmp_path / "t", instruction="i", metadata=meta, workspace={}, tests={})


def test_bad_paths_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="plain relative path"):
        write_task(
            tmp_path / "t", instruction="i", metadata=META, workspace={"../x": "y"}, tests={}
        )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metadata.json").write_text(json.dumps(META))
    with pytest.raises(FileNotFoundError, match="missing workspace"):
        load_task(tmp_path / "broken")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no task directories"):
        load_tasks(tmp_path / "empty")
    assert not (tmp_path / "t").exists()  # a refused task leaves nothing behind


def test_humaneval_source(tmp_path, sandbox):
    tasks = import_humaneval(tmp_path, limit=3)
    assert [t.task_id for t in tasks] == ["humaneval-000", "humaneval-001", "humaneval-002"]
    t = tasks[0]
    assert t.metadata["origin"] == "HumanEval/0"
    assert "has_close_elements" in t.instruction and len(t.instruction) < 400
    assert (t.workspace_dir / "solution.py").read_text().endswith("    pass\n")
    oracle = evaluate(tasks, oracle_policy, sandbox=sandbox, workers=2)
    noop = evaluate(tasks, noop_policy, sandbox=sandbox, workers=2)
    assert [r.passed for r in oracle] == [True] * 3
    assert [r.passed for r in noop] == [False] * 3
