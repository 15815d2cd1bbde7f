"""What the engine hands back: one `Completion` per finished turn, and the `Trajectory` of a
whole (possibly multi-turn) sequence with everything the RL trainer needs per token."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Completion:
    """One turn of generation.

    prompt: the tokens fed before this turn's generation (the prompt, or the tokens a
    multi-turn `extend` appended). tokens / logprobs / versions: the generated ids, their
    logprobs under the behaviour distribution, and the policy version that produced each.
    routed_experts [N, L_moe, k] (uint8, or uint16 beyond 256 experts): the experts each
    generated token was routed to when it was fed back in; a paused multi-turn turn's last
    token is fed with the next `extend`, so that turn has one row fewer.
    prompt_routed_experts [P, L_moe, k]: the same for `prompt`.
    finish_reason: "stop" (stop token or stop string; `stop` says which) or "length".
    """

    request_id: int
    turn: int
    prompt: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    routed_experts: np.ndarray
    prompt_routed_experts: np.ndarray
    finish_reason: str
    stop: int | str | None = None


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """A whole sequence, token by token: prompt, generated turns and appended tool tokens.

    generated marks the policy's tokens (the loss mask); logprobs and versions are 0 and -1 on
    the others. routed_experts [T_fed, L_moe, k] covers every token fed through the model (all
    of them once the sequence is released).
    """

    request_id: int
    token_ids: np.ndarray
    generated: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    routed_experts: np.ndarray

    def replay_routing(self) -> np.ndarray:
        """[L_moe, 1, T, k] int32 for `c2.model.forward(..., routing=...)` on `token_ids[None]`."""
        T = len(self.token_ids)
        if len(self.routed_experts) != T:
            raise ValueError(
                f"routing covers {len(self.routed_experts)} of {T} tokens; release the sequence "
                "first so its last token is fed"
            )
        return self.routed_experts.astype(np.int32).transpose(1, 0, 2)[:, None]
