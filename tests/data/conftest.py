"""Small corpora and tokenizers shared by the data tests (all built in a temp directory)."""

import os
import shutil

import numpy as np
import pytest

from c2.data import corpus as corpus_lib
from c2.data import tokenizer as tokenizer_lib

STDLIB_FILES = ("keyword.py", "colorsys.py", "bisect.py", "this.py", "fnmatch.py", "glob.py")
EXTRA_FILES = {
    "pkg/unicode_names.py": (
        'GREETING = "naïve café — 日本語 🐍"\n\ndef hello():\n    return GREETING\n'
    ),
    "pkg/empty.py": "",
    "pkg/sub/specials.py": 'MARK = "<|im_end|><|eos|>"  # special strings stay plain text\n',
    "__pycache__/skipped.py": "this must not be read\n",
    "notes.txt": "not a python file\n",
}


@pytest.fixture(scope="session")
def source_dir(tmp_path_factory) -> str:
    """A directory corpus: a few stdlib modules (several rows each at T=64) plus edge cases."""
    root = tmp_path_factory.mktemp("corpus")
    for name in STDLIB_FILES:
        shutil.copy(os.path.join(corpus_lib.stdlib_root(), name), root / name)
    for rel, text in EXTRA_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return str(root)


@pytest.fixture(scope="session")
def all_docs_corpus(source_dir) -> corpus_lib.DirectoryCorpus:
    """Everything in "train" (heldout_fraction=0) so a test sees every file."""
    return corpus_lib.DirectoryCorpus(source_dir, heldout_fraction=0.0)


@pytest.fixture(scope="session")
def bpe_tokenizer_path(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer.json trained on three stdlib files."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = [os.path.join(corpus_lib.stdlib_root(), f) for f in ("textwrap.py", "shlex.py")]
    tok.train(files, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="session")
def byte_tokenizer() -> tokenizer_lib.ByteTokenizer:
    return tokenizer_lib.ByteTokenizer()


@pytest.fixture(scope="session")
def bpe_tokenizer(bpe_tokenizer_path) -> tokenizer_lib.HFTokenizer:
    return tokenizer_lib.HFTokenizer.from_file(bpe_tokenizer_path)


def check_row_structure(batch: dict[str, np.ndarray], pad_id: int) -> None:
    """Per row: segments 1, 2, ... contiguous, padding (0) only at the end, positions 0, 1, ...
    restarting per segment, targets[t] == inputs[t + 1] inside a segment, pad_id and zero masks
    on padding."""
    for b in range(batch["inputs"].shape[0]):
        seg = batch["segment_ids"][b]
        pos = batch["positions"][b]
        real = seg > 0
        n_real = int(real.sum())
        assert real[:n_real].all() and not real[n_real:].any(), f"padding not at the end: {seg}"
        if n_real:
            assert seg[0] == 1
            steps = np.diff(seg[:n_real])
            assert set(np.unique(steps)) <= {0, 1}, f"segment ids skip: {seg}"
        starts = np.flatnonzero(np.diff(seg, prepend=-1) != 0)
        for s, e in zip(starts, [*starts[1:], len(seg)]):
            if seg[s] == 0:
                continue
            np.testing.assert_array_equal(pos[s:e], np.arange(e - s))
            np.testing.assert_array_equal(
                batch["targets"][b, s : e - 1], batch["inputs"][b, s + 1 : e]
            )
        assert (batch["inputs"][b][~real] == pad_id).all()
        assert (batch["targets"][b][~real] == pad_id).all()
        assert (batch["positions"][b][~real] == 0).all()
        assert (batch["loss_mask"][b][~real] == 0).all()
        assert (batch["target_bytes"][b][batch["loss_mask"][b] == 0] == 0).all()


@pytest.fixture(scope="session")
def check_rows():
    """`check_row_structure`, as a fixture (conftest modules are not importable by name)."""
    return check_row_structure


@pytest.fixture(scope="session")
def source_files() -> list[str]:
    """The files `source_dir` holds that a default DirectoryCorpus must list."""
    extra = [p for p in EXTRA_FILES if p.endswith(".py") and not p.startswith("__pycache__/")]
    return sorted([*STDLIB_FILES, *extra])
