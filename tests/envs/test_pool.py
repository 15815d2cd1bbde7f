"""The sandbox pool and the start-rate measurement behind c2/bench/sandbox_throughput.py."""

import json

import pytest

from c2.bench import sandbox_throughput
from c2.envs.pool import Job, SandboxPool, measure_start_rate


def test_pool_runs_concurrently_and_keeps_order(sandbox, workspace):
    # Each job waits (up to 10 s) until all six have started: only concurrent runs all see six.
    wait = (
        "touch started_{i}; for k in $(seq 200); do "
        '[ "$(ls started_* | wc -l)" -ge 6 ] && echo "{i} together" && exit 0; sleep 0.05; done; '
        'echo "{i} alone"'
    )
    jobs = [Job(wait.format(i=i), workspace) for i in range(6)]
    with SandboxPool(sandbox, workers=6) as pool:
        results = pool.map(jobs)
    assert [r.stdout for r in results] == [f"{i} together\n" for i in range(6)]


def test_pool_rejects_zero_workers(sandbox):
    with pytest.raises(ValueError, match="workers=0"):
        SandboxPool(sandbox, workers=0)


def test_measure_start_rate(sandbox):
    r = measure_start_rate(sandbox, n=12, workers=2)
    assert r.n == 12 and r.workers == 2 and r.starts_per_s > 0
    assert 0 < r.p50_first_output_ms <= r.p99_first_output_ms
    assert r.isolation == sandbox.isolation.describe()


def test_bench_script_prints_table_and_json(sandbox, capsys):
    assert sandbox_throughput.main(["--n", "6", "--workers", "1,2"]) == 0
    out = capsys.readouterr().out.strip().split("\n")
    rows = [json.loads(line) for line in out if line.startswith("{")]
    assert [r["workers"] for r in rows] == [1, 2] and all(r["n"] == 6 for r in rows)
