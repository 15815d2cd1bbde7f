"""c2 vs transformers on whole models: checkpoint import, export, FP8, sharded loading, bad input.

Parity criterion everywhere: max |c2 - HF| <= 1e-4 x max |HF logits|, float32 on CPU.
"""

from __future__ import annotations

import json
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from c2 import sharding  # noqa: E402
from c2.model import abstract_params, forward, hf, param_shardings, presets  # noqa: E402
from c2.model.hf_config import config_from_hf, config_to_hf  # noqa: E402

YARN_DS = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.7,
}
PARITY_CONFIGS = {
    # DeepSeek-V3's shape: q low-rank, group-limited routing, 2 dense layers, YaRN, mscale_all_dim.
    "deepseek_qlora_groups_yarn": (
        "deepseek_v3",
        dict(
            n_group=4, topk_group=2, first_k_dense_replace=2, num_hidden_layers=4,
            rope_parameters=YARN_DS,
        ),
    ),
    # Full-rank q, no groups, tied embeddings, DeepSeek's rotate-half option.
    "deepseek_full_q_tied": (
        "deepseek_v3",
        dict(q_lora_rank=None, tie_word_embeddings=True, rope_interleave=False),
    ),
    # Kimi-K2's YaRN (beta_fast = beta_slow = 1, factor 32) and routing (one group, scale 2.827).
    "kimi_k2_yarn": (
        "deepseek_v3",
        dict(
            routed_scaling_factor=2.827,
            rope_parameters=dict(YARN_DS, factor=32.0, beta_fast=1.0, mscale_all_dim=1.0),
        ),
    ),
    "qwen3_gqa_norm_topk": ("qwen3_moe", dict(norm_topk_prob=True)),
    # No top-k renormalisation, a dense first layer (mlp_only_layers), YaRN without mscale.
    "qwen3_no_norm_topk_dense_yarn": (
        "qwen3_moe",
        dict(
            norm_topk_prob=False, mlp_only_layers=[0], num_hidden_layers=3,
            rope_parameters={
                "rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
}  # fmt: skip
B = 2
TOKENS = np.random.RandomState(0).randint(0, 96, (B, 20))


def hf_logits(model, tokens=TOKENS) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.numpy()


def c2_logits(params, cfg, tokens=TOKENS) -> np.ndarray:
    fwd = jax.jit(forward, static_argnames="cfg")
    return np.asarray(fwd(params, jnp.asarray(tokens), cfg=cfg)[0])


def assert_trees_equal(a, b):
    chex.assert_trees_all_equal_structs(a, b)
    chex.assert_trees_all_equal(jax.device_get(a), jax.device_get(b))


@pytest.mark.parametrize("name", list(PARITY_CONFIGS))
def test_logits_match_transformers(name, hf_model, assert_parity, tmp_path):
    family, overrides = PARITY_CONFIGS[name]
    model = hf_model(family, **overrides)
    model.save_pretrained(tmp_path)
    cfg, params = hf.load_hf_checkpoint(tmp_path)  # defaults: a float32 checkpoint computes in fp32
    assert cfg.family == family and cfg.param_dtype == "float32" and cfg.dtype == "float32"
    ref = hf_logits(model)
    for impl in ("ragged", "dense"):
        assert_parity(c2_logits(params, cfg.replace(moe_impl=impl)), ref)


@pytest.mark.parametrize("name", ["deepseek_qlora_groups_yarn", "qwen3_gqa_norm_topk"])
def test_cached_decoding_matches_transformers(name, hf_model, to_c2, assert_parity):
    """Prefill then one-token decode steps (MLA attends in the latent space) vs HF's logits."""
    from c2.model import decode_step, init_cache, prefill

    family, overrides = PARITY_CONFIGS[name]
    model = hf_model(family, **overrides)
    cfg, params = to_c2(model)
    ref = hf_logits(model)
    n_prompt = 14
    cache = init_cache(cfg, B, TOKENS.shape[1])
    lengths = jnp.full((B,), n_prompt, jnp.int32)
    logits, _, cache = prefill(params, jnp.asarray(TOKENS[:, :n_prompt]), cache, lengths, cfg=cfg)
    assert_parity(logits, ref[:, :n_prompt])
    for pos in range(n_prompt, TOKENS.shape[1]):
        logits, _, cache = decode_step(
            params, jnp.asarray(TOKENS[:, pos : pos + 1]), cache, cfg=cfg
        )
        assert_parity(logits[:, 0], ref[:, pos])


def test_save_pretrained_writes_per_expert_and_fused_layout_loads_the_same(
    hf_model, to_c2, tmp_path
):
    """transformers 5 saves experts one by one; its in-memory state_dict fuses them."""
    model = hf_model("deepseek_v3")
    model.save_pretrained(tmp_path)
    src = hf.SafetensorsSource(tmp_path)
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in src
    assert "model.layers.1.mlp.experts.gate_up_proj" in model.state_dict()
    _, from_files = hf.load_hf_checkpoint(tmp_path)
    _, from_fused = to_c2(model)
    assert_trees_equal(from_files, from_fused)


def test_param_dtype_follows_the_checkpoint(hf_model, tmp_path):
    """bf16 checkpoints load as bf16 (router and bias stay float32); float32 stays float32."""
    model = hf_model("deepseek_v3").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    cfg, params = hf.load_hf_checkpoint(tmp_path)
    assert cfg.param_dtype == "bfloat16"
    assert params["embed"].dtype == jnp.bfloat16
    assert params["moe_layers"]["mlp"]["router"].dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(params["lm_head"], np.float32), model.lm_head.weight.detach().float().numpy().T
    )
    cfg32, params32 = hf.load_hf_checkpoint(tmp_path, dtype="float32")
    assert cfg32.param_dtype == "float32" and params32["embed"].dtype == jnp.float32


def test_greedy_generation_with_default_load_matches_transformers(hf_model, tmp_path):
    """What a new user does: save with transformers, load with the defaults, decode greedily. The
    tokens are transformers' greedy choices and the recorded logprobs its log-softmax."""
    from c2.infer import generate

    model = hf_model("qwen3_moe")
    model.save_pretrained(tmp_path)
    cfg, params = hf.load_hf_checkpoint(tmp_path)
    prompts = [TOKENS[0, :8].tolist(), TOKENS[1, :5].tolist()]
    for prompt, comp in zip(prompts, generate(params, cfg, prompts, 6)):
        seq = np.concatenate([prompt, comp.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.as_tensor(seq[None])).logits[0].double(), -1)
        logp = logp.numpy()[len(prompt) - 1 : -1]
        np.testing.assert_array_equal(comp.tokens, logp.argmax(-1))
        chosen = np.take_along_axis(logp, comp.tokens[:, None], -1)[:, 0]
        np.testing.assert_allclose(comp.logprobs, chosen, atol=1e-5)


def test_compute_dtype_follows_config_json_unless_asked(hf_model, tmp_path):
    """config.json's dtype sets ModelConfig.dtype; `compute_dtype=` overrides it."""
    model = hf_model("qwen3_moe")
    model.save_pretrained(tmp_path / "fp32")
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"
    assert hf.load_hf_checkpoint(tmp_path / "fp32")[0].dtype == "float32"
    cfg, params = hf.load_hf_checkpoint(tmp_path / "fp32", compute_dtype="bfloat16")
    assert cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"
    # bf16 compute is what the old default gave: visibly off transformers' fp32 logits.
    ref = hf_logits(model)
    err = np.abs(c2_logits(params, cfg) - ref).max() / np.abs(ref).max()
    assert err > 1e-3, err
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert hf.load_hf_checkpoint(tmp_path / "bf16")[0].dtype == "bfloat16"
    # transformers 4.x writes torch_dtype; a config without either falls back to the params'.
    hf_cfg = json.loads((tmp_path / "fp32" / "config.json").read_text())
    assert hf.checkpoint_dtype({**hf_cfg, "dtype": None, "torch_dtype": "bfloat16"}) == "bfloat16"
    assert hf.checkpoint_dtype({**hf_cfg, "dtype": None}) is None
    with pytest.raises(ValueError, match="dtype='int8'"):
        hf.checkpoint_dtype({**hf_cfg, "dtype": "int8"})


def _quantise_fp8(w: torch.Tensor, block: int = 128):
    """Block FP8 as in the DeepSeek-V3 release: w ~= fp8 * scale_inv per 128x128 block."""
    rows, cols = w.shape
    nr, nc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(nr * block, nc * block)
    padded[:rows, :cols] = w
    blocks = padded.view(nr, block, nc, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0  # [nr, nc]
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (
        (q.float() * scale[:, None, :, None])
        .view(nr * block, nc * block)[:rows, :cols]
        .contiguous()
    )
    return q.view(nr * block, nc * block)[:rows, :cols].contiguous(), scale, deq


def test_block_fp8_checkpoint_is_dequantised(hf_model, tmp_path):
    from safetensors.torch import save_file

    # vocab 320 > 128 puts block boundaries inside lm_head, and inside its vocab shards below.
    model = hf_model("deepseek_v3", vocab_size=320)
    quant, plain = {}, {}
    for name, w in model.state_dict().items():
        w = w.detach().contiguous()
        if name.endswith("proj.weight") or name == "lm_head.weight":
            q, scale, deq = _quantise_fp8(w)
            quant[name], quant[name + "_scale_inv"], plain[name] = q, scale, deq
        else:
            quant[name] = plain[name] = w
    config = json.loads(model.config.to_json_string())
    (tmp_path / "fp8").mkdir()
    (tmp_path / "ref").mkdir()
    save_file(quant, tmp_path / "fp8/model.safetensors")
    save_file(plain, tmp_path / "ref/model.safetensors")
    quant_cfg = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "fp8/config.json").write_text(
        json.dumps(config | {"quantization_config": quant_cfg})
    )
    (tmp_path / "ref/config.json").write_text(json.dumps(config))

    cfg, params = hf.load_hf_checkpoint(tmp_path / "fp8", dtype="float32")
    _, reference = hf.load_hf_checkpoint(tmp_path / "ref", dtype="float32")
    assert_trees_equal(params, reference)
    assert not np.array_equal(params["lm_head"], model.lm_head.weight.detach().numpy().T)
    mesh = sharding.make_mesh(fsdp=2, expert=2, tensor=2)
    _, sharded = hf.load_hf_checkpoint(tmp_path / "fp8", dtype="float32", mesh=mesh)
    assert_trees_equal(sharded, reference)
    # Scales without a quantization_config are not silently dropped.
    (tmp_path / "fp8/config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unexpected tensors.*weight_scale_inv"):
        hf.load_hf_checkpoint(tmp_path / "fp8")


def test_sharded_load_reads_only_each_devices_slices(hf_model, tmp_path, monkeypatch):
    model = hf_model("deepseek_v3", vocab_size=128)
    model.save_pretrained(tmp_path, max_shard_size="20KB")  # several files + index.json
    assert (tmp_path / "model.safetensors.index.json").exists()
    cfg, full = hf.load_hf_checkpoint(tmp_path)

    reads = []
    read = hf.SafetensorsSource.read
    monkeypatch.setattr(
        hf.SafetensorsSource,
        "read",
        lambda self, name, index: (
            reads.append((name, read(self, name, index).shape)) or read(self, name, index)
        ),
    )
    mesh = sharding.make_mesh(fsdp=2, expert=2, tensor=2)
    cfg_sharded, sharded = hf.load_hf_checkpoint(tmp_path, mesh=mesh)
    assert cfg_sharded == cfg
    assert_trees_equal(sharded, full)
    jax.tree.map(lambda x, s: chex.assert_equal(x.sharding, s), sharded, param_shardings(cfg, mesh))
    # The embedding [vocab 128 over tensor, embed 32 over fsdp]: only quarter blocks are read.
    embed_reads = {shape for name, shape in reads if name == "model.embed_tokens.weight"}
    assert embed_reads == {(64, 16)}
    # Experts are split over `expert`: each read is one expert's [I, H] slice, H split over fsdp.
    expert_reads = {s for n, s in reads if n.endswith("experts.0.gate_proj.weight")}
    assert expert_reads == {(16, 32)}


# Tiny versions of the presets (seconds to compile), each keeping its family's features.
TINY = {
    "deepseek_v3": dict(
        vocab_size=96, d_model=32, d_ff=48, d_ff_expert=16, n_heads=2, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_experts=8, n_experts_per_token=3,
        n_group=4, topk_group=2, n_layers=3,
    ),
    "kimi_k2": dict(
        vocab_size=96, d_model=32, d_ff=48, d_ff_expert=16, n_heads=2, q_lora_rank=12,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_experts=8,
        n_experts_per_token=3, n_layers=3,
    ),
    "qwen3_moe": dict(
        vocab_size=96, d_model=32, d_ff=48, d_ff_expert=16, n_heads=4, n_kv_heads=2, head_dim=8,
        n_experts=8, n_experts_per_token=3, n_layers=2,
    ),
}  # fmt: skip


def tiny(name: str, **kw):
    return presets.get(f"tiny_{name}", **TINY[name], param_dtype="float32", dtype="float32", **kw)


def random_params(cfg, seed: int = 0) -> dict:
    """c2 parameters with decisive routing: norms near 1, a non-zero router bias."""
    rng = np.random.RandomState(seed)

    def leaf(path, a):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return 1.0 + 0.2 * rng.standard_normal(a.shape).astype(np.float32)
        if "router_bias" in name:
            return 0.3 * rng.standard_normal(a.shape).astype(np.float32)
        std = cfg.d_model**-0.5 if "router" in name else 0.1
        return (std * rng.standard_normal(a.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(leaf, abstract_params(cfg))


def test_mtp_layers_export_and_import(assert_parity, tmp_path):
    """DeepSeek MTP layers live at model.layers.{n_layers + d}; transformers ignores them."""
    cfg = tiny("deepseek_v3", mtp_depth=1)
    params = random_params(cfg)
    hf.export_hf_checkpoint(params, cfg, tmp_path)
    src = hf.SafetensorsSource(tmp_path)
    for suffix in (
        "eh_proj.weight",
        "enorm.weight",
        "shared_head.head.weight",
        "embed_tokens.weight",
    ):
        assert f"model.layers.3.{suffix}" in src
    cfg2, params2 = hf.load_hf_checkpoint(tmp_path)
    assert cfg2 == cfg  # the compute dtype follows config.json's (float32) dtype
    assert_trees_equal(params2, params)
    # A checkpoint without them (what save_pretrained writes) imports with mtp_depth 0.
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert model.config.num_nextn_predict_layers == 1
    model.save_pretrained(tmp_path / "resaved")
    cfg3, params3 = hf.load_hf_checkpoint(tmp_path / "resaved")
    assert cfg3.mtp_depth == 0 and "mtp" not in params3
    assert_parity(c2_logits(params3, cfg3), hf_logits(model))


@pytest.mark.parametrize("name", ["kimi_k2", "qwen3_moe"])
def test_export_loads_in_transformers_with_the_same_logits(name, assert_parity, tmp_path):
    cfg = tiny(name)
    params = random_params(cfg, seed=1)
    hf.export_hf_checkpoint(params, cfg, tmp_path, max_shard_bytes=20_000)
    assert (tmp_path / "model.safetensors.index.json").exists()
    exported = config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert exported == cfg.replace(dtype="bfloat16")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert_parity(c2_logits(params, cfg), hf_logits(model))


def test_orbax_cli_round_trip(hf_model, tmp_path):
    model = hf_model("qwen3_moe")
    model.save_pretrained(tmp_path / "hf")
    args = ["--dtype", "bfloat16", "--mesh", "fsdp=2,expert=2,tensor=2"]  # saved from shards
    hf.main(["import", str(tmp_path / "hf"), str(tmp_path / "orbax"), *args])
    cfg, params = hf.load_orbax(tmp_path / "orbax")
    assert cfg.param_dtype == "bfloat16" and params["embed"].dtype == jnp.bfloat16
    assert params["moe_layers"]["mlp"]["router"].dtype == jnp.float32
    _, direct = hf.load_hf_checkpoint(tmp_path / "hf", dtype="bfloat16")
    assert_trees_equal(params, direct)
    mesh = sharding.make_mesh(expert=8)
    _, sharded = hf.load_orbax(tmp_path / "orbax", mesh=mesh)
    assert (
        sharded["moe_layers"]["mlp"]["w_up"].sharding
        == param_shardings(cfg, mesh)["moe_layers"]["mlp"]["w_up"]
    )
    hf.main(["export", str(tmp_path / "orbax"), str(tmp_path / "out")])
    _, again = hf.load_hf_checkpoint(tmp_path / "out")
    assert_trees_equal(again, params)


# Real release configs map onto c2's presets ------------------------------------------------------

KIMI_K2_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 163584,
    "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 131072, "model_type": "kimi_k2", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
    "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn",
    },
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.48.3", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 163840,
}  # fmt: skip
DEEPSEEK_V3_CONFIG = KIMI_K2_CONFIG | {
    "model_type": "deepseek_v3", "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "max_position_embeddings": 163840, "n_group": 8,
    "n_routed_experts": 256, "num_attention_heads": 128, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "rope_theta": 10000, "routed_scaling_factor": 2.5,
    "topk_group": 4, "vocab_size": 129280,
    "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn",
    },
}  # fmt: skip
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


@pytest.mark.parametrize(
    "hf_cfg,preset",
    [
        (KIMI_K2_CONFIG, presets.kimi_k2()),
        (DEEPSEEK_V3_CONFIG, presets.deepseek_v3()),
        (QWEN3_30B_A3B_CONFIG, presets.qwen3_30b_a3b()),
        ({"model_type": "kimi_k25", "text_config": KIMI_K2_CONFIG}, presets.kimi_k2()),
    ],
)
def test_release_configs_map_to_presets(hf_cfg, preset):
    assert config_from_hf(hf_cfg) == preset
    assert config_from_hf(config_to_hf(preset)) == preset


# Bad input ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ds_state(hf_model):
    model = hf_model("deepseek_v3")
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return state, json.loads(model.config.to_json_string())


def test_missing_tensor_is_named(ds_state):
    state, config = ds_state
    broken = {k: v for k, v in state.items() if k != "model.layers.2.self_attn.kv_b_proj.weight"}
    with pytest.raises(
        ValueError, match=r"missing tensors.*model\.layers\.2\.self_attn\.kv_b_proj"
    ):
        hf.from_hf_source(hf.DictSource(broken), config)


def test_extra_tensor_is_named(ds_state):
    state, config = ds_state
    extra = dict(state, **{"model.layers.1.self_attn.q_bias": np.zeros(4, np.float32)})
    with pytest.raises(
        ValueError, match=r"unexpected tensors.*model\.layers\.1\.self_attn\.q_bias"
    ):
        hf.from_hf_source(hf.DictSource(extra), config)


def test_wrong_shape_is_named_with_both_shapes(ds_state):
    state, config = ds_state
    name = "model.layers.0.self_attn.o_proj.weight"
    bad = dict(state, **{name: np.zeros((32, 33), np.float32)})
    with pytest.raises(ValueError, match=rf"{name}: expected shape \[32, 32\], found \[32, 33\]"):
        hf.from_hf_source(hf.DictSource(bad), config)


def test_prefixed_multimodal_checkpoint_loads(ds_state):
    """Kimi-K2.5-style wrappers: text_config and a language_model. weight prefix."""
    state, config = ds_state
    wrapped = {f"language_model.{k}": v for k, v in state.items()}
    cfg, params = hf.from_hf_source(hf.DictSource(wrapped), {"text_config": config})
    _, plain = hf.from_hf_source(hf.DictSource(state), config)
    assert cfg.family == "deepseek_v3"
    assert_trees_equal(params, plain)


DS_MIN = json.loads(transformers.DeepseekV3Config(num_hidden_layers=4).to_json_string())
QWEN_MIN = json.loads(transformers.Qwen3MoeConfig(num_hidden_layers=2).to_json_string())


@pytest.mark.parametrize(
    "base,field,value",
    [
        (DS_MIN, "attention_bias", True),
        (DS_MIN, "hidden_act", "gelu"),
        (DS_MIN, "topk_method", "group_limited_greedy"),
        (DS_MIN, "scoring_func", "softmax"),
        (DS_MIN, "moe_layer_freq", 2),
        (DS_MIN, "attention_dropout", 0.1),
        (DS_MIN, "qk_layernorm", True),  # unknown field
        (QWEN_MIN, "use_sliding_window", True),
        (QWEN_MIN, "decoder_sparse_step", 2),
        (QWEN_MIN, "mlp_only_layers", [1]),
        (QWEN_MIN, "layer_types", ["sliding_attention", "full_attention"]),
    ],
)
def test_unsupported_config_field_is_named(base, field, value):
    needle = re.escape(f"{field}={value!r}") if field != "qk_layernorm" else field
    with pytest.raises(ValueError, match=needle):
        config_from_hf(dict(base, **{field: value}))


@pytest.mark.parametrize(
    "rope,needle",
    [
        ({"rope_type": "linear", "factor": 2.0}, "'linear'"),
        ({"rope_type": "dynamic", "factor": 2.0}, "'dynamic'"),
        ({"rope_type": "llama3", "factor": 8.0}, "'llama3'"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 3.0}, "attention_factor=3.0"),
        ({"rope_type": "yarn", "factor": 4.0, "low_freq_factor": 1.0}, "low_freq_factor"),
    ],
)
def test_unsupported_rope_is_named(rope, needle):
    with pytest.raises(ValueError, match=needle):
        config_from_hf(dict(DS_MIN, rope_parameters={"rope_theta": 1e4, **rope}))


def test_unsupported_quantization_is_named(ds_state):
    state, config = ds_state
    q = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    with pytest.raises(ValueError, match="quantization_config.*compressed-tensors"):
        hf.from_hf_source(hf.DictSource(state), dict(config, quantization_config=q))


def test_unknown_fields_pass_when_not_strict():
    cfg = config_from_hf(dict(DS_MIN, qk_layernorm=True), strict=False)
    assert cfg == config_from_hf(DS_MIN)
