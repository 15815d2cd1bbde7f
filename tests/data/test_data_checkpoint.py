"""The data iterator resumes exactly: nothing repeated, nothing skipped (issue 4, Data)."""

import json

import chex
import grain
import numpy as np
import orbax.checkpoint as ocp

from c2.data import pipeline

T = 64


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _assert_same(xs, ys):
    assert len(xs) == len(ys)
    chex.assert_trees_all_equal(xs, ys, strict=True)  # values, shapes and dtypes


def _pretrain(corpus, tok):
    return pipeline.make_pretrain_dataset(
        corpus, tok, T, 4, seed=7, shuffle_window=64, shard_index=0, shard_count=1
    )


def _has_empty_remainder(state) -> bool:
    if isinstance(state, dict):
        slices = state.get("remainder_slices")
        if slices is not None and all(list(s) == [-1, -1] for s in slices.values()):
            return True
        return any(_has_empty_remainder(v) for v in state.values())
    return False


def test_pretrain_state_resumes_exactly(all_docs_corpus, byte_tokenizer):
    """Several cut points, including the start and points past an epoch boundary (the small
    corpus packs to ~55 batches of 4 rows), each through a JSON round trip."""
    ds = _pretrain(all_docs_corpus, byte_tokenizer)
    reference = _take(iter(ds), 75)
    saw_empty_remainder = False
    for n in (0, 1, 5, 17, 60):
        it = iter(ds)
        _assert_same(_take(it, n), reference[:n])
        state = json.loads(json.dumps(it.get_state()))
        saw_empty_remainder |= _has_empty_remainder(state)
        fresh = iter(ds)
        fresh.set_state(state)
        _assert_same(_take(fresh, 15), reference[n : n + 15])
    # Covers grain 0.2.18's list-vs-tuple slip that CheckpointableDataset repairs.
    assert saw_empty_remainder


def test_sft_state_resumes_exactly(byte_tokenizer):
    examples = [
        {"prompt": f"Say {i} twice.", "response": f"{i} {i}" * (1 + i % 5)} for i in range(40)
    ]
    ds = pipeline.make_sft_dataset(
        examples, byte_tokenizer, T, 2, seed=3, shard_index=0, shard_count=1
    )
    reference = _take(iter(ds), 40)
    for n in (0, 3, 11, 29):
        it = iter(ds)
        _take(it, n)
        state = json.loads(json.dumps(it.get_state()))
        fresh = iter(ds)
        fresh.set_state(state)
        _assert_same(_take(fresh, 8), reference[n : n + 8])


def test_orbax_checkpoint_manager_round_trip(tmp_path, all_docs_corpus, byte_tokenizer):
    """Saved with the model's arrays through an orbax CheckpointManager, restored into a fresh
    iterator by a new manager (as a restarted run would)."""
    ds = _pretrain(all_docs_corpus, byte_tokenizer)
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    it = iter(ds)
    _take(it, 9)
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        manager.save(
            9,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                data_iter=grain.checkpoint.CheckpointSave(it),
            ),
        )
        expected = _take(it, 12)  # keep consuming while an async save may still be running
        manager.wait_until_finished()

    fresh = iter(ds)
    with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
        assert manager.latest_step() == 9
        restored = manager.restore(
            9,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(params),
                data_iter=grain.checkpoint.CheckpointRestore(fresh),
            ),
        )
    np.testing.assert_array_equal(restored.params["w"], params["w"])
    _assert_same(_take(fresh, 12), expected)
