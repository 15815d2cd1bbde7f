"""The generation engine: continuous batching over fixed slots, multi-turn, in-flight weights.

    engine = Engine(params, cfg, max_slots=8, temperature=1.0, stop_tokens=(eos,))
    rid = engine.submit(prompt_ids, max_new_tokens=256)
    while engine.has_work():
        for completion in engine.step(): ...

Each `step` first applies a pending `update_weights`, then admits queued prompts into free slots
(a prompt is fed in chunks of static bucket sizes; the compiled decode step never changes shape),
then runs one compiled decode call over every slot and records what came back. With `run_ahead`
(the default) the next decode call is dispatched before the last one is read back, so the host's
bookkeeping overlaps the device's work; each `step` still records exactly one call. A multi-turn
request (`submit(..., multi_turn=True)`) keeps its slot and KV cache when a turn stops: append
tool output as tokens with `extend`, generation resumes from the cache; `release` ends it and
returns its `Trajectory`. Nothing is ever re-tokenised: the engine only sees token ids.
`Engine(..., mesh=)` runs all of it on a mesh (weights, slots and KV cache laid out by the
model's sharding rules: `engine_layout.py`).

This module owns the requests and the loop: the queue and the slots, turns and what ends them,
weight swaps, dispatching decode calls and recording what they return, and `generate`. The
compiled steps live in `steps.py`, feeding tokens in bucketed chunks in `prefill.py`, a
request's host-side record in `records.py`, the checks of callers' arguments in `checks.py`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from c2 import sharding
from c2.infer import checks, engine_layout, prefill, steps
from c2.infer.engine_layout import weight_shardings  # noqa: F401 - public here too
from c2.infer.prefill import MIN_BUCKET
from c2.infer.records import Completion, SequenceRecord, Trajectory
from c2.infer.sampling import SamplingParams
from c2.model.config import ModelConfig
from c2.model.transformer import restack

_restack = jax.jit(restack)


class Engine:
    """Batched KV-cache generation; see the module doc. Options:

    max_slots: sequences decoded together. max_len: context per sequence (prompt + generated,
    all turns), at most cfg.max_seq_len. temperature / top_p / top_k / seed: sampling defaults
    (per request overridable). speculative: MTP drafting of `num_draft_tokens` tokens (default
    cfg.mtp_depth) verified in one pass. stop_tokens / stop_strings: default stops (stop strings
    need `detokenize`, ids -> str). prefill_chunk: largest prompt chunk fed at once.
    steps_per_call: decode steps per compiled call (one host sync each). recompute_kv: rebuild
    in-flight KV caches with the new weights on `update_weights` (default: keep them).
    run_ahead: dispatch decode call n + 1 (from call n's device state) before reading call n
    back, so the host's work per call (reading back, recording tokens, admitting prompts)
    overlaps the device's. The device stops rows itself (stop tokens, budgets), so a row that
    call n stopped only idles in call n + 1; any host change to a row (admitting, extending,
    finishing) marks that row's output of the call already running as stale, and it is
    ignored. The outputs are the same as without it, except that `update_weights` takes effect
    one call later (the call already running has the old weights; tokens carry the version that
    produced them). Speculative decoding, stop strings (the host truncates the row) and
    `recompute_kv` updates (the host rebuilds the cache) read every call back before the next.
    mesh: a `c2.sharding` mesh or `Layout` to decode on (default: one device): weights,
    slots and KV cache laid out by its rules (`engine_layout.py`); max_slots must be a
    multiple of the devices the slots are split over. Weights given here or to
    `update_weights` may arrive in any placement (host, one device, another mesh). The mesh
    may span processes (a multi-host engine, for a model no host holds): every process then
    runs the same engine on the same requests in lockstep, and each read-back gathers across
    them (`engine_layout.to_host`; tests/infer/test_engine_multihost.py).
    """

    def __init__(
        self,
        params,
        config: ModelConfig,
        *,
        max_slots: int = 8,
        max_len: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        speculative: bool = False,
        num_draft_tokens: int | None = None,
        seed: int = 0,
        stop_tokens: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        detokenize: Callable[[Sequence[int]], str] | None = None,
        prefill_chunk: int = 256,
        steps_per_call: int = 1,
        recompute_kv: bool = False,
        run_ahead: bool = True,
        version: int = 0,
        mesh: Mesh | sharding.Layout | None = None,
    ):
        c = config
        if not isinstance(c, ModelConfig):
            raise TypeError(f"config: expected a c2.model.ModelConfig, got {type(c).__name__}")
        self.cfg = c
        self.sampling = SamplingParams(temperature, top_p, top_k).validate(c.vocab_size)
        max_slots = checks.positive_int(max_slots, "max_slots")
        self.layout = sharding.as_layout(mesh)
        if self.layout is not None:
            engine_layout.check_layout(c, self.layout, max_slots)
        self.max_len = max_len = checks.max_len(max_len, c.max_seq_len)
        if not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed={seed!r}: expected an int")
        num_draft = checks.num_draft(speculative, num_draft_tokens, c, params)
        self.stop_tokens = checks.stop_tokens(stop_tokens, c.vocab_size)
        self.stop_strings = checks.stop_strings(stop_strings, detokenize)
        self.detokenize = detokenize
        self._buckets = prefill.bucket_sizes(prefill_chunk)
        self.spec = steps.StepSpec(
            cfg=c,
            n_slots=max_slots,
            cache_len=max_len + max(MIN_BUCKET, num_draft + 1),
            n_stop=max(8, len(self.stop_tokens)),
            speculative=bool(speculative),
            num_draft=num_draft,
            steps_per_call=checks.positive_int(steps_per_call, "steps_per_call"),
            layout=self.layout,
        )
        self.recompute_kv = bool(recompute_kv)
        self.run_ahead = bool(run_ahead)
        self._param_tree = jax.tree.structure(params)
        self._param_leaves = [(a.shape, a.dtype) for a in jax.tree.leaves(params)]
        # The decoding layout: per-layer buffers (on a mesh, each in its shards).
        self._params = engine_layout.place_weights(params, c, self.layout)
        self.version = int(version)
        self._base_key = jax.random.key(int(seed))
        self._state = None  # built lazily: nothing is allocated or compiled before a step
        self._slots: list[SequenceRecord | None] = [None] * max_slots
        self._phase = np.zeros(max_slots, np.int32)  # host mirror of the device phases
        # Host changes to each row (bumped by _set): a decode call's output for a row is read
        # only if the row is unchanged since the call was dispatched (run_ahead).
        self._epoch = np.zeros(max_slots, np.int64)
        self._inflight = None  # the dispatched decode call not yet read back (run_ahead)
        self._queue: collections.deque[SequenceRecord] = collections.deque()
        self._seqs: dict[int, SequenceRecord] = {}
        self._next_rid = 0
        self._lock = threading.Lock()
        self._pending_update = None
        self._stats = collections.Counter()
        self._empty_routing = np.zeros(
            (0, c.n_moe_layers, c.n_experts_per_token), steps.routing_dtype(c)
        )

    # Requests -------------------------------------------------------------------------------

    def submit(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        multi_turn: bool = False,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop_tokens: Sequence[int] | None = None,
        stop_strings: Sequence[str] | None = None,
    ) -> int:
        """Queue a prompt; returns its request id. Options default to the engine's."""
        prompt = checks.token_array(prompt, self.cfg.vocab_size, "prompt")
        max_new = checks.room(len(prompt), max_new_tokens, self.max_len, "prompt")
        d = self.sampling
        sp = SamplingParams(
            d.temperature if temperature is None else temperature,
            d.top_p if top_p is None else top_p,
            d.top_k if top_k is None else top_k,
        ).validate(self.cfg.vocab_size)
        stops = (
            self.stop_tokens
            if stop_tokens is None
            else checks.stop_tokens(stop_tokens, self.cfg.vocab_size)
        )
        if len(stops) > self.spec.n_stop:
            raise ValueError(f"stop_tokens: {len(stops)} ids; at most {self.spec.n_stop}")
        strings = (
            self.stop_strings
            if stop_strings is None
            else checks.stop_strings(stop_strings, self.detokenize)
        )
        rid = self._next_rid
        self._next_rid += 1
        seq = SequenceRecord(
            rid=rid,
            sampling=sp,
            stop_tokens=stops,
            stop_strings=strings,
            multi_turn=bool(multi_turn),
            max_new=max_new,
            empty_routing=self._empty_routing,
        )
        seq.append_prompt(prompt.tolist())
        self._seqs[rid] = seq
        self._queue.append(seq)
        return rid

    def extend(self, request_id: int, tokens: Sequence[int], max_new_tokens: int) -> None:
        """Append tokens (tool output, the next user message) to a paused multi-turn sequence and
        generate its next turn from the kept KV cache."""
        seq = self._get(request_id)
        if seq.status != "paused":
            raise ValueError(
                f"request {request_id} is {seq.status}: extend needs a paused multi-turn sequence"
            )
        tokens = checks.token_array(tokens, self.cfg.vocab_size, "extend tokens")
        n = len(seq.tokens) + len(tokens)
        seq.max_new = checks.room(n, max_new_tokens, self.max_len, "the sequence")
        seq.append_prompt(tokens.tolist())
        seq.turn += 1
        seq.status = "extending"

    def release(self, request_id: int) -> Trajectory:
        """End a multi-turn sequence: feed its last token (to record its routing), free the slot,
        return the whole trajectory."""
        seq = self._get(request_id)
        if seq.status != "paused":
            raise ValueError(
                f"request {request_id} is {seq.status}: release needs a paused multi-turn sequence"
            )
        if seq.slot is not None:
            if seq.fed < len(seq.tokens):
                self._feed([(seq, seq.tokens[seq.fed :])])
            self._set(seq.slot, phase=0)
            self._slots[seq.slot] = None
            seq.slot = None
        seq.status = "done"
        del self._seqs[request_id]
        return seq.trajectory()

    def trajectory(self, request_id: int) -> Trajectory:
        """The sequence so far (a multi-turn one between turns, say)."""
        return self._get(request_id).trajectory()

    def _get(self, request_id: int) -> SequenceRecord:
        if request_id not in self._seqs:
            raise KeyError(f"unknown or released request id {request_id}")
        return self._seqs[request_id]

    @property
    def params(self):
        """The weights decoding runs on, as the stacked tree `__init__`/`update_weights` take
        (restacked on each read: the engine holds them per layer, `c2.model.unstack`)."""
        return _restack(self._params)

    def update_weights(self, params, version: int) -> None:
        """New weights for every in-flight sequence from the next decode call dispatched on (with
        run_ahead, the call after the one already running); thread-safe."""
        checks.same_weights(params, self._param_tree, self._param_leaves)
        with self._lock:
            self._pending_update = (params, int(version))

    def has_work(self) -> bool:
        """True when `step` would make progress: a slot is generating, or a queued prompt has a
        free slot. Multi-turn sequences paused for tool output hold their slots; when they hold
        them all, queued prompts wait (False) until one is extended or released: callers wait
        for their tools instead of spinning on empty steps."""
        active = any(
            s is not None and s.status in ("extending", "running", "flushing") for s in self._slots
        )
        queued = bool(self._queue) and self.free_slots > 0
        return active or queued or self._inflight is not None

    @property
    def free_slots(self) -> int:
        """Slots no sequence holds (a paused multi-turn sequence holds its slot)."""
        return sum(s is None for s in self._slots)

    @property
    def stats(self) -> dict:
        """Tokens, steps, and (speculative) acceptance rate and mean accepted length."""
        s = dict(self._stats)
        drafted, rows = s.get("drafted", 0), s.get("verify_rows", 0)
        if rows:
            s["acceptance_rate"] = s.get("accepted", 0) / drafted
            s["mean_accepted_length"] = 1 + s.get("accepted", 0) / rows
        return s

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[Completion]:
        """Submit every prompt, run to completion, return the completions in prompt order."""
        rids = [self.submit(p, max_new_tokens) for p in prompts]
        done: dict[int, Completion] = {}
        while self.has_work():
            for comp in self.step():
                done[comp.request_id] = comp
        return [done[r] for r in rids]

    # The loop -------------------------------------------------------------------------------

    @property
    def state(self) -> dict:
        if self._state is None:
            self._state = steps.init_state(self.spec)
        return self._state

    def _set(self, slot: int, **fields) -> None:
        vals = {
            k: np.asarray(v, self.state[k].dtype if k != "pos" else np.int32)
            for k, v in fields.items()
        }
        self._state = steps.set_rows(self.state, np.int32(slot), vals, layout=self.layout)
        self._epoch[slot] += 1
        if "phase" in fields:
            self._phase[slot] = fields["phase"]

    @property
    def _fresh_mtp(self) -> dict:
        """A row starting at position 0 has no deferred MTP entries."""
        return {"mtp_n": 0} if self.spec.speculative else {}

    def _feed(self, items, record: bool = True, reroute: bool = False) -> list[tuple[int, float]]:
        """`prefill.feed` into the engine's slots: items are (sequence, tokens); returns each
        item's (next token, logprob) sampled after its last token."""
        self._state, firsts, calls = prefill.feed(
            self._params,
            self.state,
            self._base_key,
            self.spec,
            self._buckets,
            items,
            record=record,
            reroute=reroute,
        )
        self._stats["feed_calls"] += calls
        return firsts

    def _take_update(self):
        with self._lock:
            update, self._pending_update = self._pending_update, None
        return update

    def _apply_update(self, update) -> None:
        if update is None:
            return
        t0 = time.perf_counter()
        params, self.version = update
        # Timed until the arrays exist (dispatch alone returns at once): the swap's real pause.
        placed = engine_layout.place_weights(params, self.cfg, self.layout)
        self._params = jax.block_until_ready(placed)
        self._stats["weight_updates"] += 1
        if self.recompute_kv:  # every in-flight cache and its recorded routing, new weights
            rebuild = [seq for seq in self._slots if seq is not None and seq.fed]
            for seq in rebuild:
                self._set(seq.slot, pos=0, **self._fresh_mtp)
            if rebuild:
                self._feed(
                    [(seq, seq.tokens[: seq.fed]) for seq in rebuild], record=False, reroute=True
                )
        self._stats["update_pause_s"] += time.perf_counter() - t0

    def _admit(self, events: list) -> None:
        for slot in range(len(self._slots)):
            if self._slots[slot] is None and self._queue:
                seq = self._queue.popleft()
                seq.slot, self._slots[slot] = slot, seq
                sp = seq.sampling
                stop_ids = np.full(self.spec.n_stop, -1, np.int32)
                stop_ids[: len(seq.stop_tokens)] = seq.stop_tokens
                self._set(
                    slot,
                    **self._fresh_mtp,
                    pos=0,
                    phase=0,
                    rid=seq.rid,
                    n_gen=0,
                    pause=seq.multi_turn,
                    stop_ids=stop_ids,
                    temperature=sp.temperature,
                    top_k=sp.top_k,
                    top_p=sp.top_p,
                )
                seq.status = "extending"
        starting = [s for s in self._slots if s is not None and s.status == "extending"]
        if starting:
            firsts = self._feed([(seq, seq.tokens[seq.fed :]) for seq in starting])
            for seq, (tok, lp) in zip(starting, firsts):
                self._start_turn(seq, tok, lp, events)

    def _start_turn(self, seq: SequenceRecord, tok: int, lp: float, events: list) -> None:
        """The unfed tokens are fed: take the sampled first token, arm the row for decoding."""
        seq.gen_start = len(seq.tokens)
        budget = min(seq.max_new, self.max_len - len(seq.tokens))
        seq.append_generated([int(tok)], [float(lp)], self.version)
        self._stats["generated_tokens"] += 1
        seq.n_gen += 1
        seq.status = "running"
        row = dict(tok=int(tok), n_gen=seq.n_gen, budget=budget - 1)
        hit = self._stop_string(seq, 0)
        if int(tok) in seq.stop_tokens:
            self._end_turn(seq, ("stop", int(tok)), events, **row)
        elif hit is not None:
            self._end_turn(seq, ("stop", hit[1]), events, **row)
        elif budget <= 1:
            self._end_turn(seq, ("length", None), events, **row)
        else:
            self._set(seq.slot, phase=1, **row)

    def _stop_string(self, seq: SequenceRecord, first_new: int):
        """(index in the turn of the token completing a stop string, the string), checking the
        turn's tokens from `first_new` on; None if no stop string ends there."""
        if not seq.stop_strings:
            return None
        turn = seq.tokens[seq.gen_start :]
        longest = max(len(s) for s in seq.stop_strings)
        for m in range(first_new, len(turn)):
            # A token decodes to >= 1 character (>= 1/4 for split UTF-8): this window suffices.
            text = self.detokenize(turn[max(0, m + 1 - 4 * longest - 4) : m + 1])
            prev = self.detokenize(turn[max(0, m + 1 - 4 * longest - 4) : m])
            for s in seq.stop_strings:
                if s in text and s not in prev:
                    return m, s
        return None

    def _end_turn(self, seq: SequenceRecord, finish, events: list, **row) -> None:
        """The row's turn is over (device or host decided): pause, finish, or flush the last
        token first. `row`: other fields to set on the device row in the same call."""
        seq.finish = finish
        if seq.multi_turn:
            seq.status = "paused"
            self._set(seq.slot, phase=0, **row)
            events.append(seq.completion())
        elif seq.fed == len(seq.tokens):
            self._finish(seq, events, **row)
        else:
            seq.status = "flushing"
            self._set(seq.slot, **dict(row, tok=seq.tokens[-1], phase=2))

    def _finish(self, seq: SequenceRecord, events: list, **row) -> None:
        self._set(seq.slot, phase=0, **row)
        self._slots[seq.slot] = None
        seq.slot = None
        seq.status = "done"
        events.append(seq.completion())
        del self._seqs[seq.rid]

    def step(self) -> list[Completion]:
        """Apply a pending weight update, admit prompts, run one decode call (with `run_ahead`,
        dispatch the next and read back the one before); returns the turns that finished."""
        events: list[Completion] = []
        update = self._take_update()
        ahead = self._can_run_ahead() and not (update is not None and self.recompute_kv)
        if self._inflight is not None and not ahead:
            self._read_back(self._inflight, events)  # the host must see it before going on
            self._inflight = None
        self._apply_update(update)
        self._admit(events)
        call = None
        if (self._phase > 0).any():
            if ahead and self._inflight is None:
                self._inflight = self._dispatch()  # start the pipeline
            call = self._dispatch()
        if ahead:  # read back the call before the one just dispatched
            call, self._inflight = self._inflight, call
        if call is not None:
            self._read_back(call, events)
        return events

    def _can_run_ahead(self) -> bool:
        """Whether a decode call may be dispatched before the last one is read back: not when
        the host may change a running row between calls (speculative decoding's bookkeeping,
        stop strings' truncation)."""
        return (
            self.run_ahead
            and not self.spec.speculative
            and not any(s is not None and s.stop_strings for s in self._slots)
        )

    def _dispatch(self) -> tuple:
        """Dispatch one decode call; returns what reading it back needs: (outputs, the weights'
        version, each slot's sequence and host-change count at dispatch)."""
        filled = max(s.fed for s, ph in zip(self._slots, self._phase) if s is not None and ph)
        if self._inflight is not None:  # the call still running writes before this one
            filled += self.spec.steps_per_call * (self.spec.num_draft + 1)
        kv_len = steps.attend_len(self.spec, filled)
        self._state, out = steps.decode(
            self._params, self.state, self._base_key, spec=self.spec, kv_len=kv_len
        )
        self._stats["decode_calls"] += 1
        return out, self.version, list(self._slots), self._epoch.copy()

    def _read_back(self, call: tuple, events: list) -> None:
        out, version, owners, epochs = call
        self._absorb(engine_layout.to_host(out), version, events, owners, epochs)

    def _absorb(self, out: dict, version: int, events: list, owners: list, epochs) -> None:
        """Record a decode call's output for each row still as it was at dispatch."""
        n_steps = out["phase"].shape[0]
        K = self.spec.num_draft
        done_in_call: set[int] = set()
        for i in range(n_steps):
            self._stats["decode_steps"] += 1
            for slot, seq in enumerate(owners):
                if seq is None or self._epoch[slot] != epochs[slot]:
                    continue
                n_emit, n_fed = int(out["n_emit"][i, slot]), int(out["n_fed"][i, slot])
                seq.n_gen += n_emit
                if seq.rid in done_in_call or seq.status not in ("running", "flushing"):
                    continue
                if n_fed:
                    seq.add_routing(out["routing"][i][:, slot, :n_fed].transpose(1, 0, 2))
                phase = int(out["phase"][i, slot])
                self._phase[slot] = phase
                if seq.status == "flushing":
                    if phase == 0:
                        self._finish(seq, events)
                        done_in_call.add(seq.rid)
                    continue
                if n_emit:
                    first_new = len(seq.tokens) - seq.gen_start
                    seq.append_generated(
                        out["tokens"][i, slot, :n_emit].tolist(),
                        out["logprobs"][i, slot, :n_emit].tolist(),
                        version,
                    )
                    self._stats["generated_tokens"] += n_emit
                    if K:
                        self._stats["verify_rows"] += 1
                        self._stats["drafted"] += K
                        self._stats["accepted"] += int(out["accepted"][i, slot])
                    hit = self._stop_string(seq, first_new)
                    if hit is not None:
                        self._truncate(seq, seq.gen_start + hit[0] + 1)
                        self._end_turn(seq, ("stop", hit[1]), events)
                        done_in_call.add(seq.rid)
                        continue
                if phase != 1:  # the device stopped the turn: stop token or budget
                    last = seq.tokens[-1]
                    finish = ("stop", last) if last in seq.stop_tokens else ("length", None)
                    seq.finish = finish
                    if seq.multi_turn:
                        seq.status = "paused"
                        events.append(seq.completion())
                    elif phase == 0:
                        self._finish(seq, events)
                    else:
                        seq.status = "flushing"
                    done_in_call.add(seq.rid)

    def _truncate(self, seq: SequenceRecord, length: int) -> None:
        """Drop everything after `length` tokens (a stop string ended there); roll the row back."""
        self._stats["generated_tokens"] -= len(seq.tokens) - length
        seq.truncate(length)
        self._set(seq.slot, pos=seq.fed)
        if self.spec.speculative and seq.multi_turn:
            # The device ran ahead: rebuild the row so the MTP state (the last hidden state and
            # the module's cache) belongs to the kept tokens; the next turn drafts from it.
            self._set(seq.slot, pos=0, **self._fresh_mtp)
            self._feed([(seq, seq.tokens[: seq.fed])], record=False)


def generate(
    params,
    config: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    speculative: bool = False,
    seed: int = 0,
    mesh: Mesh | sharding.Layout | None = None,
    **engine_options,
) -> list[Completion]:
    """One `Completion` per prompt (in order). Inputs are checked before anything compiles;
    `engine_options` go to `Engine` (max_slots, max_len, stop_tokens, ...). max_len defaults to
    the longest prompt plus max_new_tokens (within cfg.max_seq_len); max_slots to the prompts
    (at most 8), rounded up to a multiple of the devices `mesh` splits slots over."""
    if isinstance(prompts, (str, bytes)) or not len(prompts):
        raise ValueError("prompts: expected a non-empty list of token-id sequences")
    arrays = [
        checks.token_array(p, config.vocab_size, f"prompts[{i}]") for i, p in enumerate(prompts)
    ]
    max_new = checks.positive_int(max_new_tokens, "max_new_tokens")
    longest = max(len(a) for a in arrays)
    if longest >= config.max_seq_len:
        raise ValueError(
            f"prompts[{int(np.argmax([len(a) for a in arrays]))}] has {longest} tokens but the "
            f"context holds cfg.max_seq_len={config.max_seq_len}: no room for a generated token"
        )
    engine_options.setdefault("max_len", min(config.max_seq_len, longest + max_new))
    shards = engine_layout.batch_shards(sharding.as_layout(mesh))
    engine_options.setdefault("max_slots", -(-min(len(arrays), 8) // shards) * shards)
    engine = Engine(
        params,
        config,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        speculative=speculative,
        seed=seed,
        mesh=mesh,
        **engine_options,
    )
    return engine.generate(arrays, max_new)
