"""pallas_kernels/bench_gpu.py runs end to end (`--smoke`: tiny shapes, interpret mode on CPU).

GPU minutes are scarce: this catches a script that would crash or mis-check before it gets one.
Speed numbers from a CPU are meaningless and not looked at; every correctness check must pass.
The model-level section c2/bench/kernels_gpu.py adds (the tiny Kimi-K2 with the kernels on, 2
minutes of compiles in interpret mode) is left out here: tests/model/test_model_kernels.py
checks the same kernels in the same model on CPU, more tightly (bit-level, not error excess).
"""

import json

import jax

from pallas_kernels import bench_gpu


def test_bench_gpu_smoke_run_passes_every_check(tmp_path):
    bench_gpu.main(["--out", str(tmp_path), "--smoke"])
    data = json.loads((tmp_path / "bench_gpu.json").read_text())
    failed = [name for name, check in data["correctness"].items() if not check["ok"]]
    assert not failed, {name: data["correctness"][name] for name in failed}
    # XLA:CPU has no scaled_matmul: its two sections fail there, and nothing else may.
    on_gpu = jax.default_backend() == "gpu"
    assert len(data["correctness"]) == (11 if on_gpu else 10)
    errors = sorted(e["section"] for e in data["errors"])
    assert errors == ([] if on_gpu else ["jax.nn.scaled_matmul 96", "scaled_matmul cross-check"])
    for key in ("mxfp8_pallas_tflops", "bf16_tflops", "quantize_ms_per_operand"):
        assert data["matmul"][0][key] > 0
    for key in ("mxfp8_pallas_fwd_bwd_tflops", "bf16_ragged_dot_fwd_bwd_tflops"):
        assert data["grouped"][key] > 0
    assert data["router_replay"]["pallas_gbps"] > 0
