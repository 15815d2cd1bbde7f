"""c2.bench.plan on small configs: each stage's plan is its programs compiled whole (no layer
scaling), an RL config has a trainer and an engine entry, and one that does not fit is named.

bf16 weights, not MXFP8, 1 dense + 2 MoE layers at the tiny widths, on 8 devices (fsdp 4 x
expert 2): the test checks what is compiled and counted, not the real model's numbers."""

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from c2 import model as model_lib
from c2 import sharding
from c2.bench import plan as plan_lib
from c2.bench import plan_compile
from c2.train import lm
from c2.train.config import load_config, sharding_rules

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def _small(config, n_layers: int = 3):
    config.model.dtype = "bfloat16"
    config.model.quant = "bf16"
    config.model.overrides.n_layers = n_layers
    config.model.overrides.remat = True
    config.mesh.data, config.mesh.fsdp, config.mesh.expert = 1, 4, 2
    config.mesh.rules.expert_embed = "fsdp"
    return config


def _small_config(n_layers: int = 3, remat: bool = True):
    config = _small(load_config(EXPERIMENTS / "cpt_tiny.py"), n_layers)
    config.model.overrides.remat = remat
    config.data.seq_len, config.data.batch_size = 64, 8
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


def _shard_bytes_by_hand(tree, mesh_shape: dict) -> int:
    """Each leaf's bytes over the product of the mesh axes its spec names (all divide here)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        split = 1
        for axes in leaf.sharding.spec:
            for axis in sharding.rule_axes(axes):
                split *= mesh_shape[axis]
        total += math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize // split
    return total


def test_lm_plan_is_the_whole_model_compiled(monkeypatch):
    config = _small_config()
    compiled = []
    compile_step = plan_compile.compile_step
    monkeypatch.setattr(
        plan_compile,
        "compile_step",
        lambda *a, **k: compiled.append(compile_step(*a, **k)) or compiled[-1],
    )
    result = plan_lib.plan(config, device_memory_gb=1.0, log=lambda *_: None)
    json.dumps(result)  # the JSON line the command prints
    entry = result["stages"][config.name]
    # One program, the whole model: every layer's stacked weights are its arguments.
    (program,) = compiled
    params = program.args_info[0][0]
    assert params["moe_layers"]["mlp"]["w_up"].shape[0] == 2
    assert params["dense_layers"]["mlp"]["w_up"].shape[0] == 1
    # The plan is that program's memory analysis, nothing scaled.
    mem = program.memory_analysis()
    whole = (
        mem.argument_size_in_bytes
        + max(mem.output_size_in_bytes - mem.alias_size_in_bytes, 0)
        + mem.temp_size_in_bytes
    )
    assert result["per_device_bytes"] == entry["per_device_bytes"] == whole
    assert sum(entry["bytes"].values()) == whole
    assert entry["bytes"]["temporaries"] == mem.temp_size_in_bytes
    # Parameters: every layer's shards, counted by hand from the specs.
    mesh_sizes, cfg = lm.validate(config, 8, load_files=False)
    layout = sharding.Layout(lm.make_mesh(mesh_sizes), sharding_rules(config))
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model_lib.abstract_params(cfg),
        model_lib.param_shardings(cfg, layout),
    )
    assert entry["bytes"]["parameters"] == _shard_bytes_by_hand(abstract, mesh_sizes)
    assert result["fits"] == (whole <= 1e9) and result["not_fitting"] == []
    assert entry["collectives_in_program"]["all-to-all"]["count"] > 0  # the expert exchange


def _small_rl_config():
    config = _small(load_config(EXPERIMENTS / "rl_tiny.py"))
    # The trainer on one device (its programs' sharding is the LM test's concern): cheap.
    config.mesh.fsdp, config.mesh.expert = 1, 1
    config.rl.group_size, config.rl.prompts_per_step, config.rl.micro_batch_size = 2, 4, 4
    config.rl.single_forward = False  # the policy's log-prob forward is a program of its own
    config.rl.seq_buckets = (64,)
    config.rl.rollout.engine_slots = 4
    config.rl.rollout_mesh = "expert=2"
    config.rl.pack_groups = False
    return config


def test_rl_plan_has_the_trainer_and_the_engine_and_names_what_does_not_fit():
    config = _small_rl_config()
    result = plan_lib.plan(config, device_memory_gb=1.0, log=lambda *_: None)
    json.dumps(result)
    trainer, engine = (result["stages"][f"{config.name}/{k}"] for k in ("trainer", "engine"))
    # The trainer's programs as the RL step runs them: both forwards and the RL update.
    assert set(trainer["programs"]) == {"reference log-probs", "policy log-probs", "update"}
    parts = trainer["bytes"]
    assert parts["reference parameters"] == parts["parameters"] > 0
    largest = max(p["extra"] for p in trainer["programs"].values())
    assert any(k.startswith("largest program") and v == largest for k, v in parts.items())
    # The local engine shares the trainer's devices: its bytes are in the trainer's.
    assert parts["rollout engine (same devices)"] == engine["per_device_bytes"]
    assert trainer["batch"] == 8 and trainer["seq_len"] == 64 and trainer["devices"] == 1
    # The engine's KV cache by hand: an MLA cache (latent + rope key) per layer, the 4 slots
    # split over expert=2, max(seq_buckets) + 16 positions, bf16.
    _, cfg = lm.validate(plan_lib.stage_shapes(config)[0], 1, load_files=False)
    per_slot = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * (64 + 16) * 2 * cfg.n_layers
    assert engine["bytes"]["KV cache"] == per_slot * 4 // 2 + 2 * 4  # + pos [slots] int32
    assert engine["devices"] == 2 and engine["mesh"]["expert"] == 2
    # A budget between the two: the trainer is named, the engine fits.
    budget = (trainer["per_device_bytes"] + engine["per_device_bytes"]) / 2
    small = plan_lib.summary(config.name, list(result["stages"].values()), budget / 1e9, print)
    assert small["fits"] is False
    assert small["not_fitting"] == [f"{config.name}/trainer"]
    assert small["stages"][f"{config.name}/engine"]["fits"] is True
    assert small["per_device_bytes"] == trainer["per_device_bytes"]


def test_set_reaches_any_config_field_and_names_a_missing_one():
    config = load_config(EXPERIMENTS / "rl_tiny.py")
    plan_lib._set_field(config, "remat=false")
    plan_lib._set_field(config, "rl.single_forward=False")
    plan_lib._set_field(config, "rl.seq_buckets=256,512")
    assert config.model.overrides.remat is False and config.rl.single_forward is False
    assert config.rl.seq_buckets == (256, 512)
    # A sharding rule may be new to the config's overrides, and change type.
    plan_lib._set_field(config, "mesh.rules.embed=fsdp,context")
    plan_lib._set_field(config, "mesh.rules.q_lora=fsdp")
    plan_lib._set_field(config, "mesh.rules.q_lora=fsdp,context")
    assert config.mesh.rules.embed == config.mesh.rules.q_lora == ("fsdp", "context")
    for item, said in [("rl.nope=1", "rl.nope"), ("nope.x=1", "nope"), ("remat", "FIELD=VALUE")]:
        with pytest.raises(SystemExit, match=said):
            plan_lib._set_field(config, item)
