"""Metrics: one JSON object per logged step in DIR/metrics.jsonl, TensorBoard events, PNG plots."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

METRICS_FILE = "metrics.jsonl"

# JAX's events for the three stages of making a program: tracing, lowering to MLIR, and XLA's
# compile (or a load from the persistent compilation cache).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # fun_name= the program
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    BACKEND_COMPILE_EVENT,
)
_compile = {"seconds": 0.0, "listening": False}
_compile_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **_) -> None:
    if event in COMPILE_EVENTS:
        with _compile_lock:
            _compile["seconds"] += duration_secs


def compile_seconds() -> float:
    """Seconds this process has spent making JAX programs (tracing, lowering, compiling) since
    the first call, on any thread: the difference across a training step is the part of it that
    went to compiling, e.g. for a batch shape seen for the first time."""
    with _compile_lock:
        if not _compile["listening"]:
            import jax

            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _compile["listening"] = True
        return _compile["seconds"]


def _plain(value):
    """A JSON-able Python scalar from a numpy/jax scalar (non-finite floats kept as NaN/inf)."""
    if isinstance(value, str | bool | int) or value is None:
        return value
    arr = np.asarray(value)
    if arr.ndim:
        return [_plain(v) for v in arr.tolist()]
    return arr.item()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl file, in file order (a torn last line is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill: everything after it is unreliable
    return records


class MetricsWriter:
    """Appends step records to metrics.jsonl (flushed per record) and to TensorBoard.

    `enabled=False` (every host but the first in a multi-host run) writes nothing.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        resume_step: int = 0,
        tensorboard: bool = True,
        enabled: bool = True,
    ):
        self.workdir = Path(workdir)
        self.path = self.workdir / METRICS_FILE
        self._file = self._tb = None
        if not enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._truncate(resume_step)
        self._file = self.path.open("a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=resume_step + 1)

    def _truncate(self, resume_step: int) -> None:
        """A resumed run rewrites the file so each step after the checkpoint appears once."""
        if not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: Mapping[str, object]) -> dict:
        record = {"step": int(step)} | {k: _plain(v) for k, v in metrics.items()}
        if self._file is None:
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key == "step" or not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if math.isfinite(value):  # the JSONL keeps inf / nan; TensorBoard cannot plot them
                    self._tb.add_scalar(key, value, int(step))
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def plot_curves(
    records: Sequence[Mapping],
    keys: Iterable[str],
    out_png: str | os.PathLike,
    *,
    title: str = "",
    log_y: bool = False,
    x_key: str = "step",
) -> Path | None:
    """One PNG with a subplot per metric key present in `records`; None if no key is present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(_finite(r.get(k)) for r in records)]
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pts = [(r[x_key], r[key]) for r in records if _finite(r.get(key)) and x_key in r]
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None)
        ax.set_title(key)
        ax.set_xlabel(x_key)
        if log_y and min(ys) > 0:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
