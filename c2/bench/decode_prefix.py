"""Decode calls attending a cache prefix vs the whole cache: where slicing the prefix pays.

A decode call can attend only to the first `kv_len` cache slots (`steps.attend_len`). The slice
copies every layer's cache prefix, so it pays only when it skips enough slots; `attend_len`
takes a prefix for a decode call only when it is at most half the cache. This times one decode
call at batch B with every row `--filled` tokens in, for each cache length, attending the 128
prefix and the whole cache, interleaved (c2.bench.fair), checks that both give the same greedy
tokens, and prints which `attend_len` picks.

Command:
    python -m c2.bench.decode_prefix --workdir=runs --stage=cpt_tiny [--batch 32]
        [--cache_lens 224,316,528] [--filled 64] [--prefix 128] [--calls 5] [--repeats 7]
        [--out FILE.json]
Runtime: about 2 minutes on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import jax
import numpy as np

from c2.bench import fair
from c2.bench.generate_throughput import heldout_prompts, load_stage
from c2.infer import Engine, steps
from c2.model import init_params
from c2.model.presets import PRESETS


def decode_calls(engine: Engine, kv_len: int | None, calls: int, tokens: list):
    """A function running `calls` greedy decode calls attending kv_len slots (the state is
    donated and carried, so every call decodes the same rows one step further); each call's
    tokens [B] are appended to `tokens`."""

    def run():
        for _ in range(calls):
            engine._state, out = steps.decode(
                engine._params, engine.state, engine._base_key, spec=engine.spec, kv_len=kv_len
            )
            tokens.append(jax.device_get(out["tokens"])[0, :, 0])

    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m c2.bench.decode_prefix")
    ap.add_argument("--workdir", help="a pipeline workdir (DIR/<stage>/checkpoints)")
    ap.add_argument("--stage", default="cpt")
    ap.add_argument("--preset", default="tiny_kimi_k2", help="used when no --workdir is given")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cache_lens", default="224,316,528", help="engine max_len + 16 each")
    ap.add_argument("--filled", type=int, default=64, help="prompt tokens per row")
    ap.add_argument("--prefix", type=int, default=128)
    ap.add_argument("--calls", type=int, default=5, help="decode calls per timed run")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.filled + args.calls * (args.repeats + 1) >= args.prefix:
        ap.error(
            f"--filled {args.filled} + {args.calls} calls x {args.repeats + 1} rounds must stay "
            f"below --prefix {args.prefix}: every timed call has to fit the prefix"
        )
    if args.workdir:
        cfg, params, _ = load_stage(Path(args.workdir) / args.stage)
    else:
        cfg = PRESETS[args.preset]()
        params = init_params(cfg, jax.random.key(0))
    check = fair.load_check()
    prompts = heldout_prompts(args.batch, args.filled, cfg.vocab_size).tolist()
    results = []
    for cache_len in (int(s) for s in args.cache_lens.split(",")):
        engines, runs, tokens = {}, {}, {}
        for name, kv_len in ((f"prefix {args.prefix}", args.prefix), ("whole cache", None)):
            engine = Engine(params, cfg, max_slots=args.batch, max_len=cache_len - 16)
            for p in prompts:
                engine.submit(p, cache_len - 16 - args.filled)
            engine.step()  # admits every prompt (prefill) and decodes one step
            engines[name], tokens[name] = engine, []
            runs[name] = decode_calls(engine, kv_len, args.calls, tokens[name])
        timings, _ = fair.interleave(runs, args.repeats, pause=0.2)
        same = np.mean([np.array_equal(a, b) for a, b in zip(*tokens.values(), strict=True)])
        spec = engines["whole cache"].spec
        per_call = {n: t.median / args.calls * 1e3 for n, t in timings.items()}
        picked = steps.attend_len(spec, args.filled + 1)
        row = {
            "cache_len": spec.cache_len,
            "ms_per_call": per_call,
            "prefix_over_whole": per_call[f"prefix {args.prefix}"] / per_call["whole cache"],
            "attend_len_picks": picked,
            "identical_tokens": float(same),  # the calls whose greedy tokens agree, all rows
            "timings": {n: t.summary() for n, t in timings.items()},
        }
        results.append(row)
        print(
            f"cache {spec.cache_len}: prefix {args.prefix} {per_call[f'prefix {args.prefix}']:.2f}"
            f" ms, whole {per_call['whole cache']:.2f} ms per call "
            f"(prefix / whole {row['prefix_over_whole']:.2f}); attend_len picks {picked}; "
            f"identical tokens {same:.2f}",
            flush=True,
        )
    fair.finish(check)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "machine": platform.node(),
                    "batch": args.batch,
                    "filled": args.filled,
                    "prefix": args.prefix,
                    "load": check.record(),
                    "results": results,
                },
                indent=1,
            )
        )
    return {"results": results, "load": check.record()}


if __name__ == "__main__":
    main()
