"""grain input pipelines: read -> tokenise -> pack into [T] rows -> shuffle -> batch, per host.

Every batch is a dict of numpy arrays, all [B, T]:
  inputs       int32    token ids (pad_id on padding)
  targets      int32    the next token of the same document (pad_id on padding)
  segment_ids  int32    1, 2, ... per document piece within the row; 0 = padding
  positions    int32    restart at 0 for each document piece
  loss_mask    float32  1 where `targets` is trained; 0 on padding (and prompts, for SFT)
  target_bytes int32    UTF-8 bytes of each target token where loss_mask is 1, else 0

A document is [bos] + encode(text) + [eos], shifted *before* packing into (inputs = ids[:-1],
targets = ids[1:]), so a document split across rows keeps every one of its predictions: no
position inside a document lacks a target, and every corpus token is a target exactly once per
epoch. Pretraining packs with grain's concat-then-split (long documents continue in the next row,
positions restarting at 0); SFT packs whole examples with first-fit (a response is never cut off
from its prompt; examples longer than T are truncated).

`iter(dataset)` gives a grain iterator with `get_state() -> dict` (JSON-serialisable) and
`set_state(dict)`; it also saves/restores through orbax with `grain.checkpoint.CheckpointSave` /
`CheckpointRestore`. Each host yields its own [batch_size // count, T] slice of the global batch,
split one of two ways (`host_split`): "documents" shards the documents (`documents[index::count]`),
each host packing only its own (the least work per host; the batches depend on the host count,
and hosts' shards pack to different numbers of rows, so such training should run forever,
num_epochs=None, and stop by step); "rows" has every host pack the whole stream and keep block
`index` of each global batch, so the global batches are the single-host run's whatever the host
count (training's choice, c2/train/lm.py). The eval helpers always pack everything on every host
and give each host its block of every global batch (equal counts).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from c2.data import corpus as corpus_lib
from c2.data import sft as sft_lib
from c2.data.chat import AgentChat
from c2.data.tokenizer import Tokenizer, load_tokenizer

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask", "target_bytes")
_FEATURES = ("inputs", "targets", "loss_mask", "target_bytes")  # packed per document


def shard_info(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
    """(index, count) of this host; defaults to jax.process_index()/process_count()."""
    if shard_index is None or shard_count is None:
        import jax

        shard_index = jax.process_index() if shard_index is None else shard_index
        shard_count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count})")
    return shard_index, shard_count


def _local_batch_size(batch_size: int, shard_count: int) -> int:
    if batch_size <= 0 or batch_size % shard_count:
        raise ValueError(
            f"batch_size={batch_size} must be a positive multiple of the number of hosts "
            f"(shard_count={shard_count})"
        )
    return batch_size // shard_count


def _check_common(seq_len: int, seed: int) -> None:
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must lie in [0, 2**32), got {seed}")


def _sub_seed(seed: int, stream: int) -> int:
    """Independent 32-bit seeds for the pipeline's shuffles from one user seed."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def document_features(doc: Mapping[str, Any], tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """{"text"} -> per-document features, already shifted: inputs/targets/loss_mask/target_bytes."""
    ids = np.concatenate(
        [[tokenizer.bos_id], tokenizer.encode_array(doc["text"]), [tokenizer.eos_id]]
    ).astype(np.int32)
    targets = ids[1:]
    return {
        "inputs": ids[:-1],
        "targets": targets,
        "loss_mask": np.ones(len(targets), np.float32),
        "target_bytes": tokenizer.token_bytes(targets),
    }


def sft_features(
    example: Mapping[str, str], tokenizer: Tokenizer, seq_len: int
) -> dict[str, np.ndarray] | None:
    """A chat example -> shifted features truncated to seq_len; None if no trained token fits.
    {"messages": [...]} is an agent conversation, rendered by AgentChat (RL's token stream)."""
    if "messages" in example:
        ids, mask = AgentChat(tokenizer).conversation(example["messages"])
    else:
        ids, mask = sft_lib.format_chat(sft_lib.example_messages(example), tokenizer)
    ids, mask = ids[: seq_len + 1], mask[: seq_len + 1]
    targets, loss_mask = ids[1:], mask[1:]
    if not loss_mask.any():
        return None
    return {
        "inputs": ids[:-1],
        "targets": targets,
        "loss_mask": loss_mask,
        "target_bytes": tokenizer.token_bytes(targets) * (loss_mask > 0),
    }


def _finish_row(row: Mapping[str, np.ndarray], pad_id: int) -> dict[str, np.ndarray]:
    """Packed features -> the batch keys; pad_id on padding, masks and bytes zero there."""
    segment_ids = row["inputs_segment_ids"].astype(np.int32)
    real = segment_ids > 0
    loss_mask = (row["loss_mask"] * real).astype(np.float32)
    return {
        "inputs": np.where(real, row["inputs"], pad_id).astype(np.int32),
        "targets": np.where(real, row["targets"], pad_id).astype(np.int32),
        "segment_ids": segment_ids,
        "positions": np.where(real, row["inputs_positions"], 0).astype(np.int32),
        "loss_mask": loss_mask,
        "target_bytes": np.where(loss_mask > 0, row["target_bytes"], 0).astype(np.int32),
    }


def empty_row(seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """An all-padding row (fills the last eval batch)."""
    zeros = np.zeros(seq_len, np.int32)
    return {
        "inputs": np.full(seq_len, pad_id, np.int32),
        "targets": np.full(seq_len, pad_id, np.int32),
        "segment_ids": zeros,
        "positions": zeros,
        "loss_mask": np.zeros(seq_len, np.float32),
        "target_bytes": zeros,
    }


def _restore_tuples(state: Any) -> Any:
    """Undoes JSON's tuple -> list on grain's concat-then-split state.

    grain 0.2.18 compares `remainder_slices` entries with the tuple (-1, -1); after a JSON round
    trip (which grain's own orbax handler does) they are lists, every empty slice reads as a
    remainder, and the restored iterator silently skips and corrupts data.
    """
    if isinstance(state, dict):
        return {
            k: (
                {f: tuple(sl) for f, sl in v.items()}
                if k == "remainder_slices"
                else _restore_tuples(v)
            )
            for k, v in state.items()
        }
    if isinstance(state, list):
        return [_restore_tuples(v) for v in state]
    return state


def _noop() -> None:
    return None


def _close_chain(iterator: grain.DatasetIterator) -> None:
    """Closes an iterator chain once and for all.

    grain 0.2.18's ThreadPrefetchDatasetIterator.close is not idempotent: run again from __del__
    during interpreter teardown it prints AttributeErrors. Closing at exit and then disarming
    every node's close keeps a run's end quiet.
    """
    iterator.close()
    stack = [iterator]
    while stack:
        node = stack.pop()
        node.close = _noop
        stack.extend(node._parents)


class _CheckpointableIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator):
        super().__init__(parent)
        weakref.finalize(self, _close_chain, parent)  # also runs at exit, before teardown

    def __next__(self):
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return self._parent.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(_restore_tuples(state))


class CheckpointableDataset(grain.IterDataset):
    """The pipeline's outermost stage: makes iterator states restorable after a JSON round trip."""

    def __iter__(self) -> _CheckpointableIterator:
        return _CheckpointableIterator(self._parent.__iter__())

    def __str__(self) -> str:
        return "CheckpointableDataset"


def _read_options(read_threads: int) -> grain.ReadOptions:
    # A short read-ahead: grain's defaults (16 threads, 500 elements) mostly contend for the GIL
    # on a 2-core machine, and its index_shuffle costs ~1 ms per element on small datasets.
    return grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=64)


def _source(
    records: Sequence,
    *,
    seed: int,
    shuffle: bool,
    num_epochs: int | None,
    shard_index: int,
    shard_count: int,
) -> grain.MapDataset:
    if num_epochs is not None and num_epochs <= 0:
        raise ValueError(f"num_epochs must be positive or None (forever), got {num_epochs}")
    ds = grain.MapDataset.source(records)[shard_index::shard_count]
    if len(ds) == 0:
        name = getattr(records, "name", type(records).__name__)
        raise ValueError(
            f"no records for host {shard_index} of {shard_count}: {name} has {len(records)} records"
        )
    if shuffle:
        ds = ds.shuffle(_sub_seed(seed, 0))  # a new permutation every epoch
    return ds.repeat(num_epochs)


def pack_documents(
    documents: Sequence[Mapping[str, str]],
    tokenizer: Tokenizer,
    seq_len: int,
    *,
    seed: int = 0,
    shuffle: bool = False,
    num_epochs: int | None = 1,
    shard_index: int = 0,
    shard_count: int = 1,
    read_threads: int = 2,
) -> grain.IterDataset:
    """Documents -> packed [seq_len] rows (concat-then-split), before row shuffling and batching."""
    _check_common(seq_len, seed)
    ds = _source(
        documents,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    ds = ds.map(functools.partial(document_features, tokenizer=tokenizer))
    rows = ds.to_iter_dataset(_read_options(read_threads))
    rows = grain.experimental.ConcatThenSplitIterDataset(
        rows, length_struct={k: seq_len for k in _FEATURES}
    )
    return rows.map(functools.partial(_finish_row, pad_id=tokenizer.pad_id))


def pack_sft_examples(
    examples: Sequence[Mapping[str, str]],
    tokenizer: Tokenizer,
    seq_len: int,
    *,
    seed: int = 0,
    shuffle: bool = False,
    num_epochs: int | None = 1,
    shard_index: int = 0,
    shard_count: int = 1,
    num_packing_bins: int = 16,
    read_threads: int = 2,
) -> grain.IterDataset:
    """Chat examples -> first-fit packed [seq_len] rows with the loss on responses only."""
    _check_common(seq_len, seed)
    ds = _source(
        examples,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    ds = ds.map(functools.partial(sft_features, tokenizer=tokenizer, seq_len=seq_len))
    rows = ds.filter(lambda x: x is not None).to_iter_dataset(_read_options(read_threads))
    rows = grain.experimental.FirstFitPackIterDataset(
        rows,
        length_struct={k: seq_len for k in _FEATURES},
        num_packing_bins=num_packing_bins,
        seed=_sub_seed(seed, 1),
        shuffle_bins=shuffle,
    )
    return rows.map(functools.partial(_finish_row, pad_id=tokenizer.pad_id))


HOST_SPLITS = ("documents", "rows")


def _split_plan(host_split: str, shard_index: int, shard_count: int, batch_size: int):
    """(source shard index, source shard count, rows batched, block kept) for `host_split`."""
    local = _local_batch_size(batch_size, shard_count)
    if host_split == "documents":
        return shard_index, shard_count, local, None
    if host_split == "rows":
        block = None if shard_count == 1 else slice(shard_index * local, (shard_index + 1) * local)
        return 0, 1, batch_size, block
    raise ValueError(f"host_split={host_split!r}: expected one of {HOST_SPLITS}")


def _take_rows(batch: dict[str, np.ndarray], block: slice) -> dict[str, np.ndarray]:
    return {k: v[block] for k, v in batch.items()}


def _batched(
    rows: grain.IterDataset, local_batch: int, *, prefetch: int, block: slice | None = None
) -> CheckpointableDataset:
    ds = rows.batch(local_batch, drop_remainder=True)
    if block is not None:  # host_split="rows": this host's block of the global batch
        ds = ds.map(functools.partial(_take_rows, block=block))
    if prefetch > 0:  # overlaps packing with the train step (which releases the GIL)
        ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
    return CheckpointableDataset(ds)


def make_pretrain_dataset(
    corpus: str | corpus_lib.Corpus,
    tokenizer: str | Tokenizer,
    seq_len: int,
    batch_size: int,
    seed: int,
    split: str = "train",
    num_epochs: int | None = None,
    *,
    shuffle: bool = True,
    shuffle_window: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    prefetch: int = 2,
    read_threads: int = 2,
    host_split: str = "documents",
    replay: str | Sequence[Mapping[str, str]] = "",
    replay_fraction: float = 0.0,
) -> CheckpointableDataset:
    """Packed pretraining batches [batch_size // hosts, seq_len]; forever when num_epochs=None.
    `host_split`: how hosts divide the work (see the module doc).

    `replay`: SFT examples (a `sft.load_sft_examples` spec) mixed in as `replay_fraction` of the
    rows, packed as in SFT (loss on their responses), the rest the corpus's: continued
    pretraining that keeps what the model it starts from was trained to do. Rows interleave in
    proportion (grain's `IterDataset.mix`) before the window shuffle; the mixture runs as long as
    its shorter stream.

    Shuffling is two-level: documents are permuted afresh each epoch, then packed rows are
    shuffled within windows of `shuffle_window` rows (the rows of one long file are consecutive);
    by default about 4M tokens' worth, 16 to 1024 rows (1024 at T=256, 128 at T=32k).
    """
    tokenizer = load_tokenizer(tokenizer)
    shard_index, shard_count = shard_info(shard_index, shard_count)
    source_index, source_count, batched, block = _split_plan(
        host_split, shard_index, shard_count, batch_size
    )
    documents = corpus_lib.load_corpus(corpus).documents(split)
    rows = pack_documents(
        documents,
        tokenizer,
        seq_len,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=source_index,
        shard_count=source_count,
        read_threads=read_threads,
    )
    if not 0.0 <= replay_fraction < 1.0:
        raise ValueError(f"replay_fraction must be in [0, 1), got {replay_fraction}")
    if bool(replay) != (replay_fraction > 0):
        raise ValueError(
            f"replay={replay!r} with replay_fraction={replay_fraction}: give both or neither"
        )
    if replay:
        replayed = pack_sft_examples(
            sft_lib.load_sft_examples(replay, split),
            tokenizer,
            seq_len,
            seed=_sub_seed(seed, 3),
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard_index=source_index,
            shard_count=source_count,
            num_packing_bins=max(16, 2 * batched),
            read_threads=read_threads,
        )
        rows = grain.IterDataset.mix(
            {"corpus": rows, "replay": replayed},
            {"corpus": 1.0 - replay_fraction, "replay": replay_fraction},
        )
    if shuffle_window is None:
        shuffle_window = min(1024, max(16, (1 << 22) // seq_len))
    if shuffle and shuffle_window > 1:
        rows = grain.experimental.WindowShuffleIterDataset(
            rows, window_size=shuffle_window, seed=_sub_seed(seed, 2)
        )
    return _batched(rows, batched, prefetch=prefetch, block=block)


def make_sft_dataset(
    examples: str | Sequence[Mapping[str, str]],
    tokenizer: str | Tokenizer,
    seq_len: int,
    batch_size: int,
    seed: int,
    split: str = "train",
    num_epochs: int | None = None,
    *,
    shuffle: bool = True,
    num_packing_bins: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    prefetch: int = 2,
    host_split: str = "documents",
) -> CheckpointableDataset:
    """SFT batches (same keys as pretraining, loss on response tokens only); `host_split` as in
    `make_pretrain_dataset`.

    `examples`: a `sft.load_sft_examples` spec, e.g. "stdlib" (function-implementation tasks
    from the stdlib `split`), "functions" (oracle agent conversations, registered by
    c2.train.sft_sources) or a .jsonl of {"prompt", "response", "system"?} or {"messages"}; or a
    sequence of such dicts.
    """
    tokenizer = load_tokenizer(tokenizer)
    shard_index, shard_count = shard_info(shard_index, shard_count)
    source_index, source_count, batched, block = _split_plan(
        host_split, shard_index, shard_count, batch_size
    )
    rows = pack_sft_examples(
        sft_lib.load_sft_examples(examples, split),
        tokenizer,
        seq_len,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_index=source_index,
        shard_count=source_count,
        num_packing_bins=num_packing_bins or max(16, 2 * batched),
    )
    return _batched(rows, batched, prefetch=prefetch, block=block)


def _fixed_batches(
    rows: grain.IterDataset,
    *,
    seq_len: int,
    pad_id: int,
    batch_size: int,
    max_batches: int | None,
    shard_index: int,
    shard_count: int,
) -> list[dict[str, np.ndarray]]:
    """All rows (or the first max_batches * batch_size) as global batches, the last one padded
    with empty rows; this host's contiguous block of each global batch."""
    local = _local_batch_size(batch_size, shard_count)
    if max_batches is not None and max_batches <= 0:
        raise ValueError(f"max_batches must be positive or None, got {max_batches}")
    limit = None if max_batches is None else max_batches * batch_size
    all_rows = []
    for row in rows:
        all_rows.append(row)
        if limit is not None and len(all_rows) >= limit:
            break
    all_rows += [empty_row(seq_len, pad_id)] * (-len(all_rows) % batch_size)
    batches = []
    for start in range(0, len(all_rows), batch_size):
        mine = all_rows[start + shard_index * local : start + (shard_index + 1) * local]
        batches.append({k: np.stack([r[k] for r in mine]) for k in BATCH_KEYS})
    return batches


def make_eval_batches(
    corpus: str | corpus_lib.Corpus,
    tokenizer: str | Tokenizer,
    seq_len: int,
    batch_size: int,
    split: str = "heldout",
    max_batches: int | None = None,
    *,
    shard_index: int | None = None,
    shard_count: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """The held-out set as a fixed, ordered list of batches (identical on every call).

    Every document of the split in corpus order, packed without shuffling; the last batch is
    padded with empty rows (loss_mask 0), so summing loss and target_bytes over all batches covers
    the split exactly once. Every host packs the whole split and keeps its block of each global
    batch, so all hosts hold the same number of batches.
    """
    tokenizer = load_tokenizer(tokenizer)
    shard_index, shard_count = shard_info(shard_index, shard_count)
    documents = corpus_lib.load_corpus(corpus).documents(split)
    rows = pack_documents(documents, tokenizer, seq_len)
    return _fixed_batches(
        rows,
        seq_len=seq_len,
        pad_id=tokenizer.pad_id,
        batch_size=batch_size,
        max_batches=max_batches,
        shard_index=shard_index,
        shard_count=shard_count,
    )


def make_sft_eval_batches(
    examples: str | Sequence[Mapping[str, str]],
    tokenizer: str | Tokenizer,
    seq_len: int,
    batch_size: int,
    split: str = "heldout",
    max_batches: int | None = None,
    *,
    shard_index: int | None = None,
    shard_count: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """`make_eval_batches` for SFT examples (default: functions of the stdlib heldout split)."""
    tokenizer = load_tokenizer(tokenizer)
    shard_index, shard_count = shard_info(shard_index, shard_count)
    rows = pack_sft_examples(sft_lib.load_sft_examples(examples, split), tokenizer, seq_len)
    return _fixed_batches(
        rows,
        seq_len=seq_len,
        pad_id=tokenizer.pad_id,
        batch_size=batch_size,
        max_batches=max_batches,
        shard_index=shard_index,
        shard_count=shard_count,
    )
