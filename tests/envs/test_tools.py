"""Tool-call parsing (Hermes/Qwen format) and the tools against a workspace."""

import json
import os

import pytest

from c2.envs.tools import (
    TOOLS,
    InvalidToolCall,
    ToolCall,
    Tools,
    clip,
    format_tool_response,
    parse_tool_calls,
)


def call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def test_parse_valid_calls_in_order():
    first, second = call("list_dir", path="."), call("read_file", path="a.py", start=2)
    text = f"I'll look.\n{first}\nthen\n{second}"
    assert parse_tool_calls(text) == [
        ToolCall("list_dir", {"path": "."}),
        ToolCall("read_file", {"path": "a.py", "start": 2}),
    ]


def test_parse_no_calls():
    assert parse_tool_calls("All done, no tools needed.") == []


def test_parse_arguments_given_as_json_string():
    text = '<tool_call>{"name": "run", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("run", {"command": "ls"})]


def raw(obj) -> str:
    return f"<tool_call>{json.dumps(obj)}</tool_call>"


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        (raw({"name": "rm_rf", "arguments": {}}), "unknown tool 'rm_rf'"),
        (raw({"name": "edit", "arguments": {"path": "a"}}), "missing ['old', 'new']"),
        (raw({"name": "list_dir", "arguments": {"recursive": True}}), "unknown ['recursive']"),
        (
            raw({"name": "read_file", "arguments": {"path": "a", "start": "1"}}),
            "'start' must be int",
        ),
        (raw({"name": "run", "arguments": {"command": "ls", "timeout": True}}), "must be int"),
        (raw(["run"]), 'expected {"name"'),
        ('<tool_call>{"name": "run", "arguments": {"command": "ls"}}', "unclosed <tool_call>"),
    ],
)
def test_parse_invalid_calls(text, error):
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and isinstance(calls[0], InvalidToolCall)
    assert error in calls[0].error


def test_tool_schemas_cover_the_issue_list():
    names = [t["function"]["name"] for t in TOOLS]
    assert names == ["read_file", "list_dir", "search", "edit", "write_file", "run", "submit"]


def test_response_wrapping_and_clipping():
    assert format_tool_response("x") == "<tool_response>\nx\n</tool_response>"
    long = "a" * 100 + "b" * 100
    out = clip(long, 60)
    assert out.startswith("a" * 40) and out.endswith("b" * 20) and "140 characters cut" in out


@pytest.fixture
def tools(workspace, sandbox):
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "mod.py").write_text("\n".join(f"line {i}" for i in range(1, 11)) + "\n")
    (workspace / "notes.txt").write_text("alpha\nbeta\nalpha beta\n")
    sandbox.give_workspace(workspace)
    return Tools(workspace, sandbox, max_observation_chars=4000)


def test_read_file_numbered_range(tools):
    r = tools(ToolCall("read_file", {"path": "pkg/mod.py", "start": 3, "end": 4}))
    assert r.ok and r.content == "    3\tline 3\n    4\tline 4\n[lines 5-10 not shown]"
    r = tools(ToolCall("read_file", {"path": "/workspace/pkg/mod.py", "start": 10}))
    assert r.content == "   10\tline 10"
    r = tools(ToolCall("read_file", {"path": "pkg/mod.py", "start": 50}))
    assert not r.ok and r.error == "bad_range"


def test_read_file_refuses_non_regular_and_missing(tools, workspace):
    os.mkfifo(workspace / "fifo")
    assert tools(ToolCall("read_file", {"path": "fifo"})).error == "bad_path"
    assert tools(ToolCall("read_file", {"path": "nope.py"})).error == "os_error"
    assert tools(ToolCall("read_file", {"path": "/etc/passwd"})).error == "bad_path"


def test_list_dir(tools, workspace):
    os.symlink("notes.txt", workspace / "ln")
    r = tools(ToolCall("list_dir", {}))
    assert r.content.split("\n") == ["ln -> notes.txt", "notes.txt  (22 bytes)", "pkg/"]


def test_search(tools):
    r = tools(ToolCall("search", {"pattern": "alpha( beta)?$", "path": "."}))
    assert r.ok and sorted(r.content.strip().split("\n")) == [
        "./notes.txt:1:alpha",
        "./notes.txt:3:alpha beta",
    ]
    assert tools(ToolCall("search", {"pattern": "zzz"})).content == "No matches."
    bad = tools(ToolCall("search", {"pattern": "a(b"}))
    assert not bad.ok and bad.error == "search_failed"


def test_edit_exact_unique_occurrence(tools, workspace):
    r = tools(ToolCall("edit", {"path": "notes.txt", "old": "beta\nalpha", "new": "BETA\nALPHA"}))
    assert r.ok and "line 2" in r.content
    assert (workspace / "notes.txt").read_text() == "alpha\nBETA\nALPHA beta\n"
    r = tools(ToolCall("edit", {"path": "notes.txt", "old": "a", "new": "b"}))
    assert r.error == "bad_edit" and "found" in r.content and "times" in r.content
    r = tools(ToolCall("edit", {"path": "notes.txt", "old": "gamma", "new": "b"}))
    assert r.error == "bad_edit" and "not found" in r.content


def test_write_file_creates_dirs_owned_by_the_sandbox(tools, workspace, sandbox):
    r = tools(ToolCall("write_file", {"path": "new/deep/f.py", "content": "x = 1\n"}))
    assert r.ok and (workspace / "new/deep/f.py").read_text() == "x = 1\n"
    uid = sandbox.isolation.host_uid
    assert (workspace / "new").stat().st_uid == uid and (
        workspace / "new/deep/f.py"
    ).stat().st_uid == uid
    # The sandboxed command can modify what the host-side tool wrote.
    r = tools(ToolCall("run", {"command": "echo more >> new/deep/f.py && cat new/deep/f.py"}))
    assert r.ok and r.content.endswith("x = 1\nmore\n")


def test_write_file_refuses_to_escape(tools, workspace, tmp_path):
    assert (
        tools(ToolCall("write_file", {"path": "../escape.txt", "content": "x"})).error == "bad_path"
    )
    os.symlink(tmp_path, workspace / "out")
    assert (
        tools(ToolCall("write_file", {"path": "out/escape.txt", "content": "x"})).error
        == "bad_path"
    )
    assert not (tmp_path / "escape.txt").exists()


def test_run_reports_exit_code_and_limit(tools):
    r = tools(ToolCall("run", {"command": "echo hi; exit 2"}))
    assert not r.ok and r.error is None
    assert r.content == "exit_code: 2\nstdout:\nhi\n"
    r = tools(ToolCall("run", {"command": "sleep 10", "timeout": 1}))
    assert "stopped by limit: wall_time" in r.content


def test_invalid_call_becomes_an_error_observation(tools):
    r = tools(InvalidToolCall("{", "tool call is not valid JSON"))
    assert not r.ok and r.error == "invalid_call" and r.content.startswith("Error:")
