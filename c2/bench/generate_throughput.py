"""Generation throughput and train/inference agreement of c2.infer, in one run on this machine.

1. c2 `Engine` vs Hugging Face `transformers` `generate` (PyTorch, CPU) on identical weights
   (exported with c2.model.hf.export_hf_checkpoint), same batch, greedy, same new tokens; and
   the engine with `run_ahead=False` (each decode call read back before the next goes out).
2. Plain vs MTP-speculative greedy decoding (1..3 drafts): tokens/s, acceptance rate, mean
   accepted length; outputs must be identical to plain greedy.
3. Recorded logprobs vs the training forward's, with the recorded experts replayed and without,
   in float32 and bfloat16 (sampling at temperature 1).

Speculative numbers only mean something for a model whose MTP head was trained: pass a pipeline
workdir (experiments/pipeline_tiny.py writes DIR/<stage>/checkpoints).

Command:
    python -m c2.bench.generate_throughput --workdir=runs/main --stage=cpt [--batch 32]
    (--hf=DIR instead of --workdir: a transformers checkpoint, e.g. the shipped policy
    experiments/policies/reader_tiny; --preset=tiny_kimi_k2: freshly initialised weights;
    --requests 32 with --batch 8: 32 prompts streamed through 8 slots, each refilled as its row
    finishes, as the RL engine runs, instead of one batch that waits for its slowest row)
Timing is fair on a shared machine (c2.bench.fair): runs interleaved, medians with min-max
spread, the load average before and after and other processes' CPU during the run printed and
written to the JSON, a loud warning when the machine is busy (load >= 0.5; --require_quiet
refuses to run).
Runtime: about 5 minutes on the 2-core reference machine (transformers is half of it).
Expected: c2 many times transformers' tokens/s with identical greedy tokens; speculative
greedy identical to plain and faster when drafts are accepted; float32 replayed mismatch ~1e-6.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from c2 import model
from c2.bench import fair
from c2.infer import Engine


def load_stage(stage_dir: Path):
    """(ModelConfig, params, step) of the newest checkpoint of a pipeline stage directory. Only
    the `params` item is read (orbax), so checkpoints of older and newer trainers both load."""
    import ml_collections
    import orbax.checkpoint as ocp

    from c2.train import lm

    config = ml_collections.ConfigDict(json.loads((stage_dir / "config.json").read_text()))
    cfg = lm.model_config(config)
    steps = sorted(int(p.name) for p in (stage_dir / "checkpoints").iterdir() if p.name.isdigit())
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {stage_dir / 'checkpoints'}")
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
        model.abstract_params(cfg),
    )
    path = (stage_dir / "checkpoints" / str(steps[-1]) / "params").absolute()
    params = ocp.StandardCheckpointer().restore(path, abstract)
    return cfg, params, steps[-1]


def heldout_prompts(batch: int, prompt_len: int, vocab_size: int) -> np.ndarray:
    """[batch, prompt_len] byte tokens: line-aligned windows of held-out standard-library files."""
    from c2.data.corpus import load_corpus
    from c2.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    if tok.vocab_size > vocab_size:
        raise ValueError(f"byte prompts need vocab_size >= {tok.vocab_size}, got {vocab_size}")
    docs = load_corpus("stdlib").documents("heldout")
    out = []
    # A line start at the half of each long document, then (for large batches) at its other
    # quarters: a prompt per document first, more per document only when they run out.
    for fraction in (2, 4, 4 / 3):
        for i in range(len(docs)):
            ids = tok.encode_array(docs[i]["text"])
            if len(ids) < 4 * prompt_len:
                continue
            at = int(len(ids) / fraction)
            lines = np.flatnonzero(ids[at:] == ord("\n"))
            start = at + int(lines[0]) + 1 if len(lines) else at
            if start + prompt_len > len(ids):
                continue
            out.append(ids[start : start + prompt_len])
            if len(out) == batch:
                return np.stack(out)
    raise ValueError(f"only {len(out)} held-out prompts of {prompt_len} tokens for {batch}")


def interleaved(runs: dict, repeats: int, pause: float = 0.2) -> dict:
    """{name: (Timing, last result)}: one untimed warm-up call each (compilation), then
    `repeats` rounds calling every run in turn after an untimed pause (c2.bench.fair), so load
    on a shared machine hits all alike."""
    timings, results = fair.interleave(runs, repeats, pause=pause)
    return {name: (timings[name], results[name]) for name in runs}


def c2_run(params, cfg, prompts, new_tokens, slots, max_len=None, **options):
    """A run of the engine (greedy unless `temperature` is given) over every prompt with `slots`
    rows: more prompts than slots are admitted as rows free up (continuous batching). max_len:
    the engine's context (default: just the prompt and the new tokens)."""
    max_len = max_len or prompts.shape[1] + new_tokens
    engine = Engine(params, cfg, max_slots=slots, max_len=max_len, **options)

    def run():
        engine._stats.clear()  # stats of the last call only
        out = engine.generate(prompts.tolist(), new_tokens)
        return np.stack([c.tokens for c in out]), dict(engine.stats)

    return run


def hf_run(params, cfg, prompts, new_tokens, batch):
    """transformers generate, greedy, exactly new_tokens per row, on the exported weights, the
    prompts in consecutive batches of `batch` (equal lengths: no padding, no waiting rows)."""
    import torch
    import transformers

    from c2.model.hf import export_hf_checkpoint

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    with tempfile.TemporaryDirectory() as d:
        export_hf_checkpoint(params, cfg, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    ids = torch.tensor(prompts, dtype=torch.long)

    def run():
        outs = []
        with torch.no_grad():
            for chunk in torch.split(ids, batch):
                out = hf.generate(
                    chunk,
                    attention_mask=torch.ones_like(chunk),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
                outs.append(out[:, prompts.shape[1] :].numpy())
        return np.concatenate(outs), {
            "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__,
        }

    return run


def logprob_mismatch(params, cfg, prompts, new_tokens, dtype: str) -> dict:
    """Sample at temperature 1, recompute the logprobs with the training forward (all prompts
    have one length: one batch), with the recorded experts replayed and with live routing."""
    c = cfg.replace(dtype=dtype)
    B, P = prompts.shape
    # XLA:CPU has no bf16 x bf16 -> f32 kernel for the batched dot of the MLA cached attention
    # (attention.py, "bnts,bsr->btnr") when batch > 1: decode bf16 one sequence at a time there.
    slots = 1 if dtype == "bfloat16" and jax.default_backend() == "cpu" else B
    engine = Engine(params, c, max_slots=slots, max_len=P + new_tokens, temperature=1.0, seed=0)
    out = engine.generate(prompts.tolist(), new_tokens)
    seqs = np.stack([np.concatenate([x.prompt, x.tokens]) for x in out])
    routing = np.stack(
        [np.concatenate([x.prompt_routed_experts, x.routed_experts]) for x in out], axis=1
    ).astype(np.int32)  # [T, B, L, k] -> replay layout [L, B, T, k]
    replay = jnp.asarray(routing.transpose(2, 1, 0, 3))
    recorded = np.stack([x.logprobs for x in out])

    @jax.jit
    def train_logprobs(params, tokens, routing):
        logits, aux = model.forward(params, tokens, c, routing=routing)
        lp = jax.nn.log_softmax(logits[:, P - 1 : -1].astype(jnp.float32), -1)
        return jnp.take_along_axis(lp, tokens[:, P:, None], -1)[..., 0], aux["topk_idx"]

    res = {}
    for name, r in (("replayed", replay), ("live", None)):
        lp, live = train_logprobs(params, jnp.asarray(seqs), r)
        d = np.abs(recorded - np.asarray(lp))
        res[name] = {
            "mean_abs": float(d.mean()),
            "p99_abs": float(np.quantile(d, 0.99)),
            "max_abs": float(d.max()),
        }
        if r is None:
            same = np.sort(np.asarray(live), -1) == np.sort(np.asarray(replay), -1)
            res[name]["routing_disagreement"] = float(1 - same.all(-1).mean())
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", help="a pipeline workdir (DIR/<stage>/checkpoints)")
    ap.add_argument("--stage", default="cpt")
    ap.add_argument(
        "--hf", help="a transformers checkpoint directory instead (e.g. experiments/policies/...)"
    )
    ap.add_argument("--preset", default="tiny_kimi_k2", help="used when no --workdir is given")
    ap.add_argument("--batch", type=int, default=8, help="engine slots (transformers' batch)")
    ap.add_argument(
        "--requests",
        type=int,
        help="prompts to generate for (default: --batch); more than --batch streams them through "
        "the slots, refilling each as it finishes (continuous batching)",
    )
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument(
        "--max_len",
        type=int,
        help="the engine's context (default prompt_len + new_tokens; an RL engine holds the "
        "episode's whole context, e.g. 1024)",
    )
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--drafts", default="1,2,3", help="MTP draft lengths to benchmark")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip_hf", action="store_true")
    ap.add_argument(
        "--skip_mismatch", action="store_true", help="skip the train/inference logprob check"
    )
    ap.add_argument(
        "--moe_impl", choices=("ragged", "dense"), help="override the MoE dispatch for decoding"
    )
    ap.add_argument("--steps_per_call", type=int, default=1, help="decode steps per engine call")
    ap.add_argument("--require_quiet", action="store_true", help="refuse at load average >= 0.5")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    requests = a.batch if a.requests is None else a.requests
    if requests < 1 or a.batch < 1:
        raise ValueError(f"--batch {a.batch} --requests {requests}: expected both >= 1")
    check = fair.load_check(require_quiet=a.require_quiet)

    if a.hf:
        cfg, params = model.load_hf_checkpoint(a.hf)
        source = a.hf
    elif a.workdir:
        cfg, params, step = load_stage(Path(a.workdir) / a.stage)
        source = f"{a.workdir}/{a.stage} step {step}"
    else:
        cfg = model.presets.get(a.preset, dtype="float32")
        params = model.init_params(cfg, jax.random.key(0))
        source = f"{a.preset}, untrained"
    if a.moe_impl:
        cfg = cfg.replace(moe_impl=a.moe_impl)
    prompts = heldout_prompts(requests, a.prompt_len, cfg.vocab_size)
    res = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {jax.default_backend()}",
        "model": source,
        "dtype": cfg.dtype,
        "moe_impl": cfg.moe_impl,
        "batch": a.batch,
        "requests": requests,
        "max_len": a.max_len or a.prompt_len + a.new_tokens,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
    }
    drafts = [int(x) for x in a.drafts.split(",") if x] if cfg.mtp_depth else []
    runs = {}
    for temperature in (0.0, 1.0):  # greedy (the comparison with transformers) and sampling
        opts = dict(
            temperature=temperature, seed=0, steps_per_call=a.steps_per_call, max_len=a.max_len
        )
        runs[f"c2 T={temperature:g}"] = c2_run(params, cfg, prompts, a.new_tokens, a.batch, **opts)
        if temperature == 0.0:  # each decode call read back before the next is dispatched
            runs["c2 no run-ahead T=0"] = c2_run(
                params, cfg, prompts, a.new_tokens, a.batch, run_ahead=False, **opts
            )
        for k in drafts:
            runs[f"c2 speculative k={k} T={temperature:g}"] = c2_run(
                params,
                cfg,
                prompts,
                a.new_tokens,
                a.batch,
                speculative=True,
                num_draft_tokens=k,
                **opts,
            )
    if not a.skip_hf:
        runs["transformers T=0"] = hf_run(params, cfg, prompts, a.new_tokens, a.batch)
    timed = interleaved(runs, a.repeats)
    check = fair.finish(check)
    res.update(check.record(), repeats=a.repeats, steps_per_call=a.steps_per_call)
    res["runs"] = {}
    for name, (timing, (tokens, info)) in timed.items():
        seconds = timing.median
        temperature = name.rsplit("T=", 1)[1]
        plain_s, (plain_tokens, _) = timed[f"c2 T={temperature}"]
        plain_s = plain_s.median
        r = {
            "seconds": seconds,
            "tokens_per_s": tokens.size / seconds,
            "tokens_per_s_min_max": [tokens.size / timing.max, tokens.size / timing.min],
            **timing.summary(),
            **info,
        }
        r["speedup_over_plain"] = plain_s / seconds
        if temperature == "0":  # greedy: every variant must give the same tokens
            r["identical_to_plain"] = float((tokens == plain_tokens).all(1).mean())
        res["runs"][name] = r
        accept = (
            f", acceptance {r['acceptance_rate']:.2f}, mean accepted length "
            f"{r['mean_accepted_length']:.2f}"
            if "acceptance_rate" in r
            else ""
        )
        same = (
            f", rows identical to plain {r['identical_to_plain']:.2f}"
            if "identical_to_plain" in r
            else ""
        )
        lo, hi = r["tokens_per_s_min_max"]
        print(
            f"{name}: {r['tokens_per_s']:.0f} tokens/s ({lo:.0f}-{hi:.0f}), "
            f"{r['speedup_over_plain']:.2f}x plain{accept}{same}"
        )
    if "transformers T=0" in res["runs"]:
        res["c2_over_transformers"] = 1 / res["runs"]["transformers T=0"]["speedup_over_plain"]
        print(f"c2 over transformers (greedy): {res['c2_over_transformers']:.1f}x")
    if check.busy:
        print("(machine busy: see the warning above; not a valid comparison)")
    res["mismatch"] = {}
    for dtype in () if a.skip_mismatch else ("float32", "bfloat16"):
        res["mismatch"][dtype] = m = logprob_mismatch(params, cfg, prompts, a.new_tokens, dtype)
        print(
            f"logprob mismatch {dtype}: replayed max {m['replayed']['max_abs']:.2e} "
            f"p99 {m['replayed']['p99_abs']:.2e}; live max {m['live']['max_abs']:.2e} "
            f"(routing differs for {m['live']['routing_disagreement']:.2%} of token-layers)"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2, default=str))
    return res


if __name__ == "__main__":
    main()
