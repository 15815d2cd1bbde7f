"""A c2 workdir's saved stage config, as code of today reads it: `stage_config(workdir)` gives a
stage's (or a pipeline's last stage's) LM-stage config with the fields added to c2 since it was
written at their defaults. Here, below c2/eval, because the RL stage reads its start policy's
config with it too (`init_from`); c2.eval.models re-exports it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import ml_collections


def stage_config(workdir: str | Path) -> tuple[Path, ml_collections.ConfigDict]:
    """(stage dir, its LM-stage config) for a stage or pipeline workdir."""
    workdir = Path(workdir)
    saved = workdir / "config.json"
    if not saved.is_file():
        raise FileNotFoundError(
            f"{str(workdir)!r}: no config.json; expected a c2 workdir (python -m c2.main "
            "--workdir=DIR), 'hf:DIR', or a scripted policy"
        )
    config = ml_collections.ConfigDict(json.loads(saved.read_text()))
    if "stages" in config:  # a pipeline: its last stage's weights
        last = list(config.stages.keys())[-1]
        return stage_config(workdir / last)
    config = _with_defaults(config)
    if "rl" in config:  # an RL stage: the training-stage part (what c2.train.lm reads)
        base = copy.deepcopy(config)
        with base.unlocked():
            del base["rl"]
        base.data.seq_len = max(config.rl.seq_buckets)
        base.data.batch_size = config.rl.prompts_per_step * config.rl.group_size
        config = base
    return workdir, config


def _with_defaults(saved: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A saved stage config with the fields added to c2 since it was written, at their defaults
    (which keep the old behaviour), so a run directory stays loadable as the config grows."""
    if "rl" in saved:
        from c2.rl.config import rl_stage_defaults as defaults
    else:
        from c2.train.config import stage_defaults as defaults

    def fill(got: dict, want: dict) -> dict:
        out = dict(got)
        for key, value in want.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, dict) and isinstance(out[key], dict):
                out[key] = fill(out[key], value)
        return out

    return ml_collections.ConfigDict(fill(saved.to_dict(), defaults().to_dict()))
