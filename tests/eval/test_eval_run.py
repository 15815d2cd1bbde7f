"""The pass@k benchmark runner (c2/eval/run.py): oracle 1.0, noop 0.0, resumable, patches apply."""

import json
import shutil
import subprocess

import pytest

from c2.eval import run as bench
from c2.eval.passk import pass_at_k


@pytest.fixture(scope="module")
def sandbox_ok():
    from c2.envs.sandbox import Sandbox

    if not Sandbox().isolated:
        pytest.skip("needs a namespace sandbox")


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


def test_summary_is_the_unbiased_estimator_per_task():
    def ep(task, j, passed):
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

    recs = [ep("a", j, j < 1) for j in range(4)] + [ep("b", j, j < 3) for j in range(4)]
    res = bench.summarize(recs, ["a", "b"], 4)
    assert res["ks"] == [1, 2, 4]
    for k in (1, 2, 4):
        want = (pass_at_k(4, 1, k) + pass_at_k(4, 3, k)) / 2
        assert res["overall"]["pass@k"][str(k)]["mean"] == pytest.approx(want)
    assert res["per_task"]["a"]["pass@k"]["2"] == pytest.approx(0.5)
    assert res["overall"]["flops"] == 40.0 and res["overall"]["correctness"]["f2p_rate"] == 0.5
    with pytest.raises(ValueError, match="without 4 finished"):
        bench.summarize(recs[:7], ["a", "b"], 4)


@pytest.mark.slow
def test_a_c2_workdir_plays_on_the_engine(tmp_path, tasks, sandbox_ok, untrained_workdir):
    policy = str(untrained_workdir(tmp_path / "policy"))
    opts = bench.RunOptions(max_tokens=384, max_turn_tokens=8, max_turns=1, engine_slots=2)
    res = bench.run(tasks, policy, 1, tmp_path / "out", opts, progress=False)
    o = res["overall"]
    assert o["episodes"] == 2 and o["pass@k"]["1"]["mean"] == 0.0  # random weights
    assert 0 < o["efficiency"]["generated_tokens_mean"] <= 8  # one turn of at most 8 ids
    assert o["efficiency"]["context_tokens_mean"] > 8 and o["flops"] > 0
    eps = [json.loads(x) for x in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert sorted((e["task_id"], e["sample"]) for e in eps) == sorted(
        (t, 0) for t in res["per_task"]
    )
    assert not (tmp_path / "out" / "work").exists()  # workspaces removed once diffed
    for e in eps:  # the transcript: the one segment as the model read it, the task in it
        (text,) = e["transcript"]
        instruction = (tasks / e["task_id"] / "instruction.md").read_text()
        assert "<|im_start|>system\n" in text and instruction in text
