import numpy as np
import pytest

from c2.data import tokenizer as tk

TEXT = 'def naïve(x):\n    return "café — 日本語 🐍" * x  # <|im_end|>\n'


def test_byte_tokenizer_layout(byte_tokenizer):
    tok = byte_tokenizer
    assert tok.vocab_size == 320 and tok.vocab_size % 64 == 0
    names = (tk.PAD, tk.BOS, tk.EOS, *tk.CHAT_SPECIALS)
    ids = [tok.specials[n] for n in names]
    assert ids == list(range(256, 256 + len(names)))
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
    assert isinstance(tok, tk.Tokenizer)


def test_byte_tokenizer_round_trip_and_bytes(byte_tokenizer):
    tok = byte_tokenizer
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))  # literal: "<|im_end|>" stays bytes
    np.testing.assert_array_equal(tok.encode_array(TEXT), np.asarray(ids, np.int32))
    assert tok.decode(ids) == TEXT
    np.testing.assert_array_equal(tok.token_bytes(ids), np.ones(len(ids), np.int32))
    specials = [tok.bos_id, tok.specials[tk.THINK], tok.eos_id, 300]
    np.testing.assert_array_equal(tok.token_bytes(specials), np.zeros(4, np.int32))
    assert tok.decode([tok.bos_id, *b"hi", tok.specials[tk.IM_END], 300]) == (
        "<|bos|>hi<|im_end|><|reserved_300|>"
    )


def test_byte_tokenizer_allow_specials(byte_tokenizer):
    tok = byte_tokenizer
    ids = tok.encode("a<|im_start|>b</think>", allow_specials=True)
    assert ids == [ord("a"), tok.specials[tk.IM_START], ord("b"), tok.specials[tk.THINK_END]]


def test_byte_tokenizer_rejects_out_of_range(byte_tokenizer):
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 320\)"):
        byte_tokenizer.decode([320])
    with pytest.raises(ValueError, match=r"\[0, 320\)"):
        byte_tokenizer.token_bytes([-1])


def test_hf_tokenizer_specials(bpe_tokenizer):
    tok = bpe_tokenizer
    assert tok.eos_id == tok.specials["<|endoftext|>"]  # found among the trained specials
    assert tok.vocab_size == 600 + 10  # bos, pad and the 8 chat specials were added
    chat_ids = [tok.specials[s] for s in tk.CHAT_SPECIALS]
    assert len(set(chat_ids + [tok.bos_id, tok.eos_id, tok.pad_id])) == 11
    for s in tk.CHAT_SPECIALS:
        assert tok.decode([tok.specials[s]]) == s
    assert isinstance(tok, tk.Tokenizer)


def test_hf_tokenizer_round_trip_literal_and_specials(bpe_tokenizer):
    tok = bpe_tokenizer
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.specials[tk.IM_END] not in ids  # literal by default
    ids_sp = tok.encode("x<|im_end|>", allow_specials=True)
    assert ids_sp[-1] == tok.specials[tk.IM_END]
    np.testing.assert_array_equal(tok.encode_array(TEXT), np.asarray(ids, np.int32))


def test_hf_token_bytes_sum_to_utf8_length(bpe_tokenizer):
    tok = bpe_tokenizer
    ids = tok.encode(TEXT)
    assert int(tok.token_bytes(ids).sum()) == len(TEXT.encode("utf-8"))
    ascii_ids = tok.encode("def shlex_split(s):\n    return s.split()\n")
    for i in ascii_ids:  # whole-character tokens: decode length is the byte count
        assert tok.token_bytes([i])[0] == len(tok.decode([i]).encode("utf-8"))
    assert tok.token_bytes([tok.bos_id, tok.eos_id, tok.specials[tk.THINK]]).tolist() == [0, 0, 0]


def test_hf_metaspace_token_bytes(tmp_path):
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    raw.decoder = decoders.Metaspace(prepend_scheme="never")
    corpus = ["def f(x):\n    return x + 1\n", "café 日本 for i in range(10): print(i)\n"] * 20
    raw.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    )
    tok = tk.HFTokenizer(raw)
    assert tok.eos_id == tok.specials["</s>"]
    text = "def f(i):\n    return café + 1\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert int(tok.token_bytes(ids).sum()) == len(text.encode("utf-8"))


def test_hf_missing_specials_errors(bpe_tokenizer_path):
    with pytest.raises(ValueError, match="no bos token found"):
        tk.HFTokenizer.from_file(bpe_tokenizer_path, add_missing_specials=False)
    with pytest.raises(ValueError, match=r"bos='<nope>' is not a token"):
        tk.HFTokenizer.from_file(bpe_tokenizer_path, bos="<nope>")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tk.HFTokenizer.from_file("/nonexistent/tokenizer.json")


def test_load_tokenizer(bpe_tokenizer_path, byte_tokenizer):
    assert isinstance(tk.load_tokenizer("byte"), tk.ByteTokenizer)
    hf = tk.load_tokenizer(bpe_tokenizer_path)
    assert isinstance(hf, tk.HFTokenizer) and hf.vocab_size == 610
    assert tk.load_tokenizer(byte_tokenizer) is byte_tokenizer
    with pytest.raises(ValueError, match="'gpt9' is neither 'byte' nor"):
        tk.load_tokenizer("gpt9")
