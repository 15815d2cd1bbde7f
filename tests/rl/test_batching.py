"""Samples -> fixed-shape train batches: shapes, the one-token shift, buckets, padding, errors."""

import numpy as np
import pytest

from c2.model import presets
from c2.rl.batching import BATCH_KEYS, FAILED_STOP_REASONS, make_batch, reward_arrays
from c2.rl.records import Sample

CFG = presets.get("tiny_kimi_k2", vocab_size=64, max_seq_len=64, n_layers=3)  # 2 MoE layers
L, K = CFG.n_moe_layers, CFG.n_experts_per_token
PAD = 3


def sample(n, n_prompt, *, group="g0", index=0, seed=0, **fields):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, n).astype(np.int32)
    gen = np.arange(n) >= n_prompt
    routing = np.argsort(rng.random((n, L, CFG.n_experts)), -1)[..., :K].astype(np.uint8)
    kw = dict(
        prompt_id=f"p-{group}",
        group_id=group,
        sample_index=index,
        task_id="t",
        tokens=tokens,
        loss_mask=gen.astype(np.uint8),
        logprobs=np.where(gen, -rng.random(n), 0.0).astype(np.float32),
        versions=np.where(gen, 7, -1).astype(np.int32),
        routing=routing,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        reward_terms={"task": float(index), "style": 0.5},
        effort={"thinking_tokens": float(n - n_prompt)},
        passed=True,
        stop_reason="stop",
    )
    return Sample(**(kw | fields))


def test_shapes_shift_and_padding():
    samples = [sample(9, 4, index=0, seed=1), sample(13, 6, index=1, seed=2)]
    b = make_batch(samples, batch_size=4, seq_buckets=(8, 16, 32), cfg=CFG, pad_id=PAD)
    assert set(b) == set(BATCH_KEYS)
    for key in ("inputs", "positions", "segment_ids", "targets", "target_versions"):
        assert b[key].shape == (4, 16) and b[key].dtype == np.int32, key
    assert b["target_mask"].dtype == b["behaviour_logp"].dtype == np.float32
    assert b["routing"].shape == (L, 4, 16, K) and b["routing"].dtype == np.int32
    assert b["temperature"].shape == b["top_p"].shape == b["top_k"].shape == (4,)
    np.testing.assert_array_equal(b["valid"], [True, True, False, False])
    np.testing.assert_allclose(b["temperature"], [0.7, 0.7, 1.0, 1.0])
    np.testing.assert_array_equal(b["top_k"], [5, 5, 0, 0])
    for row, s in enumerate(samples):
        n = s.length
        np.testing.assert_array_equal(b["inputs"][row, :n], s.tokens)
        np.testing.assert_array_equal(b["positions"][row, :n], np.arange(n))
        np.testing.assert_array_equal(b["segment_ids"][row], np.arange(16) < n)
        # Position t predicts token t + 1: every per-target array is shifted by one.
        np.testing.assert_array_equal(b["targets"][row, : n - 1], s.tokens[1:])
        np.testing.assert_array_equal(b["target_mask"][row, : n - 1], s.loss_mask[1:])
        np.testing.assert_array_equal(b["behaviour_logp"][row, : n - 1], s.logprobs[1:])
        np.testing.assert_array_equal(b["target_versions"][row, : n - 1], s.versions[1:])
        np.testing.assert_array_equal(b["routing"][:, row, :n], s.routing.transpose(1, 0, 2))
        # The last real token and the padding predict nothing.
        assert not b["target_mask"][row, n - 1 :].any()
        assert (b["inputs"][row, n:] == PAD).all() and (
            b["target_versions"][row, n - 1 :] == -1
        ).all()
        # The first target is the first generated token, at the last prompt position.
        first = int(np.argmax(s.loss_mask))
        assert (
            b["target_mask"][row, first - 1] == 1 and b["target_mask"][row, : first - 1].sum() == 0
        )
    assert b["target_mask"][2:].sum() == 0 and b["segment_ids"][2:].sum() == 0
    assert (b["inputs"][2:] == PAD).all()


@pytest.mark.parametrize("reason", FAILED_STOP_REASONS)
def test_a_failed_sample_completes_its_group_but_is_not_valid(reason):
    """A sample with nothing generated (the prompt did not fit, or every attempt raised) holds
    its place in the group: its chain is present, its row is not valid (no baseline, no loss)."""
    failed = sample(6, 6, index=1, seed=2, stop_reason=reason)
    samples = [sample(9, 4, index=0, seed=1), failed, sample(9, 4, index=2, seed=3)]
    b = make_batch(samples, batch_size=4, seq_buckets=(16,), cfg=CFG, pad_id=PAD)
    np.testing.assert_array_equal(b["valid"], [True, False, True, False])
    np.testing.assert_array_equal(b["chain_valid"], [True, True, True, False])
    np.testing.assert_array_equal(b["inputs"][1, :6], failed.tokens)  # kept, for the record
    assert b["target_mask"][1].sum() == 0


def test_turn_penalties_land_on_their_turns_tokens():
    """Each generated turn (a run of loss_mask == 1) takes its own penalty count; the batch holds
    it per target, shifted like the other per-target arrays; a count per turn is checked."""
    s = sample(12, 3, seed=3)
    s.loss_mask[:] = [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1]  # three turns: tokens 3-5, 8-9, 11
    s.turn_penalties = [2, 0, 1]
    np.testing.assert_array_equal(s.token_penalties(), [0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 1])
    b = make_batch([s], batch_size=2, seq_buckets=(16,), cfg=CFG, pad_id=PAD)
    np.testing.assert_array_equal(b["target_penalty"][0, :11], s.token_penalties()[1:])
    assert not b["target_penalty"][0, 11:].any() and not b["target_penalty"][1].any()
    with pytest.raises(ValueError, match="turn_penalties has 2 entries for 3 generated turns"):
        sample(12, 3, seed=3, loss_mask=s.loss_mask, turn_penalties=[1, 0])
    assert not sample(9, 4).token_penalties().any()  # none recorded: nothing penalised


def test_padding_routing_is_distinct_and_valid():
    b = make_batch([sample(5, 2)], batch_size=2, seq_buckets=(8,), cfg=CFG, pad_id=PAD)
    pad = b["routing"][:, 1].reshape(-1, K)  # a whole padding row
    tail = b["routing"][:, 0, 5:].reshape(-1, K)  # a real row's padding positions
    for r in (pad, tail):
        np.testing.assert_array_equal(r, np.broadcast_to(np.arange(K), r.shape))
    assert all(len(set(r)) == K for r in pad) and np.all(pad < CFG.n_experts)


def test_bucket_is_the_smallest_that_holds_the_longest_sample():
    make = lambda n: make_batch(  # noqa: E731
        [sample(n, 2)], batch_size=1, seq_buckets=(8, 16, 32), cfg=CFG, pad_id=PAD
    )
    assert [make(n)["inputs"].shape[1] for n in (2, 8, 9, 16, 17, 32)] == [8, 8, 16, 16, 32, 32]
    empty = make_batch([], batch_size=2, seq_buckets=(8, 16), cfg=CFG, pad_id=PAD)
    assert empty["inputs"].shape == (2, 8) and not empty["valid"].any()


def test_too_long_sample_is_named():
    samples = [sample(10, 3), sample(40, 3, group="g1", index=2)]
    with pytest.raises(ValueError, match=r"sample g1/2 .*40 tokens.*seq_buckets=\(16, 32\)"):
        make_batch(samples, batch_size=2, seq_buckets=(16, 32), cfg=CFG, pad_id=PAD)


def test_bad_inputs_are_named():
    good = dict(batch_size=2, seq_buckets=(16,), cfg=CFG, pad_id=PAD)
    with pytest.raises(ValueError, match="3 samples do not fit batch_size=2"):
        make_batch([sample(5, 2)] * 3, **good)
    with pytest.raises(ValueError, match="seq_buckets"):
        make_batch([sample(5, 2)], **(good | {"seq_buckets": (32, 16)}))
    with pytest.raises(ValueError, match="max_seq_len=64"):
        make_batch([sample(5, 2)], **(good | {"seq_buckets": (16, 128)}))
    with pytest.raises(ValueError, match="pad_id=64"):
        make_batch([sample(5, 2)], **(good | {"pad_id": 64}))
    s = sample(5, 2, group="gx", index=1)
    s.routing = s.routing[:, :1]
    with pytest.raises(ValueError, match=r"sample gx/1.*routing.*n_moe_layers=2"):
        make_batch([s], **good)
    s = sample(5, 2, group="gx", index=1)
    s.routing[2, 0, 0] = CFG.n_experts
    with pytest.raises(ValueError, match=r"sample gx/1.*expert 16 >= n_experts=16"):
        make_batch([s], **good)
    s = sample(5, 2, group="gx", index=1)
    s.routing[3, 1, 1] = s.routing[3, 1, 0]
    with pytest.raises(ValueError, match=r"sample gx/1.*repeats an expert at token 3, MoE layer 1"):
        make_batch([s], **good)
    s = sample(5, 2, group="gx", index=1)
    s.tokens[3] = CFG.vocab_size
    with pytest.raises(ValueError, match=r"sample gx/1.*vocab_size=64"):
        make_batch([s], **good)
    with pytest.raises(ValueError, match=r"sample gx/1.*loss_mask\[0\]"):
        make_batch([sample(5, 0, group="gx", index=1)], **good)


def test_groups_must_be_complete_and_in_order():
    group = lambda g: [sample(6, 2, group=g, index=i, seed=i) for i in range(2)]  # noqa: E731
    kw = dict(batch_size=4, seq_buckets=(8,), cfg=CFG, pad_id=PAD, group_size=2)
    assert make_batch(group("a") + group("b"), **kw)["valid"].all()
    with pytest.raises(ValueError, match=r"samples 0..1 should be one complete group of 2"):
        make_batch([group("a")[0], group("b")[0]], **kw)
    with pytest.raises(ValueError, match="batch_size=4 is not a multiple of group_size=3"):
        make_batch(group("a"), **(kw | {"group_size": 3}))


def test_reward_arrays():
    samples = [sample(5, 2, index=i) for i in range(3)]
    terms, effort = reward_arrays(samples, 4)
    np.testing.assert_array_equal(terms["task"], [0, 1, 2, 0])
    np.testing.assert_array_equal(terms["style"], [0.5, 0.5, 0.5, 0])
    np.testing.assert_array_equal(effort["thinking_tokens"], [3, 3, 3, 0])
    assert all(a.dtype == np.float32 for a in (*terms.values(), *effort.values()))
    odd = sample(5, 2, group="gz", index=4, reward_terms={"task": 1.0})
    with pytest.raises(ValueError, match=r"sample gz/4.*reward_terms lacks \['style'\]"):
        reward_arrays(samples + [odd], 4)


def group_sharing(n_prompt, lengths, *, group="g0", seed=0):
    """A group whose samples share their first n_prompt tokens and those tokens' experts."""
    first = sample(max(lengths), n_prompt, group=group, seed=seed)
    out = []
    for i, n in enumerate(lengths):
        s = sample(n, n_prompt, group=group, index=i, seed=seed + 10 + i)
        s.tokens[:n_prompt], s.routing[:n_prompt] = (
            first.tokens[:n_prompt],
            first.routing[:n_prompt],
        )
        out.append(s)
    return out


def test_packed_rows_hold_each_prompt_once_and_every_sample_whole():
    """A packed row: the trunk (the shared prompt less its last token) once, then each sample's
    rest as a branch; reading the trunk and a branch back gives the sample's tokens, positions
    and experts, and packed_index finds each of its targets."""
    samples = group_sharing(6, [9, 12, 7]) + group_sharing(4, [5, 11, 8], group="g1", seed=5)
    kw = dict(batch_size=6, seq_buckets=(16,), cfg=CFG, pad_id=PAD, group_size=3)
    b = make_batch(samples, pack_buckets=(16, 32), **kw)
    assert b["packed_inputs"].shape == (2, 32) and b["packed_index"].shape == (6, 16)
    for r, (group, trunk) in enumerate([(samples[:3], 5), (samples[3:], 3)]):
        seg = b["packed_segment_ids"][r]
        assert (seg == 1).sum() == trunk
        for j, s in enumerate(group, 1):
            cols = np.concatenate([np.flatnonzero(seg == 1), np.flatnonzero(seg == 1 + j * 2**20)])
            np.testing.assert_array_equal(b["packed_inputs"][r, cols], s.tokens)
            np.testing.assert_array_equal(b["packed_positions"][r, cols], np.arange(s.length))
            routing = b["packed_routing"][:, r, cols].transpose(1, 0, 2)
            np.testing.assert_array_equal(routing, s.routing)
            np.testing.assert_allclose(b["packed_temperature"][r, cols[trunk:]], s.temperature)
            row = r * 3 + j - 1
            mask = b["target_mask"][row] > 0
            got = b["packed_targets"].reshape(-1)[b["packed_index"][row]]
            np.testing.assert_array_equal(got[mask], b["targets"][row][mask])
        assert (seg[(seg == 1).sum() + sum(s.length - trunk for s in group) :] == 0).all()
    # More rows (spread over devices): the extra ones are padding, the rest unchanged.
    wide = make_batch(samples, pack_buckets=(16, 32), pack_rows=4, **kw)
    assert wide["packed_inputs"].shape == (4, 32) and not wide["packed_segment_ids"][2:].any()
    for key in ("packed_inputs", "packed_segment_ids", "packed_index"):
        np.testing.assert_array_equal(wide[key][: len(b[key])], b[key])


def test_a_larger_bucket_on_request_adds_padding_only():
    """min_seq / min_pack: the same samples in a larger bucket, their positions unchanged and
    the rest padding; no samples: an all-padding batch of the bucket's shapes and dtypes (to
    compile that bucket's program before a batch needs it)."""
    samples = group_sharing(6, [9, 12, 7])
    kw = dict(batch_size=3, seq_buckets=(16, 32), cfg=CFG, pad_id=PAD, group_size=3)
    small = make_batch(samples, pack_buckets=(32, 64), **kw)
    big = make_batch(samples, pack_buckets=(32, 64), min_seq=17, min_pack=64, **kw)
    assert small["inputs"].shape == (3, 16) and small["packed_inputs"].shape == (1, 32)
    assert big["inputs"].shape == (3, 32) and big["packed_inputs"].shape == (1, 64)
    assert big["packed_index"].shape == (3, 32)
    for key in ("inputs", "targets", "target_mask", "segment_ids", "behaviour_logp"):
        np.testing.assert_array_equal(big[key][:, :16], small[key])
    assert not big["segment_ids"][:, 16:].any() and (big["inputs"][:, 16:] == PAD).all()
    for key in ("packed_inputs", "packed_segment_ids", "packed_targets"):
        np.testing.assert_array_equal(big[key][:, :32], small[key])
    assert not big["packed_segment_ids"][:, 32:].any()
    blank = make_batch([], pack_buckets=(32, 64), min_seq=17, min_pack=33, **kw)
    assert {k: blank[k].shape for k in big} == {k: big[k].shape for k in big}
    assert {k: blank[k].dtype for k in big} == {k: big[k].dtype for k in big}
    assert not blank["valid"].any() and not blank["packed_segment_ids"].any()
    # packed_index is a flat index into [R * W]: with one row the same columns
    np.testing.assert_array_equal(big["packed_index"][:, :16], small["packed_index"])
    with pytest.raises(
        ValueError,
        match=r"the widest packed row or min_pack has 65 tokens.*pack_buckets=\(32, 64\)",
    ):
        make_batch(samples, pack_buckets=(32, 64), min_pack=65, **kw)


def test_trunk_stops_where_the_group_differs():
    """Experts recorded differently, or a sample generating early, shorten the shared trunk;
    a group with nothing in common packs as branches alone."""
    from c2.rl.batching import trunk_length

    group = group_sharing(6, [9, 12, 7])
    assert trunk_length(group) == 5
    group[2].routing[3] = (group[2].routing[3] + 1) % CFG.n_experts
    assert trunk_length(group) == 2
    group[1].loss_mask[2:] = 1
    assert trunk_length(group) == 1
    assert trunk_length([sample(9, 4, seed=1), sample(9, 4, seed=2)]) == 0


def test_packing_errors_are_named():
    samples = group_sharing(6, [9, 12, 7])
    kw = dict(batch_size=3, seq_buckets=(16,), cfg=CFG, pad_id=PAD)
    with pytest.raises(ValueError, match="pack_buckets needs group_size"):
        make_batch(samples, pack_buckets=(32,), **kw)
    with pytest.raises(ValueError, match="pack_rows=0: fewer rows than the batch's 1 groups"):
        make_batch(samples, pack_buckets=(32,), pack_rows=0, group_size=3, **kw)
    with pytest.raises(
        ValueError,
        match=r"the packed row of group g0 has 18 tokens; the largest of pack_buckets=\(16,\)",
    ):
        make_batch(samples, pack_buckets=(16,), group_size=3, **kw)
