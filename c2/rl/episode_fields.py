"""The fields of an episode's Sample that EpisodeRunner (c2.rl.episodes) fills: its `info`
(every key, so graded and failed samples read alike), the token arrays of a trajectory or of ids
never generated, a compaction digest's line per tool call, and the runner's error counts as the
trainer records them."""

from __future__ import annotations

import numpy as np

from c2.envs.tools import InvalidToolCall


def error_metrics(counts: dict[str, int]) -> dict[str, float]:
    """The trainer's record of `EpisodeRunner.error_counts()` (summed over runners): failed
    attempts (`rollout_errors`) and episodes that failed every attempt (`rollout_gave_up`, each
    once: its attempts are already among the errors)."""
    errors = sum(n for k, n in counts.items() if k.startswith("errors/"))
    return {"rollout_errors": float(errors), "rollout_gave_up": float(counts.get("gave_up", 0))}


CORRECTNESS_KEYS = ("f2p_passed", "f2p_total", "p2p_passed", "p2p_total", "tests_error")


def episode_info(**given) -> dict:
    """A sample's `info`: every key, at its value for an episode that did nothing (a failed
    sample), overridden by `given`. Graded and failed samples carry the same keys, so a reader
    (the trainer's metrics, c2/eval/run.py) never meets a missing one."""
    info = {
        "episode_id": "",
        "turns": 0,
        "segments": 1,
        "summaries_cut": 0,
        "tool_calls": 0,
        "invalid_tool_calls": 0,
        "calls_after_submit": 0,
        "tool_errors": 0,
        "wall_s": 0.0,
        "final_message": None,
        "quality": {"changed_py_files": [], "new_findings": None},  # None: never graded
        "correctness": dict.fromkeys(CORRECTNESS_KEYS),
        "sandbox_limits_hit": [],
    }
    unknown = set(given) - set(info)
    if unknown:
        raise ValueError(f"episode_info: unknown keys {sorted(unknown)}; known: {sorted(info)}")
    return info | given


def trajectory_fields(traj, turn_penalties: list[int]) -> dict:
    """Sample fields of an engine Trajectory whose turns made `turn_penalties`."""
    return dict(
        tokens=np.asarray(traj.token_ids, np.int32),
        loss_mask=np.asarray(traj.generated, np.uint8),
        logprobs=np.asarray(traj.logprobs, np.float32),
        versions=np.asarray(traj.versions, np.int32),
        routing=np.asarray(traj.routed_experts),
        turn_penalties=list(turn_penalties),
    )


def call_summary(call) -> str:
    """One line for a compaction digest: the tool and its arguments, long values clipped."""
    if isinstance(call, InvalidToolCall):
        return "(an invalid tool call)"
    args = ", ".join(
        f"{k}={(v if len(str(v)) <= 60 else str(v)[:57] + '...')!r}"
        for k, v in call.arguments.items()
    )
    return f"{call.name}({args})"


def untrained_fields(prompt, cfg) -> dict:
    """Sample fields of ids never generated: the prompt alone, no loss, valid routing."""
    tokens = np.asarray(prompt, np.int32)
    n = len(tokens)
    return dict(
        tokens=tokens,
        loss_mask=np.zeros(n, np.uint8),
        logprobs=np.zeros(n, np.float32),
        versions=np.full(n, -1, np.int32),
        routing=distinct_experts(n, cfg),
    )


def distinct_experts(n: int, cfg) -> np.ndarray:
    """[n, L_moe, k] routing for ids never fed through the model: experts 0..k-1 (valid and
    distinct, so a batch can replay them; no loss falls on these ids)."""
    dtype = np.uint8 if cfg.n_experts <= 256 else np.uint16
    shape = (n, cfg.n_moe_layers, cfg.n_experts_per_token)
    return np.broadcast_to(np.arange(cfg.n_experts_per_token, dtype=dtype), shape).copy()
