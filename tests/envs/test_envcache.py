"""Task environments: built once, hermetic (no c2 packages inside), rebuilt after a killed build."""

import json
import subprocess
import sys

import pytest

from c2.envs.envcache import EnvBuildError, ensure_env, env_python
from c2.envs.sandbox import Sandbox, SandboxError


def _local_package(tmp_path, name="c2_probe_pkg", version="0.3"):
    src = tmp_path / "src" / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
    )
    wheels = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-w", str(wheels), str(src)], check=True, capture_output=True)
    (wheel,) = wheels.glob("*.whl")
    return wheel


def test_env_holds_its_packages_and_not_c2s(tmp_path, sandbox: Sandbox):
    pkg = _local_package(tmp_path)
    root = ensure_env([str(pkg)], cache_dir=tmp_path / "cache", pip_args=["--no-index"])
    info = json.loads((root / "c2-env.json").read_text())
    assert any("c2_probe_pkg" in line.replace("-", "_") for line in info["installed"])
    # Built once: the same list (in any order, duplicated) finds the same root without pip.
    assert ensure_env([str(pkg), str(pkg)], cache_dir=tmp_path / "cache") == root

    work = tmp_path / "w"
    work.mkdir()
    sandbox.give_workspace(work)
    code = "import sys, c2_probe_pkg; print(c2_probe_pkg.VERSION, sys.prefix)"
    r = sandbox.run(["python", "-c", code], work, python_env=root)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == ["0.3", str(root.resolve())]
    for hidden in ("jax", "c2"):  # c2's own environment is not visible
        r = sandbox.run(["python", "-c", f"import {hidden}"], work, python_env=root)
        assert r.exit_code != 0 and "ModuleNotFoundError" in r.stderr
    r = sandbox.run(["python", "-c", "import jax"], work)  # without python_env: c2's, as before
    assert r.exit_code == 0, r.stderr


def test_localhost_resolves_in_the_sandbox(tmp_path, sandbox: Sandbox):
    if not sandbox.isolated:
        pytest.skip("the rlimit backend has the host's /etc/hosts")
    code = "import socket; print(socket.gethostbyname('localhost'))"
    r = sandbox.run([sys.executable, "-c", code], tmp_path, readonly=True)
    assert r.stdout.strip() == "127.0.0.1", r.stderr


def test_killed_build_is_rebuilt_and_bad_input_is_named(tmp_path):
    root = ensure_env([], cache_dir=tmp_path)
    assert env_python(root).exists()
    (root / "c2-env.json").unlink()  # as if killed before the marker was written
    (root / "debris").write_text("x")
    again = ensure_env([], cache_dir=tmp_path)
    assert again == root and not (root / "debris").exists() and (root / "c2-env.json").is_file()
    with pytest.raises(ValueError, match="'--index-url'"):
        ensure_env(["--index-url"], cache_dir=tmp_path)
    with pytest.raises(EnvBuildError, match="c2-no-such-package-xyz"):
        ensure_env(["c2-no-such-package-xyz==0.0.1"], cache_dir=tmp_path, pip_args=["--no-index"])
    assert not list(p for p in tmp_path.iterdir() if p.is_dir() and p != root)


def test_python_env_must_be_a_venv(tmp_path, sandbox: Sandbox):
    with pytest.raises(SandboxError, match="not a virtual environment"):
        sandbox.run(["true"], tmp_path, readonly=True, python_env=tmp_path)


def test_task_environment_reaches_tools_and_grading(tmp_path, sandbox: Sandbox, monkeypatch):
    from c2.envs.grading import run_hidden_tests
    from c2.envs.tasks import write_task
    from c2.envs.tools import ToolCall, Tools

    wheel = _local_package(tmp_path, version="1.7")
    cache = tmp_path / "cache"
    ensure_env([str(wheel)], cache_dir=cache, pip_args=["--no-index"])
    meta = {
        "task_id": "env-probe",
        "fail_to_pass": ["tests/test_probe.py::test_version"],
        "pass_to_pass": [],
        "difficulty": 1,
        "seed": 0,
        "source": "test",
        "grader": "functions",
        "environment": {"requirements": [str(wheel)]},
    }
    test = "import c2_probe_pkg, probe\n\ndef test_version():\n"
    test += "    assert probe.v() == c2_probe_pkg.VERSION\n"
    task = write_task(
        tmp_path / "task",
        instruction="make probe.v return the package version",
        metadata=meta,
        workspace={"probe.py": "def v():\n    return None\n"},
        tests={"test_probe.py": test},
        solution={"probe.py": "import c2_probe_pkg\n\ndef v():\n    return c2_probe_pkg.VERSION\n"},
    )
    monkeypatch.setenv("C2_ENV_CACHE", str(cache))  # the env built above, found by its key
    env = task.python_env()
    work = task.materialize(tmp_path / "ep")
    sandbox.give_workspace(work)
    tools = Tools(work, sandbox, python_env=env)
    r = tools(
        ToolCall("run", {"command": "python -c 'import c2_probe_pkg as p; print(p.VERSION)'"})
    )
    assert r.ok and "1.7" in r.content, r.content
    tr = run_hidden_tests(task, work, sandbox)
    assert tr.outcomes == {meta["fail_to_pass"][0]: "failed"}, (tr.error, tr.sandbox)
    (work / "probe.py").write_text((task.solution_dir / "probe.py").read_text())
    assert run_hidden_tests(task, work, sandbox).outcomes == {meta["fail_to_pass"][0]: "passed"}
    bad = {**meta, "environment": {"requirements": "toolz"}}
    with pytest.raises(ValueError, match="metadata\\['environment'\\]"):
        write_task(tmp_path / "bad", instruction="x", metadata=bad, workspace={}, tests={})
