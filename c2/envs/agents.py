"""Reference agents: an oracle that applies the task's known fix through the tools, and a no-op.

Both are policies (see episode.py): the oracle reaches 100% on tasks with a solution, the no-op
0%; together they check that tasks, tools and grading agree.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable

from c2.envs.episode import Policy
from c2.envs.tasks import Task


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedPolicy:
    """Replies with the i-th message at the i-th assistant turn (stateless across threads)."""

    def __init__(self, replies: list[str]):
        if not replies:
            raise ValueError("ScriptedPolicy needs at least one reply")
        self.replies = replies

    def __call__(self, messages: list[dict]) -> str:
        turn = sum(m["role"] == "assistant" for m in messages)
        return self.replies[min(turn, len(self.replies) - 1)]


def noop_policy(task: Task | None = None) -> Policy:
    return ScriptedPolicy([tool_call("submit", message="I made no changes.")])


def _edit_calls(rel: str, old: str, new: str, max_context: int = 12) -> list[str]:
    """edit() calls turning `old` into `new` hunk by hunk, each `old` snippet unique in the file
    at that point; one write_file when no unique snippet exists."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    hunks = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    rewrite = [tool_call("write_file", path=rel, content=new)]
    calls, current = [], old
    for n, (_, i1, i2, j1, j2) in enumerate(hunks):
        # Context may not reach into a neighbouring hunk: its text differs by then.
        lo_bound = hunks[n - 1][2] if n > 0 else 0
        hi_bound = hunks[n + 1][1] if n + 1 < len(hunks) else len(a)
        for k in range(0 if i2 > i1 else 1, max_context + 1):
            lo, hi = max(lo_bound, i1 - k), min(hi_bound, i2 + k)
            snippet_old = "".join(a[lo:hi])
            snippet_new = "".join(a[lo:i1] + b[j1:j2] + a[i2:hi])
            if snippet_old and current.count(snippet_old) == 1:
                calls.append(tool_call("edit", path=rel, old=snippet_old, new=snippet_new))
                current = current.replace(snippet_old, snippet_new, 1)
                break
        else:
            return rewrite
    return calls if current == new else rewrite


def _solution_files(task: Task) -> dict[str, str]:
    if not task.solution_dir.is_dir():
        raise ValueError(f"task {task.task_id}: no solution/ directory; the oracle needs one")
    return {
        str(p.relative_to(task.solution_dir)): p.read_text()
        for p in sorted(task.solution_dir.rglob("*"))
        if p.is_file()
    }


def oracle_policy(task: Task) -> Policy:
    """Look around, apply the reference fix with edit/write_file (Harbor: run solve.sh), run the
    visible tests, submit."""
    steps = [tool_call("list_dir", path=".")]
    files = _solution_files(task)
    if task.grader == "harbor":
        if "solve.sh" not in files:
            raise ValueError(f"task {task.task_id}: solution/solve.sh is missing")
        steps.append(tool_call("run", command=files["solve.sh"], timeout=int(task.test_timeout_s)))
    else:
        for rel, new in files.items():
            current = task.workspace_dir / rel
            if current.is_file():
                steps.append(tool_call("read_file", path=rel, start=1, end=40))
                steps += _edit_calls(rel, current.read_text(), new)
            else:
                steps.append(tool_call("write_file", path=rel, content=new))
        if (task.workspace_dir / "tests").is_dir():
            steps.append(tool_call("run", command="python -m pytest -q -x tests", timeout=120))
    steps.append(tool_call("submit", message=f"Applied the fix to {', '.join(files)}."))
    return ScriptedPolicy(steps)


AGENTS: dict[str, Callable[[Task], Policy]] = {"oracle": oracle_policy, "noop": noop_policy}
