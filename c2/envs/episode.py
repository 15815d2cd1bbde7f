"""Drive a policy through one agent session on one task and record the trajectory.

The policy interface (all the RL stage has to provide):

    policy(messages: list[dict]) -> str | PolicyOutput | dict

`messages` is the conversation so far: {"role": "system" | "user" | "assistant", "content": str}
dicts (tool results come back as a user message of `<tool_response>` blocks, exactly what the
Qwen chat template renders for tool turns). The reply is the next assistant message: a plain
string, or text plus optional `token_ids`, `logprobs` (one per token) and `policy_version`
(an object with those attributes, or a dict with those keys).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from c2.envs.sandbox import Sandbox, SandboxLimits, SandboxResult
from c2.envs.tasks import PROMPT_STYLES, Task
from c2.envs.tools import TOOLS, InvalidToolCall, Tools, format_tool_response, parse_tool_calls


@dataclasses.dataclass(frozen=True)
class PolicyOutput:
    text: str
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None
    policy_version: int | None = None


Policy = Callable[[list[dict]], "str | PolicyOutput | Mapping"]


def to_policy_output(reply) -> PolicyOutput:
    """Normalise what a policy returned; reject malformed replies with a clear error."""
    if isinstance(reply, str):
        return PolicyOutput(reply)
    if isinstance(reply, Mapping):
        get = reply.get
    elif hasattr(reply, "text"):
        get = lambda k, d=None: getattr(reply, k, d)
    else:
        raise TypeError(f"policy returned {type(reply).__name__}: expected str, dict or .text")
    text = get("text")
    if not isinstance(text, str):
        raise TypeError(f"policy reply text={text!r}: expected a str")
    ids, lps = get("token_ids"), get("logprobs")
    if ids is not None and lps is not None and len(ids) != len(lps):
        raise ValueError(f"policy reply: {len(ids)} token_ids but {len(lps)} logprobs")
    return PolicyOutput(
        text,
        list(ids) if ids is not None else None,
        [float(x) for x in lps] if lps is not None else None,
        get("policy_version"),
    )


def system_prompt(mount_at: str = "/workspace") -> str:
    tools = "\n".join(json.dumps(t) for t in TOOLS)
    return (
        f"You are a software engineer working in the repository at {mount_at}. Use the tools to "
        "read, search, edit and run code, then call submit with a short summary.\n\n# Tools\n\n"
        "You may call one or more functions. Function signatures are within <tools></tools>:\n"
        f"<tools>\n{tools}\n</tools>\n\n"
        "For each call, write a JSON object with the name and arguments within <tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def compact_system_prompt(mount_at: str = "/workspace") -> str:
    """One line per tool with its required arguments, then the call format (~175 bytes: a
    byte-level tiny model reads it in every episode and trains on 512 tokens). Paths are
    relative to the workspace; its mount point is named only when it is not /workspace."""
    lines = ["Tools:" if mount_at == "/workspace" else f"Tools (repo {mount_at}):"]
    for t in TOOLS:
        f = t["function"]
        lines.append(f"{f['name']}({','.join(f['parameters']['required'])})")
    lines.append('<tool_call>{"name":..,"arguments":{..}}</tool_call>')
    return "\n".join(lines)


def task_system_prompt(task: Task) -> str:
    """The system prompt for `task`, by its metadata "prompt_style" ("full" by default, or
    "compact"): what run_episode and the RL episode driver both send."""
    style = task.metadata.get("prompt_style", "full")
    if style == "compact":
        return compact_system_prompt(task.mount_at)
    if style == "full":
        return system_prompt(task.mount_at)
    raise ValueError(
        f"task {task.task_id}: prompt_style={style!r}: expected one of {PROMPT_STYLES}"
    )


def approx_tokens(text: str) -> int:
    """Token estimate when the policy gives no token ids (about 4 bytes per token for code)."""
    return max(1, len(text.encode()) // 4)


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    max_turns: int = 30
    max_tokens: int = 32768
    max_observation_chars: int = 8000
    run_limits: SandboxLimits = SandboxLimits(timeout_s=60)
    max_run_timeout_s: float = 120.0
    count_tokens: Callable[[str], int] = approx_tokens

    def __post_init__(self):
        for k in ("max_turns", "max_tokens", "max_observation_chars"):
            if getattr(self, k) < 1:
                raise ValueError(f"EpisodeConfig.{k}={getattr(self, k)}: expected >= 1")


@dataclasses.dataclass
class Episode:
    episode_id: str
    task_id: str
    segment_id: int
    workspace: Path
    messages: list[dict]
    records: list[dict]
    final_message: str | None = None
    submitted: bool = False
    stop_reason: str = ""
    turns: int = 0
    model_tokens: int = 0
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    tool_errors: int = 0
    wall_s: float = 0.0
    sandbox_results: list[SandboxResult] = dataclasses.field(default_factory=list)


class JsonlWriter:
    """Thread-safe append of JSON lines (one trajectory record per line)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, records: Sequence[dict]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in records)
        with self._lock, open(self.path, "a") as f:
            f.write(text)


def run_episode(
    task: Task,
    policy: Policy,
    sandbox: Sandbox,
    workdir: str | os.PathLike,
    config: EpisodeConfig = EpisodeConfig(),
    *,
    episode_id: str | None = None,
    segment_id: int = 0,
    writer: JsonlWriter | None = None,
) -> Episode:
    """One session: copy the workspace, loop policy -> tool calls -> observations, record.
    A container task runs in its image (Task.sandbox), any other in `sandbox`."""
    sandbox = task.sandbox(sandbox)
    if not sandbox.isolated:
        raise RuntimeError(
            f"episodes need a namespace sandbox; this machine has {sandbox.isolation.describe()}"
        )
    t0 = time.monotonic()
    episode_id = episode_id or f"{task.task_id}-{uuid.uuid4().hex[:8]}"
    workspace = task.materialize(Path(workdir) / episode_id)
    sandbox.give_workspace(workspace)
    tools = Tools(
        workspace,
        sandbox,
        mount_at=task.mount_at,
        run_limits=task.limits(config.run_limits),  # a task's own memory, cpus, storage
        max_run_timeout_s=config.max_run_timeout_s,
        max_observation_chars=config.max_observation_chars,
        python_env=task.python_env(),
    )
    messages = [
        {"role": "system", "content": task_system_prompt(task)},
        {"role": "user", "content": task.instruction},
    ]
    ep = Episode(episode_id, task.task_id, segment_id, workspace, messages, [])
    while not ep.stop_reason:
        if ep.turns >= config.max_turns:
            ep.stop_reason = "max_turns"
            break
        t_policy = time.monotonic()
        out = to_policy_output(policy(list(messages)))
        t_policy = time.monotonic() - t_policy
        n_tokens = (
            len(out.token_ids) if out.token_ids is not None else config.count_tokens(out.text)
        )
        ep.turns += 1
        ep.model_tokens += n_tokens
        messages.append({"role": "assistant", "content": out.text})
        calls = parse_tool_calls(out.text)
        t_tools = time.monotonic()
        call_records, responses = [], []
        for call in calls:
            t_call = time.monotonic()
            result = tools(call)
            ep.tool_calls += 1
            if isinstance(call, InvalidToolCall):
                ep.invalid_tool_calls += 1
            elif not result.ok and result.error is not None:
                ep.tool_errors += 1
            call_records.append(
                {
                    "name": getattr(call, "name", None),
                    "arguments": getattr(call, "arguments", None),
                    "raw": getattr(call, "raw", None),
                    "ok": result.ok,
                    "error": result.error,
                    "result": result.content,
                    "limit": result.sandbox.limit if result.sandbox else None,
                    "t_s": time.monotonic() - t_call,
                }
            )
            responses.append(format_tool_response(result.content))
            if getattr(call, "name", None) == "submit":
                ep.submitted, ep.final_message = True, call.arguments["message"]
                ep.stop_reason = "submit"
                break
        t_tools = time.monotonic() - t_tools
        if not calls:
            ep.final_message, ep.stop_reason = out.text, "final_message"
        observation = "\n".join(responses)
        if observation and not ep.submitted:
            messages.append({"role": "user", "content": observation})
        ep.records.append(
            {
                "episode_id": episode_id,
                "task_id": task.task_id,
                "segment_id": segment_id,
                "turn": ep.turns - 1,
                "segments": [
                    {
                        "role": "assistant",
                        "text": out.text,
                        "loss_mask": 1,
                        "n_tokens": n_tokens,
                        "token_ids": list(out.token_ids) if out.token_ids is not None else None,
                        "logprobs": list(out.logprobs) if out.logprobs is not None else None,
                        "policy_version": out.policy_version,
                    },
                    {"role": "tool", "text": observation, "loss_mask": 0},
                ],
                "tool_calls": call_records,
                "timings": {"policy_s": t_policy, "tools_s": t_tools},
            }
        )
        if not ep.stop_reason and ep.model_tokens >= config.max_tokens:
            ep.stop_reason = "max_tokens"
    ep.sandbox_results = tools.sandbox_results
    ep.wall_s = time.monotonic() - t0
    if writer is not None:
        writer.write(ep.records)
    return ep


def run_episodes(
    tasks: Sequence[Task],
    make_policy: Callable[[Task], Policy],
    sandbox: Sandbox,
    workdir: str | os.PathLike,
    config: EpisodeConfig = EpisodeConfig(),
    *,
    workers: int = 4,
    writer: JsonlWriter | None = None,
    then: Callable[[Task, Episode], object] | None = None,
) -> list:
    """Many episodes concurrently (threads: the work is in sandboxes and the policy server).
    Returns the episodes, or `then(task, episode)` of each (e.g. grading), in task order."""

    def one(task: Task):
        ep = run_episode(task, make_policy(task), sandbox, workdir, config, writer=writer)
        return then(task, ep) if then is not None else ep

    with cf.ThreadPoolExecutor(max(1, workers), thread_name_prefix="episode") as ex:
        return list(ex.map(one, tasks))
