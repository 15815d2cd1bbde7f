"""What an episode is asked to play and under which settings: `RolloutConfig` (budgets,
sampling, context management, attempts) and `EpisodeRequest` (the task and where its sample
belongs), read by c2.rl.episodes.EpisodeRunner."""

from __future__ import annotations

import dataclasses
import hashlib

from c2.envs.tasks import Task

CONTEXT_MANAGEMENT = ("none", "self_summary", "compaction")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Episode budgets and sampling. Tokens count ids (the tokenizer's)."""

    max_turns: int = 4
    max_tokens: int = 1024
    max_turn_tokens: int = 256
    max_observation_chars: int = 2000
    run_timeout_s: float = 20.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    tool_workers: int = 4
    keep_workspaces: bool = False
    max_attempts: int = 3  # an episode that raises is played again, up to this many times
    # Simulated test-suite runtime (benchmarks): each task's grading waits scale * U^(-1/alpha)
    # seconds (Pareto, U drawn from the task id), at most 20 * scale. (0, 0): off.
    test_latency_pareto: tuple[float, float] = (0.0, 0.0)
    # Context management (c2.rl.episodes' module doc). Triggers and budgets in tokens; 0: the
    # defaults below.
    context_management: str = "none"
    summary_trigger: int = 0  # 0: max_tokens - summary_max_tokens - max_turn_tokens
    summary_trigger_max: int = 0  # > summary_trigger: drawn per prompt in [trigger, max]
    summary_max_tokens: int = 0  # 0: max_tokens // 8
    max_segments: int = 4

    def __post_init__(self):
        for k in ("max_turns", "max_tokens", "max_turn_tokens", "max_observation_chars"):
            if getattr(self, k) < 1:
                raise ValueError(f"RolloutConfig.{k}={getattr(self, k)}: expected >= 1")
        for k in ("tool_workers", "max_attempts"):
            if getattr(self, k) < 1:
                raise ValueError(f"RolloutConfig.{k}={getattr(self, k)}: expected >= 1")
        if self.context_management not in CONTEXT_MANAGEMENT:
            raise ValueError(
                f"RolloutConfig.context_management={self.context_management!r}: expected one of "
                f"{CONTEXT_MANAGEMENT}"
            )
        for k in ("summary_trigger", "summary_trigger_max", "summary_max_tokens"):
            if getattr(self, k) < 0:
                raise ValueError(f"RolloutConfig.{k}={getattr(self, k)}: expected >= 0")
        if self.max_segments < 1:
            raise ValueError(f"RolloutConfig.max_segments={self.max_segments}: expected >= 1")
        if self.context_management != "none":
            (lo, hi), room = self.trigger_range, self.max_tokens - self.summary_budget
            if not 0 < lo <= hi <= room:
                raise ValueError(
                    f"RolloutConfig.summary_trigger={lo} (up to RolloutConfig.summary_trigger_max="
                    f"{hi}) must lie in (0, max_tokens - summary budget = {room}]: the summary "
                    "must fit in the context after the trigger"
                )
        scale, alpha = self.test_latency_pareto
        if scale < 0 or alpha < 0 or (scale > 0) != (alpha > 0):
            raise ValueError(
                f"RolloutConfig.test_latency_pareto={self.test_latency_pareto}: expected "
                "(scale_s > 0, alpha > 0), or (0, 0) for off"
            )

    @property
    def summary_budget(self) -> int:
        return self.summary_max_tokens or max(1, self.max_tokens // 8)

    @property
    def trigger_range(self) -> tuple[int, int]:
        lo = self.summary_trigger or self.max_tokens - self.summary_budget - self.max_turn_tokens
        return lo, max(lo, self.summary_trigger_max)

    def trigger(self, prompt_id: str) -> int:
        """The segment length (tokens) past which a chain cuts: the same for a whole group."""
        lo, hi = self.trigger_range
        digest = hashlib.sha256(f"trigger:{prompt_id}".encode()).digest()
        return lo + int.from_bytes(digest[:8], "little") % (hi - lo + 1)

    def test_latency_s(self, task_id: str) -> float:
        """The simulated test runtime of a task (0 when off); the same for every episode of it."""
        scale, alpha = self.test_latency_pareto
        if not scale:
            return 0.0
        digest = hashlib.sha256(task_id.encode()).digest()
        u = (int.from_bytes(digest[:8], "little") + 1) / 2.0**64  # uniform in (0, 1]
        return min(scale * u ** (-1.0 / alpha), 20.0 * scale)


@dataclasses.dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play: the task and where its sample belongs."""

    task: Task
    prompt_id: str
    group_id: str
    sample_index: int
