"""Data pipeline speed on this machine: `python -m c2.bench.data_pipeline [--batches N]`.

Measures, in one run: listing and splitting the stdlib corpus; tokenising its whole train split
with the byte tokenizer and with a BPE tokenizer trained here (side by side); pretraining batches
per second at the tiny and a longer length; SFT extraction and batches; iterator restore time.
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import tempfile
import time

import numpy as np

from c2.data import corpus as corpus_lib
from c2.data import pipeline, sft
from c2.data import tokenizer as tokenizer_lib


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _train_bpe(vocab_size: int, out_dir: str) -> tokenizer_lib.HFTokenizer:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    files = [os.path.join(corpus_lib.stdlib_root(), f) for f in ("typing.py", "argparse.py")]
    tok.train(
        files,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return tokenizer_lib.HFTokenizer.from_file(path)


def _tokenise_all(docs, tok) -> tuple[int, int]:
    n_tokens = n_bytes = 0
    for i in range(len(docs)):
        feats = pipeline.document_features(docs[i], tok)
        n_tokens += len(feats["targets"])
        n_bytes += int(feats["target_bytes"].sum())
    return n_tokens, n_bytes


def _batches_per_s(make, n: int) -> tuple[float, list[dict]]:
    it = iter(make())
    next(it)  # start-up (thread pools, first window) is reported separately
    batches, seconds = _timed(lambda: list(itertools.islice(it, n)))
    return n / seconds, batches


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args(argv)
    rows: list[tuple[str, str]] = []

    corpus = corpus_lib.stdlib_corpus()
    (train, heldout), s = _timed(lambda: (corpus.documents("train"), corpus.documents("heldout")))
    rows.append(("stdlib list + split", f"{s:.3f} s: {len(train)} train / {len(heldout)} heldout"))

    byte = tokenizer_lib.ByteTokenizer()
    (n_tok, n_bytes), s_byte = _timed(lambda: _tokenise_all(train, byte))
    rows.append(
        (
            "tokenise stdlib train, byte",
            f"{s_byte:.2f} s, {n_bytes / s_byte / 1e6:.1f} MB/s, {n_tok} tokens",
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        bpe, s_train = _timed(lambda: _train_bpe(4096, tmp))
    (n_tok_bpe, _), s_bpe = _timed(lambda: _tokenise_all(train, bpe))
    rows.append(
        (
            "tokenise stdlib train, BPE 4096 (trained here)",
            f"{s_bpe:.2f} s ({s_bpe / s_byte:.1f}x byte), {n_bytes / s_bpe / 1e6:.1f} MB/s, "
            f"{n_tok_bpe} tokens ({n_bytes / n_tok_bpe:.2f} bytes/token; "
            f"training it took {s_train:.1f} s)",
        )
    )

    for seq_len, batch in ((256, 8), (2048, 8)):
        rate, _ = _batches_per_s(
            lambda seq_len=seq_len, batch=batch: pipeline.make_pretrain_dataset(
                "stdlib", byte, seq_len, batch, seed=0, shard_index=0, shard_count=1
            ),
            args.batches,
        )
        rows.append(
            (
                f"pretrain batches, byte, T={seq_len} B={batch}",
                f"{rate:.0f} batches/s = {rate * seq_len * batch / 1e6:.2f} M tokens/s",
            )
        )
    rate_bpe, _ = _batches_per_s(
        lambda: pipeline.make_pretrain_dataset(
            "stdlib", bpe, 256, 8, seed=0, shard_index=0, shard_count=1
        ),
        args.batches,
    )
    rows.append(
        (
            "pretrain batches, BPE 4096, T=256 B=8",
            f"{rate_bpe:.0f} batches/s = {rate_bpe * 256 * 8 / 1e6:.2f} M tokens/s",
        )
    )

    ds = pipeline.make_pretrain_dataset(
        "stdlib", byte, 256, 8, seed=0, shard_index=0, shard_count=1
    )
    it = iter(ds)
    for _ in range(200):
        next(it)
    state = it.get_state()
    fresh = iter(ds)
    _, s = _timed(lambda: (fresh.set_state(state), next(fresh)))
    rows.append(("restore iterator after 200 batches (set_state + first batch)", f"{s:.3f} s"))

    examples, s = _timed(lambda: sft.function_examples("stdlib", "train"))
    rows.append(("SFT: extract stdlib train functions", f"{s:.2f} s, {len(examples)} examples"))
    rate, batches = _batches_per_s(
        lambda: pipeline.make_sft_dataset(
            examples, byte, 512, 8, seed=0, shard_index=0, shard_count=1
        ),
        min(args.batches, 100),
    )
    real = np.mean([(b["segment_ids"] > 0).mean() for b in batches])
    trained = np.mean([b["loss_mask"].mean() for b in batches])
    rows.append(
        (
            "SFT batches, byte, T=512 B=8 (first-fit)",
            f"{rate:.0f} batches/s; {real:.0%} of positions real, {trained:.0%} trained",
        )
    )

    print(
        f"c2.data benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}"
    )
    print("| measure | result |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
