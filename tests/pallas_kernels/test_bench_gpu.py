"""pallas_kernels/bench_gpu.py, with c2/bench/kernels_gpu.py's tiny-model check added, runs end to
end (`--smoke`: tiny shapes, interpret mode on CPU).

GPU minutes are scarce: this catches a script that would crash or mis-check before it gets one.
Speed numbers from a CPU are meaningless and not looked at; every correctness check must pass.
"""

import json

import jax

from c2.bench import kernels_gpu


def test_bench_gpu_smoke_run_passes_every_check(tmp_path):
    kernels_gpu.main(["--out", str(tmp_path), "--smoke"])
    data = json.loads((tmp_path / "bench_gpu.json").read_text())
    failed = [name for name, check in data["correctness"].items() if not check["ok"]]
    assert not failed, {name: data["correctness"][name] for name in failed}
    # XLA:CPU has no scaled_matmul: its two sections fail there, and nothing else may.
    on_gpu = jax.default_backend() == "gpu"
    assert len(data["correctness"]) == (13 if on_gpu else 12)
    assert {"tiny_model_router_kernel_vs_xla", "tiny_model_mxfp8_kernels_vs_xla"} <= set(
        data["correctness"]
    )
    errors = sorted(e["section"] for e in data["errors"])
    assert errors == ([] if on_gpu else ["jax.nn.scaled_matmul 96", "scaled_matmul cross-check"])
    for key in ("mxfp8_pallas_tflops", "bf16_tflops", "quantize_ms_per_operand"):
        assert data["matmul"][0][key] > 0
    for key in ("mxfp8_pallas_fwd_bwd_tflops", "bf16_ragged_dot_fwd_bwd_tflops"):
        assert data["grouped"][key] > 0
    assert data["router_replay"]["pallas_gbps"] > 0
