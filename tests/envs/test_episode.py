"""The episode runner: policy interface, trajectory records, budgets, concurrency."""

import dataclasses
import json

import pytest

from c2.envs.agents import ScriptedPolicy, noop_policy, oracle_policy, tool_call
from c2.envs.episode import (
    EpisodeConfig,
    JsonlWriter,
    PolicyOutput,
    run_episode,
    run_episodes,
    system_prompt,
    to_policy_output,
)
from c2.envs.tasks import write_task

TESTS = """from calc import add


def test_add():
    assert add(2, 3) == 5


def test_comm():
    assert add(1, 0) == add(0, 1)
"""


@pytest.fixture
def task(tmp_path):
    ok = "def add(a, b):\n    return a + b\n"
    return write_task(
        tmp_path / "task",
        instruction="add(2, 3) should be 5.",
        metadata={
            "task_id": "calc",
            "fail_to_pass": ["tests/test_calc.py::test_add"],
            "pass_to_pass": ["tests/test_calc.py::test_comm"],
            "difficulty": 1,
            "seed": 0,
            "source": "test",
        },
        workspace={"calc.py": ok.replace("a + b", "a * b"), "tests/test_calc.py": TESTS},
        tests={"test_calc.py": TESTS},
        solution={"calc.py": ok},
    )


def test_policy_output_forms():
    assert to_policy_output("hi") == PolicyOutput("hi")
    d = to_policy_output(
        {"text": "t", "token_ids": [1, 2], "logprobs": [-0.5, -1], "policy_version": 7}
    )
    assert d == PolicyOutput("t", [1, 2], [-0.5, -1.0], 7)

    @dataclasses.dataclass
    class Gen:
        text: str
        token_ids: list

    assert to_policy_output(Gen("x", [5])) == PolicyOutput("x", [5], None, None)
    with pytest.raises(ValueError, match="2 token_ids but 1 logprobs"):
        to_policy_output({"text": "t", "token_ids": [1, 2], "logprobs": [0.0]})
    with pytest.raises(TypeError, match="expected str, dict or .text"):
        to_policy_output(42)
    with pytest.raises(TypeError, match="text=None"):
        to_policy_output({"token_ids": [1]})


def test_system_prompt_lists_tools_in_hermes_form():
    p = system_prompt()
    assert "<tools>" in p and "</tools>" in p and "<tool_call>" in p
    for name in ("read_file", "list_dir", "search", "edit", "write_file", "run", "submit"):
        assert f'"name": "{name}"' in p


def test_oracle_episode_records_the_trajectory(task, sandbox, tmp_path):
    writer = JsonlWriter(tmp_path / "traj.jsonl")
    ep = run_episode(
        task, oracle_policy(task), sandbox, tmp_path / "eps", writer=writer, segment_id=2
    )
    assert ep.stop_reason == "submit" and ep.submitted and ep.final_message.startswith("Applied")
    assert (ep.workspace / "calc.py").read_text() == (task.solution_dir / "calc.py").read_text()
    assert (task.workspace_dir / "calc.py").read_text().count("a * b") == 1  # the task is untouched
    lines = [json.loads(x) for x in (tmp_path / "traj.jsonl").read_text().splitlines()]
    assert len(lines) == ep.turns == len(ep.records)
    assert [r["turn"] for r in lines] == list(range(ep.turns))
    first = lines[0]
    assert first["segment_id"] == 2 and first["episode_id"] == ep.episode_id
    a, t = first["segments"]
    assert (a["role"], a["loss_mask"], t["role"], t["loss_mask"]) == ("assistant", 1, "tool", 0)
    assert t["text"].startswith("<tool_response>\n") and t["text"].endswith("\n</tool_response>")
    assert first["tool_calls"][0]["name"] == "list_dir" and first["tool_calls"][0]["ok"]
    assert set(first["timings"]) == {"policy_s", "tools_s"}
    # Tool results reach the policy as a user message of <tool_response> blocks.
    assert ep.messages[3] == {"role": "user", "content": t["text"]}


def test_token_ids_logprobs_and_version_are_kept(task, sandbox, tmp_path):
    def policy(messages):
        return {"text": tool_call("submit", message="done"), "token_ids": [11, 12, 13],
                "logprobs": [-0.1, -0.2, -0.3], "policy_version": 4}  # fmt: skip

    ep = run_episode(task, policy, sandbox, tmp_path / "eps")
    seg = ep.records[0]["segments"][0]
    assert seg["token_ids"] == [11, 12, 13] and seg["logprobs"] == [-0.1, -0.2, -0.3]
    assert seg["policy_version"] == 4 and ep.model_tokens == 3


def test_invalid_calls_are_counted_not_fatal(task, sandbox, tmp_path):
    policy = ScriptedPolicy([
        "<tool_call>{oops</tool_call>",
        tool_call("delete_everything"),
        tool_call("read_file", path="missing.py"),
        tool_call("submit", message="gave up"),
    ])  # fmt: skip
    ep = run_episode(task, policy, sandbox, tmp_path / "eps")
    assert ep.invalid_tool_calls == 2 and ep.tool_errors == 1 and ep.stop_reason == "submit"
    assert "Error: tool call is not valid JSON" in ep.records[0]["segments"][1]["text"]


def test_plain_reply_is_the_final_message(task, sandbox, tmp_path):
    ep = run_episode(task, ScriptedPolicy(["I think it works."]), sandbox, tmp_path / "eps")
    assert ep.stop_reason == "final_message" and ep.final_message == "I think it works."
    assert not ep.submitted and ep.turns == 1


def test_turn_and_token_budgets(task, sandbox, tmp_path):
    looping = ScriptedPolicy([tool_call("list_dir", path=".")])
    ep = run_episode(task, looping, sandbox, tmp_path / "a", EpisodeConfig(max_turns=3))
    assert ep.stop_reason == "max_turns" and ep.turns == 3
    config = EpisodeConfig(max_tokens=50, count_tokens=lambda text: 20)
    ep = run_episode(task, looping, sandbox, tmp_path / "b", config)
    assert ep.stop_reason == "max_tokens" and ep.turns == 3 and ep.model_tokens == 60


def test_config_validation():
    with pytest.raises(ValueError, match="max_turns=0"):
        EpisodeConfig(max_turns=0)


def test_many_episodes_concurrently(task, sandbox, tmp_path):
    tasks = [task] * 4
    eps = run_episodes(tasks, lambda t: noop_policy(t), sandbox, tmp_path / "eps", workers=4)
    assert [e.stop_reason for e in eps] == ["submit"] * 4
    assert len({e.episode_id for e in eps}) == 4 and len({e.workspace for e in eps}) == 4
    done = run_episodes(tasks[:2], oracle_policy, sandbox, tmp_path / "eps2", workers=2,
                        then=lambda t, e: (e.workspace / "calc.py").read_text())  # fmt: skip
    assert done == [(task.solution_dir / "calc.py").read_text()] * 2
