"""Rollout samples: what an episode hands the trainer, and their JSONL records (a contract).

One `Sample` per segment of an episode. An episode is a chain of segments (one, unless context
management cut it: self-summarisation or compaction start a new sequence at a token trigger); the
runner hands over the chain's last segment, which holds the earlier ones in `segments`, and every
segment carries the chain's reward terms and grade (one reward for the whole chain). Per token:
the ids exactly as the engine sampled and was fed, the loss mask (1 on generated ids), the
behaviour logprob (the sampling distribution's, 0 elsewhere), the policy version that produced it
(-1 elsewhere) and the routed experts. Per sample: the sampling settings, so the trainer
recomputes logprobs under the same distribution, the reward terms and the grade, and per
generated turn the tool calls it was penalised for (`turn_penalties`: the turn's own count, so
the penalty can be credited to the turn that earned it; `Sample.token_penalties`).

On disk, `<stage workdir>/rollouts/<name>.jsonl` holds one line per sample with the contract
fields `prompt_id, group_id, sample_index, tokens, loss_mask, logprobs, versions, reward,
reward_terms, passed, trained_step` (and more, below); routed experts go to a binary side file
`<name>.routing.npy.zst` (zstd-compressed `.npy` of every sample's [T, L_moe, k] rows end to end),
located by each record's `routing` entry {file, offset, length}. One line per segment: `chain_id`
("group_id/sample_index"), `segment` (0, 1, ...) and `segments` (the chain's length) say which; a
reader counting episodes takes the lines with segment == segments - 1.

What the step and version fields count (docs/recipe.md §2, "Asynchrony"):
  versions      per token, the policy version that sampled it: the weights after that many
                optimiser steps (0: the RL start weights); -1 on ids not generated.
  trained_step  the run's step that trained the sample, 1-based as the run counts steps (its
                rollouts file is step_<trained_step>.jsonl, its metrics row has that `step`):
                the update applied to version trained_step - 1 (the 0-based optimiser step)
                and produced version trained_step. None until trained.
  staleness     trained_step - 1 - min(versions of this record's generated ids): how many
                versions older than the weights it updated its oldest token is, at most
                config.rl.max_staleness (None: nothing generated, or not trained). Computing it
                as trained_step - min(versions) counts one too many.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zstandard

CONTRACT_FIELDS = (
    "prompt_id",
    "group_id",
    "sample_index",
    "tokens",
    "loss_mask",
    "logprobs",
    "versions",
    "reward",
    "reward_terms",
    "passed",
    "trained_step",
)


@dataclasses.dataclass
class Sample:
    """One episode as the trainer sees it (see the module doc). Arrays are [T] or [T, L, k]."""

    prompt_id: str
    group_id: str
    sample_index: int
    task_id: str
    tokens: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # uint8 [T]: 1 on generated ids
    logprobs: np.ndarray  # float32 [T]: behaviour logprob of generated ids, 0 elsewhere
    versions: np.ndarray  # int32 [T]: policy version of generated ids, -1 elsewhere
    routing: np.ndarray  # uint8/uint16 [T, L_moe, k]: experts each id was routed to
    temperature: float
    top_p: float
    top_k: int
    reward_terms: dict[str, float]  # task, style, communication, tool_call_penalty, ...
    effort: dict[str, float]  # counts for the length penalty (c2.rl.objectives.EFFORT_TERMS)
    passed: bool
    stop_reason: str
    failure_reason: str | None = None
    reward: float | None = None  # the combined reward, set when the trainer scores it
    trained_step: int | None = None
    info: dict = dataclasses.field(default_factory=dict)  # turns, tool calls, grade, timings
    segment: int = 0  # this segment's index in its chain
    # Per generated turn of this segment (the runs of loss_mask == 1, in order): the malformed or
    # unknown calls it made plus the calls it wrote after submit. Empty: no turn was penalised.
    turn_penalties: list[int] = dataclasses.field(default_factory=list)
    segments: list[Sample] = dataclasses.field(default_factory=list)  # the chain's earlier ones

    def __post_init__(self):
        T = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != T:
                raise ValueError(
                    f"sample {self.group_id}/{self.sample_index}: {name} has "
                    f"{len(getattr(self, name))} entries for {T} tokens"
                )
        if self.routing.ndim != 3 or len(self.routing) != T:
            raise ValueError(
                f"sample {self.group_id}/{self.sample_index}: routing {self.routing.shape} "
                f"must be [T={T}, L_moe, k]"
            )
        if self.turn_penalties:
            turns = int(self._turn_starts().sum())
            if len(self.turn_penalties) != turns:
                raise ValueError(
                    f"sample {self.group_id}/{self.sample_index}: turn_penalties has "
                    f"{len(self.turn_penalties)} entries for {turns} generated turns (runs of "
                    "loss_mask == 1)"
                )

    def _turn_starts(self) -> np.ndarray:
        """bool [T]: the first token of each generated turn (a run of loss_mask == 1)."""
        gen = np.asarray(self.loss_mask) > 0
        return gen & ~np.concatenate([[False], gen[:-1]])

    def token_penalties(self) -> np.ndarray:
        """float32 [T]: each generated token's turn penalty (`turn_penalties`), 0 elsewhere."""
        out = np.zeros(self.length, np.float32)
        if self.turn_penalties:
            gen = np.asarray(self.loss_mask) > 0
            turn = np.cumsum(self._turn_starts()) - 1
            out[gen] = np.asarray(self.turn_penalties, np.float32)[turn[gen]]
        return out

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def generated_tokens(self) -> int:
        return int(np.sum(self.loss_mask))

    @property
    def chain(self) -> list[Sample]:
        """Every segment of this sample's chain, in order (this one last)."""
        return [*self.segments, self]

    @property
    def chain_id(self) -> str:
        return f"{self.group_id}/{self.sample_index}"

    @property
    def staleness(self) -> int | None:
        """trained_step - 1 (the optimiser step that trained it) minus the oldest version of
        this segment's generated ids; None when nothing was generated or it is not trained."""
        v = self.versions[self.loss_mask > 0]
        if self.trained_step is None or not v.size:
            return None
        return int(self.trained_step) - 1 - int(v.min())

    @property
    def min_version(self) -> int:
        """The oldest policy version among the generated ids of the chain (-1 if none)."""
        v = np.concatenate([s.versions[s.loss_mask > 0] for s in self.chain])
        return int(v.min()) if v.size else -1

    def record(self, routing_ref: dict | None = None, segments: int | None = None) -> dict:
        """The JSONL record (contract fields first); `segments`: the chain's length (this
        segment's chain, when it is the last one)."""
        return {
            "prompt_id": self.prompt_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "tokens": self.tokens.tolist(),
            "loss_mask": self.loss_mask.astype(int).tolist(),
            "logprobs": [round(float(x), 6) for x in self.logprobs],
            "versions": self.versions.tolist(),
            "reward": self.reward,
            "reward_terms": self.reward_terms,
            "passed": self.passed,
            "trained_step": self.trained_step,
            "staleness": self.staleness,
            "task_id": self.task_id,
            "sampling": {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k},
            "effort": self.effort,
            "stop_reason": self.stop_reason,
            "failure_reason": self.failure_reason,
            "routing": routing_ref,
            "chain_id": self.chain_id,
            "segment": self.segment,
            "segments": len(self.segments) + 1 if segments is None else segments,
            "turn_penalties": list(self.turn_penalties),
            "info": self.info,
        }


def sample_from_record(record: dict) -> Sample:
    """A Sample from one record of `read_rollouts` (its routing read: `routed_experts`), as the
    trainer held it; one segment (earlier segments of a chain are records of their own)."""
    if "routed_experts" not in record:
        raise ValueError(
            f"record {record.get('group_id')}/{record.get('sample_index')} has no routed_experts "
            "(read it with read_rollouts(..., with_routing=True))"
        )
    sampling = record.get("sampling", {})
    return Sample(
        prompt_id=record["prompt_id"],
        group_id=record["group_id"],
        sample_index=record["sample_index"],
        task_id=record.get("task_id", ""),
        tokens=np.asarray(record["tokens"], np.int32),
        loss_mask=np.asarray(record["loss_mask"], np.uint8),
        logprobs=np.asarray(record["logprobs"], np.float32),
        versions=np.asarray(record["versions"], np.int32),
        routing=np.asarray(record["routed_experts"]),
        temperature=float(sampling.get("temperature", 1.0)),
        top_p=float(sampling.get("top_p", 1.0)),
        top_k=int(sampling.get("top_k", 0)),
        reward_terms=dict(record["reward_terms"]),
        effort=dict(record.get("effort") or {}),
        passed=bool(record["passed"]),
        stop_reason=record.get("stop_reason") or "",
        failure_reason=record.get("failure_reason"),
        reward=record.get("reward"),
        trained_step=record.get("trained_step"),
        info=dict(record.get("info") or {}),
        segment=int(record.get("segment", 0)),
        turn_penalties=[int(n) for n in record.get("turn_penalties") or []],
    )


def _compress(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return zstandard.ZstdCompressor(level=3).compress(buf.getvalue())


def _decompress(data: bytes) -> np.ndarray:
    raw = zstandard.ZstdDecompressor().decompress(data)
    return np.load(io.BytesIO(raw), allow_pickle=False)


def write_rollouts(directory: str | os.PathLike, name: str, samples: Sequence[Sample]) -> Path:
    """`directory/name.jsonl` and its routing side file, each written whole then renamed into
    place (a crash leaves the previous file or none, never half a file). Returns the JSONL path.
    A chain's last segment brings its earlier ones: every segment gets its own line."""
    seen: set[int] = set()  # given the segments themselves too, each is written once
    samples = [x for s in samples for x in s.chain if not (id(x) in seen or seen.add(id(x)))]
    length: dict[str, int] = {}  # each chain's segment count: its last segment's index + 1
    for s in samples:
        length[s.chain_id] = max(length.get(s.chain_id, 0), s.segment + 1)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    side = f"{name}.routing.npy.zst"
    lines, offset = [], 0
    for s in samples:
        ref = {"file": side, "offset": offset, "length": s.length}
        lines.append(json.dumps(s.record(ref, length[s.chain_id])))
        offset += s.length
    if samples:
        routing = np.concatenate([s.routing for s in samples])
        tmp = directory / (side + ".tmp")
        tmp.write_bytes(_compress(routing))
        tmp.replace(directory / side)
    path = directory / f"{name}.jsonl"
    tmp = directory / f"{name}.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(path)
    return path


def read_rollouts(path: str | os.PathLike, *, with_routing: bool = True) -> list[dict]:
    """The records of one rollouts JSONL; with_routing adds each record's [T, L, k] array as
    record["routed_experts"]."""
    path = Path(path)
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON record ({e})") from e
            missing = [k for k in CONTRACT_FIELDS if k not in r]
            if missing:
                raise ValueError(f"{path}:{lineno}: record lacks {missing}")
            records.append(r)
    if with_routing and records:
        cache: dict[str, np.ndarray] = {}
        for r in records:
            ref = r.get("routing")
            if ref is None:
                continue
            if ref["file"] not in cache:
                side = path.parent / ref["file"]
                if not side.is_file():
                    raise FileNotFoundError(f"{path}: routing side file {side} is missing")
                cache[ref["file"]] = _decompress(side.read_bytes())
            rows = cache[ref["file"]][ref["offset"] : ref["offset"] + ref["length"]]
            if len(rows) != len(r["tokens"]):
                raise ValueError(
                    f"{path}: routing of {r['group_id']}/{r['sample_index']} has {len(rows)} rows "
                    f"for {len(r['tokens'])} tokens"
                )
            r["routed_experts"] = rows
    return records
