"""Load a model to evaluate: a c2 workdir's newest checkpoint, or a Hugging Face directory.

    load_model("runs/main/rl")        a stage workdir (config.json + checkpoints/)
    load_model("runs/main")           a pipeline workdir: its last stage
    load_model("hf:DIR")              a transformers safetensors directory (tokenizer.json in it,
                                      or config.json's "c2_tokenizer": "byte")

Returns a `LoadedModel` whose params sit on one device (the generation engine and the
evaluations here run unsharded). `export_stage(workdir, DIR)` writes a workdir's newest weights
(or a chosen step's) as such a directory (`python -m c2.eval.models export WORKDIR DIR
[--step N]`): a stage's policy to share, evaluate or start a later stage from
(`--config.init_from=hf:DIR`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections

from c2 import model as model_lib
from c2.data.tokenizer import Tokenizer, load_tokenizer
from c2.rl.saved_config import stage_config  # noqa: F401 - this module's API too


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


def load_model(spec: str, step: int | None = None) -> LoadedModel:
    """See the module doc; `step` picks a workdir's checkpoint (default: the newest)."""
    device = jax.devices()[0]
    if spec.startswith("hf:"):
        if step is not None:
            raise ValueError(f"{spec}: an HF directory has no checkpoint steps (step={step})")
        path = Path(spec[3:])
        cfg, params = model_lib.load_hf_checkpoint(path)
        tokenizer = load_tokenizer(_hf_tokenizer_spec(path))
        params = jax.device_put(params, device)
        return LoadedModel(spec, cfg, params, tokenizer, None)
    from c2.train import lm
    from c2.train.loop import load_init_params

    stage_dir, config = stage_config(spec)
    task = lm.build_task(config)
    params = load_init_params(str(stage_dir), task, step)
    # The engine's own single-device copy (as the RL trainer hands it one).
    params = jax.tree.map(jnp.copy, jax.device_put(params, device))
    return LoadedModel(
        spec, lm.model_config(config), params, load_tokenizer(config.data.tokenizer), config
    )


# config.json's key naming a tokenizer that has no tokenizer.json (c2's byte tokenizer).
C2_TOKENIZER_KEY = "c2_tokenizer"


def _hf_tokenizer_spec(path: Path) -> str:
    if (path / "tokenizer.json").is_file():
        return str(path / "tokenizer.json")
    named = json.loads((path / "config.json").read_text()).get(C2_TOKENIZER_KEY)
    if named == "byte":
        return named
    raise FileNotFoundError(
        f"hf:{path}: no tokenizer.json in it, and its config.json names no c2 tokenizer "
        f"({C2_TOKENIZER_KEY!r}: 'byte')"
    )


def export_stage(workdir: str | Path, dst: str | Path, step: int | None = None) -> LoadedModel:
    """A stage (or pipeline) workdir's newest weights (or those after `step` steps) as a Hugging
    Face directory that `load_model("hf:DST")` and `config.init_from="hf:DST"` read: config.json
    + safetensors (exact, in the parameters' dtype), and the stage's tokenizer (its
    tokenizer.json, or `"c2_tokenizer": "byte"` in config.json for the byte tokenizer). Returns
    what it exported."""
    from c2.model.hf import export_hf_checkpoint

    model = load_model(str(workdir), step)
    dst = Path(dst)
    export_hf_checkpoint(model.params, model.cfg, dst)
    spec = model.config.data.tokenizer
    if spec == "byte":
        cfg_file = dst / "config.json"
        hf_cfg = json.loads(cfg_file.read_text()) | {C2_TOKENIZER_KEY: "byte"}
        cfg_file.write_text(json.dumps(hf_cfg, indent=2, sort_keys=True))
    else:
        src = Path(spec)
        shutil.copyfile(src / "tokenizer.json" if src.is_dir() else src, dst / "tokenizer.json")
    return model


def main(argv: list[str] | None = None) -> None:
    import argparse
    import logging

    ap = argparse.ArgumentParser(
        prog="python -m c2.eval.models", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    exp = sub.add_parser("export", help="a c2 stage or pipeline workdir -> a Hugging Face dir")
    exp.add_argument("workdir")
    exp.add_argument("dst")
    exp.add_argument("--step", type=int, default=None, help="the checkpoint (default: newest)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    model = export_stage(args.workdir, args.dst, args.step)
    logging.info("exported %s (%s) -> %s", args.workdir, model.cfg.family, args.dst)


if __name__ == "__main__":
    main()
