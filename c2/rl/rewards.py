"""An episode's reward terms and effort counts, from its grade and its token stream
(docs/recipe.md §2).

Terms (raw, unweighted; the trainer weighs and signs them with `combine_rewards`):
  task               1 if the hidden tests pass (fail-to-pass and pass-to-pass, no sandbox limit)
  style              code quality of the change: 1 / (1 + new ruff findings in the changed Python
                     files); 0 when no Python file changed
  communication      1 if the episode ends with a final message (the submit message, or a reply
                     without tool calls) that names a file it changed, else 0
  tool_call_penalty  malformed or unknown tool calls plus calls written after submit (a count)
The KL term and the length penalty need the trainer (its forward, the config's k and q); the
effort counts the length penalty measures are counted here, per generated token:
  thinking_tokens      inside <think> ... </think>, the tags included
  tool_call_tokens     inside <tool_call> ... </tool_call>, the tags included
  final_message_tokens every other generated token (prose), the closing <|im_end|> excluded
  tool_output_tokens   tokens the environment appended (observations)
  num_tool_calls, num_turns
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from c2.data.chat import AgentChat
from c2.envs.grading import GradeRecord


def effort_counts(
    chat: AgentChat, turns: Sequence[Sequence[int]], tool_output_tokens: int, num_tool_calls: int
) -> dict[str, float]:
    """Effort counts of one episode from its generated turns (see the module doc)."""
    thinking = calls = prose = 0
    for ids in turns:
        in_think = in_call = False
        for t in ids:
            if t == chat.im_end:
                continue
            if t == chat.think:
                in_think = True
            if t == chat.tool_call:
                in_call = True
            if in_think:
                thinking += 1
            elif in_call:
                calls += 1
            else:
                prose += 1
            if t == chat.think_end:
                in_think = False
            if t == chat.tool_call_end:
                in_call = False
    return {
        "thinking_tokens": float(thinking),
        "tool_call_tokens": float(calls),
        "final_message_tokens": float(prose),
        "tool_output_tokens": float(tool_output_tokens),
        "num_tool_calls": float(num_tool_calls),
        "num_turns": float(len(turns)),
    }


def names_a_change(message: str | None, changed: Sequence[str]) -> bool:
    """Whether a final message names one of the changed files (by path, name or stem)."""
    if not message or not message.strip():
        return False
    for path in changed:
        name = os.path.basename(path)
        stem = os.path.splitext(name)[0]
        if any(k and k in message for k in (path, name, stem)):
            return True
    return False


def reward_terms(
    grade: GradeRecord, final_message: str | None, invalid_calls: int, calls_after_submit: int
) -> dict[str, float]:
    """The raw reward terms of one graded episode (see the module doc)."""
    q = grade.quality
    changed_py = q.get("changed_py_files") or []
    if q.get("available") and changed_py:
        style = 1.0 / (1.0 + float(q.get("new_findings", 0)))
    else:
        style = 0.0
    changed = list(q.get("changed_files") or changed_py)
    return {
        "task": 1.0 if grade.passed else 0.0,
        "style": style,
        "communication": 1.0 if names_a_change(final_message, changed) else 0.0,
        "tool_call_penalty": float(invalid_calls + calls_after_submit),
    }
