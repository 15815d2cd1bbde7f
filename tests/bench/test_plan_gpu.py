"""c2.bench.plan compiled device-less for GPUs (`compile_for="h200"`): XLA:GPU's own memory
analysis for a mesh of GPUs that are not here. Needs the CUDA PJRT plugin (`pip install
"jax[cuda12]"`, no GPU); skips without it.

Checked on a small config over 8 H200s (fsdp 4 x expert 2): the plan's parameter + optimiser +
batch bytes equal the CPU plan's (the exact shard shapes); the GPU code paths are the ones
compiled (the expert exchange is `ragged-all-to-all`, which XLA:CPU cannot compile); the
temporaries are of the CPU compile's size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "jax_plugins.xla_cuda12", reason='needs the CUDA PJRT plugin: pip install "jax[cuda12]"'
)

ROOT = Path(__file__).parents[2]

# The plugin must see JAX on the CPU platform before the backends start: a fresh process.
SCRIPT = """
import json, os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, {tests!r})
from test_plan import _small_config
from c2.bench import plan as plan_lib
config = _small_config(n_layers=4, remat=True)
for target in ("h200", "cpu"):
    result = plan_lib.plan(config, device_memory_gb=1.0, compile_for=target, log=lambda *_: None)
    print("RESULT", json.dumps(result))
"""


def test_device_less_h200_plan_compiles_the_gpu_step():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=str(ROOT / "tests" / "bench"))],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    gpu, cpu = (
        json.loads(x.removeprefix("RESULT "))
        for x in out.stdout.splitlines()
        if x.startswith("RESULT ")
    )
    assert gpu["compile_for"] == "h200" and gpu["devices"] == 8
    (gpu,) = gpu["stages"].values()
    (cpu,) = cpu["stages"].values()
    # The GPU's expert exchange (XLA:CPU cannot compile it, so the CPU plan pads instead).
    assert gpu["collectives_in_program"]["ragged-all-to-all"]["count"] > 0
    assert cpu["collectives_in_program"]["ragged-all-to-all"]["count"] == 0
    # The same sharded state and batch: the GPU executable's arguments are the exact shards.
    for key in ("parameters", "optimiser state", "batch"):
        assert gpu["bytes"][key] == cpu["bytes"][key], key
    # The same step, compiled by another compiler: temporaries of the same size, not equal.
    assert 0.5 < gpu["bytes"]["temporaries"] / cpu["bytes"]["temporaries"] < 1.5
    assert gpu["fits"] and gpu["per_device_bytes"] < 1e9
