"""The pass@k benchmark runner (c2/eval/run.py): oracle 1.0, noop 0.0, resumable, patches apply;
a trained policy's passes credited on the engine; failures recorded; settings kept on resume;
intervals inside [0, 1]; command limits and backends from the tasks."""

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from c2.eval import run as bench
from c2.eval.passk import pass_at_k, wilson_interval

ROOT = Path(__file__).parents[2]
READER = ROOT / "experiments" / "policies" / "reader_tiny"  # the RL stage's start policy


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from c2.envs.functions import generate_function_tasks

    out = tmp_path_factory.mktemp("tasks")
    generate_function_tasks(out, 2, 0, "eval", "basic")
    return out


def test_ks_and_patch_of_added_modified_deleted_files(tmp_path):
    assert bench.ks_for(1) == [1] and bench.ks_for(4) == [1, 2, 4]
    assert bench.ks_for(6) == [1, 2, 4, 6]
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "pkg").mkdir(parents=True)
    (a / "pkg" / "m.py").write_text("x = 1\ny = 2\n")
    (b / "pkg" / "m.py").write_text("x = 1\ny = 3\n")
    (a / "gone.txt").write_text("bye\n")
    (b / "new.py").write_text("z = 0")  # no final newline
    patch = bench.workspace_patch(a, b)
    assert "--- /dev/null\n+++ b/new.py" in patch and "deleted file mode" in patch
    work = tmp_path / "work"
    shutil.copytree(a, work)
    (work / "p.diff").write_text(patch)
    subprocess.run(["git", "apply", "p.diff"], cwd=work, check=True)
    (work / "p.diff").unlink()
    assert bench.workspace_patch(b, work) == ""  # the patch turned a into b exactly


def test_oracle_passes_noop_fails_resumes_and_predictions_apply(tmp_path, tasks, sandbox_ok):
    out = tmp_path / "oracle"
    res = bench.run(tasks, "oracle", 2, out, progress=False)
    o = res["overall"]
    assert res["ks"] == [1, 2] and o["tasks"] == 2 and o["episodes"] == 4
    assert o["pass@k"]["1"]["mean"] == 1.0 and o["pass@k"]["2"]["mean"] == 1.0
    assert o["best_of_2"]["mean"] == 1.0
    for dim in bench.DIMENSIONS:
        assert dim in o and all(dim in r for r in res["per_task"].values())
    assert o["correctness"]["f2p_rate"] == 1.0 and o["interaction"]["submitted_rate"] == 1.0
    assert o["quality"]["new_ruff_findings_mean"] is not None
    assert o["efficiency"]["generated_tokens_mean"] > 0 and o["generated_tokens"] > 0
    assert json.loads((out / "results.json").read_text()) == res
    for name in ("report.md", "passk.png", "per_task.png"):
        assert (out / name).is_file(), name

    # SWE-bench predictions: the patch turns the task's workspace into the reference solution.
    from c2.envs.tasks import load_tasks

    by_id = {t.task_id: t for t in load_tasks(tasks)}
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == sorted(by_id)
    for p in preds:
        assert p["model_name_or_path"] == "oracle" and p["model_patch"].startswith("diff --git")
        task = by_id[p["instance_id"]]
        work = tmp_path / "apply" / task.task_id
        shutil.copytree(task.workspace_dir, work)
        (work.parent / "p.diff").write_text(p["model_patch"])
        subprocess.run(["git", "apply", str(work.parent / "p.diff")], cwd=work, check=True)
        for f in task.solution_dir.rglob("*"):
            if f.is_file():
                assert (work / f.relative_to(task.solution_dir)).read_text() == f.read_text()

    # Resumable: nothing finished is played again; a larger N plays only the new samples.
    played = []
    real = bench._scripted_episodes

    def spy(todo, *a, **k):
        played.append([(t.task_id, j) for t, j in todo])
        return real(todo, *a, **k)

    before = (out / "episodes.jsonl").read_text()
    bench._scripted_episodes = spy
    try:
        again = bench.run(tasks, "oracle", 2, out, progress=False)
        assert played == [] and again == res
        assert (out / "episodes.jsonl").read_text() == before
        more = bench.run(tasks, "oracle", 3, out, progress=False)
    finally:
        bench._scripted_episodes = real
    assert sorted(played[0]) == sorted((t, 2) for t in by_id)
    assert more["ks"] == [1, 2, 3] and more["overall"]["pass@k"]["3"]["mean"] == 1.0
    with pytest.raises(ValueError, match="policy='oracle'"):
        bench.run(tasks, "noop", 2, out, progress=False)

    res = bench.run(tasks, "noop", 2, tmp_path / "noop", progress=False)
    assert res["overall"]["pass@k"]["1"]["mean"] == 0.0
    assert res["overall"]["best_of_2"]["mean"] == 0.0
    assert res["overall"]["correctness"]["f2p_rate"] == 0.0
    preds = (tmp_path / "noop" / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(x)["model_patch"] for x in preds] == ["", ""]


def _ep(task, j, passed):
    """An episode record as the runner writes it."""
    return {
        "task_id": task,
        "sample": j,
        "passed": passed,
        "correctness": {
            "f2p_passed": int(passed),
            "f2p_total": 1,
            "p2p_passed": 0,
            "p2p_total": 0,
            "tests_error": None,
        },
        "quality": {"new_findings": 0},
        "efficiency": {
            "generated_tokens": 10,
            "context_tokens": None,
            "turns": 1,
            "tool_calls": 1,
            "wall_s": 0.1,
        },
        "interaction": {
            "submitted": True,
            "final_message": True,
            "invalid_tool_calls": 0,
            "tool_errors": 0,
            "sandbox_limits_hit": [],
        },
        "flops": 5.0,
    }


def test_summary_is_the_unbiased_estimator_per_task():
    recs = [_ep("a", j, j < 1) for j in range(4)] + [_ep("b", j, j < 3) for j in range(4)]
    res = bench.summarize(recs, ["a", "b"], 4)
    assert res["ks"] == [1, 2, 4]
    for k in (1, 2, 4):
        want = (pass_at_k(4, 1, k) + pass_at_k(4, 3, k)) / 2
        assert res["overall"]["pass@k"][str(k)]["mean"] == pytest.approx(want)
    assert res["per_task"]["a"]["pass@k"]["2"] == pytest.approx(0.5)
    for k in (1, 2, 4):  # Wilson over the 2 tasks, not mean +- z sd (which leaves [0, 1] here)
        o = res["overall"]["pass@k"][str(k)]
        assert o["ci95"] == pytest.approx(wilson_interval(o["mean"], 2))
        assert 0.0 <= o["ci95"][0] <= o["mean"] <= o["ci95"][1] <= 1.0
    assert res["overall"]["best_of_4"]["ci95"] == pytest.approx(wilson_interval(1.0, 2))
    assert res["overall"]["flops"] == 40.0 and res["overall"]["correctness"]["f2p_rate"] == 0.5
    with pytest.raises(ValueError, match="without 4 finished"):
        bench.summarize(recs[:7], ["a", "b"], 4)


@pytest.mark.parametrize(
    "passes, want",  # Wilson 95% by hand (z = 1.96): 1 of 4 and 5 of 5 tasks; 0 of 5 mirrors 5
    [([1, 0, 0, 0], [0.0456, 0.6994]), ([1] * 5, [0.5655, 1.0]), ([0] * 5, [0.0, 0.4345])],
)
def test_intervals_stay_inside_0_1_with_all_pass_and_all_fail(passes, want):
    ids = [f"t{i}" for i in range(len(passes))]
    res = bench.summarize([_ep(t, 0, bool(p)) for t, p in zip(ids, passes)], ids, 1)
    for got in (res["overall"]["pass@k"]["1"], res["overall"]["best_of_1"]):
        assert got["mean"] == sum(passes) / len(passes)
        assert got["ci95"] == pytest.approx(want, abs=1e-4)  # mean +- z sd: [-0.24, 0.74], [1, 1]


@pytest.mark.parametrize("ci", ["true", "1", ""])
def test_a_missing_backend_fails_in_ci_and_skips_locally(ci, monkeypatch, missing_backend):
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="no podman here"):
        missing_backend("no podman here")


def _function_tasks(root, n, level="basic"):
    from c2.envs.functions import generate_function_tasks

    generate_function_tasks(root, n, 1, "eval", level)
    return sorted(p.name for p in root.iterdir())


def test_a_task_whose_episode_or_grading_raises_is_a_failure_and_the_run_goes_on(
    tmp_path, sandbox_ok, monkeypatch
):
    from c2.envs import grading

    tasks = tmp_path / "tasks"
    ok, bad_grade, bad_episode = _function_tasks(tasks, 3)
    ws = tasks / bad_episode / "workspace"  # a file where the workspace should be: copying fails
    shutil.rmtree(ws)
    ws.write_text("not a directory\n")
    real, calls = grading.grade, []

    def grade(task, *a, **k):
        calls.append(task.task_id)
        if task.task_id == bad_grade:
            raise RuntimeError("the grader broke")
        return real(task, *a, **k)

    monkeypatch.setattr(grading, "grade", grade)
    opts = bench.RunOptions(max_attempts=2)
    res = bench.run(tasks, "oracle", 1, tmp_path / "out", opts, progress=False)
    eps = {
        e["task_id"]: e
        for e in map(json.loads, (tmp_path / "out" / "episodes.jsonl").read_text().splitlines())
    }
    assert eps[ok]["passed"] and eps[ok]["stop_reason"] == "submit"
    assert not eps[bad_grade]["passed"] and eps[bad_grade]["stop_reason"] == "rollout_error"
    assert eps[bad_grade]["failure_reason"] == "grading: RuntimeError: the grader broke"
    assert eps[bad_grade]["efficiency"]["tool_calls"] > 0  # the episode itself was played
    assert calls.count(bad_grade) == 2  # played again once, then recorded
    assert eps[bad_episode]["failure_reason"].startswith("episode: NotADirectoryError")
    assert bad_episode not in calls  # nothing to grade
    o = res["overall"]
    assert o["errors"] == 2 and res["per_task"][bad_grade]["errors"] == 1
    assert o["pass@k"]["1"]["mean"] == pytest.approx(1 / 3)
    assert (
        "2 episodes could not be played or graded" in (tmp_path / "out" / "report.md").read_text()
    )


def test_resume_refuses_a_changed_setting_naming_it(tmp_path):
    meta = {"policy": "runs/x", "tasks_dir": "/t"}
    before = meta | {"options": dataclasses.asdict(bench.RunOptions())}
    bench.check_resume(before, meta, bench.RunOptions(engine_slots=4, workers=8), tmp_path)
    for field, value in [
        ("temperature", 0.5),
        ("max_tokens", 256),
        ("seed", 3),
        ("run_timeout_s", 30.0),
        ("top_p", 0.9),
        ("context_management", "self_summary"),
    ]:
        old = getattr(bench.RunOptions(), field)
        changed = bench.RunOptions(**{field: value})
        with pytest.raises(ValueError, match=f"with {field}={old!r}, not {value!r}"):
            bench.check_resume(before, meta, changed, tmp_path)
    with pytest.raises(ValueError, match="policy='runs/x', not 'runs/y'"):
        bench.check_resume(before, meta | {"policy": "runs/y"}, bench.RunOptions(), tmp_path)
    # A field run.json predates reads as its default; a scripted agent samples nothing.
    older = meta | {"options": {"temperature": 1.0}}
    bench.check_resume(older, meta, bench.RunOptions(), tmp_path)
    with pytest.raises(ValueError, match="max_turns=4, not 9"):
        bench.check_resume(older, meta, bench.RunOptions(max_turns=9), tmp_path)
    scripted = {"policy": "oracle", "tasks_dir": "/t"}
    bench.check_resume(before | scripted, scripted, bench.RunOptions(temperature=0.1), tmp_path)
    # Each invocation's engine draws from its own seed (request numbers restart with an engine).
    seeds = {bench.engine_seed(0, i) for i in range(4)} | {bench.engine_seed(1, 0)}
    assert len(seeds) == 5 and bench.engine_seed(7, 0) == 7


def test_a_resumed_run_keeps_its_settings(tmp_path, sandbox_ok):
    tasks = tmp_path / "tasks"
    _function_tasks(tasks, 1)
    out = tmp_path / "out"
    bench.run(tasks, "oracle", 1, out, bench.RunOptions(run_timeout_s=5.0), progress=False)
    with pytest.raises(ValueError, match="run_timeout_s=5.0, not 7.0: resume with"):
        bench.run(tasks, "oracle", 2, out, bench.RunOptions(run_timeout_s=7.0), progress=False)
    assert json.loads((out / "run.json").read_text())["options"]["run_timeout_s"] == 5.0
    res = bench.run(tasks, "oracle", 2, out, bench.RunOptions(run_timeout_s=5.0), progress=False)
    assert res["overall"]["episodes"] == 2
    assert json.loads((out / "run.json").read_text())["invocations"] == 2


def test_command_limits_come_from_each_task(tmp_path, sandbox_ok, monkeypatch):
    from c2.envs import episode
    from c2.envs.tasks import load_task

    tasks = tmp_path / "tasks"
    plain, harbor_like = _function_tasks(tasks, 2)
    meta_file = tasks / harbor_like / "metadata.json"
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text()) | {"agent_timeout_s": 45}))
    test_timeout = load_task(tasks / plain).test_timeout_s
    assert test_timeout == 10  # the functions tasks' own, not the 120 / 20 s this replaced
    assert bench.command_timeout_s(load_task(tasks / harbor_like)) == 45.0
    assert bench.command_timeout_s(load_task(tasks / plain), override=3.0) == 3.0
    real, seen = episode.run_episode, {}

    def spy(task, policy, sandbox, workdir, config, **k):
        seen[task.task_id] = (config.run_limits.timeout_s, config.max_run_timeout_s)
        return real(task, policy, sandbox, workdir, config, **k)

    monkeypatch.setattr(episode, "run_episode", spy)
    res = bench.run(tasks, "oracle", 1, tmp_path / "out", progress=False)
    assert res["overall"]["pass@k"]["1"]["mean"] == 1.0
    assert seen == {plain: (test_timeout, test_timeout), harbor_like: (45.0, 45.0)}


class _Iso:
    def __init__(self, text):
        self.text = text

    def describe(self):
        return self.text


class _FakeSandbox:
    def __init__(self, isolated):
        self.isolated, self.isolation = isolated, _Iso("rlimit only")


def test_only_the_backends_a_task_set_uses_are_required(tmp_path):
    from c2.envs.tasks import Task

    def task(i, container=None):
        meta = {"task_id": f"t{i}"} | ({"container": container} if container else {})
        return Task(tmp_path, "", meta)

    podman = [task(i, {"image": "x", "engine": "podman"}) for i in range(2)]
    docker = [task(9, {"image": "y", "engine": "docker"})]
    plain = [task(5)]
    no_bwrap = _FakeSandbox(isolated=False)
    engines = {"podman": None, "docker": "docker is not installed"}

    bench.check_isolation(podman, no_bwrap, engines.get)  # containers alone: no bubblewrap
    assert bench.describe_isolation(podman, no_bwrap) == "podman containers"
    with pytest.raises(bench.IsolationMissing) as e:
        bench.check_isolation(podman + plain + docker, no_bwrap, engines.get)
    assert str(e.value) == (
        "episodes cannot run here: 1 task(s) (t5) run in the namespace sandbox; this machine has "
        "rlimit only (`make system-deps` installs bubblewrap); 1 task(s) (t9) run in docker "
        "containers: docker is not installed"
    )
    bench.check_isolation(plain, _FakeSandbox(isolated=True), lambda _: "never asked")
    stand_in = bench.ContainersOnly(limits="L")
    assert stand_in.isolated and stand_in.limits == "L"
    with pytest.raises(RuntimeError, match="container-only task set reached the host"):
        stand_in.run("true", tmp_path)


HARBOR_TOML = """version = "1.0"
[metadata]
difficulty = "easy"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 30.0
[environment]
build_timeout_sec = 300.0
memory = "512M"
"""


@pytest.mark.slow
def test_a_container_only_task_set_runs_without_bubblewrap(tmp_path, podman_base, monkeypatch):
    """The oracle passes a Harbor task in its podman image, with the namespace sandbox missing
    (an rlimit-only Sandbox: what a machine without bubblewrap has)."""
    from c2.envs.container import BASE_IMAGES
    from c2.envs.harbor_import import import_harbor_tasks
    from c2.envs.sandbox import Sandbox

    monkeypatch.setitem(BASE_IMAGES, "debian:bookworm-slim", podman_base)
    src = tmp_path / "src" / "add-one"
    for d in ("environment", "tests", "solution"):
        (src / d).mkdir(parents=True)
    (src / "instruction.md").write_text("Write data.txt's number plus one to answer.txt.\n")
    (src / "task.toml").write_text(HARBOR_TOML)
    (src / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"
    )
    (src / "environment" / "data.txt").write_text("41\n")
    (src / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/answer.txt)" = "42" ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    (src / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho $(( $(cat data.txt) + 1 )) > answer.txt\n"
    )
    (o,) = import_harbor_tasks([src], tmp_path / "tasks", backend="podman", log=lambda _: None)
    assert o.status == "imported", o.detail
    no_bwrap = Sandbox(backend="rlimit")
    assert not no_bwrap.isolated
    res = bench.run(
        tmp_path / "tasks", "oracle", 1, tmp_path / "out", progress=False, sandbox=no_bwrap
    )
    assert res["overall"]["pass@k"]["1"]["mean"] == 1.0 and res["overall"]["errors"] == 0
    assert res["isolation"] == "podman containers"
    # With a task of the namespace sandbox beside it, the run refuses, naming that task.
    (plain,) = _function_tasks(tmp_path / "plain", 1)
    shutil.move(tmp_path / "plain" / plain, tmp_path / "tasks" / plain)
    with pytest.raises(bench.IsolationMissing, match=rf"1 task\(s\) \({plain}\) run in the names"):
        bench.run(
            tmp_path / "tasks", "oracle", 1, tmp_path / "out2", progress=False, sandbox=no_bwrap
        )


@pytest.mark.slow
def test_a_trained_policy_s_passes_are_credited_on_the_engine(tmp_path, sandbox_ok, monkeypatch):
    """The RL stage's start policy, greedy on four held-out wide-level tasks, solves some (it was
    measured to pass 3 of these 4): each episode's credit must equal an independent grade of the
    patch it recorded, so a path that never credits a pass, or always does, fails. A task whose
    grading raises is recorded as a failure with the error; command limits are the task's."""
    from c2.envs.grading import grade
    from c2.envs.sandbox import Sandbox
    from c2.envs.tasks import load_tasks
    from c2.rl import episodes as rl_episodes

    tasks_dir = tmp_path / "tasks"
    ids = _function_tasks(tasks_dir, 5, level="wide")
    broken = ids.pop()  # its grading raises
    real_grade, runner_limits = rl_episodes.grade, []

    def grade_or_raise(task, *a, **k):
        if task.task_id == broken:
            raise RuntimeError("the grader broke")
        return real_grade(task, *a, **k)

    class Runner(rl_episodes.EpisodeRunner):
        def __init__(self, engine, chat, sandbox, work, config):
            runner_limits.append(config.run_timeout_s)
            super().__init__(engine, chat, sandbox, work, config)

    monkeypatch.setattr(rl_episodes, "grade", grade_or_raise)
    monkeypatch.setattr(rl_episodes, "EpisodeRunner", Runner)
    opts = bench.RunOptions(
        max_tokens=512, max_turn_tokens=192, max_turns=3, temperature=0.0, engine_slots=8
    )
    out = tmp_path / "out"
    res = bench.run(tasks_dir, f"hf:{READER}", 1, out, opts, progress=False)
    eps = {
        e["task_id"]: e
        for e in map(json.loads, (out / "episodes.jsonl").read_text().split("\n")[:-1])
    }
    assert sorted(eps) == sorted([*ids, broken]) and runner_limits == [10.0]  # the tasks' own

    assert not eps[broken]["passed"] and eps[broken]["stop_reason"] == "rollout_error"
    assert "grade: RuntimeError: the grader broke" in eps[broken]["failure_reason"]
    by_id = {t.task_id: t for t in load_tasks(tasks_dir)}
    credited = {t for t in ids if eps[t]["passed"]}
    assert credited, "the start policy passed none of the tasks it was measured to pass"
    regraded = set()
    for t in ids:  # the recorded patch applied to the task's workspace, graded afresh
        work = tmp_path / "regrade" / t
        shutil.copytree(by_id[t].workspace_dir, work)
        if eps[t]["patch"]:
            (work.parent / f"{t}.diff").write_text(eps[t]["patch"])
            subprocess.run(["git", "apply", str(work.parent / f"{t}.diff")], cwd=work, check=True)
        sandbox = Sandbox()
        sandbox.give_workspace(work)
        if grade(by_id[t], work, sandbox).passed:
            regraded.add(t)
    assert credited == regraded
    assert res["per_task"][broken]["errors"] == 1 and res["overall"]["errors"] == 1
    assert res["overall"]["pass@k"]["1"]["mean"] == pytest.approx(len(credited) / 5)
    for t in ids:  # the transcript: what the model read, the task in it, and what it wrote
        (text,) = eps[t]["transcript"]
        assert by_id[t].instruction in text and "<tool_call>" in text
        assert eps[t]["efficiency"]["generated_tokens"] > 0 and eps[t]["flops"] > 0
    assert not (out / "work").exists()  # workspaces removed once diffed
