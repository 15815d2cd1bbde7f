"""Agent episodes on the generation engine, token in / token out (docs/recipe.md §2-3).

`EpisodeRunner.run(requests)` plays many episodes at once against one `Engine` (continuous
batching) and a thread pool for the tools, the sandbox and grading:

  prompt ids (AgentChat.prompt)  -> engine.submit(multi_turn=True)
  a turn ends (<|im_end|>)       -> tool calls read from the generated ids (special-id tags)
                                 -> tools run in the pool; outputs -> AgentChat.observation ids
                                 -> engine.extend(rid, ids): appended as they are, masked out
  submit / final message / limit -> engine.release(rid) -> Trajectory -> grade -> Sample

The trainer sees exactly the ids the engine sampled and was fed: nothing is re-tokenised. Each
episode holds one engine slot from submit to release, so at most `engine` slots episodes are in
flight; when every one waits for its tools the loop waits on them (it never steps an idle engine).
Budgets are checked before the engine would refuse: per turn (`max_turn_tokens`), per episode
(`max_tokens`, prompt and observations included) and the engine's context (`max_len`).

Context management (`RolloutConfig.context_management`) turns an episode into a chain of
segments, each a sequence of its own that fits the context:

  "self_summary"  when the next observation would take the segment past its trigger
                  (`summary_trigger` tokens, drawn per prompt up to `summary_trigger_max`, so a
                  group shares it), or leave no room for a summary after it, the observation
                  goes in with a summary instruction; the model writes a summary (at most
                  `summary_max_tokens`; cut there if longer) and the episode goes on in a new
                  sequence: system prompt + task + summary, in the same workspace. The summary
                  is generated, so it is trained.
  "compaction"    the baseline: at the same points the new sequence starts from a digest
                  written without the model (the tool calls made so far, the last output).
  "none"          one sequence; the context ends the episode.

`max_segments` is the chain's budget (stop reason "chain_budget"). The chain is graded once, at
its end; every segment becomes a Sample with the chain's reward terms and effort (the last one
holds the earlier ones in `segments`), so every segment gets the chain's advantage.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from c2.data.chat import AgentChat
from c2.envs.chain_prompts import (  # noqa: F401 - SUMMARY_HEADER: this module's API too
    SUMMARY_HEADER,
    SUMMARY_INSTRUCTION,
    segment_head,
)
from c2.envs.episode import Episode, task_system_prompt
from c2.envs.grading import grade
from c2.envs.sandbox import Sandbox, SandboxLimits
from c2.envs.tools import InvalidToolCall, Tools, validate_tool_call
from c2.infer.engine import Engine
from c2.infer.lockstep import LockstepError
from c2.infer.records import Completion
from c2.rl.episode_fields import (  # noqa: F401 - error_metrics: this module's API too
    CORRECTNESS_KEYS,
    call_summary,
    episode_info,
    error_metrics,
    trajectory_fields,
    untrained_fields,
)
from c2.rl.records import Sample
from c2.rl.rewards import effort_counts, reward_terms
from c2.rl.rollout_config import (  # noqa: F401 - CONTEXT_MANAGEMENT: this module's API too
    CONTEXT_MANAGEMENT,
    EpisodeRequest,
    RolloutConfig,
)

log = logging.getLogger(__name__)


# The stop reasons EpisodeRunner gives an episode (Sample.stop_reason):
#   submit           the agent called submit
#   final_message    a reply with no tool call
#   max_turns
#   max_tokens       the episode's token budget (prompt + replies + observations)
#   context          the engine's context (max_len) could not hold the next observation
#   turn_budget      a reply ran out of max_turn_tokens before <|im_end|>
#   prompt_too_long
#   rollout_error    its tools, grading or the engine raised on every attempt
#   chain_budget     context management needed another segment beyond max_segments


@dataclasses.dataclass
class _Live:
    """An episode in flight."""

    req: EpisodeRequest
    ep: Episode
    tools: Tools
    prompt: np.ndarray | None = None
    rid: int = -1  # the engine request id; -1 until submitted
    trajectory: object = None  # the engine's Trajectory, once released
    turns: list = dataclasses.field(default_factory=list)  # generated ids per turn
    turn_penalties: list = dataclasses.field(default_factory=list)  # penalised calls per turn
    tool_output_tokens: int = 0
    calls_after_submit: int = 0
    t0: float = 0.0
    dropped: bool = False  # failed and played again: results still pending for it are void
    # Chains (context management): the finished segments' token fields, the whole chain's
    # generated ids per turn and observation tokens (its effort), and what compaction digests.
    segments: list = dataclasses.field(default_factory=list)
    all_turns: list = dataclasses.field(default_factory=list)
    chain_obs_tokens: int = 0
    history: list = dataclasses.field(default_factory=list)  # (call summaries, outputs)
    summarising: bool = False
    summaries_cut: int = 0
    trigger: int = 0
    longest_action: int = 0  # the chain's longest reply that was not a summary


class EpisodeRunner:
    """Plays episodes on one engine; see the module doc. Not thread-safe: one caller at a time
    (the engine is driven from the calling thread only)."""

    def __init__(
        self,
        engine: Engine,
        chat: AgentChat,
        sandbox: Sandbox,
        workdir: str | Path,
        config: RolloutConfig = RolloutConfig(),  # noqa: B008 - frozen, shared safely
    ):
        if not sandbox.isolated:
            raise RuntimeError(
                "episodes need a namespace sandbox; this machine has "
                f"{sandbox.isolation.describe()}"
            )
        if chat.im_end not in engine.stop_tokens:
            raise ValueError(
                f"the engine must stop on <|im_end|> (id {chat.im_end}); its stop_tokens are "
                f"{engine.stop_tokens}"
            )
        self.engine, self.chat, self.sandbox, self.config = engine, chat, sandbox, config
        self.workdir = Path(workdir)
        self.limit = min(config.max_tokens, engine.max_len)
        self.stats: dict[str, float] = {}  # of the last run / stream
        self.errors: list[tuple[str, int, str]] = []  # (group, sample, reason), every failure
        # "errors/<where>": failed attempts by where they failed; "gave_up": episodes that
        # failed every attempt. Written by the playing thread, read by others (`error_counts`).
        self.counts: Counter = Counter()
        self._counts_lock = threading.Lock()

    def error_counts(self) -> dict[str, int]:
        """A snapshot of `counts`, safe to take from another thread while episodes play."""
        with self._counts_lock:
            return dict(self.counts)

    def _count(self, key: str) -> None:
        with self._counts_lock:
            self.counts[key] += 1

    # The loop --------------------------------------------------------------------------------

    def run(
        self,
        requests: Sequence[EpisodeRequest],
        on_sample: Callable[[Sample], None] | None = None,
    ) -> list[Sample]:
        """Plays every request; returns their samples in request order."""
        pending = collections.deque(requests)
        order = {_key(r): i for i, r in enumerate(requests)}
        done: dict[int, Sample] = {}

        def take(n: int) -> list[EpisodeRequest] | None:
            if not pending:
                return None
            return [pending.popleft() for _ in range(min(n, len(pending)))]

        def finished(sample: Sample) -> None:
            done[order[(sample.group_id, sample.sample_index)]] = sample
            if on_sample is not None:
                on_sample(sample)

        self.stream(take, finished)
        return [done[i] for i in range(len(requests))]

    def stream(
        self,
        take: Callable[[int], list[EpisodeRequest] | None],
        on_sample: Callable[[Sample], None],
        *,
        idle: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Plays episodes as `take(n)` hands them out, until it returns None (no more will come)
        and none is in flight, or until `stop` is set (episodes in flight are then dropped).

        take(n): up to n requests that may start now ([] when none may start yet). Each finished
        episode goes to on_sample(sample), from this thread. When nothing can progress (no engine
        work, no tool or grading result pending, nothing to take) the loop calls idle(), which
        should block until take may have more (default: sleep 10 ms).

        An episode whose tools, grading or engine step raises is played again from scratch (its
        workspace cleared) up to `max_attempts` times; after that it becomes a failed, empty
        sample (stop reason "rollout_error", nothing to train) so its group still completes.
        The errors are in `self.errors` and counted in `self.stats`.
        """
        live: dict[int, _Live] = {}  # engine request id -> episode
        futures: dict[cf.Future, tuple[str, _Live]] = {}
        retry: collections.deque[EpisodeRequest] = collections.deque()
        attempts: Counter = Counter()
        t0 = time.perf_counter()
        gen0 = self.engine.stats.get("generated_tokens", 0)
        idle_s, episodes, no_more = 0.0, 0, False
        engine_failures = 0

        def failed(req: EpisodeRequest, where: str, error: BaseException) -> None:
            """Play `req` again, or give up on it with a failed sample."""
            reason = f"{where}: {type(error).__name__}: {error}"
            self.errors.append((req.group_id, req.sample_index, reason))
            self._count(f"errors/{where}")
            log.warning("episode %s/%d failed (%s)", req.group_id, req.sample_index, reason)
            attempts[_key(req)] += 1
            if attempts[_key(req)] < self.config.max_attempts:
                retry.append(req)
            else:
                self._count("gave_up")
                on_sample(self._failed_sample(req, reason))

        def drop(ep: _Live) -> None:
            """Free an episode's engine slot and workspace (it failed or the run stops)."""
            ep.dropped = True
            if ep.rid >= 0 and live.pop(ep.rid, None) is not None:
                with contextlib.suppress(Exception):
                    self.engine.release(ep.rid)
            shutil.rmtree(ep.ep.workspace, ignore_errors=True)

        with cf.ThreadPoolExecutor(self.config.tool_workers, thread_name_prefix="tools") as pool:
            while not (stop is not None and stop.is_set()):
                free = self.engine.free_slots
                starting = [retry.popleft() for _ in range(min(free, len(retry)))]
                if not no_more and free > len(starting):
                    more = take(free - len(starting))
                    no_more = more is None
                    starting += more or []
                for req in starting:
                    try:
                        started = self._start(req, attempts[_key(req)])
                    except Exception as e:  # the workspace could not be made
                        failed(req, "start", e)
                        continue
                    episodes += 1
                    if started.rid < 0:  # the prompt does not fit: an empty, failed sample
                        futures[pool.submit(self._grade, started)] = ("grade", started)
                    else:
                        live[started.rid] = started
                if no_more and not (live or futures or retry):
                    break
                progressed = False
                if self.engine.has_work():
                    progressed = True
                    try:
                        completions = self.engine.step()
                        engine_failures = 0
                    except LockstepError:  # a multi-host engine out of step: the worker's end
                        raise
                    except Exception as e:  # the engine's state is suspect: replay every episode
                        engine_failures += 1
                        if engine_failures > self.config.max_attempts:
                            raise
                        for ep in list(live.values()):
                            drop(ep)
                            failed(ep.req, "engine", e)
                        completions = []
                    for comp in completions:
                        self._after_turn(live[comp.request_id], comp, pool, futures, live)
                finished = [f for f in futures if f.done()]
                if not finished and not progressed and futures:
                    t_wait = time.perf_counter()
                    finished, _ = cf.wait(list(futures), 0.05, return_when=cf.FIRST_COMPLETED)
                    idle_s += time.perf_counter() - t_wait
                elif not finished and not progressed and not retry:
                    t_wait = time.perf_counter()
                    (idle or _nap)()
                    idle_s += time.perf_counter() - t_wait
                for f in finished:
                    kind, ep = futures.pop(f)
                    error = None if f.cancelled() else f.exception()
                    if ep.dropped:  # its tools may have written after the drop: clear again
                        shutil.rmtree(ep.ep.workspace, ignore_errors=True)
                        continue
                    if error is not None:
                        drop(ep)
                        failed(ep.req, kind, error)
                    elif kind == "tools":
                        self._after_tools(ep, f.result(), pool, futures, live)
                    else:
                        on_sample(f.result())
            for ep in list(live.values()):  # stopped: nothing in flight is kept
                drop(ep)
            for f in futures:
                f.cancel()
        wall = time.perf_counter() - t0
        gen = self.engine.stats.get("generated_tokens", 0) - gen0
        self.stats = {"episodes": episodes, "wall_s": wall, "generated_tokens": gen}
        self.stats |= {"engine_idle_s": idle_s, "generated_tokens_per_s": gen / max(wall, 1e-9)}

    # Steps of one episode -------------------------------------------------------------------

    def _start(self, req: EpisodeRequest, attempt: int = 0) -> _Live:
        task, c = req.task, self.config
        episode_id = f"{req.group_id}-{req.sample_index}"
        if attempt:  # its own workspace: tools of the failed attempt may still be running
            episode_id += f"-retry{attempt}"
        stale = self.workdir / episode_id
        if stale.exists():  # left by a run killed mid-episode: this episode is played again
            shutil.rmtree(stale)
        workspace = task.materialize(stale)
        sandbox = task.sandbox(self.sandbox)  # a container task: its image's (container.py)
        sandbox.give_workspace(workspace)
        limits = task.limits(SandboxLimits(timeout_s=c.run_timeout_s))  # the task's own resources
        tools = Tools(
            workspace,
            sandbox,
            mount_at=task.mount_at,
            run_limits=limits,
            max_run_timeout_s=c.run_timeout_s,
            max_observation_chars=c.max_observation_chars,
            python_env=task.python_env(),
        )
        system = task_system_prompt(task)
        ep = Episode(episode_id, task.task_id, 0, workspace, [], [])
        prompt = self.chat.prompt(system, task.instruction)
        live = _Live(req, ep, tools, prompt=prompt, t0=time.monotonic())
        live.trigger = c.trigger(req.prompt_id) if c.context_management != "none" else self.limit
        if len(prompt) + 1 > self.limit:
            ep.stop_reason = "prompt_too_long"
            return live
        self._submit(live, prompt)
        return live

    def _submit(self, live: _Live, prompt: np.ndarray) -> None:
        c = self.config
        live.prompt, live.turns, live.tool_output_tokens = prompt, [], 0
        live.turn_penalties = []
        live.rid = self.engine.submit(
            prompt,
            min(c.max_turn_tokens, self.limit - len(prompt)),
            multi_turn=True,
            temperature=c.temperature,
            top_p=c.top_p,
            top_k=c.top_k,
        )

    def _after_turn(self, live: _Live, comp: Completion, pool, futures, running) -> None:
        """A reply ended: read its tool calls and run them, or end the episode."""
        ep, ids = live.ep, [int(t) for t in comp.tokens]
        live.turns.append(ids)
        live.turn_penalties.append(0)
        live.all_turns.append(ids)
        ep.model_tokens += len(ids)
        if live.summarising:  # the reply is the summary: a new segment starts from it
            if comp.finish_reason == "length" and (not ids or ids[-1] != self.chat.im_end):
                live.summaries_cut += 1  # cut at its budget; the chain goes on with what it has
            self._new_segment(live, self.chat.reply_text(ids), running)
            return
        ep.turns += 1
        live.longest_action = max(live.longest_action, len(ids))
        if comp.finish_reason == "length" and (not ids or ids[-1] != self.chat.im_end):
            budget_left = self.limit - self._length(live)
            ep.stop_reason = "max_tokens" if budget_left <= 0 else "turn_budget"
            self._finish(live, pool, futures, running)
            return
        spans, unclosed = self.chat.tool_call_spans(ids)
        calls = [validate_tool_call(s.strip()) for s in spans]
        if unclosed:
            calls.append(InvalidToolCall("<tool_call>", "unclosed <tool_call>"))
        if not calls:
            ep.final_message, ep.stop_reason = self.chat.reply_text(ids), "final_message"
            self._finish(live, pool, futures, running)
            return
        futures[pool.submit(self._run_tools, live, calls)] = ("tools", live)

    def _run_tools(self, live: _Live, calls) -> list[str]:
        """Runs one reply's calls in order (in a pool thread); returns their outputs."""
        ep, outputs = live.ep, []
        for n, call in enumerate(calls):
            result = live.tools(call)
            ep.tool_calls += 1
            if isinstance(call, InvalidToolCall):
                ep.invalid_tool_calls += 1
                live.turn_penalties[-1] += 1
            elif not result.ok and result.error is not None:
                ep.tool_errors += 1
            outputs.append(result.content)
            live.history.append((call_summary(call), result.content))
            if getattr(call, "name", None) == "submit":
                ep.submitted, ep.final_message = True, call.arguments["message"]
                ep.stop_reason = "submit"
                live.calls_after_submit += len(calls) - n - 1
                live.turn_penalties[-1] += len(calls) - n - 1
                break
        return outputs

    def _after_tools(self, live: _Live, outputs, pool, futures, running) -> None:
        ep, c = live.ep, self.config
        if ep.submitted:
            self._finish(live, pool, futures, running)
            return
        if ep.turns >= c.max_turns:
            ep.stop_reason = "max_turns"
            self._finish(live, pool, futures, running)
            return
        obs = self.chat.observation(outputs)
        if c.context_management != "none" and self._cut_now(live, outputs, obs):
            if len(live.segments) + 1 >= c.max_segments:
                ep.stop_reason = "chain_budget"
                self._finish(live, pool, futures, running)
                return
            if c.context_management == "compaction":
                self._new_segment(live, self._digest(live), running)
                return
            if self._ask_for_summary(live, outputs):
                return
        room = self.limit - self._length(live) - len(obs)
        if room < 1:
            ep.stop_reason = "context" if self.limit == self.engine.max_len else "max_tokens"
            self._finish(live, pool, futures, running)
            return
        live.tool_output_tokens += len(obs)
        live.chain_obs_tokens += len(obs)
        self.engine.extend(live.rid, obs, min(c.max_turn_tokens, room))

    # Chains ---------------------------------------------------------------------------------

    def _cut_now(self, live: _Live, outputs, obs) -> bool:
        """Past the trigger, or the last observation at which the summary will fit: after one
        more reply (as long as the chain's longest action so far: summaries are not the next
        reply) and an observation as long as this one, the summary instruction and the summary
        would no longer fit in the context."""
        length = self._length(live)
        if length + len(obs) > live.trigger:
            return True
        asked = self.chat.observation(outputs, note=SUMMARY_INSTRUCTION)
        reply = live.longest_action or self.config.max_turn_tokens
        later = length + len(obs) + reply + len(asked)
        return later + self.config.summary_budget > self.limit

    def _ask_for_summary(self, live: _Live, outputs) -> bool:
        """Feed the observation with the summary instruction; the next reply is the summary.
        An observation too long to leave room for the summary is replaced by a notice."""
        budget = self.config.summary_budget
        for outs in (outputs, ["(output omitted: the context is full)"] * len(outputs)):
            obs = self.chat.observation(outs, note=SUMMARY_INSTRUCTION)
            room = self.limit - self._length(live) - len(obs)
            if room >= min(budget, 16):
                live.summarising = True
                live.tool_output_tokens += len(obs)
                live.chain_obs_tokens += len(obs)
                self.engine.extend(live.rid, obs, min(budget, room))
                return True
        return False

    def _digest(self, live: _Live) -> str:
        """Compaction: what the chain did so far, in a fixed format, without the model."""
        lines = ["Earlier in this task you made these tool calls (outputs omitted):"]
        lines += [f"{i}. {call}" for i, (call, _) in enumerate(live.history, 1)]
        if live.history:
            last = live.history[-1][1]
            lines.append("The last output was:\n" + last[: self.config.max_observation_chars // 2])
        return "\n".join(lines)

    def _new_segment(self, live: _Live, summary: str, running) -> None:
        """Close this segment (its trajectory is kept for training) and go on in a new sequence
        from the system prompt, the task and `summary`, in the same workspace."""
        traj = self.engine.release(live.rid)
        del running[live.rid]
        live.segments.append(trajectory_fields(traj, live.turn_penalties))
        live.summarising = False
        task, system = live.req.task, task_system_prompt(live.req.task)
        head = segment_head(task.instruction)
        # Room for the summary: the new sequence must leave a turn's budget for the next reply.
        room = self.limit - self.config.max_turn_tokens - len(self.chat.prompt(system, head))
        ids = list(self.chat.tokenizer.encode(summary))[: max(room, 0)]
        prompt = self.chat.prompt(system, head + self.chat.tokenizer.decode(ids))
        if len(prompt) + 1 > self.limit:  # not even the header fits: the task alone (it did)
            prompt = self.chat.prompt(system, task.instruction)
        self._submit(live, prompt)
        running[live.rid] = live

    def _length(self, live: _Live) -> int:
        return len(live.prompt) + sum(len(t) for t in live.turns) + live.tool_output_tokens

    def _finish(self, live: _Live, pool, futures, running) -> None:
        """Release the engine slot (the trajectory is complete) and grade in the pool."""
        live.trajectory = self.engine.release(live.rid)
        del running[live.rid]
        futures[pool.submit(self._grade, live)] = ("grade", live)

    def _grade(self, live: _Live) -> Sample:
        ep, req = live.ep, live.req
        ep.sandbox_results = live.tools.sandbox_results
        time.sleep(self.config.test_latency_s(req.task.task_id))  # simulated test runtime
        ep.wall_s = time.monotonic() - live.t0
        record = grade(req.task, ep.workspace, self.sandbox, episode=ep)
        terms = reward_terms(
            record, ep.final_message, ep.invalid_tool_calls, live.calls_after_submit
        )
        effort = effort_counts(self.chat, live.all_turns, live.chain_obs_tokens, ep.tool_calls)
        if live.trajectory is None:  # never generated: the prompt alone, nothing to train
            last = untrained_fields(live.prompt, self.engine.cfg)
        else:
            last = trajectory_fields(live.trajectory, live.turn_penalties)
        if not self.config.keep_workspaces:
            shutil.rmtree(ep.workspace, ignore_errors=True)
        chain = dict(
            reward_terms=terms,
            effort=effort,
            passed=record.passed,
            stop_reason=ep.stop_reason,
            failure_reason=record.failure_reason,
            info=episode_info(
                episode_id=ep.episode_id,
                turns=ep.turns,
                segments=len(live.segments) + 1,
                summaries_cut=live.summaries_cut,
                tool_calls=ep.tool_calls,
                invalid_tool_calls=ep.invalid_tool_calls,
                calls_after_submit=live.calls_after_submit,
                tool_errors=ep.tool_errors,
                wall_s=round(ep.wall_s, 3),
                final_message=ep.final_message,
                quality=record.quality,
                correctness={k: record.correctness[k] for k in CORRECTNESS_KEYS},
                sandbox_limits_hit=record.interaction["sandbox_limits_hit"],
            ),
        )

        # Every segment carries the chain's grade and reward terms: one reward for the chain.
        def own(k):  # each segment its own dicts: the trainer writes per-segment scores in them
            return {n: dict(v) if isinstance(v, dict) else v for n, v in chain.items()} | {
                "segment": k
            }

        earlier = [self._sample(req, **f, **own(k)) for k, f in enumerate(live.segments)]
        return self._sample(req, **last, **own(len(earlier)), segments=earlier)

    def _failed_sample(self, req: EpisodeRequest, reason: str) -> Sample:
        """An episode that raised on every attempt: its prompt, nothing to train, reward 0."""
        prompt = self.chat.prompt(task_system_prompt(req.task), req.task.instruction)
        return self._sample(
            req,
            **untrained_fields(prompt, self.engine.cfg),
            reward_terms={
                "task": 0.0,
                "style": 0.0,
                "communication": 0.0,
                "tool_call_penalty": 0.0,
            },
            effort=effort_counts(self.chat, [], 0, 0),
            passed=False,
            stop_reason="rollout_error",
            failure_reason=reason,
            info=episode_info(episode_id=f"{req.group_id}-{req.sample_index}"),
        )

    def _sample(self, req: EpisodeRequest, **fields) -> Sample:
        """A Sample of `req`, with the sampling settings its tokens were drawn under."""
        c = self.config
        return Sample(
            prompt_id=req.prompt_id,
            group_id=req.group_id,
            sample_index=req.sample_index,
            task_id=req.task.task_id,
            temperature=float(c.temperature),
            top_p=float(c.top_p),
            top_k=int(c.top_k),
            **fields,
        )


def _key(req: EpisodeRequest) -> tuple[str, int]:
    return req.group_id, req.sample_index


def _nap() -> None:
    time.sleep(0.01)
