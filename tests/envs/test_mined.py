"""Tasks mined from real packages (mined.py): a small local package for determinism, metadata,
validity and errors; toolz from PyPI for the oracle (passes), the no-op (fails) and a hostile
agent (contained)."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from c2.envs.agents import ScriptedPolicy, noop_policy, oracle_policy, tool_call
from c2.envs.episode import run_episode
from c2.envs.evaluate import evaluate
from c2.envs.grading import grade, run_hidden_tests
from c2.envs.mined import SourceError, generate_mined, lines_changed, load_source, stub_sites
from c2.envs.tasks import load_task

_STATS = '''"""Small statistics helpers."""


def mean(xs):
    """The arithmetic mean of a non-empty sequence."""
    total = 0
    for x in xs:
        total += x
    return total / len(xs)


def clamp(x, lo, hi):
    """x limited to the interval [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def running_max(xs):
    """The maximum of each prefix of xs."""
    out = []
    best = None
    for x in xs:
        if best is None or x > best:
            best = x
        out.append(best)
    return out
'''

_TEXT = '''"""Small text helpers."""


def words(s):
    """The whitespace-separated words of s, lower-cased."""
    parts = s.split()
    return [p.lower() for p in parts if p]


def initials(name):
    """The upper-cased first letters of each word of name."""
    letters = []
    for w in name.split():
        letters.append(w[0].upper())
    return "".join(letters)
'''

_TEST_STATS = """from ministats.stats import clamp, mean, running_max


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert clamp(-1, 0, 10) == 0
    assert clamp(11, 0, 10) == 10
    assert clamp(10, 0, 10) == 10


def test_running_max():
    assert running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]
"""

_TEST_TEXT = """from ministats.text import initials, words


def test_words():
    assert words("Hello  World a") == ["hello", "world", "a"]


def test_initials():
    assert initials("ada king lovelace") == "AKL"


def test_unrelated():
    assert 1 + 1 == 2
"""


def _local_package(root: Path, *, tests: bool = True, broken: bool = False) -> Path:
    (root / "src" / "ministats").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "ministats"\nversion = "0.3.1"\ndescription = "Tiny helpers"\n'
    )
    (root / "src" / "ministats" / "__init__.py").write_text('"""ministats."""\n')
    stats = _STATS.replace("return total / len(xs)", "return total") if broken else _STATS
    (root / "src" / "ministats" / "stats.py").write_text(stats)
    (root / "src" / "ministats" / "text.py").write_text(_TEXT)
    if tests:
        (root / "tests").mkdir()
        (root / "tests" / "test_stats.py").write_text(_TEST_STATS)
        (root / "tests" / "test_text.py").write_text(_TEST_TEXT)
    return root


def _tree(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def local_src(tmp_path_factory):
    return _local_package(tmp_path_factory.mktemp("src") / "ministats")


@pytest.fixture(scope="module")
def local_tasks(local_src, tmp_path_factory, sandbox):
    out = tmp_path_factory.mktemp("tasks") / "a"
    return generate_mined(
        str(local_src), out, n=3, seed=0, levels=["1", "2", "feature"], sandbox=sandbox
    )


def test_layout_of_a_src_package(local_src):
    src = load_source(str(local_src))
    assert (src.name, src.version, src.packages) == ("ministats", "0.3.1", ["ministats"])
    assert set(src.files) == {"ministats/__init__.py", "ministats/stats.py", "ministats/text.py"}
    assert set(src.tests) == {"test_stats.py", "test_text.py"}
    assert any(r.startswith("pytest==") for r in src.requirements)


def test_stub_sites_keep_signature_and_docstring():
    stubs = {m.function: m for m in stub_sites(_STATS, "ministats/stats.py")}
    assert set(stubs) == {"mean", "clamp", "running_max"}
    out = stubs["running_max"].apply(_STATS)
    assert '    """The maximum of each prefix of xs."""\n    raise NotImplementedError\n' in out
    assert "best" not in out.split("def running_max")[1]
    assert lines_changed(out, _STATS) == 8  # 7 lines removed, 1 added


def test_mined_tasks_metadata_and_validity(local_tasks, local_src, sandbox):
    assert [t.metadata["level"] for t in local_tasks] == ["1", "2", "feature"]
    for t in local_tasks:
        m = t.metadata
        assert m["source"] == f"dir:{local_src}" and m["package"] == "ministats"
        assert m["version"] == "0.3.1"
        assert m["symbols"] and all(s.startswith("ministats.") for s in m["symbols"])
        assert len(m["symbols"]) == {"1": 1, "2": 2, "feature": 1}[m["level"]]
        assert m["fail_to_pass"] and m["pass_to_pass"]
        assert not set(m["fail_to_pass"]) & set(m["pass_to_pass"])
        # The files holding a fail_to_pass test are hidden; the rest of the suite is visible.
        for hidden in m["hidden_test_files"]:
            assert not (t.workspace_dir / hidden).exists()
            assert (t.tests_dir / hidden[len("tests/") :]).is_file()
        assert (t.workspace_dir / "ministats" / "stats.py").is_file()  # src/ flattened
        assert m["environment"]["requirements"] and t.python_env() is not None
        assert m["solution_lines_changed"] >= 2
        assert "raise NotImplementedError" not in t.instruction or m["level"] != "1"
    feature = local_tasks[2]
    fn = feature.metadata["symbols"][0].rsplit(".", 1)[1]
    text = (feature.workspace_dir / feature.metadata["mutations"][0]["file"]).read_text()
    assert "raise NotImplementedError" in text.split(f"def {fn}(")[1].split("\ndef ")[0]
    # The hidden tests: fail_to_pass fails on the workspace as given and passes with the fix.
    for t in local_tasks[:2]:
        before = run_hidden_tests(t, t.workspace_dir, sandbox)
        assert not any(before.passed(x) for x in t.fail_to_pass)
        assert all(before.passed(x) for x in t.pass_to_pass)
        fixed = Path(str(t.root) + "-fixed")
        shutil.copytree(t.workspace_dir, fixed)
        for p in t.solution_dir.rglob("*.py"):
            shutil.copy(p, fixed / p.relative_to(t.solution_dir))
        after = run_hidden_tests(t, fixed, sandbox)
        assert all(after.passed(x) for x in t.fail_to_pass + t.pass_to_pass), after


def test_same_seed_same_tasks_other_seed_other_tasks(local_tasks, local_src, tmp_path, sandbox):
    root = local_tasks[0].root.parent
    again = generate_mined(
        str(local_src), tmp_path / "b", n=3, seed=0, levels=["1", "2", "feature"], sandbox=sandbox
    )
    assert [t.task_id for t in again] == [t.task_id for t in local_tasks]
    for t in again:
        assert _tree(t.root) == _tree(root / t.task_id)
    other = generate_mined(
        str(local_src), tmp_path / "c", n=3, seed=1, levels=["1", "2", "feature"], sandbox=sandbox
    )
    mutations = [json.dumps(t.metadata["mutations"]) for t in local_tasks]
    assert [json.dumps(t.metadata["mutations"]) for t in other] != mutations


def test_clear_errors_and_no_half_written_task(tmp_path, sandbox):
    with pytest.raises(SourceError, match="no such directory"):
        load_source(str(tmp_path / "missing"))
    with pytest.raises(SourceError, match="pypi:NAME==VERSION"):
        load_source("pypi:toolz")
    no_tests = _local_package(tmp_path / "nt", tests=False)
    with pytest.raises(SourceError, match="no tests found"):
        load_source(str(no_tests))
    broken = _local_package(tmp_path / "br", broken=True)
    (broken / "tests" / "test_text.py").write_text("def test_a():\n    assert False\n")
    out = tmp_path / "out"
    with pytest.raises(SourceError, match="fail before any change"):
        generate_mined(str(broken), out, n=1, seed=0, sandbox=sandbox)
    assert not out.exists() or not list(out.iterdir())
    # The CLI says what was wrong and exits 2.
    cmd = [sys.executable, "-m", "c2.envs.generate", "--source", str(no_tests), "--out", str(out)]
    p = subprocess.run([*cmd, "--n", "1"], capture_output=True, text=True)
    assert p.returncode == 2 and "no tests found" in p.stderr


def test_a_missing_pypi_version_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match=r"pypi:toolz==0\.0\.0\.1.*no source distribution"):
        load_source("pypi:toolz==0.0.0.1", cache_dir=tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing half-unpacked


@pytest.fixture(scope="module")
def toolz_tasks(tmp_path_factory, sandbox):
    out = tmp_path_factory.mktemp("toolz")
    tasks = generate_mined(
        "pypi:toolz==1.0.0", out, n=2, seed=0, levels=["1", "feature"], sandbox=sandbox
    )
    assert len(tasks) == 2
    return tasks


def test_pypi_tasks_oracle_passes_noop_fails(toolz_tasks, sandbox):
    for t in toolz_tasks:
        assert t.metadata["source"] == "pypi:toolz==1.0.0" and t.metadata["version"] == "1.0.0"
        assert all(s.startswith("toolz.") for s in t.metadata["symbols"])
    oracle = evaluate(toolz_tasks, oracle_policy, sandbox=sandbox, workers=2)
    assert [r.passed for r in oracle] == [True, True], [r.failure_reason for r in oracle]
    noop = evaluate(toolz_tasks, noop_policy, sandbox=sandbox, workers=2)
    assert [r.passed for r in noop] == [False, False]


def test_hostile_agent_in_a_mined_task_is_contained(toolz_tasks, sandbox, tmp_path):
    task = load_task(toolz_tasks[0].root)
    env = task.python_env()
    env_before, hidden_before = _tree(env), _tree(task.tests_dir)
    host_file = tmp_path / "host.txt"
    host_file.write_text("original\n")
    site = next(env.glob("lib/python*/site-packages"))
    plugin = "import pytest\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n"
    plugin += "    item.runtest = lambda: None\n"
    commands = [
        f"echo evil > {host_file}; cat {host_file}",
        # Plant a plugin in the task's (read-only) environment that passes every test.
        f"echo 'import os' > {site}/sitecustomize.py; mkdir -p $VIRTUAL_ENV/evil; "
        f"touch {site}/toolz.py",
        "rm -rf tests /grading ../tests; find / -name 'test_*.py' -delete 2>/dev/null; echo ok",
        f"python -c 'import sys; print(sys.prefix); import c2' 2>&1; ls {sys.prefix} 2>&1",
    ]
    policy = ScriptedPolicy(
        [tool_call("run", command=c) for c in commands]
        + [
            tool_call("write_file", path="conftest.py", content=plugin),
            tool_call("write_file", path="tests/conftest.py", content=plugin),
            tool_call("submit", message="done"),
        ]
    )
    ep = run_episode(task, policy, sandbox, tmp_path / "eps")
    g = grade(task, ep.workspace, sandbox, ep)
    assert not g.passed and "fail_to_pass still failing" in g.failure_reason
    assert g.correctness["p2p_passed"] == g.correctness["p2p_total"]
    assert host_file.read_text() == "original\n"
    assert _tree(env) == env_before and _tree(task.tests_dir) == hidden_before
    assert not (site / "sitecustomize.py").exists() and not (env / "evil").exists()
