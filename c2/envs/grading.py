"""Multi-dimensional grading of one episode (docs/recipe.md §3): correctness (fail-to-pass and
pass-to-pass results of the hidden tests), code quality (new ruff findings in the changed files),
efficiency (tokens, tool calls, wall time) and interaction (a final message, invalid tool calls).

Hidden tests run in a sandbox over the final workspace, mounted read-only, with the pristine tests
from the task directory: whatever the agent did to its copy of the tests does not count. An
episode that ran into a sandbox limit (processes, memory, output, time, ...), in its own commands
or in the hidden tests' run, fails, with the limit named in failure_reason. Every process an
episode's command started is dead when the command returns (the sandbox's pid namespace and
cgroup), so nothing the agent left running reaches the grading.

Outcomes the workspace cannot forge: the verdict is decided and sent by a process that never runs
workspace code, over a pipe only it holds (grading_channel.py); nothing is read back from a file
the sandbox can write, and a test that never reports is failed, with the reason recorded.
- "functions" grader (grading_runner.py, grading_worker.py): sound by construction. The trusted
  runner runs the hidden tests and their assertions; workspace code runs in worker processes
  forked from a factory it forked first, reached through proxies that bring back only plain
  literal data.
  Exit hooks, signal handlers, monkeypatching, forked survivors, os._exit, a result whose
  __eq__ is always true: each only fails the test (a dead or hung worker fails the call it was
  in, named in failure_reason). The hidden tests reach the runner on a pipe, read after the
  factory was forked, and are mounted nowhere: no process running workspace code can read
  them (from files, /proc, or memory it inherited) to return the values they assert. Nor can
  it plant a module for the runner to import later (in /grading, in the standard library or its
  __pycache__): the runner loads no module from a filesystem mounted writable, and a
  container's grading has a read-only root (container_run.py).
- pytest grader (grading_pytest.py + grading_plugin.py): tests and tested code share pytest's
  process, so it cannot be sound in general. A trusted non-dumpable parent runs pytest as a child
  and takes each outcome keyed with a random key it handed over before any test module was
  imported; "passed" needs a test call the plugin made itself to return; the first outcome per
  test stands, reading stops at session end, then the whole tree is killed. Every generic route
  (exit hooks, patching pytest's runner or reports or sys.exit, signal handlers, survivors,
  files, printed lines, conftest.py / .pth / sitecustomize, os._exit, reopening descriptors via
  /proc) fails; NOT defended: code that knows the plugin's internals and digs its key out of
  memory (or calls its hooks), that replaces the test functions themselves before they run (e.g.
  patching pytest's Function.obj), a returned object whose __eq__ is always true, and code that
  reads the hidden tests (they are files in pytest's process, /grading/tests) to return the
  values they assert.
Both backends: bubblewrap and podman pass the pipes in (a container's grading is a fresh
container, exec'd with the descriptors and nothing else holding them; the episode's container
is stopped first if the agent left a process in it); docker cannot, and is refused for these
two graders (its Harbor test.sh grading is unaffected).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import importlib.util
import json
import math
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from c2.envs.grading_channel import Messages, ResultsChannel, tests_payload
from c2.envs.sandbox import Sandbox, SandboxLimits, SandboxResult
from c2.envs.tasks import Task

_PLUGIN = Path(__file__).with_name("grading_plugin.py")
_PARENT = Path(__file__).with_name("grading_pytest.py")
_RUNNER = Path(__file__).with_name("grading_runner.py")
_WORKER = Path(__file__).with_name("grading_worker.py")  # the runner's import
RUFF_SELECT = "E,F,W,B,SIM"


@dataclasses.dataclass
class TestRun:
    """Per-test outcomes ("passed", "failed", "skipped", or absent: never ran)."""

    outcomes: dict[str, str]
    error: str | None
    sandbox: SandboxResult | None = None

    def passed(self, test_id: str) -> bool:
        return self.outcomes.get(test_id) == "passed"


@dataclasses.dataclass
class GradeRecord:
    task_id: str
    episode_id: str | None
    passed: bool
    failure_reason: str | None
    correctness: dict
    quality: dict
    efficiency: dict
    interaction: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sandbox_limits(task: Task, base: SandboxLimits) -> SandboxLimits:
    limits = task.limits(base)  # a task's own memory / cpus / storage (Harbor: task.toml)
    return dataclasses.replace(limits, timeout_s=task.test_timeout_s, max_output_bytes=1 << 20)


def run_hidden_tests(
    task: Task, workspace: str | os.PathLike, sandbox: Sandbox, limits: SandboxLimits | None = None
) -> TestRun:
    """Run the task's hidden tests against `workspace` in a sandbox (a container task's: the
    container its episode ran in, so the tests see what the agent installed, as in Harbor)."""
    sandbox = task.sandbox(sandbox)
    limits = _sandbox_limits(task, limits or sandbox.limits)
    python_env = task.python_env()
    if task.grader == "harbor":
        return _run_harbor(task, workspace, sandbox, limits, python_env)
    run = runner_outcomes if task.grader == "functions" else pytest_outcomes
    return run(
        task.tests_dir,
        workspace,
        sandbox,
        limits=limits,
        mount_at=task.mount_at,
        python_env=python_env,
    )


def pytest_outcomes(
    tests_dir: str | os.PathLike,
    workspace: str | os.PathLike,
    sandbox: Sandbox,
    *,
    limits: SandboxLimits,
    mount_at: str = "/workspace",
    python_env: str | os.PathLike | None = None,
) -> TestRun:
    """Per-test outcomes of running `tests_dir` (mounted read-only at /grading/tests, so ids
    read "tests/test_x.py::test_y") against `workspace` (read-only at `mount_at`): pytest runs
    as the child of a trusted parent (grading_pytest.py), which alone can reach c2."""
    pytest = ["python", "-P", "-m", "pytest", "-p", "grading_plugin", "-p", "no:cacheprovider"]
    pytest += ["-c", "/dev/null", "--rootdir=/grading", "-q", "/grading/tests"]
    env = {"PYTHONPATH": "/grading", "C2_WORKSPACE": mount_at}
    parent = ["python", "-I", "-S", "-B", "/grading/grading_pytest.py"]
    scripts = [(_PLUGIN, "/grading/grading_plugin.py"), (_PARENT, "/grading/grading_pytest.py")]
    scripts += _runner_files()  # the parent's helpers
    binds = [(tests_dir, "/grading/tests")]  # pytest needs them as files (module doc)

    def cmd(channel):
        kill = _kill_mode(sandbox)
        return [*parent, channel.out, f"{limits.timeout_s:g}", kill, "--", *pytest]

    return _sandboxed_outcomes(
        cmd, scripts + binds, env, None, workspace, sandbox, limits, mount_at, python_env
    )


def runner_outcomes(
    tests_dir: str | os.PathLike,
    workspace: str | os.PathLike,
    sandbox: Sandbox,
    *,
    limits: SandboxLimits,
    mount_at: str = "/workspace",
    python_env: str | os.PathLike | None = None,
) -> TestRun:
    """`pytest_outcomes` for plain test functions, run by grading_runner.py without pytest
    (the "functions" grader: ~10x faster; same ids, same outcomes; workspace code runs in a
    worker process, the tests and their assertions in the trusted runner, which alone receives
    the tests: on a pipe, never as files in the sandbox)."""
    # -S (no site-packages) unless the task brings an environment whose packages it needs.
    flags = ["-I", "-B"] if python_env is not None else ["-I", "-S", "-B"]

    main = "import sys; sys.path.insert(0, '/grading'); import grading_runner as r; "
    main += "r.main(*sys.argv[1:])"
    runner = ["python", *flags, "-c", main]

    def cmd(channel):
        return [*runner, channel.tests_in, mount_at, channel.out, f"{limits.timeout_s:g}"]

    tests = tests_payload(tests_dir)
    return _sandboxed_outcomes(
        cmd, _runner_files(), {}, tests, workspace, sandbox, limits, mount_at, python_env
    )


@functools.cache
def _runner_files() -> list[tuple[Path, str]]:
    """grading_runner.py and grading_worker.py, each with its bytecode where the sandbox's Python
    looks for it (an import checks it against the source's mtime and size; another Python
    version compiles anew): (host path, path in the sandbox) pairs, the runner's first."""
    scratch = tempfile.mkdtemp(prefix="c2-runner-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # one per process, not one a run
    files = []
    for source in (_RUNNER, _WORKER):
        inside = f"/grading/{source.name}"
        pyc = importlib.util.cache_from_source(inside)
        host = Path(scratch) / os.path.basename(pyc)
        py_compile.compile(str(source), cfile=str(host), doraise=True)
        host.chmod(0o644)
        files += [(source, inside), (host, pyc)]
    return files


def _kill_mode(sandbox) -> str:
    """How pytest's trusted parent ends what the tests left before it reports: "kill-all" in a
    bwrap pid namespace (every process it can signal: only the sandbox's), "kill-new" in a
    container (every process that was not there when it started: the container's init and
    sleep must live), "keep" without a pid namespace."""
    if not sandbox.isolated:
        return "keep"
    return "kill-all" if isinstance(sandbox, Sandbox) else "kill-new"


def _sandboxed_outcomes(
    cmd, files, env, tests, workspace, sandbox, limits, mount_at, python_env=None
) -> TestRun:
    """Run `cmd(channel)` with `files` mounted read-only, the workspace read-only; the trusted
    process writes its messages to `channel.out`, a pipe passed in as a descriptor only it
    holds, read here while it runs, and reads `tests` (bytes), when given, from
    `channel.tests_in` (grading_channel.py)."""
    _need_namespaces(sandbox)
    with ResultsChannel(sandbox, tests) as channel:
        r = sandbox.run(
            cmd(channel),
            workspace,
            limits=limits,
            mount_at=mount_at,
            readonly=True,
            binds=[(src, dst, False) for src, dst in files],
            env=env,
            python_env=python_env,
            **channel.run_kwargs,
        )
        got = channel.read()
    return _test_run(got, r)


def _test_run(got: Messages, r: SandboxResult) -> TestRun:
    if not got.ended and not got.outcomes and not got.collect_errors:
        why = f"limit {r.limit}" if r.limit else f"exit code {r.exit_code}: {r.stderr[-300:]}"
        error = "; ".join([f"hidden tests produced no results ({why})", *got.notes[:3]])
        return TestRun({}, error, r)
    errors = []
    if r.limit:
        errors.append(f"stopped by limit {r.limit}")
    if got.collect_errors:
        errors.append(f"collection errors in {got.collect_errors[:3]}")
    errors += got.notes[:3]
    if not got.ended and not r.limit:
        errors.append(f"hidden tests ended early (exit code {r.exit_code})")
    return TestRun(dict(got.outcomes), "; ".join(errors) or None, r)


def _need_namespaces(sandbox: Sandbox) -> None:
    if not sandbox.isolated:
        raise RuntimeError(
            f"grading needs a namespace sandbox; this machine has {sandbox.isolation.describe()}"
        )


def _read_json(path: Path, max_bytes: int):  # Harbor's reward.json
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > max_bytes:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run_harbor(task, workspace, sandbox, limits, python_env=None) -> TestRun:
    """Harbor's test.sh over the episode's final state; its reward is read once no process
    that could write it is alive: a container task's container is restarted for the tests (the
    agent's leftover processes end) and stopped before /logs is copied back (run_verifier);
    the bubblewrap sandbox ends every process of a command when it returns."""
    _need_namespaces(sandbox)
    run = getattr(sandbox, "run_verifier", sandbox.run)
    with tempfile.TemporaryDirectory(prefix="c2-grade-") as out:
        (Path(out) / "verifier").mkdir()
        sandbox.give_workspace(out)
        binds = [(task.tests_dir, "/tests", False), (out, "/logs", True)]
        r = run(
            ["bash", "/tests/test.sh"],
            workspace,
            limits=limits,
            mount_at=task.mount_at,
            binds=binds,
            python_env=python_env,
        )
        reward = _harbor_reward(Path(out) / "verifier")
    test_id = task.fail_to_pass[0]
    if reward is None:
        why = f"limit {r.limit}" if r.limit else f"exit code {r.exit_code}"
        return TestRun({test_id: "failed"}, f"test.sh wrote no reward ({why})", r)
    return TestRun({test_id: "passed" if reward >= 1.0 else "failed"}, None, r)


def _harbor_reward(verifier: Path) -> float | None:
    """reward.txt (one number) or reward.json ({"reward": x} or its first value); None for
    anything else: a link, a special or oversized file, a value that is not a finite number."""
    txt = verifier / "reward.txt"
    try:
        if txt.is_symlink() or (txt.exists() and not txt.is_file()):
            return None
        if txt.is_file():
            value = float(txt.read_text().strip()) if txt.stat().st_size < 4096 else math.nan
            return value if math.isfinite(value) else None
    except (OSError, ValueError):
        return None
    data = _read_json(verifier / "reward.json", 1 << 16)
    if isinstance(data, dict):
        data = data.get("reward", next(iter(data.values()), None))
    if not isinstance(data, int | float) or isinstance(data, bool) or not math.isfinite(data):
        return None
    return float(data)


# ---------------------------------------------------------------------- code quality


def _ruff_binary() -> str | None:
    # The ruff installed beside this interpreter first: ruff's own finder can fail on a
    # sysconfig without EXE (seen in CI), and PATH may hold another version.
    beside = os.path.join(os.path.dirname(sys.executable), "ruff")
    if os.access(beside, os.X_OK):
        return beside
    try:
        from ruff.__main__ import find_ruff_bin

        return find_ruff_bin()
    except (ImportError, FileNotFoundError, TypeError):
        return shutil.which("ruff")


def ruff_findings(source: str, filename: str, ruff: str) -> collections.Counter:
    """Rule codes ruff reports for one file's text (read from stdin: nothing is executed)."""
    cmd = [ruff, "check", "--isolated", "--no-cache", "--output-format", "json"]
    cmd += ["--select", RUFF_SELECT, "--line-length", "100", "--stdin-filename", filename, "-"]
    p = subprocess.run(cmd, input=source.encode(), capture_output=True, timeout=60)
    try:
        return collections.Counter(f["code"] or "syntax" for f in json.loads(p.stdout or b"[]"))
    except ValueError:
        return collections.Counter({"ruff_failed": 1})


def _regular_text(path: Path) -> str | None:
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
        return None
    return path.read_text(errors="replace")


def changed_files(original: Path, final: Path) -> list[str]:
    """Regular files added or modified by the agent (symlinks are never followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(final):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__", ".pytest_cache")]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), final)
            new, old = _regular_text(final / rel), _regular_text(original / rel)
            if new is not None and new != old:
                out.append(rel)
    return sorted(out)


def code_quality(original: Path, final: Path) -> dict:
    files = [f for f in changed_files(original, final) if f.endswith(".py")]
    ruff = _ruff_binary()
    if ruff is None:
        return {"available": False, "changed_py_files": files, "new_findings": None}
    new_by_rule: collections.Counter = collections.Counter()
    for rel in files:
        after = ruff_findings(_regular_text(final / rel), rel, ruff)
        before_text = _regular_text(original / rel)
        before = ruff_findings(before_text, rel, ruff) if before_text is not None else {}
        for code, n in after.items():
            new_by_rule[code] += max(0, n - before.get(code, 0))
    new_by_rule = +new_by_rule  # drop zeros
    return {
        "available": True,
        "changed_py_files": files,
        "new_findings": sum(new_by_rule.values()),
        "new_findings_by_rule": dict(sorted(new_by_rule.items())),
    }


# ---------------------------------------------------------------------- the record


def grade(task: Task, workspace: str | os.PathLike, sandbox: Sandbox, episode=None) -> GradeRecord:
    """Grade the final `workspace` of one episode (an episode.Episode, or None: no trajectory)."""
    workspace = Path(workspace)
    quality = code_quality(task.workspace_dir, workspace)
    tests = run_hidden_tests(task, workspace, sandbox)
    tests_limits = list(tests.sandbox.limits_hit) if tests.sandbox is not None else []
    f2p = {t: tests.passed(t) for t in task.fail_to_pass}
    p2p = {t: tests.passed(t) for t in task.pass_to_pass}
    correctness = {
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "f2p_passed": sum(f2p.values()),
        "f2p_total": len(f2p),
        "p2p_passed": sum(p2p.values()),
        "p2p_total": len(p2p),
        "tests_error": tests.error,
        "tests_limits_hit": tests_limits,
        "tests_output_tail": _output_tail(tests.sandbox),
    }
    ep = episode
    limits_hit = sorted({x for r in ep.sandbox_results for x in r.limits_hit}) if ep else []
    # A limit hit anywhere fails the episode: what ran past a limit was cut off and its outcome
    # cannot be trusted (and flooding the sandbox must never pay).
    passed = all(f2p.values()) and all(p2p.values()) and not limits_hit and not tests_limits
    reasons = []
    if limits_hit:
        reasons.append(
            f"{_limit_words(limits_hit)} hit during the episode: {', '.join(limits_hit)}"
        )
    if tests_limits:
        reasons.append(
            f"{_limit_words(tests_limits)} hit by the hidden tests: {', '.join(tests_limits)}"
        )
    if tests.error:
        reasons.append(tests.error)
    unreported = [t for t in [*f2p, *p2p] if t not in tests.outcomes]
    if unreported:
        reasons.append(f"never reported: {_few(unreported)}")
    if not all(f2p.values()):
        failed = [t for t, ok in f2p.items() if not ok]
        reasons.append(f"fail_to_pass still failing: {_few(failed)}")
    if not all(p2p.values()):
        reasons.append(f"pass_to_pass broken: {_few([t for t, ok in p2p.items() if not ok])}")
    efficiency = {
        "model_tokens": ep.model_tokens if ep else None,
        "turns": ep.turns if ep else None,
        "tool_calls": ep.tool_calls if ep else None,
        "wall_s": ep.wall_s if ep else None,
    }
    interaction = {
        "final_message": bool(ep and ep.final_message),
        "submitted": bool(ep and ep.submitted),
        "invalid_tool_calls": ep.invalid_tool_calls if ep else None,
        "tool_errors": ep.tool_errors if ep else None,
        "stop_reason": ep.stop_reason if ep else None,
        "sandbox_limits_hit": limits_hit,
    }
    return GradeRecord(
        task_id=task.task_id,
        episode_id=ep.episode_id if ep else None,
        passed=passed,
        failure_reason=None if passed else "; ".join(reasons) or "unknown",
        correctness=correctness,
        quality=quality,
        efficiency=efficiency,
        interaction=interaction,
    )


def _output_tail(r: SandboxResult | None, n: int = 600) -> str | None:
    """The end of what the hidden tests printed (why they failed, for the record)."""
    if r is None:
        return None
    return (r.stdout[-n:] + ("\n--- stderr\n" + r.stderr[-n:] if r.stderr else "")).strip()


def _limit_words(limits: list[str]) -> str:
    return "sandbox limit" if len(limits) == 1 else "sandbox limits"


def _few(ids: list[str], k: int = 3) -> str:
    return ", ".join(ids[:k]) + (f" (+{len(ids) - k} more)" if len(ids) > k else "")
