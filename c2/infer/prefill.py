"""Feeding tokens into the engine's slots: prompts, the tokens a multi-turn `extend` appends, a
finished row's last token, and cache rebuilds (new weights, a speculative row rolled back).

A row's tokens go in chunks of static bucket sizes (powers of two from `MIN_BUCKET` up to the
engine's `prefill_chunk`), so the compiled `steps.feed` sees a few shapes only; the rows needing
one chunk size share one forward pass (batched prefill), their count padded to a power of two
(and to a multiple of the devices the slots are split over). Each fed token's routed experts
are recorded on its sequence; a rebuild records none, or, with new weights, replaces them.
"""

from __future__ import annotations

import collections

import numpy as np

from c2.infer import engine_layout, steps
from c2.infer.checks import positive_int

MIN_BUCKET = 16


def bucket_sizes(prefill_chunk) -> list[int]:
    """The chunk sizes a row is fed in: powers of two times MIN_BUCKET below `prefill_chunk`,
    and `prefill_chunk` itself (the largest chunk fed at once)."""
    prefill_chunk = positive_int(prefill_chunk, "prefill_chunk")
    if prefill_chunk < MIN_BUCKET:
        raise ValueError(f"prefill_chunk={prefill_chunk}: expected >= {MIN_BUCKET}")
    return sorted(
        {b for b in (MIN_BUCKET << i for i in range(32)) if b < prefill_chunk} | {prefill_chunk}
    )


def feed(params, state, base_key, spec: steps.StepSpec, buckets, items, *, record, reroute):
    """Feed tokens into sequences' slots: items are (sequence, tokens), each sequence holding a
    slot. Returns the new state, each item's (next token, logprob) sampled after its last
    token, and the forward passes run. Recording: the tokens follow the sequence's `fed` ones
    and their routing is added to it. Not recording: a rebuild from position 0; `reroute` then
    replaces the recorded routing of the rebuilt tokens (new weights route them anew)."""
    done = [0] * len(items)
    last: list = [None] * len(items)
    rebuilt: list[list] = [[] for _ in items]
    calls = 0
    while True:
        by_size = collections.defaultdict(list)
        for j, (seq, tokens) in enumerate(items):
            if done[j] < len(tokens):
                room = spec.cache_len - (seq.fed if record else done[j])
                fits = [b for b in buckets if b <= room]
                left = len(tokens) - done[j]
                by_size[min([b for b in fits if b >= left], default=max(fits))].append(j)
        if not by_size:
            break
        for size, js in sorted(by_size.items()):
            rows = []
            for j in js:
                seq, tokens = items[j]
                rows.append((seq.slot, tokens, done[j], seq.fed if record else done[j]))
            state, tok, lp, lengths, routing = _feed_chunk(
                params, state, base_key, spec, rows, size
            )
            calls += 1
            if record or reroute:
                routing = engine_layout.to_host(routing)
            for k, j in enumerate(js):
                n = int(lengths[k])
                if record:
                    items[j][0].add_routing(routing[:, k, :n].transpose(1, 0, 2))
                elif reroute:
                    rebuilt[j].append(routing[:, k, :n].transpose(1, 0, 2))
                done[j] += n
                last[j] = (tok, lp, k)
    if reroute:
        for (seq, _), blocks in zip(items, rebuilt):
            seq.routing = [np.concatenate([seq.empty_routing, *blocks])]
    # In a fixed order (not keyed by id: a multi-host engine's processes gather leaf by leaf).
    arrays = list({id(a): a for out in last for a in out[:2]}.values())
    fetched = dict(zip(map(id, arrays), engine_layout.to_host(arrays)))
    firsts = [(int(fetched[id(t)][k]), float(fetched[id(lp)][k])) for t, lp, k in last]
    return state, firsts, calls


def _feed_chunk(params, state, base_key, spec: steps.StepSpec, rows, size: int):
    """One forward pass feeding the next chunk (at most `size` tokens) of each row: rows are
    (slot, tokens, how many of them are fed, the cache position the chunk goes to). The row
    count is padded to a power of two (padding rows write nothing). Returns the new state, the
    sampled tokens and logprobs, and the chunk lengths and routing by (padded) row."""
    n_slots = spec.n_slots
    n_rows = 1 << (len(rows) - 1).bit_length()
    shards = engine_layout.batch_shards(spec.layout)  # each device feeds as many rows
    n_rows = min(-(-n_rows // shards) * shards, n_slots)
    slots = np.full(n_rows, n_slots, np.int32)
    chunk = np.zeros((n_rows, size), np.int32)
    lengths = np.ones(n_rows, np.int32)
    for k, (slot, tokens, done, _) in enumerate(rows):
        n = min(len(tokens) - done, size)
        slots[k], lengths[k] = slot, n
        chunk[k, :n] = tokens[done : done + n]
    kv_len = steps.attend_len(spec, max(start for *_, start in rows), size)
    state, tok, lp, routing = steps.feed(
        params, state, base_key, slots, chunk, lengths, spec=spec, kv_len=kv_len
    )
    return state, tok, lp, lengths, routing
