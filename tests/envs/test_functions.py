"""Generated function tasks: determinism, disjoint splits, the oracle through the real tools and
grader, the fast runner against pytest, and the conversation SFT and RL share."""

import json
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest

from c2.data.chat import AgentChat
from c2.data.tokenizer import IM_END, ByteTokenizer
from c2.envs import functions as fn
from c2.envs import grading
from c2.envs.agents import ScriptedPolicy, noop_policy
from c2.envs.episode import compact_system_prompt, run_episode, system_prompt, task_system_prompt
from c2.envs.grading import grade, pytest_outcomes, runner_outcomes
from c2.envs.sandbox import SandboxLimits
from c2.envs.tasks import load_task, load_tasks
from c2.envs.tools import ToolCall, Tools


def _frame_regex(frame: str) -> re.Pattern:
    parts = [re.escape(lit) + (".+?" if f else "") for lit, f, _, _ in
             string.Formatter().parse(frame)]  # fmt: skip
    return re.compile("^" + "".join(parts) + "$")


def test_deterministic_by_seed(tmp_path):
    a, b = fn.function_tasks(60, 3, "train"), fn.function_tasks(60, 3, "train")
    assert a == b
    assert [t.instruction for t in a] != [t.instruction for t in fn.function_tasks(60, 4, "train")]
    assert fn.function_tasks(30, 3, "train") == a[:30]  # a prefix of the same stream
    ta = fn.generate_function_tasks(tmp_path / "a", 5, 3, "eval")
    tb = fn.generate_function_tasks(tmp_path / "b", 5, 3, "eval")
    for x, y in zip(ta, tb, strict=True):
        assert (x.instruction, dict(x.metadata)) == (y.instruction, dict(y.metadata))
        assert (x.tests_dir / f"test_{x.metadata['file'][:-3]}.py").read_text() == (
            y.tests_dir / f"test_{y.metadata['file'][:-3]}.py"
        ).read_text()


def test_splits_are_disjoint_by_template_and_text():
    train, held = fn.templates("train"), fn.templates("eval")
    assert {t.name for t in train}.isdisjoint({t.name for t in held})
    assert {t.frame for t in train}.isdisjoint({t.frame for t in held})
    for split in (train, held):  # both splits spell in code and in words, name all three ways
        assert {t.spelling for t in split} == {"code", "words"}
        assert {t.naming for t in split} == {"op", "noun", "letter"}
    tr, ev = fn.function_tasks(3000, 0, "train"), fn.function_tasks(500, 0, "eval")
    assert len({t.instruction for t in tr}) == 3000 and len({t.instruction for t in ev}) == 500
    assert {t.instruction for t in tr}.isdisjoint({t.instruction for t in ev})
    # No held-out instruction fits a train sentence frame, and no train one an eval frame.
    for tasks, frames in ((ev, train), (tr, held)):
        regexes = [_frame_regex(t.frame) for t in frames]
        assert not [t.instruction for t in tasks if any(r.match(t.instruction) for r in regexes)]
    # Every operation appears in both splits (the skills are shared).
    assert {t.metadata["op"] for t in tr} == {t.metadata["op"] for t in ev} == set(fn.OPS)
    assert {t.metadata["template"] for t in ev} == {t.name for t in held}


def test_basic_level_varies_only_the_operation(tmp_path, sandbox):
    """The basic level: f(n) in f.py, n + c / n - c / n * c with c in {2, 3} (6 answers) under a
    ticket tag; every distinct instruction of a split (and no more) is drawn; the splits share no
    sentence frame; the oracle passes."""
    tr = fn.function_tasks(720, 0, "train", "basic")
    ev = fn.function_tasks(360, 0, "eval", "basic")
    for tasks in (tr, ev):
        assert {(t.function, t.file, t.metadata["arg"]) for t in tasks} == {("f", "f.py", "n")}
        answers = {(t.metadata["op"], t.metadata["const"]) for t in tasks}
        assert answers == {(op, c) for op in fn.BASIC_OPS for c in fn.BASIC_CONSTS}
        assert all(t.metadata["level"] == "basic" and t.task_id.startswith("fnb-") for t in tasks)
        assert all(re.match(r"^\[[a-z]+\] ", t.instruction) for t in tasks)
    assert {t.instruction for t in tr}.isdisjoint({t.instruction for t in ev})
    untagged = [{t.instruction.split("] ", 1)[1] for t in x} for x in (tr, ev)]
    assert untagged[0].isdisjoint(untagged[1])  # held-out sentence frames, never trained on
    with pytest.raises(RuntimeError, match="exhausted after 720"):
        fn.function_tasks(721, 0, "train", "basic")
    for task in fn.generate_function_tasks(tmp_path / "b", 3, 0, "eval", "basic"):
        ep = run_episode(task, ScriptedPolicy(fn.oracle_replies(task)), sandbox, tmp_path / "e")
        assert grade(task, ep.workspace, sandbox, ep).passed, task.instruction


def test_wide_level_is_the_basic_form_with_constants_to_read(tmp_path, sandbox):
    """The wide level: basic's function, file, argument, tags and templates, constants 1-99, so
    no (tag, template) pair predicts the answer; the basic level's draws are unchanged by it."""
    tr = fn.function_tasks(3000, 0, "train", "wide")
    ev = fn.function_tasks(600, 0, "eval", "wide")
    for tasks, split in ((tr, "train"), (ev, "eval")):
        assert {(t.function, t.file, t.metadata["arg"]) for t in tasks} == {("f", "f.py", "n")}
        assert {t.metadata["op"] for t in tasks} == set(fn.BASIC_OPS)
        assert {t.metadata["const"] for t in tasks} == set(fn.WIDE_CONSTS)
        assert {t.metadata["template"] for t in tasks} == {x.name for x in fn.templates(split)}
        assert all(t.task_id.startswith(f"fnw-{split}-") for t in tasks)
        assert all(re.match(r"^\[[a-z]+\] ", t.instruction) for t in tasks)
    untagged = [{t.instruction.split("] ", 1)[1] for t in x} for x in (tr, ev)]
    assert untagged[0].isdisjoint(untagged[1])
    assert fn.function_tasks(2, 0, "train", "basic")[1].instruction == (
        "[db] Create f.py with f(n) returning n * 3."
    )
    task = fn.generate_function_tasks(tmp_path / "w", 1, 0, "eval", "wide")[0]
    ep = run_episode(task, ScriptedPolicy(fn.oracle_replies(task)), sandbox, tmp_path / "e")
    assert grade(task, ep.workspace, sandbox, ep).passed, task.instruction


def test_instructions_and_episodes_are_short():
    chat = AgentChat(ByteTokenizer())
    tasks = fn.function_tasks(400, 1, "train") + fn.function_tasks(200, 1, "eval")
    for t in tasks:
        assert 30 <= len(t.instruction) <= fn.MAX_INSTRUCTION_CHARS
        ids, mask = chat.conversation(fn.task_conversation(t))
        assert len(ids) <= 512 and fn.episode_bytes(t) <= fn.MAX_EPISODE_BYTES
        assert 3 <= t.tests[next(iter(t.tests))].count("assert ") <= 4
    assert len(compact_system_prompt()) <= 300 < len(system_prompt())


def test_conversation_mask_covers_exactly_the_replies(tmp_path):
    tok = ByteTokenizer()
    chat = AgentChat(tok)
    task = fn.generate_function_tasks(tmp_path, 1, 0, "train")[0]
    messages = fn.oracle_conversation(task)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == task_system_prompt(task) == compact_system_prompt()
    assert messages[1]["content"] == task.instruction
    ids, mask = chat.conversation(messages)
    assert len(ids) <= 512
    trained = tok.decode(ids[mask > 0])
    assert trained == IM_END.join(fn.oracle_replies(task)) + IM_END
    # The mask is two contiguous runs: one per reply.
    edges = [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]]
    assert len(edges) == 3 and mask[-1] == 1


def test_tool_output_is_what_the_real_tools_return(tmp_path, sandbox):
    for t in fn.function_tasks(5, 2, "train"):
        ws = tmp_path / t.task_id
        ws.mkdir()
        sandbox.give_workspace(ws)
        res = Tools(ws, sandbox)(ToolCall("write_file", {"path": t.file, "content": t.source}))
        assert res.ok and res.content == fn.task_conversation(t)[3]["content"][0]


def test_metadata_and_cli(tmp_path, capsys):
    assert fn.main(["--out", str(tmp_path), "--n", "3", "--seed", "5", "--split", "eval"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"n": 3, "out": str(tmp_path), "split": "eval", "seed": 5}
    tasks = load_tasks(tmp_path)
    for t in tasks:
        m = t.metadata
        assert m["source"] == "functions" and m["split"] == "eval" and m["grader"] == "functions"
        assert m["prompt_style"] == "compact" and m["pass_to_pass"] == [] and m["seed"] == 5
        assert m["template"] in {x.name for x in fn.templates("eval")}
        assert [p.name for p in t.solution_dir.iterdir()] == [m["file"]]
        assert not any(t.workspace_dir.iterdir())
    with pytest.raises(ValueError, match="split"):
        fn.function_tasks(1, 0, "test")


@pytest.mark.slow
def test_oracle_passes_and_noop_fails_through_tools_sandbox_and_grader(tmp_path, sandbox):
    tasks = fn.generate_function_tasks(tmp_path / "tr", 6, 11, "train")
    tasks += fn.generate_function_tasks(tmp_path / "ev", 4, 11, "eval")
    for task in tasks:
        ep = run_episode(task, ScriptedPolicy(fn.oracle_replies(task)), sandbox, tmp_path / "eps")
        g = grade(task, ep.workspace, sandbox, ep)
        assert g.passed, (task.instruction, g.failure_reason)
        assert ep.stop_reason == "submit" and ep.tool_calls == 2 and ep.invalid_tool_calls == 0
        convo = fn.oracle_conversation(task)
        assert [m["content"] for m in ep.messages[:3]] == [m["content"] for m in convo[:3]]
        assert ep.records[0]["tool_calls"][0]["result"] == convo[3]["content"][0]
        assert g.quality["new_findings"] == 0
        ep = run_episode(task, noop_policy(task), sandbox, tmp_path / "eps")
        g = grade(task, ep.workspace, sandbox, ep)
        assert not g.passed and g.correctness["f2p_passed"] == 0


def _final(task, tmp_path, sandbox, files, name):
    ws = tmp_path / name
    shutil.copytree(task.workspace_dir, ws)
    for rel, text in files.items():
        (ws / rel).write_text(text)
    sandbox.give_workspace(ws)
    return ws


WORKSPACES = {
    "correct": None,  # the solution
    "wrong": "def {f}({a}):\n    return None\n",
    "half": "def {f}({a}):\n    if {a} == {x0!r}:\n        return None\n    return {code}\n",
    "raises": "def {f}({a}):\n    raise ValueError('no')\n",
    "exits": "import sys\n\n\ndef {f}({a}):\n    sys.exit(0)\n",
    "syntax": "def {f}({a}:\n",
    "import_error": "import no_such_module_c2\n\n\ndef {f}({a}):\n    return {a}\n",
    "missing": "",
    "misnamed": "def other({a}):\n    return {a}\n",
}


def test_runner_gives_the_same_outcomes_as_pytest(tmp_path, sandbox):
    task = fn.generate_function_tasks(tmp_path / "t", 1, 7, "train")[0]
    m = task.metadata
    src = (task.solution_dir / m["file"]).read_text()
    first = task.tests_dir / f"test_{m['file'][:-3]}.py"
    x0 = re.search(r"assert \w+\((.+?)\) == ", first.read_text()).group(1)
    limits = SandboxLimits(timeout_s=20)
    seen = set()
    for name, body in WORKSPACES.items():
        files = {}
        if body is None:
            files = {m["file"]: src}
        elif body:
            code = src.split("return ", 1)[1].strip()
            fmt = {"f": m["function"], "a": m["arg"], "x0": eval(x0), "code": code}
            files = {m["file"]: body.format(**fmt)}
        ws = _final(task, tmp_path, sandbox, files, name)
        fast = runner_outcomes(task.tests_dir, ws, sandbox, limits=limits)
        slow = pytest_outcomes(task.tests_dir, ws, sandbox, limits=limits)
        assert fast.outcomes == slow.outcomes, name
        assert (fast.error is None) == (slow.error is None), (name, fast.error, slow.error)
        seen.add(tuple(sorted(fast.outcomes.values())) or fast.error.split(" in ")[0])
    assert {("passed", "passed"), ("failed", "failed"), ("failed", "passed")} <= seen
    assert "collection errors" in seen


PLAIN_TESTS = """import sys

from mod import value


def test_ok():
    assert value() == 1


def test_bad():
    assert value() == 2


def test_needs_fixture(no_such_fixture):
    pass


async def test_async():
    pass


def test_exit():
    sys.exit(0)


def helper():
    raise AssertionError("not a test")
"""


def test_runner_matches_pytest_on_a_hand_written_test_file(tmp_path, sandbox):
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "test_plain.py").write_text(PLAIN_TESTS)
    (tests / "sub" / "value_test.py").write_text("def test_sub():\n    assert True\n")
    (tests / "helpers.py").write_text("def test_not_collected():\n    assert False\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "mod.py").write_text("def value():\n    return 1\n")
    sandbox.give_workspace(ws)
    limits = SandboxLimits(timeout_s=20)
    fast = runner_outcomes(tests, ws, sandbox, limits=limits)
    slow = pytest_outcomes(tests, ws, sandbox, limits=limits)
    assert (
        fast.outcomes
        == slow.outcomes
        == {
            "tests/sub/value_test.py::test_sub": "passed",
            "tests/test_plain.py::test_ok": "passed",
            "tests/test_plain.py::test_bad": "failed",
            "tests/test_plain.py::test_needs_fixture": "failed",
            "tests/test_plain.py::test_async": "failed",
            "tests/test_plain.py::test_exit": "failed",
        }
    )
    assert fast.error is None and slow.error is None


def test_functions_grader_with_hostile_workspace_code(tmp_path, sandbox):
    task = load_task(fn.generate_function_tasks(tmp_path / "t", 1, 9, "eval")[0].root)
    m = task.metadata
    src = (task.solution_dir / m["file"]).read_text()
    host_file = tmp_path / "host.txt"
    host_file.write_text("original\n")
    forger = (
        "import json, os\n"
        "ids = " + repr(m["fail_to_pass"]) + "\n"
        "for p in ('/grading/out/results.json', '/grading/grading_runner.py', "
        f"'/grading/grading_worker.py', '{host_file}', '/workspace/x'):\n"
        "    try:\n"
        "        open(p, 'w').write('{}')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    hostile = {
        "json.py": "raise SystemExit('shadowed')\n",  # workspace last on sys.path: never imported
        "importlib.py": "raise SystemExit('shadowed')\n",
        m["file"]: src,
    }
    g = grade(task, _final(task, tmp_path, sandbox, hostile, "shadow"), sandbox)
    assert g.passed and g.quality["changed_py_files"]  # the real json and importlib were used
    g = grade(task, _final(task, tmp_path, sandbox, {m["file"]: forger + src}, "forge"), sandbox)
    # os._exit in the worker, during the import: a collection error naming what happened
    assert not g.passed and "collection errors in" in g.correctness["tests_error"]
    assert f"worker exited (code 0) during import of {m['file'][:-3]}" in g.failure_reason
    assert host_file.read_text() == "original\n"
    spin = _final(task, tmp_path, sandbox, {m["file"]: src + "while True:\n    pass\n"}, "spin")
    run = runner_outcomes(task.tests_dir, spin, sandbox, limits=SandboxLimits(timeout_s=2))
    assert run.outcomes == {} and "limit wall_time" in run.error
    assert "wall_time" in run.sandbox.limits_hit


def test_the_runner_imports_no_module_from_a_writable_filesystem(tmp_path):
    """grading_runner, once imported, has left its own directory off sys.path and refuses any
    module whose file lies on a filesystem mounted writable (here the host's tmp_path): nothing
    the sandbox can write ever runs in the trusted runner."""
    (tmp_path / "planted.py").write_text("PLANTED = True\n")
    envs = str(Path(grading.__file__).parent)
    code = f"import sys; sys.path.insert(0, {envs!r}); import grading_runner; "
    code += f"print({envs!r} in sys.path); sys.path.insert(0, {str(tmp_path)!r}); import planted"
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", code], capture_output=True, text=True
    )
    assert r.stdout == "False\n", r.stderr
    assert f"planted: {tmp_path}/planted.py is on a writable filesystem: not imported" in r.stderr


def test_a_limit_hit_by_the_hidden_tests_fails_even_when_they_pass(tmp_path, sandbox):
    if sandbox.isolation.cgroups is None:
        pytest.skip("the process limit is counted by the pids cgroup")
    task = fn.generate_function_tasks(tmp_path / "t", 1, 4, "train")[0]
    m = task.metadata
    flood = (
        "import os, time\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(0.5)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
    )
    src = flood + (task.solution_dir / m["file"]).read_text()
    g = grade(task, _final(task, tmp_path, sandbox, {m["file"]: src}, "flood"), sandbox)
    assert all(g.correctness["fail_to_pass"].values())  # every test passed ...
    assert not g.passed and "processes" in g.correctness["tests_limits_hit"]  # ... yet it fails
    assert "sandbox limit hit by the hidden tests: processes" in g.failure_reason
