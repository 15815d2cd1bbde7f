"""The agent's tools and the Hermes/Qwen tool-call format.

A model calls a tool by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; each
result comes back as `<tool_response>...</tool_response>`. File tools act on the host copy of the
workspace with every path resolved inside it (symlinks included: nothing in the sandbox is alive
between calls, so a resolved path cannot change under us); `run` and `search` execute in the
sandbox. A malformed or unknown call is an error observation, never an exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat

from c2.envs.sandbox import Sandbox, SandboxLimits, SandboxResult


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    params = {"type": "object", "properties": props, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


_S, _I = {"type": "string"}, {"type": "integer"}
TOOLS = [
    _fn(
        "read_file",
        "Read lines start..end (1-based, inclusive) of a text file, numbered.",
        {"path": _S, "start": _I, "end": _I},
        ["path"],
    ),
    _fn("list_dir", "List a directory of the workspace.", {"path": _S}, []),
    _fn(
        "search",
        "Search files for an extended regular expression (grep -rnE).",
        {"pattern": _S, "path": _S},
        ["pattern"],
    ),
    _fn(
        "edit",
        "Replace the one exact occurrence of `old` in a file with `new`.",
        {"path": _S, "old": _S, "new": _S},
        ["path", "old", "new"],
    ),
    _fn(
        "write_file",
        "Create or overwrite a file with `content`.",
        {"path": _S, "content": _S},
        ["path", "content"],
    ),
    _fn(
        "run",
        "Run a shell command in the workspace (sandboxed, no network).",
        {"command": _S, "timeout": _I},
        ["command"],
    ),
    _fn(
        "submit", "Finish: give a short summary of what you changed.", {"message": _S}, ["message"]
    ),
]
_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
_TYPES = {"string": str, "integer": int}
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class InvalidToolCall:
    raw: str
    error: str


@dataclasses.dataclass
class ToolResult:
    ok: bool
    content: str
    error: str | None = None  # short kind: "invalid_call", "not_found", "outside_workspace", ...
    sandbox: SandboxResult | None = None


def parse_tool_calls(text: str) -> list[ToolCall | InvalidToolCall]:
    """Every `<tool_call>` block of a model message, validated against the tool schemas."""
    calls: list[ToolCall | InvalidToolCall] = []
    for m in _CALL_RE.finditer(text):
        calls.append(validate_tool_call(m.group(1).strip()))
    dangling = text.count("<tool_call>") - len(calls)
    if dangling > 0:
        calls.append(
            InvalidToolCall(text[text.rfind("<tool_call>") :][:200], "unclosed <tool_call>")
        )
    return calls


def validate_tool_call(raw: str) -> ToolCall | InvalidToolCall:
    """One call's JSON text (what sits between the tags) checked against the tool schemas."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return InvalidToolCall(raw[:200], f"tool call is not valid JSON: {e}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return InvalidToolCall(raw[:200], 'expected {"name": <tool>, "arguments": {...}}')
    name, args = obj["name"], obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return InvalidToolCall(raw[:200], f"{name}: arguments string is not JSON")
    if name not in _SCHEMAS:
        return InvalidToolCall(raw[:200], f"unknown tool {name!r}; tools: {', '.join(_SCHEMAS)}")
    if not isinstance(args, dict):
        return InvalidToolCall(raw[:200], f"{name}: arguments must be an object")
    schema = _SCHEMAS[name]
    missing = [k for k in schema["required"] if k not in args]
    unknown = [k for k in args if k not in schema["properties"]]
    if missing or unknown:
        return InvalidToolCall(raw[:200], f"{name}: missing {missing}, unknown {unknown}")
    for k, v in args.items():
        want = _TYPES[schema["properties"][k]["type"]]
        if v is not None and (not isinstance(v, want) or isinstance(v, bool)):
            return InvalidToolCall(raw[:200], f"{name}: argument {k!r} must be {want.__name__}")
    return ToolCall(name, {k: v for k, v in args.items() if v is not None})


def format_tool_response(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def clip(text: str, limit: int) -> str:
    """Keep the head and the tail of a long observation."""
    if len(text) <= limit:
        return text
    head, tail = (limit * 2) // 3, limit // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


class _PathError(Exception):
    pass


class Tools:
    """Executes tool calls against one episode's workspace."""

    def __init__(
        self,
        workspace: str | os.PathLike,
        sandbox: Sandbox,
        *,
        mount_at: str = "/workspace",
        run_limits: SandboxLimits | None = None,
        max_run_timeout_s: float = 120.0,
        max_observation_chars: int = 8000,
        max_read_lines: int = 400,
        python_env: str | os.PathLike | None = None,
    ):
        self.root = os.path.realpath(workspace)
        self.sandbox, self.mount_at = sandbox, mount_at.rstrip("/")
        self.run_limits = run_limits or SandboxLimits(timeout_s=60)
        self.max_run_timeout_s = max_run_timeout_s
        self.max_chars, self.max_read_lines = max_observation_chars, max_read_lines
        self.sandbox_results: list[SandboxResult] = []
        self.python_env = python_env  # the task's environment (Task.python_env), else c2's

    def __call__(self, call: ToolCall | InvalidToolCall) -> ToolResult:
        if isinstance(call, InvalidToolCall):
            return ToolResult(False, f"Error: {call.error}", "invalid_call")
        if call.name == "submit":
            return ToolResult(True, "Submitted.")
        try:
            result = getattr(self, call.name)(**call.arguments)
        except _PathError as e:
            return ToolResult(False, f"Error: {e}", "bad_path")
        except OSError as e:
            return ToolResult(False, f"Error: {e.strerror or e}", "os_error")
        result.content = clip(result.content, self.max_chars)
        return result

    # ------------------------------------------------------------------ paths

    def _resolve(self, path: str) -> str:
        p = path.strip()
        if p == self.mount_at or p.startswith(self.mount_at + "/"):
            p = p[len(self.mount_at) :].lstrip("/")
        if os.path.isabs(p):
            raise _PathError(f"{path!r} is outside the workspace {self.mount_at}")
        full = os.path.realpath(os.path.join(self.root, p or "."))
        if full != self.root and not full.startswith(self.root + os.sep):
            raise _PathError(f"{path!r} resolves outside the workspace")
        return full

    def _rel(self, full: str) -> str:
        return os.path.relpath(full, self.root)

    def _read_regular(self, full: str, path: str) -> str:
        st = os.stat(full)
        if not stat.S_ISREG(st.st_mode):
            raise _PathError(f"{path!r} is not a regular file")
        if st.st_size > self.sandbox.limits.max_file_mb << 20:
            raise _PathError(f"{path!r} is too large ({st.st_size} bytes)")
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            raise _PathError(f"{path!r} is a binary file ({len(data)} bytes)")
        return data.decode("utf-8", "replace")

    def _write(self, full: str, text: str) -> None:
        uid = self.sandbox.isolation.host_uid
        parent = os.path.dirname(full)
        missing = []
        while not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(missing):
            os.mkdir(d)
            if uid != os.geteuid():
                os.lchown(d, uid, uid)
        if os.path.lexists(full) and not os.path.isfile(full):
            raise _PathError(f"{self._rel(full)!r} exists and is not a regular file")
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if uid != os.geteuid():
            os.lchown(full, uid, uid)

    # ------------------------------------------------------------------ tools

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> ToolResult:
        full = self._resolve(path)
        lines = self._read_regular(full, path).splitlines()
        start = max(1, start)
        end = min(len(lines), end if end is not None else start + self.max_read_lines - 1)
        if start > max(1, len(lines)):
            return ToolResult(False, f"Error: {path!r} has {len(lines)} lines", "bad_range")
        body = "\n".join(f"{i:>5}\t{lines[i - 1]}" for i in range(start, end + 1))
        more = f"\n[lines {end + 1}-{len(lines)} not shown]" if end < len(lines) else ""
        return ToolResult(True, body + more)

    def list_dir(self, path: str = ".") -> ToolResult:
        full = self._resolve(path)
        if not os.path.isdir(full):
            return ToolResult(False, f"Error: {path!r} is not a directory", "not_found")
        rows = []
        for entry in sorted(os.scandir(full), key=lambda e: e.name)[:500]:
            if entry.is_symlink():
                rows.append(f"{entry.name} -> {os.readlink(entry.path)}")
            elif entry.is_dir(follow_symlinks=False):
                rows.append(entry.name + "/")
            else:
                rows.append(f"{entry.name}  ({entry.stat(follow_symlinks=False).st_size} bytes)")
        return ToolResult(True, "\n".join(rows) or "(empty)")

    def search(self, pattern: str, path: str = ".") -> ToolResult:
        rel = self._rel(self._resolve(path))
        cmd = ["grep", "-rnIE", "--exclude-dir=.git", "-m", "100", "-e", pattern, "--", rel]
        limits = dataclasses.replace(self.run_limits, timeout_s=10, max_output_bytes=256 << 10)
        r = self._sandboxed(cmd, limits)
        if r.exit_code == 1 and not r.stderr:
            return ToolResult(True, "No matches.", sandbox=r)
        if r.exit_code != 0:
            return ToolResult(False, f"Error: {r.stderr.strip() or r.limit}", "search_failed", r)
        return ToolResult(True, r.stdout, sandbox=r)

    def edit(self, path: str, old: str, new: str) -> ToolResult:
        full = self._resolve(path)
        text = self._read_regular(full, path)
        if not old:
            return ToolResult(False, "Error: `old` is empty; use write_file to create", "bad_edit")
        n = text.count(old)
        if n != 1:
            where = "not found" if n == 0 else f"found {n} times; include more context"
            return ToolResult(False, f"Error: `old` {where} in {path!r}", "bad_edit")
        self._write(full, text.replace(old, new, 1))
        line = text[: text.index(old)].count("\n") + 1
        return ToolResult(True, f"Edited {self._rel(full)} at line {line}.")

    def write_file(self, path: str, content: str) -> ToolResult:
        full = self._resolve(path)
        if full == self.root:
            raise _PathError(f"{path!r} is the workspace directory")
        if len(content.encode()) > self.sandbox.limits.max_file_mb << 20:
            return ToolResult(False, "Error: content exceeds the file size limit", "too_large")
        self._write(full, content)
        return ToolResult(True, f"Wrote {len(content)} characters to {self._rel(full)}.")

    def run(self, command: str, timeout: int | None = None) -> ToolResult:
        t = self.run_limits.timeout_s if timeout is None else timeout
        limits = dataclasses.replace(
            self.run_limits, timeout_s=max(1, min(t, self.max_run_timeout_s))
        )
        r = self._sandboxed(command, limits)
        head = f"exit_code: {r.exit_code}" + (f"\nstopped by limit: {r.limit}" if r.limit else "")
        parts = [head]
        if r.stdout:
            parts.append("stdout:\n" + clip(r.stdout, self.max_chars // 2))
        if r.stderr:
            parts.append("stderr:\n" + clip(r.stderr, self.max_chars // 2))
        return ToolResult(r.exit_code == 0 and r.limit is None, "\n".join(parts), None, r)

    def _sandboxed(self, command, limits) -> SandboxResult:
        r = self.sandbox.run(
            command, self.root, limits=limits, mount_at=self.mount_at, python_env=self.python_env
        )
        self.sandbox_results.append(r)
        return r
