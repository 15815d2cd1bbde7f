"""The engine on a mesh: the one-device engine's tokens, logprobs and recorded experts, with
weights, slots and KV cache where the sharding rules put them; speculative decoding and
in-flight weight updates (arriving on a device outside the mesh) on the mesh; bad meshes
refused before anything compiles."""

import dataclasses

import jax
import numpy as np
import pytest
from conftest import ENGINE, MAX_LEN, log_softmax
from jax.sharding import PartitionSpec as P

from c2 import sharding
from c2.infer import Engine, engine_layout, generate, steps
from c2.infer.engine_layout import weight_shardings

PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(16)), list(range(3, 20)), list(range(30, 60))]
SLOTS = ("data", "fsdp", "expert")  # the `batch` rule: the engine's slots

# Where the rules put each array (the stacked weights; the engine's per-layer arrays drop the
# leading layer axis), and the KV cache: MLA's latent is split by slots only.
KIMI_LAYOUT = {
    "weights": {
        ("embed",): P("tensor", "fsdp"),
        ("moe_layers", "mlp", "w_gate"): P(None, "expert", None, None),
        ("moe_layers", "mlp", "w_down"): P(None, "expert", None, None),
        ("moe_layers", "mlp", "shared", "w_up"): P(None, "fsdp", "tensor"),
        ("moe_layers", "attn", "wkv_b"): P(None, None, "tensor", None),
        ("moe_layers", "attn", "wo"): P(None, "tensor", None, "fsdp"),
        ("dense_layers", "mlp", "w_gate"): P(None, "fsdp", "tensor"),
        ("mtp", "block", "mlp", "w_up"): P(None, "expert", None, None),
    },
    "cache": {"latent": P(SLOTS, None, None), "k_rope": P(SLOTS, None, None)},
}
QWEN_LAYOUT = {
    "weights": {
        ("lm_head",): P("fsdp", "tensor"),
        ("moe_layers", "attn", "wk"): P(None, "fsdp", "tensor", None),
        ("moe_layers", "attn", "wq"): P(None, "fsdp", "tensor", None),
        ("moe_layers", "mlp", "w_up"): P(None, "expert", None, None),
    },
    "cache": {"k": P(SLOTS, None, "tensor", None), "v": P(SLOTS, None, "tensor", None)},
}


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _assert_layout(engine, layout, mesh):
    """Each listed array's actual sharding is the rules' (per layer: the layer axis dropped),
    on the mesh's devices; every state array splits its slots; `weight_shardings` agrees."""
    shardings = weight_shardings(engine.cfg, mesh)
    for path, spec in layout["weights"].items():
        assert _get(shardings, path).spec == spec, path
        want = jax.sharding.NamedSharding(mesh, spec if len(path) == 1 else P(*spec[1:]))
        group = _get(engine._params, path[:1])
        for arr in [group] if len(path) == 1 else [_get(layer, path[1:]) for layer in group]:
            assert arr.sharding.is_equivalent_to(want, arr.ndim), (path, arr.sharding)
            assert arr.sharding.device_set == set(mesh.devices.flat)
    for group in ("dense", "moe"):
        for layer in engine.state["cache"].get(group, []):
            for name, spec in layout["cache"].items():
                want = jax.sharding.NamedSharding(mesh, spec)
                assert layer[name].sharding.is_equivalent_to(want, 4 if name in "kv" else 3)
    slots = jax.sharding.NamedSharding(mesh, P(SLOTS))
    for name in ("tok", "phase", "rid", "n_gen", "temperature"):
        assert engine.state[name].sharding.is_equivalent_to(slots, 1), name
    assert engine.state["cache"]["pos"].sharding.is_equivalent_to(slots, 1)


@pytest.mark.parametrize(
    "family, spec, layout",
    [("kimi", "expert=2,tensor=2", KIMI_LAYOUT), ("qwen", "data=2,tensor=2", QWEN_LAYOUT)],
)
def test_mesh_engine_equals_one_device(family, spec, layout, request):
    """Greedy tokens, logprobs (fp32) and the recorded experts of prompt and generated tokens
    equal the one-device engine's, batched prefill and continuous batching included; weights,
    KV cache and slots lie where the rules say, after decoding too."""
    m = request.getfixturevalue(family)
    mesh = sharding.mesh_from_spec(spec)
    want = generate(m.params, m.cfg, PROMPTS, 10, **ENGINE)
    engine = Engine(m.params, m.cfg, max_slots=4, max_len=MAX_LEN, prefill_chunk=16, mesh=mesh)
    got = engine.generate(PROMPTS, 10)
    for a, b in zip(want, got):
        assert b.tokens.tolist() == a.tokens.tolist()
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
        np.testing.assert_array_equal(b.routed_experts, a.routed_experts)
        np.testing.assert_array_equal(b.prompt_routed_experts, a.prompt_routed_experts)
    _assert_layout(engine, layout, mesh)


def test_speculative_and_weight_update_in_flight_on_a_mesh(kimi):
    """MTP speculative decoding on an expert x tensor mesh, new weights arriving mid-flight on a
    device outside the mesh (rebuilding the cache): the tokens before are the old weights'
    greedy ones, after it the new weights' greedy continuation, with the full forward's
    logprobs; the experts recorded are the ones the new weights route; the new weights sit in
    the rules' shards."""
    mesh = sharding.mesh_from_spec("expert=2,tensor=2")
    outside = jax.devices()[-1]
    assert outside not in set(mesh.devices.flat)
    new = jax.device_get(jax.tree.map(lambda a: a * 1.5, kimi.params))  # the reference's
    engine = Engine(
        kimi.params,
        kimi.cfg,
        max_slots=2,
        max_len=MAX_LEN,
        prefill_chunk=16,
        speculative=True,
        recompute_kv=True,
        mesh=mesh,
    )
    prompt = PROMPTS[1]
    engine.submit(prompt, 10)
    engine.step()  # prefill and one verify pass under version 0
    engine.update_weights(jax.device_put(new, outside), version=1)
    out = []
    while engine.has_work():
        out += engine.step()
    (comp,) = out
    n_old = int((comp.versions == 0).sum())
    assert 2 <= n_old < 10 and comp.versions.tolist() == [0] * n_old + [1] * (10 - n_old)
    old = comp.tokens[:n_old].tolist()
    assert old == kimi.greedy(prompt, n_old)
    assert comp.tokens[n_old:].tolist() == kimi.greedy(prompt + old, 10 - n_old, params=new)
    full = prompt + comp.tokens.tolist()
    lp = np.concatenate(
        [
            log_softmax(kimi.logits(full)[len(prompt) - 1 : len(prompt) - 1 + n_old]),
            log_softmax(kimi.logits(full, params=new)[len(prompt) - 1 + n_old : -1]),
        ]
    )
    np.testing.assert_allclose(comp.logprobs, lp[np.arange(10), comp.tokens], atol=2e-5)
    routing = np.concatenate([comp.prompt_routed_experts, comp.routed_experts])
    live = kimi.live_routing(full, params=new)
    assert np.mean(np.sort(routing, -1) == np.sort(live, -1)) > 0.99
    assert engine.stats["weight_updates"] == 1 and engine.stats["accepted"] > 0
    _assert_layout(engine, KIMI_LAYOUT, mesh)


@pytest.fixture
def no_compile(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("compiled/ran a step for a bad mesh")

    for name in ("feed", "decode", "init_state", "set_rows"):
        monkeypatch.setattr(steps, name, fail)
    monkeypatch.setattr(engine_layout, "place_weights", fail)


@pytest.mark.parametrize(
    "spec, slots, match",
    [
        ("context=2", 4, "context=2, expected 1"),
        ("data=2,expert=2", 6, "max_slots=6 is not divisible by .* = 4"),
        ("tensor=8", 8, "ModelConfig.n_heads=4 is not divisible by mesh axes tensor"),
    ],
)
def test_bad_mesh_fails_before_compiling(kimi, no_compile, spec, slots, match):
    with pytest.raises(ValueError, match=match):
        Engine(kimi.params, kimi.cfg, max_slots=slots, mesh=sharding.mesh_from_spec(spec))


def test_weights_not_matching_the_config_are_named(kimi):
    params = {k: v for k, v in kimi.params.items() if k != "lm_head"}
    with pytest.raises(ValueError, match=r"missing \[\"\['lm_head'\]\"\], unexpected \[\]"):
        Engine(params, kimi.cfg, max_slots=4, mesh=sharding.mesh_from_spec("expert=2,tensor=2"))


def test_the_rl_stage_engine_takes_its_mesh_from_the_config():
    """`config.rl.rollout_mesh` on this process's first devices, under the stage's rules (the
    weights the trainer hands over are laid out for the same one); "" is one device."""
    from c2.rl.config import rl_stage_defaults
    from c2.rl.engine_weights import engine_mesh

    config = rl_stage_defaults()
    assert engine_mesh(config) is None
    config.rl.rollout_mesh = "expert=2,tensor=2"
    config.mesh.rules = {"mlp": None}
    layout = engine_mesh(config)
    assert dict(layout.mesh.shape) == dict(data=1, fsdp=1, expert=2, context=1, tensor=2)
    assert list(layout.mesh.devices.flat) == jax.local_devices()[:4]
    assert layout.rules == {**sharding.RULES, "mlp": None}


def test_generate_rounds_its_slots_up_to_the_mesh(kimi, monkeypatch):
    """Five prompts on a mesh splitting slots over data x expert = 4: eight slots."""
    from c2.infer import engine as engine_module

    seen = {}

    class Spy:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

        def generate(self, prompts, max_new_tokens):
            return []

    monkeypatch.setattr(engine_module, "Engine", Spy)
    mesh = sharding.mesh_from_spec("data=2,expert=2")
    generate(kimi.params, kimi.cfg, PROMPTS, 4, mesh=mesh)
    assert seen["max_slots"] == 8 and seen["mesh"] is mesh


def test_an_eval_run_names_a_bad_engine_mesh_and_may_change_it_on_resume(tmp_path):
    from c2.eval import run

    with pytest.raises(ValueError, match="--engine_mesh: mesh spec 'experts=2'"):
        run.RunOptions(engine_mesh="experts=2")
    meta = {"policy": "runs/x", "tasks_dir": "/t"}
    before = meta | {"options": dataclasses.asdict(run.RunOptions())}
    run.check_resume(before, meta, run.RunOptions(engine_mesh="expert=2,tensor=2"), tmp_path)
