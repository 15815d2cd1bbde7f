"""The ablation harness: each ablation switches one RL choice against the recipe's default.

    python -m c2.eval.ablate --config=experiments/rl_tiny.py --seeds 3 --ablations A,B,... \\
        [--out DIR] [--set init_from=hf:DIR --set train.steps=12 ...]

Runs the RL stage (`c2.rl.trainer.run`) once per (ablation, seed), "baseline" (the config as
given) included, each in its own workdir `OUT/<ablation>/seed_<s>` (seed s sets config.train.seed:
initialisation of the sampling streams; tasks and held-out set are the same for every run). A run
that finished (final_metrics.json for the same config) is not run again; one cut short resumes
from its checkpoint (the trainer's own resume). Then OUT/ablations.json, OUT/ablations.md (a
table of held-out pass@1, best-of-K, reward and stability indicators with 95% intervals, and the
paired change of pass@1 against the baseline) and OUT/*.png.

Intervals: over seeds, Student t (n - 1 degrees of freedom) for n >= 2 seeds; with one seed, the
held-out pass@1 and best-of-K carry the run's own interval over tasks (c2.rl.evaluation) and the
others none. `--list` prints every ablation and what it overrides.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import ml_collections
import numpy as np

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Ablation:
    what: str
    overrides: dict  # config path -> value
    unavailable: str = ""  # why it cannot run (a missing piece), or "" when it can
    # What the baseline config must hold for the comparison to mean what `what` says.
    requires: dict = dataclasses.field(default_factory=dict)


ABLATIONS: dict[str, Ablation] = {
    "length_norm": Ablation(
        "length normalisation on: each sequence's token losses averaged over its own length "
        "(default: the constant-normalised token sum)",
        {"rl.objective.aggregation": "sequence_mean_token_mean"},
    ),
    "std_norm": Ablation(
        "advantages divided by the group's reward std (default: group mean only)",
        {"rl.objective.advantage": "group_mean_std"},
    ),
    "kl_k3_loss": Ablation(
        "k3 KL estimator as a loss term (default: k1 in the reward)",
        {"rl.objective.kl_kind": "k3", "rl.objective.kl_placement": "loss"},
    ),
    "no_kl": Ablation("no KL regularisation (kl_beta 0)", {"rl.objective.kl_beta": 0.0}),
    "mismatch_filter_off": Ablation(
        "no train/inference mismatch filter (default: p99 and 3 nats); still measured",
        {"rl.objective.mismatch_quantile": -1.0, "rl.objective.mismatch_threshold": -1.0},
    ),
    "mismatch_all_tokens": Ablation(
        "the mismatch p99 ranks stale tokens too (default: only the fresh ones)",
        {"rl.mismatch_tokens": "all"},
    ),
    "tool_call_credit_turn": Ablation(
        "the tool-call penalty on the tokens of the turn that made the calls, weight 1 (default: "
        "a term of the episode's reward, weight 0.1)",
        {"rl.rewards.tool_call_credit": "turn", "rl.rewards.tool_call_penalty": 1.0},
        requires={"rl.rewards.tool_call_credit": "episode"},
    ),
    "tis_off": Ablation(
        "no truncated importance sampling (default: TIS)",
        {"rl.objective.importance_correction": "none"},
    ),
    "synchronous": Ablation(
        "synchronous, on-policy RL (max_staleness 0; default 2)", {"rl.max_staleness": 0}
    ),
    "router_replay_off": Ablation(
        "MoE router replay off: the train forwards route tokens themselves (default: the "
        "engine's recorded experts are replayed)",
        {"rl.router_replay": False},
    ),
    "compaction": Ablation(
        "prompt-based compaction of long episodes (a digest written without the model) instead "
        "of self-summary",
        {"rl.context_management": "compaction"},
        requires={"rl.context_management": "self_summary"},
    ),
    "no_context_management": Ablation(
        "no context management: the context ends a long episode (default: self-summary)",
        {"rl.context_management": "none"},
        requires={"rl.context_management": "self_summary"},
    ),
}
BASELINE = "baseline"
FINAL = "final_metrics.json"
RUN_CONFIG = "ablation.json"


def get_field(config: ml_collections.ConfigDict, path: str):
    """The value at a dotted config path ("rl.objective.kl_beta")."""
    node = config
    for part in path.split("."):
        node = node[part]
    return node


def set_field(config: ml_collections.ConfigDict, path: str, value) -> None:
    """Set an existing dotted config path (a KeyError names a missing one), coercing lists to
    tuples and ints to floats where the field holds one."""
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise KeyError(f"config has no field {path!r} ({part!r} is not in it)")
        node = node[part]
    if leaf not in node:
        raise KeyError(f"config has no field {path!r}")
    current = node[leaf]
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    node[leaf] = value


def check_ablations(names: Sequence[str], config: ml_collections.ConfigDict) -> None:
    """Every name known, runnable, and a change against `config`; else ValueError naming it."""
    for name in names:
        if name == BASELINE:
            continue
        if name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; known: {', '.join(ABLATIONS)}")
        a = ABLATIONS[name]
        if a.unavailable:
            raise ValueError(f"ablation {name!r} ({a.what}) is unavailable: {a.unavailable}")
        wrong = {k: v for k, v in a.requires.items() if get_field(config, k) != v}
        if wrong:
            have = {k: get_field(config, k) for k in wrong}
            raise ValueError(
                f"ablation {name!r} ({a.what}) compares against a baseline with {wrong}; this "
                f"config has {have} (use one with long episodes, e.g. "
                "experiments/rl_notes_tiny.py)"
            )
        if all(get_field(config, k) == v for k, v in a.overrides.items()):
            raise ValueError(
                f"ablation {name!r} changes nothing: the config already has {a.overrides}"
            )


def run_config(base: ml_collections.ConfigDict, name: str, seed: int):
    config = copy.deepcopy(base)
    with config.unlocked():
        for k, v in ({} if name == BASELINE else ABLATIONS[name].overrides).items():
            set_field(config, k, v)
        config.train.seed = int(base.train.seed) + seed
        config.name = f"{base.name}-{name}-s{seed}"
    return config


def _done(workdir: Path, config) -> bool:
    saved = workdir / RUN_CONFIG
    return (
        (workdir / FINAL).is_file()
        and saved.is_file()
        and json.loads(saved.read_text()) == json.loads(config.to_json_best_effort())
    )


def run_all(
    base: ml_collections.ConfigDict,
    ablations: Sequence[str],
    seeds: int,
    out: str | Path,
    *,
    train=None,
) -> dict:
    """Runs what is not finished (baseline first), then writes the table; returns it."""
    if seeds < 1:
        raise ValueError(f"--seeds={seeds}: expected >= 1")
    names = [BASELINE] + [a for a in ablations if a != BASELINE]
    check_ablations(names, base)
    if train is None:
        from c2.rl.trainer import run as train
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for s in range(seeds):
            workdir = out / name / f"seed_{s}"
            config = run_config(base, name, s)
            if _done(workdir, config):
                log.info("%s seed %d: finished earlier, not run again", name, s)
                continue
            saved = workdir / RUN_CONFIG
            if saved.is_file() and json.loads(saved.read_text()) != json.loads(
                config.to_json_best_effort()
            ):
                raise ValueError(
                    f"{workdir} holds a run of another config; remove it or use another --out"
                )
            workdir.mkdir(parents=True, exist_ok=True)
            saved.write_text(config.to_json_best_effort(indent=2))
            log.info("%s seed %d: training in %s", name, s, workdir)
            train(config, workdir)
    table = collect(out, names, seeds)
    (out / "ablations.json").write_text(json.dumps(table, indent=2))
    write_table(table, out)
    return table


# Results ------------------------------------------------------------------------------------


def t_interval(values: Sequence[float]) -> dict:
    """Mean and 95% Student-t interval of a few runs' values (None and NaN left out)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], float)
    if not len(v):
        return {"mean": None, "ci95": None, "n": 0}
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(v)}


def run_summary(workdir: Path) -> dict:
    """One finished run: final held-out pass@1 / best-of-K, reward, stability indicators."""
    from c2.train.metrics import read_metrics

    final = json.loads((workdir / FINAL).read_text())
    steps = final["steps"]
    ev = final["evaluations"][str(steps)]
    k = ev["k"]
    rows = read_metrics(workdir / "metrics.jsonl")

    def col(key):
        return [r[key] for r in rows if r.get(key) is not None]

    losses = col("loss")
    return {
        "steps": steps,
        "k": k,
        "pass@1": ev["pass@1"],
        "pass@1_ci95": ev["pass@1_ci95"],
        "best_of_k": ev[f"best_of_{k}"],
        "best_of_k_ci95": ev[f"best_of_{k}_ci95"],
        "pass@1_start": final["evaluations"].get("0", {}).get("pass@1"),
        "reward_mean": float(np.mean(col("reward/total"))) if col("reward/total") else None,
        "grad_norm_max": max(col("grad_norm"), default=None),
        "kl_final": col("kl")[-1] if col("kl") else None,
        "mismatch_p99_max": max(col("mismatch_p99"), default=None),
        "tokens_dropped_mean": (
            float(np.mean(col("frac_tokens_dropped"))) if col("frac_tokens_dropped") else None
        ),
        "nonfinite_loss_steps": int(sum(not math.isfinite(x) for x in losses)),
        "per_task_passes": ev.get("per_task_passes"),
        "reward_curve": col("reward/total"),
    }


MEASURES = (
    "pass@1",
    "best_of_k",
    "reward_mean",
    "grad_norm_max",
    "kl_final",
    "mismatch_p99_max",
    "tokens_dropped_mean",
    "nonfinite_loss_steps",
)


def collect(out: Path, names: Sequence[str], seeds: int) -> dict:
    runs = {n: [run_summary(out / n / f"seed_{s}") for s in range(seeds)] for n in names}
    table = {"seeds": seeds, "rows": []}
    base = runs[BASELINE]
    for n in names:
        rs = runs[n]
        row = {
            "ablation": n,
            "what": "the recipe's defaults (the config as given)"
            if n == BASELINE
            else ABLATIONS[n].what,
            "overrides": {} if n == BASELINE else ABLATIONS[n].overrides,
            "k": rs[0]["k"],
        }
        for m in MEASURES:
            row[m] = t_interval([r[m] for r in rs])
        if seeds == 1:  # the run's own interval over held-out tasks
            row["pass@1"]["ci95"] = rs[0]["pass@1_ci95"]
            row["best_of_k"]["ci95"] = rs[0]["best_of_k_ci95"]
        # Paired by seed against the baseline (same tasks, same seed).
        deltas = [r["pass@1"] - b["pass@1"] for r, b in zip(rs, base)]
        row["pass@1_delta"] = t_interval(deltas)
        if seeds == 1 and n != BASELINE:
            row["pass@1_delta"]["ci95"] = _task_paired_ci(rs[0], base[0])
        row["reward_curves"] = [r["reward_curve"] for r in rs]
        table["rows"].append(row)
    return table


def _task_paired_ci(run: dict, base: dict) -> list[float] | None:
    """One seed: the paired change of pass@1 over held-out tasks (c2.rl.evaluation.compare)."""
    from c2.rl.evaluation import compare

    a, b = run.get("per_task_passes"), base.get("per_task_passes")
    if not a or not b:
        return None
    try:
        c = compare({"per_task_passes": b, "k": base["k"]}, {"per_task_passes": a, "k": run["k"]})
    except ValueError:
        return None
    return c["pass@1_delta_ci95"]


def _cell(x: dict, digits: int = 3) -> str:
    if x["mean"] is None:
        return "-"
    s = f"{x['mean']:.{digits}f}"
    if x.get("ci95"):
        lo, hi = x["ci95"]
        s += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return s


def _plots(table: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table["rows"]
    names = [r["ablation"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, m, label in ((axes[0], "pass@1", "held-out pass@1"), (axes[1], "best_of_k", "")):
        means = [r[m]["mean"] or 0.0 for r in rows]
        err = [
            [r[m]["mean"] - r[m]["ci95"][0], r[m]["ci95"][1] - r[m]["mean"]]
            if r[m].get("ci95")
            else [0.0, 0.0]
            for r in rows
        ]
        ax.bar(range(len(rows)), means, yerr=np.asarray(err).T, capsize=3)
        ax.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.set_title(label or f"held-out best-of-{rows[0]['k']}")
    fig.suptitle(f"ablations, {table['seeds']} seed(s), 95% intervals")
    fig.tight_layout()
    fig.savefig(out / "ablations.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for r in rows:
        curves = [c for c in r["reward_curves"] if c]
        if curves:
            n = min(len(c) for c in curves)
            ax.plot(range(1, n + 1), np.mean([c[:n] for c in curves], 0), label=r["ablation"])
    ax.set(xlabel="step", ylabel="reward (mean over seeds)", title="training reward")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=110)
    plt.close(fig)
    return ["ablations.png", "reward.png"]


def write_table(table: dict, out: Path) -> Path:
    plots = _plots(table, out)
    k = table["rows"][0]["k"]
    head = (
        f"| ablation | pass@1 | best-of-{k} | pass@1 vs baseline | reward | max grad norm | "
        "final KL | max mismatch p99 | tokens dropped | non-finite steps |"
    )
    lines = [
        f"# Ablations ({table['seeds']} seed(s))",
        "",
        "Each row switches one RL choice against the baseline (the config as given). Cells: mean "
        "[95% interval]; "
        + (
            "over seeds (t)."
            if table["seeds"] > 1
            else "one seed: pass@1 and best-of-K over held-out tasks, the change paired over tasks."
        ),
        "",
        head,
        "|" + "---|" * 10,
    ]
    for r in table["rows"]:
        cells = [r["ablation"], _cell(r["pass@1"]), _cell(r["best_of_k"])]
        cells += [_cell(r["pass@1_delta"]) if r["ablation"] != BASELINE else "-"]
        cells += [_cell(r["reward_mean"]), _cell(r["grad_norm_max"], 2)]
        cells += [_cell(r["kl_final"], 4), _cell(r["mismatch_p99_max"], 3)]
        cells += [_cell(r["tokens_dropped_mean"], 3), _cell(r["nonfinite_loss_steps"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| ablation | what | overrides |", "|---|---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['ablation']} | {r['what']} | `{r['overrides']}` |")
    lines += [""] + [f"![{p}]({p})" for p in plots] + [""]
    path = out / "ablations.md"
    path.write_text("\n".join(lines))
    return path


# CLI ----------------------------------------------------------------------------------------


def parse_set(items: Sequence[str]) -> dict:
    """`--set key=value` arguments as {key: value}: Python literals, else the text."""
    out = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq:
            raise ValueError(f"--set {item!r}: expected key=value")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c2.eval.ablate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="an RL config file (path[:arg])")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ablations", default="", help="comma-separated; see --list")
    parser.add_argument("--out", default=None, help="default: runs/ablate_<config name>")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    parser.add_argument("--list", action="store_true", help="print the ablations and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, a in ABLATIONS.items():
            status = f"UNAVAILABLE: {a.unavailable}" if a.unavailable else a.overrides
            print(f"{name}\t{a.what}\t{status}")
        return 0
    if not args.config:
        parser.error("--config is required")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("c2").setLevel(logging.INFO)
    from c2.train.config import ConfigError, load_config

    path, _, arg = args.config.partition(":")
    try:
        config = load_config(path, arg or None)
        for k, v in parse_set(args.set).items():
            set_field(config, k, v)
        names = [a for a in args.ablations.split(",") if a]
        check_ablations(names, config)
    except (ValueError, KeyError, ConfigError) as e:
        parser.error(str(e))
    out = Path(args.out or f"runs/ablate_{config.name}")
    import jax

    if not jax.config.jax_compilation_cache_dir:  # every run after the first reuses programs
        jax.config.update("jax_compilation_cache_dir", str(out / "jax_cache"))
    try:
        table = run_all(config, names, args.seeds, out)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    for r in table["rows"]:
        print(json.dumps({"ablation": r["ablation"], "pass@1": r["pass@1"]["mean"]}))
    print(f"table: {out / 'ablations.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
