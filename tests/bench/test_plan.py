"""c2.bench.plan's arithmetic on a small config: the plan compiles 1 dense + 2 MoE and 1 dense + 3
MoE layers and scales by the layer count; the full model (1 dense + 4 MoE) compiled whole must
agree with it (per device bytes within 10%, FLOPs within 2%), on a real 8-device mesh (fsdp 4 x
expert 2), both with the grouped-GEMM stand-in.

bf16 weights, not MXFP8: the scaling is what is checked, and MXFP8's quantisation ops make each
of the test's six compiles about 2.5x slower on a CPU."""

import json
from pathlib import Path

import pytest

from c2.bench import plan as plan_lib
from c2.train import lm
from c2.train.config import load_config

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def _small_config(n_layers: int, remat: bool):
    config = load_config(EXPERIMENTS / "cpt_tiny.py")
    config.model.dtype = "bfloat16"
    config.model.quant = "bf16"
    config.model.overrides.n_layers = n_layers
    config.model.overrides.remat = remat
    config.data.seq_len, config.data.batch_size = 64, 8
    config.mesh.data, config.mesh.fsdp, config.mesh.expert = 1, 4, 2
    config.mesh.rules.expert_embed = "fsdp"
    return config


def test_collectives_are_counted_from_hlo_text():
    hlo = """  %all-to-all = (f32[2,4]{1,0}, /*index=5*/f32[2,4]{1,0}) all-to-all(%a, %b)
  %ar = f32[16,4]{1,0} all-reduce(%p), channel_id=1
  ROOT %ag = bf16[8]{0} all-gather-start(%x)
  %ag2 = bf16[8]{0} all-gather-done(%ag)
  %ra = bf16[64,16]{1,0} ragged-all-to-all(%in, %out, %o1, %s1, %o2, %s2)"""
    got = plan_lib.collectives(hlo)
    assert got["all-to-all"] == {"count": 1, "bytes": 64}
    assert got["all-reduce"] == {"count": 1, "bytes": 256}
    assert got["all-gather"] == {"count": 1, "bytes": 16}
    assert got["ragged-all-to-all"] == {"count": 1, "bytes": 2048}
    assert got["reduce-scatter"]["count"] == 0


@pytest.mark.parametrize("remat", [True])
def test_plan_scaled_by_layers_matches_the_whole_model_compiled(remat):
    config = _small_config(n_layers=5, remat=remat)  # 1 dense + 4 MoE: one layer past the plan's
    result = plan_lib.plan(config, device_memory_gb=1.0, log=lambda *_: None)
    json.dumps(result)  # the JSON line the command prints
    mesh_sizes, cfg = lm.validate(config, 8, load_files=False)
    mesh = lm.make_mesh(mesh_sizes)
    from c2.quant import target

    # Both sides with the grouped-GEMM stand-in (the plan's default): the scaling is what is
    # checked here, and the CPU's own ragged_dot expansion would swamp the small model's bytes.
    with target.as_backend("gpu"), plan_lib.grouped_gemm_standin():
        whole = plan_lib.measure(cfg, config, mesh, 8, 64)
    measured = whole.argument + max(whole.output - whole.alias, 0) + whole.temp
    predicted = result["per_device_bytes"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
    assert abs(result["flops_per_device"] - whole.flops) <= 0.02 * whole.flops
    # Parameters + optimiser state: the exact shard shapes, as the whole compile's arguments.
    state = result["param_bytes"] + result["optimizer_bytes"] + result["batch_bytes"]
    assert abs(state - whole.argument) <= 0.01 * whole.argument
    assert result["fits"] == (predicted <= 1e9)
    assert result["collectives"]["all-to-all"]["count"] > 0  # the expert exchange
