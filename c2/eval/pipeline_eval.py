"""The main job's evaluation: held-out bits per byte of every stage's weights at the short and
the extended length, MTP acceptance, and SFT response bits per byte; then the report.

Rows, in order: the starting weights (untrained, or the base model); each stage's final weights
under that stage's model config; and, for the first stage that adds YaRN, the previous stage's
weights with YaRN switched on but no training (separates what the rescaling does from what the
extension training does).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import ml_collections

from c2 import model as model_lib
from c2.data import pipeline as data_pipeline
from c2.data.tokenizer import load_tokenizer
from c2.train import lm
from c2.train.bpb import heldout_bpb
from c2.train.checkpoint import Checkpointer
from c2.train.loop import init_key

log = logging.getLogger(__name__)

EVAL_FILE = "eval.json"


def eval_defaults() -> ml_collections.ConfigDict:
    """The `config.eval` section of a pipeline config."""
    e = ml_collections.ConfigDict()
    e.corpus = "stdlib"
    e.short_seq_len = 128
    e.long_seq_len = 1024
    # Batches are sized so both lengths read the same number of held-out tokens.
    e.short_batch_size = 16
    e.short_batches = 8
    e.long_batch_size = 4
    e.long_batches = 4
    e.sft_batches = 4
    # What the agent policy reads from a function task's instruction (c2.eval.copying), on this
    # many held-out wide-level conversations per row (0: off): the reading probes the base model
    # is kept for through continued pretraining, the extension and SFT.
    e.reading_prompts = 40
    return e


def reading_probe(params, cfg: model_lib.ModelConfig, tokenizer, prompts: int) -> dict:
    """{"reads_operation", "reads_constant", "call_head_nats"}: teacher-forced on `prompts`
    held-out wide-level function tasks, the share of operations and constant digits the first
    tool call gets right (chance 1/3 and ~1/10) and the call's fixed head's mean log-probability
    per token (near 0: the tool-call format holds), averaged over the held-out templates."""
    import numpy as np

    from c2.eval import copying

    logits = copying.forward_logits_fn(params, cfg)
    reads = copying.task_reading_accuracy(logits, tokenizer, "wide", prompts)
    head = copying.task_format_logprob(logits, tokenizer, "wide", prompts)
    return {
        "reads_operation": reads["operation"],
        "reads_constant": reads["constant"],
        "call_head_nats": float(np.mean(list(head.values()))),
    }


def _latest_params(stage: ml_collections.ConfigDict, stage_dir: Path, mesh_sizes: dict):
    """(step, params) of the newest readable checkpoint in stage_dir, laid out by the stage's
    layout on a mesh of `mesh_sizes`."""
    cfg = lm.model_config(stage)
    shardings = model_lib.param_shardings(cfg, lm.make_layout(stage, mesh_sizes))
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model_lib.abstract_params(cfg),
        shardings,
    )
    ckpt = Checkpointer(stage_dir / "checkpoints")
    found = ckpt.restore_latest(abstract, None, set_aside=False)
    ckpt.close()
    if found is None:
        raise FileNotFoundError(f"no readable checkpoint in {stage_dir / 'checkpoints'}")
    return found[0], found[1]


def stage_params(stage: ml_collections.ConfigDict, stage_dir: Path, mesh_sizes: dict):
    """The final parameters of a finished stage, laid out by its layout (mesh of `mesh_sizes`,
    the stage's `config.mesh.rules`)."""
    step, params = _latest_params(stage, stage_dir, mesh_sizes)
    if step != stage.train.steps:
        raise RuntimeError(f"{stage_dir}: latest checkpoint is step {step}, not the final one")
    return params


def _start_row(first: ml_collections.ConfigDict, mesh_sizes: dict):
    """The parameters stage 1 started from: its fresh init, an HF import or a workdir."""
    cfg, layout = lm.model_config(first), lm.make_layout(first, mesh_sizes)
    if not first.init_from:
        params = model_lib.init_params(cfg, init_key(first.train.seed), layout)
        return "untrained", cfg, params, layout
    if first.init_from.startswith("hf:"):
        base = lm.import_hf_params(first.init_from[3:], cfg, layout, seed=first.train.seed)
        return "base (HF import)", cfg, base, layout
    params = _latest_params(first, Path(first.init_from), mesh_sizes)[1]
    return "base (init_from)", cfg, params, layout


def _models(stages: dict, workdir: Path, mesh_sizes: dict):
    """(label, ModelConfig, params, the layout they are laid out by) for every row of the
    evaluation: each stage's own rules on one mesh of `mesh_sizes`."""
    rows = [_start_row(next(iter(stages.values())), mesh_sizes)]
    prev_cfg = prev_params = prev_name = prev_layout = None
    yarn_shown = False
    for name, stage in stages.items():
        cfg, layout = lm.model_config(stage), lm.make_layout(stage, mesh_sizes)
        params = stage_params(stage, workdir / name, mesh_sizes)
        if cfg.rope_scaling is not None and prev_cfg is not None and not yarn_shown:
            if prev_cfg.rope_scaling is None:
                rows.append((f"{prev_name} + YaRN, no training", cfg, prev_params, prev_layout))
            yarn_shown = True
        rows.append((f"after {name}", cfg, params, layout))
        prev_cfg, prev_params, prev_name, prev_layout = cfg, params, name, layout
    return rows


def evaluate(config: ml_collections.ConfigDict, stages: dict, workdir: str | Path) -> dict:
    """Runs every measurement and writes DIR/eval.json; returns {"rows": [...], ...}."""
    workdir = Path(workdir)
    ec = config.eval
    first = next(iter(stages.values()))
    mesh_sizes, _ = lm.validate(first, jax.device_count())
    tok = first.data.tokenizer
    short = data_pipeline.make_eval_batches(
        ec.corpus, tok, ec.short_seq_len, ec.short_batch_size, max_batches=ec.short_batches
    )
    long = data_pipeline.make_eval_batches(
        ec.corpus, tok, ec.long_seq_len, ec.long_batch_size, max_batches=ec.long_batches
    )
    sft_stage = next((s for s in stages.values() if s.data.kind == "sft"), None)
    sft = None
    if sft_stage is not None:
        sft = data_pipeline.make_sft_eval_batches(
            sft_stage.data.corpus,
            tok,
            sft_stage.data.seq_len,
            sft_stage.data.batch_size,
            max_batches=ec.sft_batches,
        )
    rows = []
    for label, cfg, params, layout in _models(stages, workdir, mesh_sizes):
        s = heldout_bpb(params, cfg, short, layout)
        lg = heldout_bpb(params, cfg, long, layout)
        row = {
            "model": label,
            "yarn": cfg.rope_scaling is not None,
            "bpb_short": s["bpb"],
            "bpb_long": lg["bpb"],
            "mtp1_acceptance": s.get("mtp1_acceptance"),
            "mtp1_acceptance_long": lg.get("mtp1_acceptance"),
        }
        if sft is not None:
            row["sft_bpb"] = heldout_bpb(params, cfg, sft, layout)["bpb"]
        if ec.get("reading_prompts", 0):
            row |= reading_probe(params, cfg, load_tokenizer(tok), ec.reading_prompts)
        log.info("eval %s", row)
        rows.append(row)
    results = {
        "short_seq_len": ec.short_seq_len,
        "long_seq_len": ec.long_seq_len,
        "short_tokens": s["tokens"],
        "long_tokens": lg["tokens"],
        "sft_seq_len": sft_stage.data.seq_len if sft_stage is not None else None,
        "rows": rows,
    }
    if jax.process_index() == 0:
        (workdir / EVAL_FILE).write_text(json.dumps(results, indent=2))
    return results
