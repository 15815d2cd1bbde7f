"""What `python -m c2.main` runs: one stage, or a pipeline of stages then evaluation and a report.

A config with a `stages` field is a pipeline (experiments/pipeline_tiny.py): its stages run in
`stage_order`, each in DIR/<stage>, each starting from the previous stage's checkpoint unless it
names its own `init_from`; then c2.eval.pipeline_eval measures held-out bits per byte and MTP
acceptance of every stage's weights and writes DIR/report.md with PNG plots. Any other config is
a single stage trained in DIR. Both resume by themselves from an existing DIR.

Layering: this module sits above c2.train and c2.eval (it runs training, then evaluation, then the
report); c2.eval imports c2.train, and c2.train imports neither (tests/test_layering.py).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import jax
import ml_collections

from c2.eval import pipeline_eval, report
from c2.train import lm
from c2.train import metrics as metrics_lib
from c2.train.config import ConfigError
from c2.train.loop import train

log = logging.getLogger(__name__)

PIPELINE_FIELDS = ("name", "train", "init_from", "stage_order", "stages", "eval")


def is_pipeline(config: ml_collections.ConfigDict) -> bool:
    return "stages" in config


def stage_configs(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """{stage name: resolved stage config} with each init_from chained to the previous stage."""
    unknown = sorted(set(config.keys()) - set(PIPELINE_FIELDS))
    if unknown:
        raise ConfigError(f"config.{unknown[0]}: unknown field; known: {list(PIPELINE_FIELDS)}")
    if not config.stage_order:
        raise ConfigError("config.stage_order: expected at least one stage")
    out, previous = {}, None
    for name in config.stage_order:
        if name not in config.stages:
            raise ConfigError(
                f"config.stage_order: stage {name!r} is not in config.stages "
                f"({sorted(config.stages.keys())})"
            )
        stage = copy.deepcopy(config.stages[name])
        if previous is not None and not stage.init_from:
            stage.init_from = str(workdir / previous)
        out[name] = stage
        previous = name
    return out


def check_sandbox(where: str) -> None:
    """An RL stage grades its episodes in a namespace sandbox (bubblewrap), and grading refuses
    anything weaker: say so before the first stage trains, not when the RL stage starts."""
    from c2.envs.isolation import probe

    isolation = probe()
    if jax.process_index() == 0 and isolation.backend == "rlimit":  # process 0 grades
        raise ConfigError(
            f"{where} grades its episodes in a bubblewrap sandbox, and this machine has none "
            f"({isolation.describe()}): install bubblewrap (`make system-deps` as root, or "
            "`apt-get install bubblewrap`), then run the same command again"
        )


def validate_pipeline(
    config: ml_collections.ConfigDict, workdir: Path, num_devices: int | None = None
) -> dict:
    """Every stage checked (naming `config.stages.<stage>.<field>`) before anything compiles."""
    stages = stage_configs(config, workdir)
    for name, stage in stages.items():
        try:
            if "rl" in stage:
                from c2.rl.config import validate_rl

                validate_rl(stage, num_devices or jax.device_count())
                check_sandbox(f"stage {name!r} (RL)")
            else:
                lm.validate(stage, num_devices or jax.device_count())
        except ConfigError as e:
            raise ConfigError(str(e).replace("config.", f"config.stages.{name}.", 1)) from e
    return stages


def merge_stage_metrics(workdir: Path, stage_names) -> list[dict]:
    """DIR/metrics.jsonl: every stage's records in order, `step` counted across stages."""
    merged, offset = [], 0
    for name in stage_names:
        records = metrics_lib.read_metrics(workdir / name / metrics_lib.METRICS_FILE)
        for r in records:
            merged.append(r | {"step": offset + r["step"], "stage": name, "stage_step": r["step"]})
        if records:
            offset += records[-1]["step"]
    tmp = workdir / "metrics.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in merged))
    tmp.replace(workdir / metrics_lib.METRICS_FILE)
    return merged


def run_stage(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Trains (or resumes) one stage in `workdir`: an RL stage (a config with `rl`) or an LM
    stage; returns its last metrics record (the RL stage: its evaluation summary)."""
    if "rl" in config:
        from c2.rl import trainer as rl_trainer

        check_sandbox("the RL stage")
        return rl_trainer.run(config, workdir)
    return train(config, workdir, lm.build_task(config))


def run_pipeline(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """All stages, then the evaluation and the report; returns the evaluation results."""
    workdir = Path(workdir)
    stages = validate_pipeline(config, workdir)
    primary = jax.process_index() == 0  # every host computes; the first one writes
    if primary:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    timings = {}
    for name, stage in stages.items():
        t0 = time.perf_counter()
        log.info("pipeline stage %s -> %s", name, workdir / name)
        run_stage(stage, workdir / name)
        timings[name] = time.perf_counter() - t0
        if primary:
            merge_stage_metrics(workdir, list(stages)[: list(stages).index(name) + 1])
    t0 = time.perf_counter()
    results = pipeline_eval.evaluate(config, stages, workdir)
    timings["evaluation"] = time.perf_counter() - t0
    if primary:
        report.write_report(config, stages, workdir, results, timings)
    return results


def run(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """The entry point's whole job: a pipeline or a single stage."""
    if is_pipeline(config):
        return run_pipeline(config, workdir)
    return run_stage(config, workdir)
