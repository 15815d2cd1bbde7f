"""Base-model selection: rank candidate checkpoints by the report's three measures, in one table.

    python -m c2.eval.select --candidates A,B,C --out OUT [--repo DIR] [--api_steps 50]

Each candidate is a c2 workdir (a stage's or a pipeline's: its last stage) or `hf:DIR`.

1. Codebase bits per byte (the report's "codebase perplexity"): held-out next-token loss per byte
   of UTF-8 on a repository no candidate trained on: `--repo DIR` (every .py file under it), or by
   default the held-out split of the standard-library corpus (`c2.data.corpus`, never in CPT).
2. State-tracking distance: generated programs that set a few variables and then apply d
   sequential updates (`x = x + 3`, `y = x`, `x = y - 2`, ...), ending `# v == ` before the
   final value of one variable. A program counts as solved when the greedy continuation is that
   value exactly (scored teacher-forced: every answer token the argmax, the same test). The
   distance is the largest d tested (`--depths`) at which at least 50% are solved (0 if none).
   The answer's bits per byte at each d are reported too (a continuous view for small models).
3. Fresh-API knowledge: a generated library (`qorvath`, made-up names, seeded) whose API exists
   only in one small CPT corpus written to OUT/fresh_api/corpus (its source and usage
   examples). Held-out questions, in a form the corpus never uses (a comment naming what a
   function does, then `qorvath.`), ask for each function's name. Accuracy (greedy exact, as
   above) before, and, with `--api_steps N > 0`, after N steps of CPT on that corpus from the
   candidate (c2 workdirs only: OUT/fresh_api/cpt_<i>); the gain is what the candidate learns
   from the new corpus.

Ranking: each measure ranks the candidates on its own (1 = best; equal values share the mean of
their places): codebase bits per byte (lower first); state tracking by distance (higher first),
then the answers' mean bits per byte over the depths (lower first: it separates small models
whose distance is equal); fresh API by accuracy (higher first), then the answers' bits per byte,
after CPT when every candidate has an after-measure, else before for all (like with like). The
selection orders by the mean of the three ranks (a Borda count: no measure's units or scale
weigh in), ties by bits per byte. Each row keeps its `ranks` and `mean_rank`.
OUT/selection.json and OUT/selection.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import logging
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from c2.eval.models import LoadedModel, load_model, stage_config

log = logging.getLogger(__name__)

LIBRARY = "qorvath"


@dataclasses.dataclass(frozen=True)
class SelectOptions:
    repo: str = "stdlib"  # a directory (all of it held out) or "stdlib" (its held-out split)
    seq_len: int = 128
    bpb_batches: int = 8
    batch_size: int = 8
    depths: tuple[int, ...] = (1, 2, 4, 8, 16)
    programs: int = 32  # per depth
    api_functions: int = 24
    api_steps: int = 0  # CPT steps on the fresh-API corpus (0: before only)
    seed: int = 0


# Scoring answers teacher-forced --------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _answer_fn(cfg):
    from c2 import model as model_lib

    def fn(params, inputs, positions, segment_ids, targets, mask):
        logits, _ = model_lib.forward(
            params, inputs, cfg, positions=positions, segment_ids=segment_ids
        )
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
        tgt = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        hit = jnp.argmax(logits, -1) == targets
        return (
            jnp.sum(-tgt * mask, -1),  # nats per example
            jnp.all(hit | (mask == 0), -1),  # every answer token the argmax
        )

    return jax.jit(fn)


def score_answers(model: LoadedModel, items: Sequence[tuple[str, str]], batch_size: int = 16):
    """(solved [N] bool, answer bits per byte [N]) of prompt -> answer pairs."""
    tok = model.tokenizer
    rows = []
    for prompt, answer in items:
        p = [tok.bos_id, *tok.encode_array(prompt).tolist()]
        a = tok.encode_array(answer).tolist()
        rows.append((p + a, len(p), len(a), len(answer.encode())))
    length = max(len(r[0]) for r in rows)
    length = -(-length // 32) * 32  # a few fixed shapes
    if length > model.cfg.max_seq_len:
        raise ValueError(f"an item of {length} tokens exceeds max_seq_len {model.cfg.max_seq_len}")
    fn = _answer_fn(model.cfg)
    solved, bpb = [], []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        chunk += [chunk[-1]] * (batch_size - len(chunk))  # whole batches: one compiled shape
        B = len(chunk)
        inputs = np.zeros((B, length), np.int32)
        targets = np.zeros((B, length), np.int32)
        mask = np.zeros((B, length), np.float32)
        seg = np.zeros((B, length), np.int32)
        for b, (ids, n_prompt, n_ans, _) in enumerate(chunk):
            n = len(ids) - 1
            inputs[b, :n], targets[b, :n], seg[b, :n] = ids[:-1], ids[1:], 1
            mask[b, n_prompt - 1 : n_prompt - 1 + n_ans] = 1.0
        pos = np.broadcast_to(np.arange(length, dtype=np.int32), (B, length))
        nats, ok = jax.device_get(fn(model.params, inputs, pos, seg, targets, mask))
        for b in range(min(batch_size, len(rows) - i)):
            solved.append(bool(ok[b]))
            bpb.append(float(nats[b]) / np.log(2) / chunk[b][3])
    return np.array(solved), np.array(bpb)


# 1. Codebase bits per byte -------------------------------------------------------------------


def codebase_bpb(model: LoadedModel, opts: SelectOptions) -> dict:
    from c2.data.pipeline import make_eval_batches
    from c2.train.bpb import heldout_bpb

    split = "heldout" if opts.repo == "stdlib" else "all"
    seq_len = min(opts.seq_len, model.cfg.max_seq_len)
    batches = make_eval_batches(
        opts.repo, model.tokenizer, seq_len, opts.batch_size, split, max_batches=opts.bpb_batches
    )
    r = heldout_bpb(model.params, model.cfg, batches)
    return {"bpb": r["bpb"], "tokens": r["tokens"], "repo": opts.repo, "split": split}


# 2. State tracking ---------------------------------------------------------------------------


def state_program(d: int, rng: random.Random) -> tuple[str, str]:
    """A program of d sequential updates and the final value of its queried variable."""
    names = rng.sample("abcdefghkmnpqrstuvwxyz", 3)
    env = {v: rng.randrange(10) for v in names}
    lines = [f"{v} = {env[v]}" for v in names]
    for _ in range(d):
        v = rng.choice(names)
        kind = rng.randrange(3)
        if kind == 0:
            k = rng.randrange(1, 10)
            env[v] += k
            lines.append(f"{v} = {v} + {k}")
        elif kind == 1:
            k = rng.randrange(1, 10)
            env[v] -= k
            lines.append(f"{v} = {v} - {k}")
        else:
            src = rng.choice([n for n in names if n != v])
            env[v] = env[src]
            lines.append(f"{v} = {src}")
    q = rng.choice(names)
    return "\n".join(lines) + f"\n# {q} == ", f"{env[q]}\n"


def state_tracking(model: LoadedModel, opts: SelectOptions) -> dict:
    per_depth = {}
    for d in opts.depths:
        rng = random.Random(f"state:{opts.seed}:{d}")
        items = [state_program(d, rng) for _ in range(opts.programs)]
        solved, bpb = score_answers(model, items, opts.batch_size)
        per_depth[str(d)] = {"accuracy": float(solved.mean()), "answer_bpb": float(bpb.mean())}
    ok = [d for d in opts.depths if per_depth[str(d)]["accuracy"] >= 0.5]
    return {"distance": max(ok, default=0), "per_depth": per_depth}


# 3. Fresh-API knowledge ------------------------------------------------------------------------

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "ta",
    "vo",
    "zi",
    "pe",
    "sa",
    "du",
    "fi",
    "go",
    "hu",
    "ja",
]
_OPS = [
    ("a + b * {k}", "adds {k} times b to a"),
    ("a * {k} - b", "multiplies a by {k} and subtracts b"),
    ("max(a, b) + {k}", "takes the larger of a and b plus {k}"),
    ("min(a, b) - {k}", "takes the smaller of a and b minus {k}"),
    ("(a - b) * {k}", "scales the difference of a and b by {k}"),
    ("a // {k} + b", "floor-divides a by {k} and adds b"),
    ("abs(a - b) + {k}", "measures the distance between a and b plus {k}"),
    ("a % {k} * b", "multiplies b by a modulo {k}"),
]


def fresh_api(n: int, seed: int) -> list[dict]:
    """The library: n functions, each with a made-up name, a body and what it does."""
    rng = random.Random(f"fresh_api:{seed}")
    names, out = set(), []
    while len(out) < n:
        name = "".join(rng.sample(_SYLLABLES, 3))
        if name in names:
            continue
        names.add(name)
        body, what = rng.choice(_OPS)
        k = rng.randrange(2, 10)
        out.append({"name": name, "body": body.format(k=k), "what": what.format(k=k)})
    return out


def write_api_corpus(api: list[dict], root: Path) -> Path:
    """The only text where the API exists: its source, and usage examples, as .py files (one
    file per function, several phrasings). At least one file lands in the held-out split, so a
    CPT stage on it can evaluate."""
    from c2.data.corpus import heldout_score

    root.mkdir(parents=True, exist_ok=True)
    src = [f'"""{LIBRARY}: small integer helpers."""\n']
    for f in api:
        src.append(f'\ndef {f["name"]}(a, b):\n    """{f["what"].capitalize()}."""\n')
        src.append(f"    return {f['body']}\n")
    (root / f"{LIBRARY}.py").write_text("".join(src))
    for i, f in enumerate(api):
        text = (
            f"import {LIBRARY}\n\n\ndef use_{i}(a, b):\n"
            f"    # {LIBRARY}.{f['name']} {f['what']}\n"
            f"    return {LIBRARY}.{f['name']}(a, b)\n\n\n"
            f"value = {LIBRARY}.{f['name']}(3, 4)  # {f['what']}\n"
        )
        (root / f"use_{f['name']}.py").write_text(text)
    j = 0
    while heldout_score(f"extra_{j}.py") >= 0.02:
        j += 1
    (root / f"extra_{j}.py").write_text(f"from {LIBRARY} import *  # noqa\n")
    return root


def api_questions(api: list[dict]) -> list[tuple[str, str]]:
    """Held-out form: the description first, then the call to complete (never in the corpus)."""
    return [(f"# Use the function that {f['what']}.\nx = {LIBRARY}.", f["name"] + "(") for f in api]


def api_accuracy(model: LoadedModel, api: list[dict], batch_size: int) -> dict:
    solved, bpb = score_answers(model, api_questions(api), batch_size)
    return {"accuracy": float(solved.mean()), "answer_bpb": float(bpb.mean())}


def cpt_on_corpus(candidate: str, corpus: Path, steps: int, workdir: Path) -> str:
    """A short CPT stage on `corpus` from a c2 workdir candidate; returns its workdir."""
    from c2.train import lm
    from c2.train.loop import train

    stage_dir, config = stage_config(candidate)
    c = copy.deepcopy(config)
    c.name = f"{config.name}-fresh_api"
    c.init_from = str(stage_dir)
    c.data.kind, c.data.corpus = "pretrain", str(corpus)
    c.data.eval_batches = 1
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, steps, 0
    c.train.progress_bar = False
    c.optimizer.warmup_steps = min(c.optimizer.warmup_steps, max(steps // 5, 0))
    final = workdir / "final_metrics.json"
    if not final.is_file():  # resumable: a finished CPT is not run again
        train(c, workdir, lm.build_task(c))
    return str(workdir)


# The table -----------------------------------------------------------------------------------


def evaluate_candidate(spec: str, index: int, opts: SelectOptions, out: Path, api, corpus):
    model = load_model(spec)
    row = {"candidate": spec}
    row["codebase"] = codebase_bpb(model, opts)
    row["state_tracking"] = state_tracking(model, opts)
    row["fresh_api"] = {"before": api_accuracy(model, api, opts.batch_size)}
    del model
    if opts.api_steps:
        if spec.startswith("hf:"):
            row["fresh_api"]["after"] = None
            row["fresh_api"]["note"] = "CPT after-measure needs a c2 workdir candidate"
        else:
            after_dir = cpt_on_corpus(spec, corpus, opts.api_steps, out / f"cpt_{index}")
            row["fresh_api"]["after"] = api_accuracy(load_model(after_dir), api, opts.batch_size)
    log.info("candidate %s: %s", spec, json.dumps(row))
    return row


MEASURES = ("codebase", "state_tracking", "fresh_api")


def measure_keys(rows: Sequence[dict]) -> dict[str, list[tuple]]:
    """Per measure, each row's sort key (smaller is better), as the module doc says."""
    phase = "after" if all(r["fresh_api"].get("after") for r in rows) else "before"

    def state(r):
        per_depth = r["state_tracking"]["per_depth"].values()
        return (
            -r["state_tracking"]["distance"],
            float(np.mean([d["answer_bpb"] for d in per_depth])),
        )

    def api(r):
        a = r["fresh_api"][phase]
        return (-a["accuracy"], a["answer_bpb"])

    return {
        "codebase": [(r["codebase"]["bpb"],) for r in rows],
        "state_tracking": [state(r) for r in rows],
        "fresh_api": [api(r) for r in rows],
    }


def _places(keys: Sequence[tuple]) -> list[float]:
    """1-based ranks of keys (smaller first); equal keys share the mean of their places."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    out = [0.0] * len(keys)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and keys[order[j + 1]] == keys[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def rank_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows ordered best first by mean rank over the three measures (ties: bits per byte),
    each with its per-measure `ranks`, `mean_rank` and final `rank`."""
    places = {m: _places(keys) for m, keys in measure_keys(rows).items()}
    for i, row in enumerate(rows):
        row["ranks"] = {m: places[m][i] for m in MEASURES}
        row["mean_rank"] = float(np.mean(list(row["ranks"].values())))
    ranked = sorted(rows, key=lambda r: (r["mean_rank"], r["codebase"]["bpb"]))
    for rank, row in enumerate(ranked, 1):
        row["rank"] = rank
    return ranked


def select(candidates: Sequence[str], out: str | Path, opts: SelectOptions = SelectOptions()):
    """Measures every candidate, ranks them, writes OUT/selection.json and .md; returns rows."""
    if not candidates:
        raise ValueError("--candidates: expected at least one")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    api = fresh_api(opts.api_functions, opts.seed)
    corpus = write_api_corpus(api, out / "fresh_api" / "corpus")
    (out / "fresh_api" / "questions.json").write_text(json.dumps(api_questions(api), indent=1))
    rows = [
        evaluate_candidate(c, i, opts, out / "fresh_api", api, corpus)
        for i, c in enumerate(candidates)
    ]
    ranked = rank_rows(rows)
    result = {"options": dataclasses.asdict(opts), "rows": ranked}
    (out / "selection.json").write_text(json.dumps(result, indent=2))
    _write_md(result, out)
    return ranked


def _write_md(result: dict, out: Path) -> None:
    lines = [
        "# Base-model selection",
        "",
        "Ordered by the mean of each measure's rank (in brackets).",
        "",
        "| rank | mean rank | candidate | codebase bits/byte | state-tracking distance | "
        "fresh-API accuracy before | after CPT |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        after = r["fresh_api"].get("after")
        after_cell = f"{after['accuracy']:.2f}" if after else "-"
        ranks = r["ranks"]
        lines.append(
            f"| {r['rank']} | {r['mean_rank']:.2f} | {r['candidate']} | "
            f"{r['codebase']['bpb']:.3f} ({ranks['codebase']:g}) | "
            f"{r['state_tracking']['distance']} ({ranks['state_tracking']:g}) | "
            f"{r['fresh_api']['before']['accuracy']:.2f} | {after_cell} "
            f"({ranks['fresh_api']:g}) |"
        )
    lines += ["", "State tracking per depth (accuracy / answer bits per byte):", ""]
    depths = result["options"]["depths"]
    lines += ["| candidate | " + " | ".join(f"d={d}" for d in depths) + " |"]
    lines += ["|---|" + "---|" * len(depths)]
    for r in result["rows"]:
        pd = r["state_tracking"]["per_depth"]
        cells = [f"{pd[str(d)]['accuracy']:.2f} / {pd[str(d)]['answer_bpb']:.2f}" for d in depths]
        lines.append(f"| {r['candidate']} | " + " | ".join(cells) + " |")
    (out / "selection.md").write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m c2.eval.select",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--candidates", required=True, help="comma-separated workdirs / hf:DIR")
    parser.add_argument("--out", required=True)
    d = SelectOptions()
    for f in dataclasses.fields(SelectOptions):
        if f.name == "depths":
            parser.add_argument("--depths", default=",".join(map(str, d.depths)))
        else:
            parser.add_argument(
                f"--{f.name}", type=type(getattr(d, f.name)), default=getattr(d, f.name)
            )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("c2").setLevel(logging.INFO)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(SelectOptions)}
    fields["depths"] = tuple(int(x) for x in args.depths.split(","))
    try:
        rows = select(
            [c for c in args.candidates.split(",") if c], args.out, SelectOptions(**fields)
        )
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    for r in rows:
        brief = {"rank": r["rank"], "mean_rank": r["mean_rank"], "candidate": r["candidate"]}
        brief["bpb"] = r["codebase"]["bpb"]
        print(json.dumps(brief | {"state_distance": r["state_tracking"]["distance"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
