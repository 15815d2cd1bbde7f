"""A mesh that cannot shard the model fails before jax sees a sharding, naming the config field.

Every test sees 8 simulated CPU devices (tests/conftest.py).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model, sharding
from c2.model import presets


def _fails(match: str):
    return pytest.raises(ValueError, match=re.escape(match))


def test_tensor_axis_must_divide_n_kv_heads():
    c = presets.get("tiny_qwen3_moe")  # 4 query heads, 2 kv heads: tensor=4 divides only the first
    assert (c.n_heads, c.n_kv_heads) == (4, 2)
    mesh = sharding.make_mesh(data=2, tensor=4)
    msg = "ModelConfig.n_kv_heads=2 is not divisible by mesh axes tensor of size 4"
    with _fails(msg):
        model.init_params(c, jax.random.key(0), mesh)
    with _fails(msg):
        model.param_shardings(c, mesh)
    # The forward names it too (its activations are constrained by the same rule).
    toks = jnp.zeros((2, 16), jnp.int32)
    with _fails("n_kv_heads=2 is not divisible by mesh axes tensor of size 4"):
        model.forward(model.abstract_params(c), toks, c, mesh=mesh)


def test_expert_axis_must_divide_n_experts():
    c = presets.get("tiny_qwen3_moe", n_experts=12)
    with _fails("ModelConfig.n_experts=12 is not divisible by mesh axes expert of size 8"):
        model.init_params(c, jax.random.key(0), sharding.make_mesh(expert=8))


def test_every_indivisible_field_is_named_at_once():
    # n_heads over tensor, and the shared expert's width (d_ff_expert * n_shared_experts) over
    # tensor through the `mlp` rule; d_ff=384 and vocab_size=320 divide 8 and are not named.
    c = presets.get("tiny_kimi_k2", n_heads=6, d_ff_expert=100)
    with pytest.raises(ValueError) as err:
        model.init_params(c, jax.random.key(0), sharding.make_mesh(tensor=8))
    msg = str(err.value)
    assert "ModelConfig.n_heads=6 is not divisible by mesh axes tensor of size 8" in msg
    assert "ModelConfig.d_ff_expert * n_shared_experts=100 is not divisible" in msg
    assert "d_ff=" not in msg and "vocab_size" not in msg
    # d_ff_expert itself is sharded by no default rule; mapped onto the tensor axis, it is named.
    c = presets.get("tiny_kimi_k2", d_ff_expert=98, n_shared_experts=0)
    mesh = sharding.make_mesh(data=2, tensor=4)
    model.param_shardings(c, mesh)
    with _fails("ModelConfig.d_ff_expert=98 is not divisible by mesh axes tensor of size 4"):
        model.param_shardings(c, mesh, {**sharding.RULES, "expert_mlp": "tensor"})
    # Several mesh axes on one logical axis: their product must divide it.
    rules = {**sharding.RULES, "embed": ("fsdp", "tensor"), "vocab": None, "mlp": None}
    rules |= {"heads": None, "kv_heads": None}
    mesh = sharding.make_mesh(fsdp=2, tensor=4)
    model.param_shardings(presets.get("tiny_kimi_k2", d_model=136), mesh, rules)
    with _fails("ModelConfig.d_model=132 is not divisible by mesh axes fsdp x tensor of size 8"):
        model.param_shardings(presets.get("tiny_kimi_k2", d_model=132), mesh, rules)


def test_the_check_follows_the_rules():
    """kv heads replicated by a rule: the mesh that could not shard them now initialises."""
    c = presets.get("tiny_qwen3_moe")
    mesh = sharding.make_mesh(data=2, tensor=4)
    rules = {**sharding.RULES, "kv_heads": None}
    p = model.init_params(c, jax.random.key(0), mesh, rules)
    assert p["moe_layers"]["attn"]["wk"].sharding.spec[2] is None  # kv heads whole
    assert p["moe_layers"]["attn"]["wq"].sharding.shard_shape((2, 128, 4, 32)) == (2, 128, 1, 32)


def test_a_divisible_mesh_initialises_in_shards():
    c = presets.get("tiny_qwen3_moe")  # 2 kv heads over tensor=2, 16 experts over expert=2
    mesh = sharding.make_mesh(fsdp=2, expert=2, tensor=2)
    p = model.init_params(c, jax.random.key(0), mesh)
    wk, w_up = p["moe_layers"]["attn"]["wk"], p["moe_layers"]["mlp"]["w_up"]
    # [layers, d_model / fsdp, kv heads / tensor, head_dim]
    assert wk.sharding.shard_shape(wk.shape) == (4, 64, 1, 32)
    assert w_up.sharding.shard_shape(w_up.shape) == (4, 8, 128, 64)  # experts over expert
    # The same values as an unsharded init: parameters are keyed by name, not by layout.
    ref = model.init_params(c, jax.random.key(0))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), p, ref)
