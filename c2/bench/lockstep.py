"""What a multi-host engine's lockstep costs: one engine on a mesh over two processes (4 CPU
devices each, expert=4 x tensor=2, jax.distributed with gloo), driven two ways on the same
requests, rounds interleaved:

  replicated  both processes run the same script (what lockstep must reproduce, and its
              floor: no messages at all, but every process must know every request);
  lockstep    process 0 leads through a `LockstepEngine`, process 1 replays its messages
              (`lockstep.follow`, the coordination service's key-value store): the RL fleet's way.

    python -m c2.bench.lockstep [--slots 8] [--new_tokens 64] [--rounds 5] [--require_quiet]
        [--out c2/bench/results/lockstep_cpu.json]

Reports decode calls a second in each mode (medians, min-max), their ratio, the messages and
bytes a call, and the channel's own cost: messages a second through it alone. On a GPU
cluster a decode call takes tens of milliseconds and the messages the same as here, so the
ratio here (a tiny model, calls of a few ms) is a worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from c2.bench import fair

PROMPT_LEN = 24


def _session(engine, slots: int, new_tokens: int) -> int:
    """`slots` prompts to `new_tokens` tokens each; returns the decode calls made."""
    rng = np.random.default_rng(0)
    for _ in range(slots):
        engine.submit(rng.integers(1, 200, PROMPT_LEN).tolist(), max_new_tokens=new_tokens)
    calls = 0
    while engine.has_work():
        engine.step()
        calls += 1
    return calls


def _process(process_id: int, port: int, args: argparse.Namespace, out: str) -> None:
    import jax

    from c2 import distributed, model, sharding
    from c2.infer import lockstep
    from c2.infer.engine import Engine

    distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id
    )
    mesh = sharding.make_mesh(expert=4, tensor=2)
    distributed.warm_collectives(mesh)
    cfg = model.presets.get("tiny_kimi_k2", dtype="float32", mtp_depth=0)
    params = model.init_params(cfg, jax.random.key(0))
    max_len = PROMPT_LEN + args.new_tokens
    make = lambda: Engine(params, cfg, max_slots=args.slots, max_len=max_len, mesh=mesh)  # noqa: E731
    channel = distributed.Channel("bench")
    sent = {"bytes": 0, "messages": 0}

    def send(record):
        sent["bytes"] += len(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
        sent["messages"] += 1
        channel.send(record)

    def run(mode: str) -> tuple[float, int]:
        engine = make()
        distributed.barrier(f"{mode} start")
        t0 = time.perf_counter()
        if mode == "replicated":
            calls = _session(engine, args.slots, args.new_tokens)
        elif process_id == 0:
            leader = lockstep.LockstepEngine(engine, send)
            calls = _session(leader, args.slots, args.new_tokens)
            leader.close()
        else:
            calls = lockstep.follow(engine, channel.receive, lambda v: params)["steps"]
        seconds = time.perf_counter() - t0
        distributed.barrier(f"{mode} end")
        return seconds, calls

    results: dict = {"replicated": [], "lockstep": []}
    for mode in ("replicated", "lockstep"):  # warm-up: compiles
        run(mode)
    sent.update(bytes=0, messages=0)
    for r in range(args.rounds):
        for mode in ("replicated", "lockstep") if r % 2 == 0 else ("lockstep", "replicated"):
            seconds, calls = run(mode)
            results[mode].append(calls / seconds)
    results["calls"] = calls
    results["sent"] = dict(sent)
    # The channel alone: small messages, back to back.
    n = 2000
    distributed.barrier("channel start")
    t0 = time.perf_counter()
    for i in range(n):
        if process_id == 0:
            channel.send([("step", (), {"state": (i,)})])
        else:
            channel.receive(60.0)
    results["channel_messages_per_s"] = n / (time.perf_counter() - t0)
    distributed.barrier("channel end")
    if process_id == 0:
        Path(out).write_text(json.dumps(results))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="")
    p.add_argument("--require_quiet", action="store_true", help="refuse a busy machine")
    p.add_argument("--_process", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--_port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--_result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._process >= 0:
        _process(args._process, args._port, args, args._result)
        return {}
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    result = Path(os.environ.get("TMPDIR", "/tmp")) / f"c2-lockstep-{os.getpid()}.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    # Load before and after only: the benchmark's own processes are children, which the
    # count of cores used by others would take for other load.
    check = fair.load_check(require_quiet=args.require_quiet, cpu=lambda: None)
    forwarded = [f"--slots={args.slots}", f"--new_tokens={args.new_tokens}"]
    forwarded += [f"--rounds={args.rounds}", f"--_port={port}", f"--_result={result}"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "c2.bench.lockstep", f"--_process={i}", *forwarded], env=env
        )  # fmt: skip
        for i in range(2)
    ]
    codes = [proc.wait(timeout=3600) for proc in procs]
    if codes != [0, 0]:
        raise SystemExit(f"the benchmark's processes exited with {codes}")
    fair.finish(check, cpu=lambda: None)
    raw = json.loads(result.read_text())
    result.unlink()
    med = {m: float(np.median(raw[m])) for m in ("replicated", "lockstep")}
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": fair.processor(),
        "load_before": check.before[0],
        "load_after": check.after[0],
        "command": "python -m c2.bench.lockstep " + " ".join(sys.argv[1:]),
        "slots": args.slots,
        "new_tokens": args.new_tokens,
        "decode_calls": raw["calls"],
        "calls_per_s": {
            m: {"median": med[m], "min": min(raw[m]), "max": max(raw[m])} for m in med
        },  # fmt: skip
        "lockstep_vs_replicated": med["lockstep"] / med["replicated"],
        "messages_per_call": raw["sent"]["messages"] / (args.rounds * raw["calls"]),
        "bytes_per_call": raw["sent"]["bytes"] / (args.rounds * raw["calls"]),
        "channel_messages_per_s": raw["channel_messages_per_s"],
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
