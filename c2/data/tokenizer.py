"""Tokenisers: a byte-level one for the tiny runs and Hugging Face `tokenizers` files for real ones.

Both follow one small protocol (`Tokenizer`). `encode` treats its text literally: a special token's
string inside the text (say "<|im_end|>" in a source file) is encoded as ordinary text unless
`allow_specials=True`; chat formatting inserts special ids itself. `token_bytes` gives the UTF-8
byte length each id stands for (0 for specials), the denominator of bits per byte.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
THINK, THINK_END = "<think>", "</think>"
CHAT_SPECIALS = (
    IM_START,
    IM_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    THINK,
    THINK_END,
)


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline, SFT formatting and bits-per-byte need from a tokenizer."""

    vocab_size: int  # number of ids the model's embedding must hold (max id + 1, or padded)
    bos_id: int
    eos_id: int
    pad_id: int
    # Every special token string -> id; the role names PAD/BOS/EOS are always keys, even where
    # the vocabulary spells them differently ("<s>", "<|endoftext|>").
    specials: Mapping[str, int]

    def encode(self, text: str, *, allow_specials: bool = False) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...  # int32 [L], literal text

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def token_bytes(self, ids: Sequence[int] | np.ndarray) -> np.ndarray: ...  # int32, ids' shape


def _lookup_bytes(table_V: np.ndarray, ids, vocab_size: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}); got min {ids.min()} max {ids.max()}"
        )
    return table_V[ids.astype(np.int64)].astype(np.int32)


def _split_on_specials(text: str, specials: Mapping[str, int]) -> list[str]:
    """Splits text into pieces, each either a special token's string or plain text."""
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    return [piece for piece in re.split(pattern, text) if piece]


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; specials follow; the vocab is padded to a multiple of 64.

    Layout: 256 pad, 257 bos, 258 eos, 259..266 the chat specials (`CHAT_SPECIALS` order),
    267..319 reserved (decoded as "<|reserved_N|>"). vocab_size = 320.
    """

    NUM_BYTES = 256
    VOCAB_MULTIPLE = 64

    def __init__(self):
        names = (PAD, BOS, EOS, *CHAT_SPECIALS)
        self.specials: dict[str, int] = {s: self.NUM_BYTES + i for i, s in enumerate(names)}
        used = self.NUM_BYTES + len(names)
        self.vocab_size = -(-used // self.VOCAB_MULTIPLE) * self.VOCAB_MULTIPLE
        self._id_to_special = {i: s for s, i in self.specials.items()}
        for i in range(used, self.vocab_size):
            self._id_to_special[i] = f"<|reserved_{i}|>"
        self.pad_id, self.bos_id, self.eos_id = (self.specials[s] for s in (PAD, BOS, EOS))
        self._bytes_V = np.zeros(self.vocab_size, np.int32)
        self._bytes_V[: self.NUM_BYTES] = 1

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def encode(self, text: str, *, allow_specials: bool = False) -> list[int]:
        if not allow_specials:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        for piece in _split_on_specials(text, self.specials):
            ids.extend([self.specials[piece]] if piece in self.specials else piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Bytes decode as UTF-8 (invalid sequences become U+FFFD); specials as their strings."""
        out: list[str] = []
        run = bytearray()
        for i in np.asarray(ids, np.int64).reshape(-1).tolist():
            if 0 <= i < self.NUM_BYTES:
                run.append(i)
                continue
            if i not in self._id_to_special:
                raise ValueError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
            out.append(run.decode("utf-8", errors="replace"))
            run.clear()
            out.append(self._id_to_special[i])
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_bytes(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return _lookup_bytes(self._bytes_V, ids, self.vocab_size)


@functools.cache
def _byte_level_decoder_map() -> dict[str, int]:
    """Inverse of GPT-2's bytes->printable-unicode table used by ByteLevel BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    byte_to_char = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in byte_to_char.items()}


def _decoder_types(tokenizer_json: dict) -> set[str]:
    decoder = tokenizer_json.get("decoder") or {}
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    return {p.get("type") for p in parts if p}


_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")

# Names tried, in order, when a tokenizer.json does not say which of its tokens are bos/eos/pad.
_BOS_CANDIDATES = ("<|begin_of_text|>", "<|bos|>", "<s>", "[BOS]", "<|startoftext|>", "<bos>")
_EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "<|eos|>", "</s>", "[EOS]", "<eos>")
_PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]", "<|padding|>")


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` behind the `Tokenizer` protocol.

    Missing bos/eos/pad and chat specials are added as new special tokens (so vocab_size grows);
    pass `add_missing_specials=False` to require them to exist instead.
    """

    def __init__(
        self,
        tokenizer,
        *,
        bos: str | None = None,
        eos: str | None = None,
        pad: str | None = None,
        add_missing_specials: bool = True,
    ):
        self._tok = tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)

        def resolve(role: str, given: str | None, candidates: tuple[str, ...], default: str):
            if given is not None:
                if given not in vocab:
                    raise ValueError(f"{role}={given!r} is not a token of this tokenizer")
                return given
            found = next((c for c in candidates if c in vocab), None)
            if found is not None:
                return found
            if not add_missing_specials:
                raise ValueError(
                    f"no {role} token found (tried {candidates}); pass {role}=<token string>"
                )
            return default

        names = {
            BOS: resolve("bos", bos, _BOS_CANDIDATES, BOS),
            EOS: resolve("eos", eos, _EOS_CANDIDATES, EOS),
            PAD: resolve("pad", pad, _PAD_CANDIDATES, PAD),
        }
        wanted = [*dict.fromkeys([*names.values(), *CHAT_SPECIALS])]
        missing = [s for s in wanted if s not in vocab]
        if missing and not add_missing_specials:
            raise ValueError(f"tokenizer lacks special tokens {missing}")
        if missing:
            tokenizer.add_special_tokens(missing)
        self.specials: dict[str, int] = {s: tokenizer.token_to_id(s) for s in wanted}
        for role, s in names.items():
            self.specials[role] = tokenizer.token_to_id(s)
        for added in tokenizer.get_added_tokens_decoder().values():
            if added.special:
                self.specials.setdefault(added.content, tokenizer.token_to_id(added.content))
        self.bos_id, self.eos_id, self.pad_id = (self.specials[s] for s in (BOS, EOS, PAD))
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._bytes_V = self._byte_lengths()
        # A second copy encodes special strings literally; a flag flipped per call would race
        # between the pipeline's reader threads.
        self._tok_literal = type(tokenizer).from_str(tokenizer.to_str())
        self._tok_literal.encode_special_tokens = True

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> HFTokenizer:
        """Loads a tokenizer.json (or a directory holding one)."""
        import tokenizers

        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file {path!r} does not exist")
        return cls(tokenizers.Tokenizer.from_file(path), **kwargs)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"

    def _byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes per id, read from the vocabulary strings (0 for special tokens)."""
        tokenizer_json = json.loads(self._tok.to_str())
        decoders = _decoder_types(tokenizer_json)
        special_ids = {
            i for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        } | set(self.specials.values())
        byte_level = _byte_level_decoder_map() if "ByteLevel" in decoders else None
        table = np.zeros(self.vocab_size, np.int32)
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            if i in special_ids:
                continue
            if byte_level is not None and all(c in byte_level for c in token):
                table[i] = len(token)  # one printable char per byte
            elif _BYTE_FALLBACK.match(token):
                table[i] = 1
            else:
                if "WordPiece" in decoders and token.startswith("##"):
                    token = token[2:]
                table[i] = len(token.replace("\u2581", " ").encode("utf-8"))
        return table

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), np.int32)

    def encode(self, text: str, *, allow_specials: bool = False) -> list[int]:
        tok = self._tok if allow_specials else self._tok_literal
        return tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got {ids.tolist()}")
        return self._tok.decode(ids.tolist(), skip_special_tokens=False)

    def token_bytes(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return _lookup_bytes(self._bytes_V, ids, self.vocab_size)


def load_tokenizer(spec: str | Tokenizer) -> Tokenizer:
    """ "byte" -> ByteTokenizer; a path to tokenizer.json (or its directory) -> HFTokenizer."""
    if not isinstance(spec, str):
        if not isinstance(spec, Tokenizer):
            raise TypeError(f"tokenizer must be a spec string or a Tokenizer, got {type(spec)}")
        return spec
    if spec == "byte":
        return ByteTokenizer()
    if os.path.exists(spec):
        return HFTokenizer.from_file(spec)
    raise ValueError(
        f"tokenizer spec {spec!r} is neither 'byte' nor an existing tokenizer.json path"
    )
