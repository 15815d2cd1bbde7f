"""The weight store (c2/rl/weight_sync.py) measured: delta size at RL rates, latency, pause.

    python -m c2.bench.weight_sync [--steps 12] [--out c2/bench/results/weight_sync.json]
    python -m c2.bench.weight_sync --scale        # -> c2/bench/results/weight_sync_scale.json

For each model (the tiny Kimi-K2 preset and a >=100M-parameter one built with `init_params`) and
each learning rate (Adam, 1e-6 and 1e-5): float32 masters take `--steps` real Adam steps on the
next-token loss of random token batches; every step is published as a new version (version 0 is
the anchor; then deltas only) and a subscriber fetches each one. Reported: stored bytes per
version over the full serving-dtype (bf16) size, first delta, mean, and the mean of the last four
(Adam's update settles after its first steps: `m/sqrt(v)` shrinks as noisy gradients average
out); publish and fetch latency and MB/s (of the full bf16 model) for file:// and for a real
S3-protocol server on the loopback (moto, when installed); the engine's pause per weight swap
with a BackgroundFetcher feeding a tiny engine. Ends with a projection for Kimi-K2 (1.04T, bf16).

`--scale` (S3 only) measures what grows with the fleet and the history instead: HTTP requests
per idle poll (counted at the moto server) with 10 and 200 versions in the store, and publish
and fetch latency (publish end to delivery at each follower) with 1, 8 and 64 subscribers, each
a WeightSubscriber following on its own BackgroundFetcher thread (poll 50 ms) in this process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from c2 import model
from c2.infer import Engine
from c2.rl import weight_sync as ws

MODELS = {
    "tiny_kimi_k2": {},
    # >= 100M parameters: the tiny preset's shape, wider and with a real vocabulary.
    "kimi_k2_190m": dict(
        vocab_size=32000, d_model=512, n_layers=6, n_experts=32, d_ff_expert=512, d_ff=1536
    ),
}
LRS = (1e-6, 1e-5)
KIMI_K2_PARAMS = 1.04e12


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def build(name: str):
    cfg = model.presets.get("tiny_kimi_k2", dtype="float32", **MODELS[name])
    params = model.init_params(cfg, jax.random.key(0))
    return cfg, params


def adam_trajectory(cfg, params, lr: float, steps: int, seed: int = 0):
    """Yields the float32 masters after each of `steps` Adam steps (version 1, 2, ...)."""

    def loss(p, tokens):
        logits, _ = model.forward(p, tokens[:, :-1], cfg)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    opt = optax.adam(lr)

    @jax.jit
    def step(p, state, tokens):
        updates, state = opt.update(jax.grad(loss)(p, tokens), state, p)
        return optax.apply_updates(p, updates), state

    rng = np.random.default_rng(seed)
    state = opt.init(params)
    for _ in range(steps):
        tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 65)), jnp.int32)
        params, state = step(params, state, tokens)
        yield jax.block_until_ready(params)  # the step's time is not the publisher's


class Target:
    """One store with its publisher and a subscriber that fetches every version."""

    def __init__(self, name: str, url: str):
        self.name, self.url = name, url
        self.pub = ws.WeightPublisher(url, full_every=1_000_000)  # one anchor, then deltas
        self.sub = ws.WeightSubscriber(url, register=False)
        self.published: list[ws.Published] = []
        self.fetch_s: list[float] = []

    def version(self, params, v: int) -> None:
        self.published.append(self.pub.publish(params, v))
        t0 = time.perf_counter()
        got, fetched = self.sub.fetch(v)
        jax.block_until_ready(fetched)
        self.fetch_s.append(time.perf_counter() - t0)
        assert got == v

    def latency(self) -> dict:
        full_mb = self.published[0].full_bytes / 1e6
        anchor, deltas = self.published[0], self.published[1:]
        pub_delta = statistics.median(p.seconds for p in deltas)
        fetch_delta = statistics.median(self.fetch_s[1:])
        return {
            "store": self.name,
            "versions": len(self.published),
            "full_mb": round(full_mb, 1),
            "publish_anchor_s": round(anchor.seconds, 3),
            "publish_delta_s": round(pub_delta, 3),
            "fetch_anchor_s": round(self.fetch_s[0], 3),
            "fetch_delta_s": round(fetch_delta, 3),
            "publish_anchor_mb_s": round(full_mb / anchor.seconds, 1),
            "publish_delta_mb_s": round(full_mb / pub_delta, 1),
            "fetch_anchor_mb_s": round(full_mb / self.fetch_s[0], 1),
            "fetch_delta_mb_s": round(full_mb / fetch_delta, 1),
        }

    def close(self) -> None:
        self.pub.close()
        self.sub.close()


def measure(name: str, lr: float, steps: int, workdir: pathlib.Path, s3_url: str | None) -> dict:
    cfg, params = build(name)
    params = jax.block_until_ready(params)
    # Warm up: the first publication compiles one cast per tensor shape (once per process).
    ws.WeightPublisher(workdir / f"warmup_{name}_{lr:g}").publish(params, 0)
    targets = [Target("file://", f"file://{workdir / f'{name}_{lr:g}'}")]
    if s3_url is not None and lr == LRS[0]:  # the S3 server: the first 4 versions
        targets.append(Target("s3 (moto, loopback)", f"{s3_url}/{name}"))
    for t in targets:
        t.version(params, 0)
    for v, masters in enumerate(adam_trajectory(cfg, params, lr, steps), start=1):
        for t in targets:
            if t.name == "file://" or v < 4:
                t.version(masters, v)
    ratios = [p.stored_bytes / p.full_bytes for p in targets[0].published[1:]]
    out = {
        "model": name,
        "params": int(sum(x.size for x in jax.tree.leaves(params))),
        "lr": lr,
        "steps": steps,
        "full_bytes": targets[0].published[0].full_bytes,
        "anchor_ratio": round(
            targets[0].published[0].stored_bytes / targets[0].published[0].full_bytes, 4
        ),
        "delta_ratio_first": round(ratios[0], 4),
        "delta_ratio_mean": round(statistics.mean(ratios), 4),
        "delta_ratio_last4": round(statistics.mean(ratios[-4:]), 4),
        "delta_ratios": [round(r, 4) for r in ratios],
        "latency": [t.latency() for t in targets],
    }
    for t in targets:
        t.close()
    print(json.dumps({k: v for k, v in out.items() if k != "delta_ratios"}), flush=True)
    return out


def engine_pause(workdir: pathlib.Path, versions: int = 5) -> dict:
    """A tiny engine decodes while a BackgroundFetcher fetches, decodes and hands over versions."""
    cfg, params = build("tiny_kimi_k2")
    url = f"file://{workdir / 'engine'}"
    pub = ws.WeightPublisher(url, full_every=4)
    pub.publish(params, 0)
    sub = ws.WeightSubscriber(url, register=False)
    version, served = sub.fetch()
    engine = Engine(served, cfg, max_slots=4, max_len=256, prefill_chunk=16, version=version)
    engine.generate([[1, 2, 3]], 4)  # compile before timing
    with sub.follow(engine, poll_s=0.01) as fetcher:
        for v, masters in enumerate(adam_trajectory(cfg, params, 1e-5, versions), start=1):
            pub.publish(masters, v)
            engine.submit(list(range(1, 9)), 32)
            while engine.has_work():  # decoding while the fetcher works
                engine.step()
            fetcher.wait_for(v, timeout=120)
            engine.step()
    s = engine.stats
    return {
        "weight_updates": s["weight_updates"],
        "update_pause_s_total": s["update_pause_s"],
        "pause_per_update_us": round(1e6 * s["update_pause_s"] / max(1, s["weight_updates"]), 1),
        "fetch_s_per_version": round(sub.stats["fetch_s"] / max(1, sub.stats["fetches"]), 4),
        "fetch_errors": [str(e) for e in fetcher.errors],
    }


def kimi_projection(ratio: float, worker_gbit_s: float, store_tbit_s: float, workers: int) -> dict:
    """Bytes per version and time for `workers` replicas to pull one version from the store: each
    replica at `worker_gbit_s`, the store serving `store_tbit_s` in all (the slower governs)."""
    full = 2 * KIMI_K2_PARAMS  # bf16
    delta = ratio * full
    per_worker_s = delta * 8 / (worker_gbit_s * 1e9)
    aggregate_s = workers * delta * 8 / (store_tbit_s * 1e12)
    return {
        "full_bf16_gb": round(full / 1e9, 1),
        "delta_ratio": ratio,
        "delta_gb": round(delta / 1e9, 1),
        "workers": workers,
        "worker_gbit_s": worker_gbit_s,
        "store_tbit_s": store_tbit_s,
        "seconds_to_all_workers": round(max(per_worker_s, aggregate_s), 1),
        "seconds_full_anchor_to_all_workers": round(
            max(full * 8 / (worker_gbit_s * 1e9), workers * full * 8 / (store_tbit_s * 1e12)), 1
        ),
    }


class HttpCount:
    """WSGI middleware counting the requests the S3 server answers."""

    def __init__(self, app):
        self.app, self.n = app, 0

    def __call__(self, environ, start_response):
        self.n += 1
        return self.app(environ, start_response)


def _nudged(params, rng):
    """Params after a step-like change (every float moved by 1e-3 * a random sign)."""
    move = lambda x: x + 1e-3 * np.sign(rng.standard_normal(x.shape)).astype(x.dtype)  # noqa: E731
    return jax.tree.map(lambda x: move(x) if x.dtype == jnp.float32 else x, params)


def poll_cost(url: str, counter: HttpCount, histories=(10, 200), polls: int = 20) -> list[dict]:
    """HTTP requests per idle poll (the follower holds the newest version) at each history."""
    _, params = build("tiny_kimi_k2")
    rng = np.random.default_rng(0)
    pub = ws.WeightPublisher(url, full_every=16)
    out, v = [], 0
    for n in histories:
        while v < n:
            params = _nudged(params, rng)
            pub.publish(params, v)
            v += 1
        sub = ws.WeightSubscriber(url, register=False)
        fetcher = ws.BackgroundFetcher(sub, lambda p, version: None)
        fetcher.poll_once()
        before = counter.n
        for _ in range(polls):
            assert fetcher.poll_once() is None
        out.append({"versions": n, "http_requests_per_poll": (counter.n - before) / polls})
        sub.close()
    pub.close()
    return out


def fleet_latency(url: str, counter: HttpCount, subscribers: int, versions: int = 4) -> dict:
    """Publish `versions` deltas to `subscribers` followers; latency and requests per poll."""
    _, params = build("tiny_kimi_k2")
    rng = np.random.default_rng(1)
    pub = ws.WeightPublisher(url, full_every=1_000_000)
    pub.publish(params, 0)
    arrived: dict[int, list[float]] = {}
    subs = [ws.WeightSubscriber(url) for _ in range(subscribers)]
    for s in subs:
        s.fetch()
    fetchers = [
        ws.BackgroundFetcher(s, lambda p, v: arrived.setdefault(v, []).append(time.perf_counter()),
                             poll_s=0.05).start()
        for s in subs
    ]  # fmt: skip
    reads0, http0, t0 = sum(s.store.requests["read"] for s in subs), counter.n, time.perf_counter()
    time.sleep(2.0)  # idle: every request is a poll
    polls = sum(s.store.requests["read"] for s in subs) - reads0
    idle = {"polls_per_s": round(polls / (time.perf_counter() - t0), 1)}
    idle["http_requests_per_poll"] = round((counter.n - http0) / max(1, polls), 3)
    publish_s, fetch_s = [], []
    for v in range(1, versions + 1):
        params = _nudged(params, rng)
        p = pub.publish(params, v)
        end = time.perf_counter()
        for f in fetchers:
            f.wait_for(v, timeout=300)
        publish_s.append(p.seconds)
        fetch_s += [t - end for t in arrived.get(v, [])]
    for f in fetchers:
        f.stop()
    errors = sum(len(f.errors) for f in fetchers)
    for s in subs:
        s.close()
    pub.close()
    return {
        "subscribers": subscribers,
        **idle,
        "publish_delta_s_median": round(statistics.median(publish_s), 3),
        "fetch_delta_s_median": round(statistics.median(fetch_s), 3),
        "fetch_delta_s_max": round(max(fetch_s), 3),
        "deliveries": len(fetch_s),
        "fetch_errors": errors,
    }


def scale(fleets=(1, 8, 64)) -> dict:
    server, s3_url = start_s3()
    if server is None:
        raise SystemExit("--scale needs moto (pip install -e '.[test]')")
    counter = HttpCount(server._server.app)
    server._server.app = counter  # every request the server answers passes through it
    out = {"poll_cost": poll_cost(f"{s3_url}/history", counter)}
    print(json.dumps(out["poll_cost"]), flush=True)
    out["fleet"] = []
    for n in fleets:
        out["fleet"].append(fleet_latency(f"{s3_url}/fleet{n}", counter, n))
        print(json.dumps(out["fleet"][-1]), flush=True)
    server.stop()
    return out


def start_s3():
    """moto's S3 server on the loopback and a bucket; None where moto is not installed."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("moto not installed (pip install -e '.[test]'): no S3 measurement")
        return None, None
    for k, v in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="weights"
    )
    os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
    return server, "s3://weights/bench"


def table(results: list[dict]) -> str:
    rows = [
        "| model | params | lr | full bf16 | anchor | first delta | mean delta | last-4 delta |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['lr']:g} | "
            f"{r['full_bytes'] / 1e6:.1f} MB | {100 * r['anchor_ratio']:.1f}% | "
            f"{100 * r['delta_ratio_first']:.2f}% | {100 * r['delta_ratio_mean']:.2f}% | "
            f"{100 * r['delta_ratio_last4']:.2f}% |"
        )
    rows += [
        "",
        "| model | lr | store | publish anchor | publish delta | fetch anchor | fetch delta |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for lat in r["latency"]:
            rows.append(
                f"| {r['model']} | {r['lr']:g} | {lat['store']} | "
                f"{lat['publish_anchor_s']:.2f} s ({lat['publish_anchor_mb_s']:.0f} MB/s) | "
                f"{lat['publish_delta_s']:.2f} s ({lat['publish_delta_mb_s']:.0f} MB/s) | "
                f"{lat['fetch_anchor_s']:.2f} s ({lat['fetch_anchor_mb_s']:.0f} MB/s) | "
                f"{lat['fetch_delta_s']:.2f} s ({lat['fetch_delta_mb_s']:.0f} MB/s) |"
            )
    return "\n".join(rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="Adam steps (versions) per run")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no_s3", action="store_true")
    parser.add_argument("--worker_gbit_s", type=float, default=100.0)
    parser.add_argument("--store_tbit_s", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--scale", action="store_true", help="polls and fleets on moto S3 only")
    parser.add_argument("--out", default=None, help="default: results/weight_sync[_scale].json")
    args = parser.parse_args(argv)
    before = load_average()
    print(f"load average before: {before}", flush=True)
    if args.scale:
        return _write(args, argv, before, scale())
    server, s3_url = (None, None) if args.no_s3 else start_s3()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for lr in LRS:
                results.append(measure(name, lr, args.steps, pathlib.Path(tmp), s3_url))
        pause = engine_pause(pathlib.Path(tmp))
    if server is not None:
        server.stop()
    print(json.dumps(pause))
    big = [r for r in results if r["lr"] == LRS[0]][-1]
    projection = kimi_projection(
        big["delta_ratio_last4"], args.worker_gbit_s, args.store_tbit_s, args.workers
    )
    report = {
        "results": results,
        "engine": pause,
        "kimi_k2_projection": projection,
    }
    print(table(results))
    print(json.dumps(projection))
    return _write(args, argv, before, report)


def _write(args, argv, before: list[float], report: dict) -> dict:
    """Stamp the report (date, machine, load, command) and write it to --out."""
    after = load_average()
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores",
        "load_average_before": before,
        "load_average_after": after,
        "command": " ".join(["python -m c2.bench.weight_sync", *(argv or sys.argv[1:])]),
        **report,
    }
    print(f"load average after: {after}")
    name = "weight_sync_scale.json" if args.scale else "weight_sync.json"
    out = pathlib.Path(args.out or f"c2/bench/results/{name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
