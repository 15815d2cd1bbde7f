"""Load a model to evaluate: a c2 workdir's newest checkpoint, or a Hugging Face directory.

    load_model("runs/main/rl")        a stage workdir (config.json + checkpoints/)
    load_model("runs/main")           a pipeline workdir: its last stage
    load_model("hf:DIR")              a transformers safetensors directory (tokenizer.json in it)

Returns a `LoadedModel` whose params sit on one device (the generation engine and the
evaluations here run unsharded).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections

from c2 import model as model_lib
from c2.data.tokenizer import Tokenizer, load_tokenizer


@dataclasses.dataclass
class LoadedModel:
    name: str  # the spec it was loaded from
    cfg: model_lib.ModelConfig
    params: dict
    tokenizer: Tokenizer
    config: ml_collections.ConfigDict | None  # the stage config (None for hf:)

    @property
    def forward_flops_per_token(self) -> float:
        """Forward FLOPs per token at a 512-token context (training FLOPs / 3)."""
        return model_lib.flops_per_token(self.cfg, 512, include_mtp=False) / 3.0


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


def load_model(spec: str) -> LoadedModel:
    """See the module doc."""
    device = jax.devices()[0]
    if spec.startswith("hf:"):
        path = Path(spec[3:])
        cfg, params = model_lib.load_hf_checkpoint(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{spec}: no tokenizer.json in {path}")
        tokenizer = load_tokenizer(str(tok_file))
        params = jax.device_put(params, device)
        return LoadedModel(spec, cfg, params, tokenizer, None)
    from c2.train import lm
    from c2.train.loop import load_init_params

    stage_dir, config = stage_config(spec)
    task = lm.build_task(config)
    params = load_init_params(str(stage_dir), task)
    # The engine's own single-device copy (as the RL trainer hands it one).
    params = jax.tree.map(jnp.copy, jax.device_put(params, device))
    return LoadedModel(
        spec, lm.model_config(config), params, load_tokenizer(config.data.tokenizer), config
    )
