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


@dataclasses.dataclass
class SequenceRecord:
    """The engine's host-side record of one request, token by token (see Trajectory).

    `routing` holds [n, L_moe, k] blocks, one per feed, for the first `fed` tokens. The current
    turn's prompt (or appended tokens) starts at `prompt_start`, its generation at `gen_start`.
    """

    rid: int
    sampling: object  # SamplingParams
    stop_tokens: tuple[int, ...]
    stop_strings: tuple[str, ...]
    multi_turn: bool
    max_new: int
    empty_routing: np.ndarray  # [0, L_moe, k] in the packed dtype
    tokens: list[int] = dataclasses.field(default_factory=list)
    generated: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    routing: list[np.ndarray] = dataclasses.field(default_factory=list)
    fed: int = 0
    n_gen: int = 0  # tokens sampled so far (the RNG counter; truncation does not rewind it)
    slot: int | None = None
    status: str = "queued"  # queued, extending, running, flushing, paused, done
    turn: int = 0
    prompt_start: int = 0
    gen_start: int = 0
    finish: tuple[str, int | str | None] = ("length", None)

    def append_prompt(self, tokens) -> None:
        """Tokens the policy did not generate (prompt, tool output)."""
        n = len(tokens)
        self.prompt_start = len(self.tokens)
        self.tokens += list(tokens)
        self.generated += [False] * n
        self.logprobs += [0.0] * n
        self.versions += [-1] * n

    def append_generated(self, tokens, logprobs, version: int) -> None:
        self.tokens += list(tokens)
        self.generated += [True] * len(tokens)
        self.logprobs += list(logprobs)
        self.versions += [version] * len(tokens)

    def add_routing(self, rows_NLK: np.ndarray) -> None:
        """Experts of the next fed tokens."""
        self.routing.append(rows_NLK)
        self.fed += len(rows_NLK)

    def routing_rows(self, start: int, stop: int) -> np.ndarray:
        rows = np.concatenate([self.empty_routing, *self.routing])
        self.routing = [rows]
        return rows[start:stop]

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (and their routing, where fed)."""
        del self.tokens[length:], self.generated[length:], self.logprobs[length:]
        del self.versions[length:]
        if self.fed > length:
            self.routing, self.fed = [self.routing_rows(0, length)], length

    def completion(self) -> Completion:
        g, p = self.gen_start, self.prompt_start
        return Completion(
            request_id=self.rid,
            turn=self.turn,
            prompt=np.asarray(self.tokens[p:g], np.int32),
            tokens=np.asarray(self.tokens[g:], np.int32),
            logprobs=np.asarray(self.logprobs[g:], np.float32),
            versions=np.asarray(self.versions[g:], np.int32),
            routed_experts=self.routing_rows(g, self.fed),
            prompt_routed_experts=self.routing_rows(p, g),
            finish_reason=self.finish[0],
            stop=self.finish[1],
        )

    def trajectory(self) -> Trajectory:
        return Trajectory(
            request_id=self.rid,
            token_ids=np.asarray(self.tokens, np.int32),
            generated=np.asarray(self.generated, bool),
            logprobs=np.asarray(self.logprobs, np.float32),
            versions=np.asarray(self.versions, np.int32),
            routed_experts=self.routing_rows(0, self.fed),
        )
