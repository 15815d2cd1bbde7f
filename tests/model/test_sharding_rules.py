"""One set of sharding rules: a `Layout` (mesh + rules) lays out weights and activations alike,
and rules that put two dimensions of one array on one mesh axis are refused by name.

Every test sees 8 simulated CPU devices (tests/conftest.py).
"""

from __future__ import annotations

import re

import chex
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import model, sharding
from c2.train import lm
from c2.train.config import ConfigError, stage_defaults, validate_stage

# Batch over data x fsdp x tensor, heads whole: the tensor axis moves from heads to the batch.
BATCH_ON_TENSOR = {
    **sharding.RULES,
    "batch": ("data", "fsdp", "tensor"),
    "heads": None,
    "kv_heads": None,
}


@pytest.fixture
def constraints(monkeypatch):
    """The (shape, PartitionSpec) of every sharding constraint traced while it is active."""
    seen, original = [], jax.lax.with_sharding_constraint

    def spy(x, s):
        seen.append((tuple(x.shape), s.spec))
        return original(x, s)

    monkeypatch.setattr(jax.lax, "with_sharding_constraint", spy)
    return seen


def _loss(p, toks, c, mesh):
    logits, aux = model.forward(p, toks, c, mesh=mesh, return_hidden=True)
    return jnp.mean(jax.nn.logsumexp(logits, -1)) + aux["balance_loss"], (logits, aux["hidden"])


def test_overridden_rules_move_the_activations(constraints):
    """Under a Layout the forward constrains its activations by the layout's rules (the default
    rules' q spec is not the override's), the compiled hidden state is sharded that way, and
    logits and gradients equal the single-device ones."""
    c = model.presets.get("tiny_qwen3_moe", dtype="float32")  # GQA: 4 heads, 2 kv heads
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (8, 16), 0, c.vocab_size, jnp.int32)
    step = jax.jit(jax.value_and_grad(_loss, has_aux=True), static_argnums=(2, 3))
    ref = step(p, toks, c, None)

    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    q_shape = (8, 16, c.n_heads, c.head_dim)
    default = P(sharding.BATCH_AXES, "context", "tensor", None)
    jax.eval_shape(lambda p: model.forward(p, toks, c, mesh=mesh), p)  # a bare mesh: RULES
    assert (q_shape, default) in constraints

    layout = sharding.Layout(mesh, BATCH_ON_TENSOR)
    ps = model.init_params(c, jax.random.key(0), layout)
    assert ps["moe_layers"]["attn"]["wq"].sharding.spec == P(None, "fsdp", None, None)
    batch = ("data", "fsdp", "tensor")
    assert sharding.batch_sharding(layout).spec == P(batch, "context")
    toks_l = jax.device_put(toks, sharding.batch_sharding(layout))
    constraints.clear()
    hidden = step.lower(ps, toks_l, c, layout).compile().output_shardings[0][1][1]
    assert (q_shape, P(batch, "context", None, None)) in constraints
    assert (q_shape, default) not in constraints
    # The embedding table is gathered along its embed dim before the lookup (its vocab rule
    # kept); every other constraint is an activation's, batch first.
    table = (c.vocab_size, c.d_model)
    assert (table, P(BATCH_ON_TENSOR["vocab"], None)) in constraints
    assert all(spec[0] == batch for shape, spec in constraints if shape != table), constraints
    want = NamedSharding(mesh, P(batch, "context", None))
    assert hidden.is_equivalent_to(want, 3), hidden

    out = step(ps, toks_l, c, layout)
    chex.assert_trees_all_close(out, ref, atol=2e-5, rtol=1e-5)


def test_the_ring_runs_over_the_sequence_rule():
    """seq over context x tensor: ring attention passes keys around those 4 shards (not the
    context axis alone) and gives the single-device dense logits and gradients."""
    c = model.presets.get(
        "tiny_kimi_k2",
        dtype="float32",
        n_layers=2,
        mtp_depth=0,
        attention_block_q=4,
        attention_block_kv=4,
    )
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 16), 0, c.vocab_size, jnp.int32)
    step = jax.jit(jax.value_and_grad(_loss, has_aux=True), static_argnums=(2, 3))
    ref = step(p, toks, c.replace(attention_impl="dense"), None)
    rules = {**sharding.RULES, "seq": ("context", "tensor"), "heads": None, "kv_heads": None}
    layout = sharding.Layout(sharding.make_mesh(data=2, context=2, tensor=2), rules)
    ps = model.init_params(c, jax.random.key(0), layout)
    toks = jax.device_put(toks, sharding.batch_sharding(layout))
    out = step(ps, toks, c.replace(attention_impl="blockwise"), layout)
    chex.assert_trees_all_close(out, ref, atol=2e-5, rtol=1e-5)


def _raises(*names: str):
    pattern = ".*".join(re.escape(repr(n)) for n in names)
    return pytest.raises(ValueError, match=pattern)


def test_two_dimensions_on_one_mesh_axis_raise():
    rules = {**sharding.RULES, "heads": "fsdp"}
    with _raises("batch", "heads", "fsdp"):
        sharding.logical_to_spec(("batch", "seq", "heads", None), rules)
    # One axis inside a tuple rule collides too, and a weight names its parameter.
    rules = {**sharding.RULES, "embed": ("fsdp", "tensor")}
    c = model.presets.get("tiny_qwen3_moe")
    with pytest.raises(ValueError, match=r"parameter \['embed'\]: .*'vocab' and 'embed'.*'tensor'"):
        model.param_shardings(c, sharding.make_mesh(fsdp=2, tensor=4), rules)
    # An activation's: the forward refuses before compiling anything.
    rules = {**sharding.RULES, "heads": "fsdp", "kv_heads": "fsdp"}
    layout = sharding.Layout(sharding.make_mesh(data=2, fsdp=2, tensor=2), rules)
    toks = jnp.zeros((8, 16), jnp.int32)
    with _raises("batch", "heads", "fsdp"):
        jax.eval_shape(lambda p: model.forward(p, toks, c, mesh=layout), model.abstract_params(c))
    # Batch and sequence share every token array: refused when the layout is made.
    with _raises("batch", "seq", "data"):
        sharding.Layout(layout.mesh, {**sharding.RULES, "seq": "data"})
    cfg = stage_defaults()
    cfg.mesh.rules.seq = "fsdp"
    with pytest.raises(ConfigError, match=r"config\.mesh\.rules: .*'batch' and 'seq'.*'fsdp'"):
        validate_stage(cfg, 8)


def test_a_layout_is_one_value():
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    layout = sharding.Layout(mesh, BATCH_ON_TENSOR)
    assert sharding.as_layout(mesh) == sharding.Layout(mesh)  # a bare mesh: the default rules
    assert sharding.as_layout(layout) is layout and sharding.mesh_of(layout) is mesh
    # Equal however the table is ordered: a static jit argument, like a mesh.
    shuffled = sharding.Layout(mesh, dict(reversed(list(BATCH_ON_TENSOR.items()))))
    assert shuffled == layout and hash(shuffled) == hash(layout)
    assert sharding.token_axes(layout) == ("data", "fsdp", "tensor", "context")
    assert sharding.token_axes(mesh) == sharding.TOKEN_AXES
    c = model.presets.get("tiny_qwen3_moe")
    chex.assert_trees_all_equal(
        model.param_shardings(c, layout), model.param_shardings(c, mesh, BATCH_ON_TENSOR)
    )
    with pytest.raises(ValueError, match="carries its own sharding rules"):
        model.param_shardings(c, layout, sharding.RULES)
    with pytest.raises(ValueError, match=r"lack logical axes \['vocab'\]"):
        sharding.Layout(mesh, {k: v for k, v in sharding.RULES.items() if k != "vocab"})
    with pytest.raises(ValueError, match="heads='model': 'model' is not an axis of the mesh"):
        sharding.Layout(mesh, {**sharding.RULES, "heads": "model"})
    with pytest.raises(ValueError, match="experts='tensor': expert parallelism runs over"):
        sharding.Layout(mesh, {**sharding.RULES, "experts": "tensor"})


def test_the_stage_takes_its_rules_to_the_activations(constraints):
    """`config.mesh.rules` reaches the training task's weights, batches and loss alike."""
    c = stage_defaults()
    c.model.dtype = "float32"
    for k, v in dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, d_ff_expert=16).items():
        c.model.overrides[k] = v
    c.data.seq_len, c.data.batch_size = 32, 8
    c.train.progress_bar, c.train.measure_peak = False, False
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    for k in ("batch", "heads", "kv_heads"):
        c.mesh.rules[k] = BATCH_ON_TENSOR[k]
    task = lm.build_task(c)
    batch = ("data", "fsdp", "tensor")
    assert task.batch_sharding.spec == P(batch, "context")
    params = task.abstract_params
    assert params["moe_layers"]["attn"]["wkv_b"].sharding.spec == P(None, None, None, None)
    data = {
        k: jax.ShapeDtypeStruct((8, 32), jnp.int32, sharding=task.batch_sharding)
        for k in ("inputs", "targets", "segment_ids", "positions", "target_bytes")
    }
    data["loss_mask"] = jax.ShapeDtypeStruct((8, 32), jnp.float32, sharding=task.batch_sharding)
    jax.eval_shape(task.loss_fn, params, data, jax.random.key(0))
    cfg = lm.model_config(c)
    table = (cfg.vocab_size, cfg.d_model)  # the embedding table, gathered along embed
    assert (table, P(BATCH_ON_TENSOR["vocab"], None)) in constraints
    activations = [spec for shape, spec in constraints if shape != table]
    assert activations and all(spec[0] == batch for spec in activations), constraints


def test_a_mesh_spec_names_axis_sizes_and_bad_specs_say_what_is_wrong():
    assert sharding.parse_mesh("") == dict.fromkeys(sharding.MESH_AXES, 1)
    sizes = sharding.parse_mesh(" expert=4, tensor=2 ")
    assert sizes == {"data": 1, "fsdp": 1, "expert": 4, "context": 1, "tensor": 2}
    mesh = sharding.mesh_from_spec("expert=2,tensor=2")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "expert": 2, "context": 1, "tensor": 2}
    assert list(mesh.devices.flat) == jax.local_devices()[:4]
    for bad in ("experts=2", "tensor=0", "tensor", "tensor=-1"):
        with pytest.raises(ValueError, match=f"'{bad}' is not axis=size"):
            sharding.parse_mesh(bad)
    with pytest.raises(ValueError, match="needs 16 devices but 8"):
        sharding.mesh_from_spec("expert=4,tensor=4")
