import itertools

import numpy as np
import pytest

from c2.data import corpus as corpus_lib
from c2.data import pipeline

T = 64


def _doc_streams(docs, tok):
    """Reference: concat over documents of [bos] + ids and of ids + [eos]."""
    inputs, targets = [], []
    for i in range(len(docs)):
        ids = tok.encode(docs[i]["text"])
        inputs += [tok.bos_id, *ids]
        targets += [*ids, tok.eos_id]
    return np.asarray(inputs), np.asarray(targets)


def _real_stream(batches, key):
    return np.concatenate([b[key][b["segment_ids"] > 0] for b in batches])


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
def test_packing_invariants(tok_name, all_docs_corpus, byte_tokenizer, bpe_tokenizer, check_rows):
    tok = byte_tokenizer if tok_name == "byte" else bpe_tokenizer
    docs = all_docs_corpus.documents("train")
    ds = pipeline.make_pretrain_dataset(
        all_docs_corpus,
        tok,
        T,
        batch_size=2,
        seed=0,
        num_epochs=1,
        shuffle=False,
        shard_index=0,
        shard_count=1,
    )
    batches = list(ds)
    for b in batches:
        assert set(b) == set(pipeline.BATCH_KEYS)
        for k, v in b.items():
            assert v.shape == (2, T), k
            assert v.dtype == (np.float32 if k == "loss_mask" else np.int32), k
        check_rows(b, tok.pad_id)
        real = b["segment_ids"] > 0
        np.testing.assert_array_equal(b["loss_mask"], real.astype(np.float32))
        np.testing.assert_array_equal(b["target_bytes"], tok.token_bytes(b["targets"]) * real)
    # One epoch, unshuffled: the packed stream is exactly the documents, in order, each token
    # once as an input and once as a target (so every target is its document's next token).
    ref_inputs, ref_targets = _doc_streams(docs, tok)
    all_rows = -(-len(ref_inputs) // T)
    assert len(batches) == all_rows // 2  # drop_remainder drops the last, partial batch
    got_inputs, got_targets = _real_stream(batches, "inputs"), _real_stream(batches, "targets")
    np.testing.assert_array_equal(got_inputs, ref_inputs[: len(got_inputs)])
    np.testing.assert_array_equal(got_targets, ref_targets[: len(got_targets)])
    # Long documents are split across rows: a row may start mid-document (not with bos).
    first_tokens = np.concatenate([b["inputs"][:, 0] for b in batches])
    assert (first_tokens != tok.bos_id).any()
    # Bits-per-byte denominators add up to the text's UTF-8 size.
    total_bytes = sum(len(docs[i]["text"].encode()) for i in range(len(docs)))
    got_bytes = sum(int(b["target_bytes"].sum()) for b in batches)
    assert got_bytes == tok.token_bytes(ref_targets[: len(got_targets)]).sum() <= total_bytes


def test_every_token_once_with_padding_row(all_docs_corpus, byte_tokenizer, check_rows):
    """batch_size=1 keeps every row, the last one padded: the stream is the corpus exactly."""
    docs = all_docs_corpus.documents("train")
    batches = list(
        pipeline.make_pretrain_dataset(
            all_docs_corpus,
            byte_tokenizer,
            T,
            1,
            seed=0,
            num_epochs=1,
            shuffle=False,
            shard_index=0,
            shard_count=1,
            prefetch=0,
        )
    )
    ref_inputs, ref_targets = _doc_streams(docs, byte_tokenizer)
    np.testing.assert_array_equal(_real_stream(batches, "inputs"), ref_inputs)
    np.testing.assert_array_equal(_real_stream(batches, "targets"), ref_targets)
    assert len(batches) == -(-len(ref_inputs) // T)
    for b in batches:
        check_rows(b, byte_tokenizer.pad_id)
    assert (batches[-1]["segment_ids"] == 0).any()  # the only padding is at the very end
    assert all((b["segment_ids"] > 0).all() for b in batches[:-1])


def test_shuffle_is_seeded_and_loses_nothing(all_docs_corpus, byte_tokenizer):
    def take(seed, n, **kw):
        ds = pipeline.make_pretrain_dataset(
            all_docs_corpus,
            byte_tokenizer,
            T,
            4,
            seed=seed,
            shard_index=0,
            shard_count=1,
            shuffle_window=64,
            **kw,
        )
        return list(itertools.islice(iter(ds), n))

    a, b, c = take(1, 6), take(1, 6), take(2, 6)
    for x, y in zip(a, b):
        for k in pipeline.BATCH_KEYS:
            np.testing.assert_array_equal(x[k], y[k])
    assert any(not np.array_equal(x["inputs"], z["inputs"]) for x, z in zip(a, c))

    one_epoch = list(
        iter(
            pipeline.make_pretrain_dataset(
                all_docs_corpus,
                byte_tokenizer,
                T,
                1,
                seed=3,
                num_epochs=1,
                shard_index=0,
                shard_count=1,
                shuffle_window=64,
            )
        )
    )
    ref_inputs, _ = _doc_streams(all_docs_corpus.documents("train"), byte_tokenizer)
    got = _real_stream(one_epoch, "inputs")
    assert not np.array_equal(got, ref_inputs)
    np.testing.assert_array_equal(np.sort(got), np.sort(ref_inputs))


def test_host_shards_are_disjoint_and_cover(all_docs_corpus, byte_tokenizer):
    docs = all_docs_corpus.documents("train")
    streams, paths = [], []
    for index in range(2):
        ds = pipeline.make_pretrain_dataset(
            all_docs_corpus,
            byte_tokenizer,
            T,
            batch_size=2,
            seed=0,
            num_epochs=1,
            shuffle=False,
            shard_index=index,
            shard_count=2,
            prefetch=0,
        )
        batches = list(ds)
        assert all(b["inputs"].shape == (1, T) for b in batches)  # local batch = 2 // 2
        streams.append(_real_stream(batches, "inputs"))
        paths.append(docs.paths[index::2])
    assert set(paths[0]).isdisjoint(paths[1]) and sorted(paths[0] + paths[1]) == docs.paths
    for index in range(2):
        mine = [docs[i] for i in range(index, len(docs), 2)]
        ref, _ = _doc_streams(mine, byte_tokenizer)
        np.testing.assert_array_equal(streams[index], ref)

    with pytest.raises(ValueError, match=r"batch_size=3 must be a positive multiple .*=2"):
        pipeline.make_pretrain_dataset(
            all_docs_corpus, byte_tokenizer, T, 3, seed=0, shard_index=0, shard_count=2
        )
    with pytest.raises(ValueError, match=r"shard_index=2 must lie in \[0, shard_count=2\)"):
        pipeline.shard_info(2, 2)


def test_default_shard_is_this_process():
    import jax

    assert pipeline.shard_info(None, None) == (jax.process_index(), jax.process_count())


def test_stdlib_default_pretrain_batches(byte_tokenizer, check_rows):
    ds = pipeline.make_pretrain_dataset("stdlib", "byte", 128, 4, seed=0)
    for b in itertools.islice(iter(ds), 3):
        assert b["inputs"].shape == (4, 128)
        check_rows(b, byte_tokenizer.pad_id)


def test_eval_batches_fixed_and_complete(all_docs_corpus, byte_tokenizer, check_rows):
    kwargs = dict(split="all", shard_index=0, shard_count=1)
    first = pipeline.make_eval_batches(all_docs_corpus, byte_tokenizer, T, 4, **kwargs)
    second = pipeline.make_eval_batches(all_docs_corpus, byte_tokenizer, T, 4, **kwargs)
    assert len(first) == len(second) > 2
    for x, y in zip(first, second):
        for k in pipeline.BATCH_KEYS:
            np.testing.assert_array_equal(x[k], y[k])
    for b in first:
        check_rows(b, byte_tokenizer.pad_id)
    docs = all_docs_corpus.documents("all")
    ref_inputs, ref_targets = _doc_streams(docs, byte_tokenizer)
    np.testing.assert_array_equal(_real_stream(first, "inputs"), ref_inputs)
    np.testing.assert_array_equal(_real_stream(first, "targets"), ref_targets)
    total_bytes = sum(len(docs[i]["text"].encode()) for i in range(len(docs)))
    assert sum(int(b["target_bytes"].sum()) for b in first) == total_bytes
    assert (first[-1]["segment_ids"] == 0).all(axis=1).any()  # padded with empty rows

    capped = pipeline.make_eval_batches(
        all_docs_corpus, byte_tokenizer, T, 4, max_batches=2, **kwargs
    )
    assert len(capped) == 2
    np.testing.assert_array_equal(capped[1]["inputs"], first[1]["inputs"])

    # Two hosts: equal batch counts, and host blocks stack into the global batch.
    hosts = [
        pipeline.make_eval_batches(
            all_docs_corpus, byte_tokenizer, T, 4, split="all", shard_index=i, shard_count=2
        )
        for i in range(2)
    ]
    assert len(hosts[0]) == len(hosts[1]) == len(first)
    for k, global_batch in enumerate(first):
        np.testing.assert_array_equal(
            np.concatenate([hosts[0][k]["inputs"], hosts[1][k]["inputs"]]), global_batch["inputs"]
        )


def test_default_heldout_eval_matches_split_bytes(byte_tokenizer):
    from c2.data import corpus as corpus_lib

    heldout = corpus_lib.stdlib_corpus().documents("heldout")
    batches = pipeline.make_eval_batches(
        "stdlib", byte_tokenizer, 256, 8, shard_index=0, shard_count=1
    )
    total_bytes = sum(len(heldout[i]["text"].encode()) for i in range(len(heldout)))
    assert sum(int(b["target_bytes"].sum()) for b in batches) == total_bytes


def test_bad_pipeline_arguments(all_docs_corpus, byte_tokenizer):
    with pytest.raises(ValueError, match="seq_len must be positive, got 0"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, 0, 1, seed=0)
    with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\*\*32\), got -1"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, 8, 1, seed=-1)
    with pytest.raises(ValueError, match="num_epochs must be positive or None"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, 8, 1, 0, num_epochs=0)
    with pytest.raises(ValueError, match="split must be one of"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, 8, 1, 0, split="dev")
    with pytest.raises(ValueError, match=r"no records for host 0 of 1: dir:.*\[heldout\] has 0"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, 8, 1, 0, split="heldout")


def test_epochs_reshuffle_documents_per_host(tmp_path, byte_tokenizer):
    """One row per document (T=2: [bos, c] -> [c, eos]) shows the document order directly;
    global batch 2 = one row per host."""
    import json

    path = tmp_path / "letters.jsonl"
    path.write_text("".join(json.dumps({"text": c, "path": c}) + "\n" for c in "abcdef"))
    corpus = corpus_lib.JsonlCorpus(str(path), heldout_fraction=0.0)

    def order(shard_index, **kw):
        ds = pipeline.make_pretrain_dataset(
            corpus, byte_tokenizer, 2, 2, seed=5, num_epochs=4, shuffle_window=1,
            shard_index=shard_index, shard_count=2, **kw,
        )  # fmt: skip
        return "".join(chr(b["inputs"][0, 1]) for b in ds)

    host0, host1 = order(0), order(1)
    epochs0 = [host0[i : i + 3] for i in range(0, 12, 3)]
    epochs1 = [host1[i : i + 3] for i in range(0, 12, 3)]
    assert all(sorted(e) == list("ace") for e in epochs0)
    assert all(sorted(e) == list("bdf") for e in epochs1)
    assert len(set(epochs0)) > 1 and len(set(epochs1)) > 1  # a new permutation per epoch
    assert order(0, shuffle=False) == "ace" * 4


def test_replay_mixes_sft_rows_in_proportion_and_resumes(
    all_docs_corpus, byte_tokenizer, check_rows
):
    """Continued pretraining with replay: `replay_fraction` of the rows are SFT rows (loss on the
    responses only, prompts untrained), the rest the corpus's (every token trained); the stream
    resumes exactly from a saved state. (Unshuffled, so that 8 batches hold the exact share.)"""
    examples = [{"prompt": f"p{i} " * 3, "response": f"r{i}"} for i in range(40)]
    ds = pipeline.make_pretrain_dataset(
        all_docs_corpus,
        byte_tokenizer,
        T,
        4,
        seed=0,
        shuffle=False,
        replay=examples,
        replay_fraction=0.25,
    )
    it = iter(ds)
    batches = [next(it) for _ in range(8)]
    state = it.get_state()
    after = next(it)
    resumed = iter(ds)
    resumed.set_state(state)
    np.testing.assert_array_equal(next(resumed)["inputs"], after["inputs"])
    rows = [{k: b[k][r] for k in b} for b in batches for r in range(4)]
    for b in batches:
        check_rows(b, byte_tokenizer.pad_id)
    replayed = [r for r in rows if r["loss_mask"][r["segment_ids"] > 0].min() == 0]
    assert len(replayed) == len(rows) // 4  # the prompts' tokens are the untrained ones
    text = byte_tokenizer.decode(replayed[0]["inputs"][replayed[0]["segment_ids"] > 0].tolist())
    assert "p" in text and "r" in text
    with pytest.raises(ValueError, match="give both or neither"):
        pipeline.make_pretrain_dataset(all_docs_corpus, byte_tokenizer, T, 4, 0, replay=examples)
    with pytest.raises(ValueError, match=r"replay_fraction must be in \[0, 1\), got 1.0"):
        pipeline.make_pretrain_dataset(
            all_docs_corpus, byte_tokenizer, T, 4, 0, replay=examples, replay_fraction=1.0
        )
