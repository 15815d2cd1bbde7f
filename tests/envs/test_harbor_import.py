"""Harbor / Terminal-Bench 2 import: the standard test setup, COPY / RUN, refusals with reasons,
task.toml limits, a batch that survives a broken task, idempotent re-import.

The tasks are small synthetic ones in the shapes of the public Terminal-Bench 2 set (the uv
installer boilerplate, `COPY file /app`, `COPY file .`, RUN lines shlex cannot split, pip lines);
their environment is built offline from a local wheel in place of the package index.
"""

import json
import subprocess
import sys

import pytest

from c2.envs.agents import noop_policy, oracle_policy
from c2.envs.envcache import ensure_env
from c2.envs.evaluate import evaluate
from c2.envs.harbor_import import (
    UnsupportedTask,
    classify,
    import_harbor,
    import_harbor_tasks,
    plan_dockerfile,
    report,
    rewrite_test_sh,
    split_shell,
)
from c2.envs.sandbox import SandboxLimits

# Harbor's standard test.sh, as 82 of the 89 Terminal-Bench 2 tasks have it.
STANDARD_TEST_SH = """#!/bin/bash

# Install curl
apt-get update
apt-get install -y curl

# Install uv
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh

source $HOME/.local/bin/env

# Check if we're in a valid working directory
if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile."
    exit 1
fi

uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  -w numpy==2.3.3 \\
  -w pytest-json-ctrf==0.3.5 \\
  pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA


if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def test_standard_test_setup_becomes_pytest_from_the_task_environment():
    script, reqs, apt = rewrite_test_sh(STANDARD_TEST_SH, have=lambda p: p == "curl")
    assert reqs == ["pytest==8.4.1", "numpy==2.3.3", "pytest-json-ctrf==0.3.5"]
    assert apt == ["curl"]
    for gone in ("apt-get", "astral.sh", "uvx", ".local/bin/env"):
        assert gone not in script
    lines = script.splitlines()
    i = lines.index("pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA")
    assert [x for x in lines[i + 1 :] if x.strip()][0] == "if [ $? -eq 0 ]; then"
    assert 'if [ "$PWD" = "/" ]; then' in lines
    # The pip variant (7 tasks), including --break-system-packages.
    pip_sh = "#!/bin/bash\npip install pytest==8.4.1 pytest-json-ctrf==0.3.5"
    pip_sh += " --break-system-packages\npython -m pytest /tests/test_outputs.py -rA\n"
    script, reqs, _ = rewrite_test_sh(pip_sh, have=lambda p: True)
    assert reqs == ["pytest==8.4.1", "pytest-json-ctrf==0.3.5"]
    assert script.splitlines()[1:] == ["python -m pytest /tests/test_outputs.py -rA"]
    # apt packages this machine lacks are named.
    with pytest.raises(UnsupportedTask, match="lacks: primer3") as e:
        rewrite_test_sh("apt-get install -y curl primer3\n", have=lambda p: p == "curl")
    assert e.value.reason == "apt"


def test_shell_splitting_never_crashes():
    assert split_shell("a && b 'x && y'; c") == [("a", ""), ("b 'x && y'", "&&"), ("c", ";")]
    # An apostrophe shlex cannot close (a sed script spread over continued lines).
    assert classify("""sed -i "/UI/a var x = 'wss:" /usr/share/x.js""", "RUN") == ("keep", [])
    assert split_shell('echo "it\'s && fine" && rm x') == [
        ('echo "it\'s && fine"', ""),
        ("rm x", "&&"),
    ]
    assert classify("DEBIAN_FRONTEND=noninteractive apt-get install -y -q git=1:2.39", "x") == (
        "apt",
        ["git"],
    )
    assert classify("pip3 install --no-cache-dir numpy==2.3.0 --upgrade pip==25.2", "x") == (
        "pip",
        ["numpy==2.3.0"],
    )
    assert classify("rm -rf /var/lib/apt/lists/*", "x") == ("drop", [])
    with pytest.raises(UnsupportedTask, match="downloads") as e:
        classify("curl https://example.com/x > y", "x")
    assert e.value.reason == "download"


def _wheel(tmp_path):
    """A local wheel standing in for the package index (the tests run offline)."""
    src = tmp_path / "pkgsrc"
    (src / "c2_tb_probe").mkdir(parents=True)
    (src / "c2_tb_probe" / "__init__.py").write_text("WORD = 'hello'\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "c2_tb_probe"\nversion = "1.0"\n'
    )
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-w", str(tmp_path / "wheels"), str(src)], check=True)
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    return wheel


@pytest.fixture
def offline_env(tmp_path):
    """env_builder: records the requirements asked for and builds the local wheel's env."""
    wheel = _wheel(tmp_path)
    asked = []

    def build(reqs):
        asked.append(list(reqs))
        return ensure_env([str(wheel)], cache_dir=tmp_path / "envs", pip_args=["--no-index"])

    build.asked = asked
    return build


DOCKERFILE = """FROM python:3.13-slim-bookworm
WORKDIR /app
RUN apt-get update && apt-get install -y \\
    git \\
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir toolz==1.0.0 --break-system-packages
COPY greet.py /app
COPY word.txt .
COPY data/ /app/data/
# A build step run offline in the sandbox, with quotes shlex alone cannot split.
RUN echo "it's built" > built.txt && python3 -c 'import c2_tb_probe' \\
    && mkdir -p out
"""

TEST_SH = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  python /tests/check.py


if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

CHECK_PY = """import sys, subprocess
out = subprocess.run(["python3", "greet.py"], capture_output=True, text=True).stdout.strip()
try:
    import jax  # c2's own environment must not be visible
    sys.exit("c2's environment leaked")
except ImportError:
    pass
sys.exit(0 if out == open("word.txt").read().strip() and open("built.txt").read() else 1)
"""


def _task_dir(root, dockerfile=DOCKERFILE, test_sh=TEST_SH, toml_extra=""):
    (root / "environment" / "data").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "instruction.md").write_text("Make greet.py print the word in word.txt.\n")
    (root / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ndifficulty = "easy"\ncategory = "demo"\n'
        "[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 300.0\n"
        '[environment]\nbuild_timeout_sec = 60.0\ncpus = 2\nmemory = "4G"\nstorage = "10G"\n'
        + toml_extra
    )
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    (root / "environment" / "greet.py").write_text("print('bye')\n")
    (root / "environment" / "word.txt").write_text("hello\n")
    (root / "environment" / "data" / "d.txt").write_text("d\n")
    (root / "tests" / "test.sh").write_text(test_sh)
    (root / "tests" / "check.py").write_text(CHECK_PY)
    (root / "solution" / "solve.sh").write_text(
        "cat > /app/greet.py <<'EOF'\nprint(open('/app/word.txt').read().strip())\nEOF\n"
    )
    return root


def _have(p):
    return p in ("git", "curl")


def test_import_grade_oracle_and_noop(tmp_path, sandbox, offline_env):
    src = _task_dir(tmp_path / "src" / "greet")
    kw = {"sandbox": sandbox, "have": _have, "env_builder": offline_env}
    task = import_harbor(src, tmp_path / "tasks", **kw)
    assert task.task_id == "harbor-greet" and task.grader == "harbor" and task.mount_at == "/app"
    assert offline_env.asked == [["pytest==8.4.1", "toolz==1.0.0"]]
    assert task.requirements == ["pytest==8.4.1", "toolz==1.0.0"]
    ws = task.workspace_dir
    assert (ws / "greet.py").read_text() == "print('bye')\n"  # COPY file /app: into /app
    assert (ws / "word.txt").read_text() == "hello\n"  # COPY file .: into the workdir
    assert (ws / "data" / "d.txt").is_file()
    assert (ws / "built.txt").read_text() == "it's built\n" and (ws / "out").is_dir()
    assert "uvx" not in (task.tests_dir / "test.sh").read_text()
    assert (task.tests_dir / "test.sh.orig").read_text() == TEST_SH
    meta = task.metadata
    assert meta["test_timeout_s"] == 60.0 and meta["agent_timeout_s"] == 300.0
    limits = task.limits(SandboxLimits())
    assert (limits.memory_mb, limits.cpus, limits.max_workspace_mb) == (4096, 2.0, 10240)

    # The oracle passes and noop fails; the tests see the task's environment, not c2's.
    records = {
        agent.__name__: evaluate([task], agent, sandbox=sandbox, workers=1)[0]
        for agent in (oracle_policy, noop_policy)
    }
    assert records["oracle_policy"].passed, records["oracle_policy"].failure_reason
    assert not records["noop_policy"].passed


@pytest.mark.parametrize(
    "dockerfile, test_sh, reason, message",
    [
        ("FROM x\nWORKDIR /app\nCOPY greet.py /etc/\n", TEST_SH, "copy-outside-workdir", "/etc/"),
        ("FROM x\nWORKDIR /app\nCOPY big.bin /app/\n", TEST_SH, "copy-source-missing", "big.bin"),
        ("FROM x\nWORKDIR /app\nRUN curl -o a https://x/a\n", TEST_SH, "download", "curl"),
        ("FROM x\nWORKDIR /app\nRUN apt-get install -y cobol\n", TEST_SH, "apt", "lacks: cobol"),
        ("FROM x\nWORKDIR /app\nRUN pip install .\n", TEST_SH, "pip-local", "local path"),
        ("FROM x AS b\nFROM x\nWORKDIR /app\n", TEST_SH, "multi-stage", "multi-stage"),
        ("FROM x\nWORKDIR /app\n", "git clone https://x/y\n", "download", "test.sh line 1"),
        ("FROM x\nWORKDIR /app\n", "npm install left-pad\n", "other-installer", "npm"),
    ],
)
def test_refusals_name_their_reason(tmp_path, dockerfile, test_sh, reason, message):
    src = _task_dir(tmp_path / "src" / "t", dockerfile, test_sh)
    with pytest.raises(UnsupportedTask, match=message) as e:
        import_harbor(src, tmp_path / "tasks", have=_have, env_builder=lambda r: None)
    assert e.value.reason == reason
    assert not (tmp_path / "tasks").exists() or not any((tmp_path / "tasks").iterdir())


def test_unbalanced_quote_in_run_is_a_plan_not_a_crash(tmp_path):
    plan = plan_dockerfile(
        'FROM x\nWORKDIR /app\nRUN sed -i "/a/a \\\n  x = \'wss:" f.js && apt-get install -y git\n',
        tmp_path,
        have=_have,
    )
    assert plan.apt == ["git"] and plan.steps[0][1] == "run"


def test_batch_reports_skips_and_reimports_idempotently(
    tmp_path, sandbox, offline_env, monkeypatch
):
    good = _task_dir(tmp_path / "src" / "good")
    refused = _task_dir(tmp_path / "src" / "refused", dockerfile="FROM x\nCOPY a /etc/a\n")
    broken = _task_dir(tmp_path / "src" / "broken")
    (broken / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nRUN exit 3\n")
    out = tmp_path / "tasks"
    kw = {"sandbox": sandbox, "have": _have, "env_builder": offline_env, "log": lambda s: None}
    outcomes = import_harbor_tasks([tmp_path / "src"], out, **kw)
    by = {o.src.rsplit("/", 1)[1]: o for o in outcomes}
    assert by["good"].status == "imported"
    assert (by["refused"].status, by["refused"].reason) == ("refused", "copy-outside-workdir")
    assert (by["broken"].status, by["broken"].reason) == ("refused", "build-failed")
    assert "exit code 3" in by["broken"].detail
    assert sorted(p.name for p in out.iterdir()) == ["harbor-good"]  # no debris
    assert report(outcomes)["reasons"] == {"copy-outside-workdir": 1, "build-failed": 1}

    # Again into the same directory: nothing to redo, no FileExistsError.
    builds = len(offline_env.asked)
    again = import_harbor_tasks([good], out, **kw)
    assert again[0].status == "unchanged" and len(offline_env.asked) == builds
    # A changed source is imported again; one that is refused now is removed.
    (good / "environment" / "word.txt").write_text("hi\n")
    assert import_harbor_tasks([good], out, **kw)[0].status == "imported"
    assert (out / "harbor-good" / "workspace" / "word.txt").read_text() == "hi\n"
    (good / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nCOPY a /etc/a\n")
    assert import_harbor_tasks([good], out, **kw)[0].status == "refused"
    assert not (out / "harbor-good").exists()

    # An unexpected error in one task is reported with its traceback and the batch goes on.
    import c2.envs.harbor_import as hi

    def boom(*a, **k):
        raise IsADirectoryError("boom")

    monkeypatch.setattr(hi, "_copy_into", boom)
    (good / "environment" / "Dockerfile").write_text(DOCKERFILE)
    outcomes = import_harbor_tasks([good, refused], out, **kw)
    assert [o.status for o in outcomes] == ["error", "refused"]
    assert "IsADirectoryError: boom" in outcomes[0].detail
    assert list(out.iterdir()) == []


def test_cli_writes_a_report(tmp_path, monkeypatch):
    from c2.envs import sources

    _task_dir(tmp_path / "src" / "r", dockerfile="FROM x\nWORKDIR /app\nRUN wget x\n")
    assert sources.main(["harbor", "--out", str(tmp_path / "out"), str(tmp_path / "src")]) == 0
    rep = json.loads((tmp_path / "out" / "import-report.json").read_text())
    assert rep["tasks"] == 1 and rep["reasons"] == {"download": 1}
    assert rep["outcomes"][0]["detail"].startswith("Dockerfile line 3")
