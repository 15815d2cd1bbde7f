"""Reward terms and effort counts against hand-computed values."""

import pytest

from c2.data.chat import AgentChat
from c2.data.tokenizer import ByteTokenizer
from c2.envs.grading import GradeRecord
from c2.rl.rewards import effort_counts, names_a_change, reward_terms


@pytest.fixture(scope="module")
def chat():
    return AgentChat(ByteTokenizer())


def test_effort_counts_split_thinking_calls_and_prose(chat):
    # turn 1: <think>ab</think> then <tool_call>{}</tool_call>, <|im_end|>
    turn1 = chat.reply("<think>ab</think>ok<tool_call>{}</tool_call>")
    turn2 = chat.reply("done")
    counts = effort_counts(chat, [turn1, turn2], tool_output_tokens=17, num_tool_calls=1)
    assert counts == {
        "thinking_tokens": 4.0,  # <think> a b </think>
        "tool_call_tokens": 4.0,  # <tool_call> { } </tool_call>
        "final_message_tokens": 6.0,  # "ok" + "done"; the two <|im_end|> are not counted
        "tool_output_tokens": 17.0,
        "num_tool_calls": 1.0,
        "num_turns": 2.0,
    }


@pytest.mark.parametrize(
    "message, changed, want",
    [
        ("Added triple to triple.py.", ["triple.py"], True),
        ("Changed the helper in pkg/util.py", ["pkg/util.py"], True),
        ("updated util", ["pkg/util.py"], True),  # the stem names it
        ("All done.", ["triple.py"], False),
        ("", ["triple.py"], False),
        (None, ["triple.py"], False),
        ("Added triple.py", [], False),  # nothing changed: nothing to state
    ],
)
def test_communication_needs_a_message_naming_a_change(message, changed, want):
    assert names_a_change(message, changed) is want


def _grade(passed, quality):
    return GradeRecord("t", "e", passed, None, {}, quality, {}, {})


def test_reward_terms_by_hand():
    q = {"available": True, "changed_py_files": ["a.py"], "new_findings": 3}
    terms = reward_terms(_grade(True, q), "Fixed a.py", invalid_calls=2, calls_after_submit=1)
    assert terms == {
        "task": 1.0,
        "style": 0.25,  # 1 / (1 + 3)
        "communication": 1.0,
        "tool_call_penalty": 3.0,
    }
    none_changed = {"available": True, "changed_py_files": [], "new_findings": 0}
    terms = reward_terms(_grade(False, none_changed), "Fixed a.py", 0, 0)
    assert terms == {"task": 0.0, "style": 0.0, "communication": 0.0, "tool_call_penalty": 0.0}
