"""Reading Hugging Face tensors by slice: safetensors files or in-memory arrays, block-FP8 aware.

A `Src` names one HF tensor and how a c2 array is cut from it (transposed [out, in] -> [in, out],
split heads, one expert of a fused tensor); `read_slice` returns only the requested c2 slice,
reading the smallest block of the HF tensor that covers it and dequantising block-FP8 weights
(`weight_scale_inv`, one float32 scale per 128x128 block) on the way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

# safetensors' numpy backend has no float8 dtypes: those tensors are memory-mapped directly.
_FP8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}

# Tensor sources ----------------------------------------------------------------------------------


class SafetensorsSource:
    """Named tensors of a checkpoint directory, read lazily by slice with `safetensors`."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {self.path}")
        self._stack = contextlib.ExitStack()
        self._file, self._handle, self._shape, self._dtype = {}, {}, {}, {}
        for fname in files:
            if not (self.path / fname).exists():
                raise FileNotFoundError(f"{index} names {fname}, which is not in {self.path}")
            h = self._stack.enter_context(safe_open(self.path / fname, framework="numpy"))
            for name in h.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                if name in self._file:
                    raise ValueError(f"tensor {name} is in both {self._file[name]} and {fname}")
                s = h.get_slice(name)
                self._file[name], self._handle[name] = fname, h
                self._shape[name], self._dtype[name] = tuple(s.get_shape()), s.get_dtype()
        self._headers: dict[str, tuple[int, dict]] = {}

    def names(self) -> set[str]:
        return set(self._file)

    def __contains__(self, name: str) -> bool:
        return name in self._file

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shape[name]

    def dtype(self, name: str) -> str:
        return _ST_DTYPES.get(self._dtype[name], self._dtype[name])

    def read(self, name: str, index: tuple) -> np.ndarray:
        if self._dtype[name] in _FP8:
            return self._read_raw(name, _FP8[self._dtype[name]])[index]
        return self._handle[name].get_slice(name)[index]

    def _read_raw(self, name: str, dtype) -> np.ndarray:
        """A memory map of one tensor: safetensors' numpy backend has no float8 dtypes."""
        fname = self._file[name]
        if fname not in self._headers:
            with open(self.path / fname, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                self._headers[fname] = (8 + n, json.loads(f.read(n)))
        base, header = self._headers[fname]
        begin, end = header[name]["data_offsets"]
        raw = np.memmap(self.path / fname, np.uint8, "r", offset=base + begin, shape=(end - begin,))
        return raw.view(dtype).reshape(self._shape[name])

    def close(self):
        self._stack.close()


class DictSource:
    """Named in-memory arrays (e.g. a torch state_dict converted with `.numpy()`)."""

    def __init__(self, tensors: Mapping[str, np.ndarray]):
        self._t = {k: np.asarray(v) for k, v in tensors.items()}

    def names(self) -> set[str]:
        return set(self._t)

    def __contains__(self, name: str) -> bool:
        return name in self._t

    def shape(self, name: str) -> tuple[int, ...]:
        return self._t[name].shape

    def dtype(self, name: str) -> str:
        return self._t[name].dtype.name

    def read(self, name: str, index: tuple) -> np.ndarray:
        return self._t[name][index]

    def close(self):
        pass


@dataclasses.dataclass(frozen=True)
class Src:
    """One HF tensor feeding one per-layer (per-expert) slice of a c2 leaf.

    `n_in` None: the c2 slice equals the HF tensor. Otherwise the HF matrix is [out, in] and the
    c2 slice is its transpose with `in` split into the first n_in c2 dims, `out` into the rest.
    `lead` picks an expert of a fused [E, rows, cols] tensor; `row0` offsets into its rows.
    """

    name: str
    n_in: int | None = 1
    lead: int | None = None
    row0: int = 0


def read_matrix(src, s: Src, rows: slice, cols: slice, block) -> np.ndarray:
    """HF matrix block [rows, cols] in float32, dequantising block-FP8 weights."""
    lead = () if s.lead is None else (s.lead,)
    r = slice(rows.start + s.row0, rows.stop + s.row0)
    w = src.read(s.name, (*lead, r, cols))
    scale_name = s.name + "_scale_inv"
    if block is None or scale_name not in src:
        return np.asarray(w, np.float32)
    b0, b1 = block
    sr = slice(r.start // b0, (r.stop - 1) // b0 + 1)
    sc = slice(cols.start // b1, (cols.stop - 1) // b1 + 1)
    scale = np.asarray(src.read(scale_name, (sr, sc)), np.float32)
    scale = np.repeat(np.repeat(scale, b0, 0), b1, 1)
    r_off, c_off = r.start - sr.start * b0, cols.start - sc.start * b1
    scale = scale[r_off : r_off + w.shape[0], c_off : c_off + w.shape[1]]
    return np.asarray(w, np.float32) * scale


def read_slice(src, s: Src, shape: tuple[int, ...], sl: tuple[slice, ...], block) -> np.ndarray:
    """The c2 per-tensor array of `shape`, restricted to contiguous slices `sl`."""
    if s.n_in is None:
        if len(shape) == 2:
            return read_matrix(src, s, sl[0], sl[1], block)
        return np.asarray(src.read(s.name, sl))
    n_in = s.n_in
    flat_in = np.arange(math.prod(shape[:n_in])).reshape(shape[:n_in])[sl[:n_in]]
    flat_out = np.arange(math.prod(shape[n_in:])).reshape(shape[n_in:])[sl[n_in:]]
    cols, rows = flat_in.ravel(), flat_out.ravel()
    c0, r0 = int(cols.min()), int(rows.min())
    m = read_matrix(src, s, slice(r0, int(rows.max()) + 1), slice(c0, int(cols.max()) + 1), block)
    return m[np.ix_(rows - r0, cols - c0)].T.reshape(*flat_in.shape, *flat_out.shape)
