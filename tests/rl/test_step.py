"""The RL step: replayed log-probs equal the engine's, a policy-gradient step raises a rewarded
action's probability, micro-batch and device splits give the same update, frozen leaves stay
where they are, bad inputs are named.

One tiny float32 model; every learner is built once per module (compiles dominate the runtime).
"""

import dataclasses
import re
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from c2 import model, sharding
from c2.infer import Engine
from c2.rl import config as rl_config
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.objectives import EffortWeights, ObjectiveConfig
from c2.rl.records import Sample
from c2.rl.step import OUT_OF_SUPPORT_LOGP, RLLearner
from c2.train import lm
from c2.train.config import ConfigError, load_config, stage_defaults
from c2.train.metrics import BACKEND_COMPILE_EVENT
from c2.train.optimizer import make_optimizer, param_labels

EXPERIMENTS = Path(__file__).parents[2] / "experiments"
CFG = model.presets.get(
    "tiny_kimi_k2",
    dtype="float32",
    vocab_size=64,
    max_seq_len=64,
    d_model=64,
    n_layers=2,
    mtp_depth=0,
)
B, T, G = 8, 32, 4  # batch rows, the one sequence bucket, group size
MICRO = 4  # the reference learner's micro-batch size
FROZEN = "router_bias|e_score_correction_bias|final_norm"  # the default, and one more
OBJECTIVE = ObjectiveConfig(group_size=G, loss_constant=float(G * T), kl_beta=0.05)
# Reward weights may follow schedules of the step (the style weight: 0.5 at step 0, 0.6 at 1).
WEIGHTS = {
    "style": optax.linear_schedule(0.5, 1.5, 10),
    "tool_call_penalty": 1.0,
    "length_penalty": 0.01,
}
EFFORT = {"thinking_tokens": 0.0, "tool_call_tokens": 0.0, "final_message_tokens": 0.0}
ONE_DEVICE = sharding.make_mesh(devices=jax.devices()[:1])
GOOD, BAD = 7, 11


def make_learner(mesh, micro_batch_size, objective=OBJECTIVE, **kw):
    opt = stage_defaults().optimizer
    opt.lr, opt.schedule, opt.warmup_steps, opt.frozen = 1e-3, "constant", 0, FROZEN
    # First-step Adam is lr * g / (|g| + eps): with eps >> float noise in g, equal-up-to-rounding
    # gradients give equal updates (with 1e-8 a near-zero gradient's sign would decide).
    opt.eps = 1e-3
    tx, schedule = make_optimizer(opt, 100, model.abstract_params(CFG))
    kw = (
        dict(
            mesh=mesh,
            micro_batch_size=micro_batch_size,
            reward_weights=WEIGHTS,
            effort_weights=EffortWeights(),
            length_penalty_k=0.05,
            length_penalty_q=0.5,
            schedule=schedule,
        )
        | kw
    )
    return RLLearner(CFG, objective, tx, **kw)


def copy(tree):
    return jax.tree.map(jnp.copy, tree)


def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope="module")
def params():
    p = model.init_params(CFG, jax.random.key(0, impl="unsafe_rbg"))
    # A nonzero router bias, so "it did not move" can fail.
    bias = p["moe_layers"]["mlp"]["router_bias"]
    p["moe_layers"]["mlp"]["router_bias"] = 0.1 * jax.random.normal(jax.random.key(1), bias.shape)
    return p


@pytest.fixture(scope="module")
def learner():
    return make_learner(ONE_DEVICE, MICRO)


def make_sample(tokens, n_prompt, group, index, rng, *, routing=None, **fields):
    n = len(tokens)
    gen = np.arange(n) >= n_prompt
    if routing is None:
        routing = np.argsort(rng.random((n, CFG.n_moe_layers, CFG.n_experts)), -1)
        routing = routing[..., : CFG.n_experts_per_token]
    kw = dict(
        prompt_id=f"p{group}",
        group_id=f"g{group}",
        sample_index=index,
        task_id="t",
        tokens=np.asarray(tokens, np.int32),
        loss_mask=gen.astype(np.uint8),
        logprobs=np.zeros(n, np.float32),  # set from the model by with_behaviour
        versions=np.where(gen, 0, -1).astype(np.int32),
        routing=np.asarray(routing, np.uint8),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        reward_terms={"task": 0.0, "style": 0.0, "tool_call_penalty": 0.0},
        effort=dict(EFFORT),
        passed=True,
        stop_reason="stop",
    )
    return Sample(**(kw | fields))


def with_behaviour(learner, params, batch, noise=0.0, seed=0):
    """The batch with behaviour log-probs = the model's own (+ noise: an engine that differs)."""
    logp = np.asarray(learner.logprobs(params, batch))
    noise = noise * np.random.default_rng(seed).standard_normal(logp.shape)
    batch["behaviour_logp"] = np.where(batch["target_mask"] > 0, logp + noise, 0.0).astype(
        np.float32
    )
    return batch


@pytest.fixture(scope="module")
def random_batch(params, learner):
    """Two groups of random sequences with per-row sampling settings and rewards."""
    rng = np.random.default_rng(0)
    samples = []
    settings = [{}, {"temperature": 0.7}, {"top_p": 0.9}, {"top_k": 16, "temperature": 0.8}]
    for g in range(B // G):
        for i in range(G):
            n = int(rng.integers(12, T + 1))
            rewards = {
                "task": float(rng.integers(0, 2)),
                "style": float(rng.random()),
                "tool_call_penalty": float(rng.integers(0, 3)),
            }
            effort = dict(EFFORT, thinking_tokens=float(rng.integers(0, 50)))
            samples.append(
                make_sample(
                    rng.integers(0, CFG.vocab_size, n),
                    int(rng.integers(4, 9)),
                    g,
                    i,
                    rng,
                    reward_terms=rewards,
                    effort=effort,
                    **settings[i],
                )
            )
    batch = make_batch(samples, batch_size=B, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    batch = with_behaviour(learner, params, batch, noise=0.05)
    terms, effort = reward_arrays(samples, B)
    return batch, terms, effort


def run_update(learner, params, batch, terms, effort, ref_scale=0.99):
    p = learner.shard_params(copy(params))
    ref = jax.tree.map(lambda x: x * ref_scale, p)  # a reference a little away: k1 is nonzero
    out = learner.update(p, learner.init_opt_state(p), ref, batch, terms, effort, 0)
    return out


@pytest.fixture(scope="module")
def reference(params, learner, random_batch):
    """One update on one device, micro-batches of MICRO rows: what every split must equal."""
    new, opt_state, metrics, per_sample = run_update(learner, params, *random_batch)
    return host(new), host(metrics), host(per_sample)


def test_logprobs_equal_the_engines_with_router_replay(params, learner):
    """Multi-turn episodes from the engine (turn, tool tokens, turn) at temperature 0.7, alone
    and with top-k or top-p: the learner's router-replayed log-probs of every generated token
    equal the behaviour log-probs the engine recorded. The engine's router bias differs from
    the learner's (the bias picks experts and never weighs them): the same function when the
    recorded experts are replayed, other experts (and log-probs) when the learner routes."""
    served = copy(params)
    bias = served["moe_layers"]["mlp"]["router_bias"]
    served["moe_layers"]["mlp"]["router_bias"] = jax.random.normal(jax.random.key(7), bias.shape)
    engine = Engine(served, CFG, max_slots=3, max_len=T, prefill_chunk=16, seed=1)
    settings = [{}, {"top_k": 5}, {"top_p": 0.8}]
    rids = [
        engine.submit(list(range(3 + i, 9 + 2 * i)), 5, multi_turn=True, temperature=0.7, **kw)
        for i, kw in enumerate(settings)
    ]
    while engine.has_work():
        engine.step()
    for rid in rids:
        engine.extend(rid, [20, 21, 22], max_new_tokens=5)
    while engine.has_work():
        engine.step()
    samples = []
    for i, (rid, kw) in enumerate(zip(rids, settings)):
        traj = engine.release(rid)
        assert len(traj.routed_experts) == len(traj.token_ids)
        samples.append(
            Sample(
                prompt_id="p",
                group_id="g",
                sample_index=i,
                task_id="t",
                tokens=traj.token_ids,
                loss_mask=traj.generated.astype(np.uint8),
                logprobs=traj.logprobs,
                versions=traj.versions,
                routing=traj.routed_experts,
                temperature=0.7,
                top_p=kw.get("top_p", 1.0),
                top_k=kw.get("top_k", 0),
                reward_terms={"task": 0.0},
                effort={},
                passed=False,
                stop_reason="length",
            )
        )
    batch = make_batch(samples, batch_size=B, seq_buckets=(T,), cfg=CFG, pad_id=0)
    mask = batch["target_mask"] > 0
    assert mask.sum() == sum(s.generated_tokens for s in samples) == 3 * 10  # two turns of 5
    logp = np.asarray(learner.logprobs(params, batch))
    assert (logp[mask] > OUT_OF_SUPPORT_LOGP).all()
    np.testing.assert_allclose(logp[mask], batch["behaviour_logp"][mask], atol=5e-5)
    assert (batch["target_versions"][mask] == 0).all()
    live = np.asarray(make_learner(ONE_DEVICE, MICRO, router_replay=False).logprobs(params, batch))
    assert np.abs(live[mask] - batch["behaviour_logp"][mask]).max() > 1e-2


def live_routing(params, tokens):
    """[T, L_moe, k]: the experts the model itself picks for `tokens` (what an engine records)."""
    _, aux = model.forward(params, np.asarray([tokens], np.int32), CFG)
    return np.asarray(aux["topk_idx"])[:, 0].transpose(1, 0, 2)


def pg_batch(learner, params):
    """Two groups from one prompt whose first generated token is GOOD (task reward 1), BAD
    (tool-call penalty 1) or another id (nothing), with the model's own log-probs."""
    rng = np.random.default_rng(1)
    prompt = [1, 2, 3, 4, 5, 6]
    shared = live_routing(params, prompt + [0])  # the engine's choice: replay = live routing
    samples = []
    for g, others in enumerate([(20, 30), (40, 50)]):
        for i, tok in enumerate((GOOD, BAD) + others):
            terms = {
                "task": float(tok == GOOD),
                "style": 0.0,
                "tool_call_penalty": float(tok == BAD),
            }
            samples.append(
                make_sample(
                    prompt + [tok], len(prompt), g, i, rng, routing=shared, reward_terms=terms
                )
            )
    batch = make_batch(samples, batch_size=B, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    batch = with_behaviour(learner, params, batch)
    return batch, *reward_arrays(samples, B)


def test_policy_gradient_raises_the_rewarded_action(params, learner):
    """Two steps on the toy task: the exact probability of the rewarded first token rises, the
    penalised one's falls, so the expected reward P(GOOD) - P(BAD) rises."""
    batch, terms, effort = pg_batch(learner, params)
    pos = 5  # the last prompt position predicts the first generated token

    def probs(p):
        logp = np.asarray(learner.logprobs(p, batch))
        return np.exp(logp[0, pos]), np.exp(logp[1, pos])

    p = learner.shard_params(copy(params))
    ref = copy(p)
    opt_state = learner.init_opt_state(p)
    seen = [probs(p)]
    for step in range(2):
        # The per-sample train/behaviour gap the update reports: 0 at step 0 (the behaviour
        # log-probs are the current policy's), then the mean |logp - behaviour| over targets.
        gap = np.abs(np.asarray(learner.logprobs(p, batch)) - batch["behaviour_logp"])
        targets = (batch["target_mask"] > 0) & batch["valid"][:, None]
        want_gap = np.where(targets, gap, 0).sum(-1) / np.maximum(targets.sum(-1), 1)
        p, opt_state, metrics, per_sample = learner.update(
            p, opt_state, ref, batch, terms, effort, step
        )
        np.testing.assert_allclose(per_sample["mismatch_mean"], want_gap, atol=1e-6)
        assert (per_sample["mismatch_max"] >= per_sample["mismatch_mean"]).all()
        assert (want_gap > 1e-4).any() == (step == 1)
        seen.append(probs(p))
        if step == 0:  # the current policy is the reference: k1 is exactly 0
            np.testing.assert_array_equal(per_sample["kl"], 0.0)
            np.testing.assert_allclose(per_sample["advantage"], [1, -1, 0, 0] * 2, atol=1e-6)
            assert float(metrics["target_tokens"]) == float(metrics["kept_tokens"]) == B
            assert float(metrics["tokens_out_of_support"]) == 0
            assert float(metrics["is_ratio_max"]) == pytest.approx(1.0, abs=1e-6)
        assert float(metrics["weight/style"]) == pytest.approx(0.5 + 0.1 * step)
    good, bad = np.array(seen).T
    assert (np.diff(good) > 0).all() and (np.diff(bad) < 0).all(), seen
    assert good[-1] - bad[-1] > good[0] - bad[0] + 1e-3, seen


def test_targets_outside_the_support_are_dropped_and_counted(params, learner):
    """top_k=2 on the first group: the targets outside a row's two likeliest ids get
    OUT_OF_SUPPORT_LOGP, are counted, and train nothing; the update stays finite."""
    batch, terms, effort = pg_batch(learner, params)
    batch["top_k"][:G] = 2
    mask = batch["target_mask"] > 0
    logp = np.asarray(learner.logprobs(params, batch))
    outside = mask & (logp == OUT_OF_SUPPORT_LOGP)
    assert 0 < outside.sum() < mask.sum()
    batch["behaviour_logp"] = np.where(outside, -1.0, batch["behaviour_logp"]).astype(np.float32)
    p = learner.shard_params(copy(params))
    new, _, metrics, _ = learner.update(
        p, learner.init_opt_state(p), copy(p), batch, terms, effort, 0
    )
    assert float(metrics["tokens_out_of_support"]) == outside.sum()
    assert float(metrics["kept_tokens"]) == mask.sum() - outside.sum()
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(host(new)))


def test_reference_update_metrics(reference, random_batch):
    """The metrics and per-sample outputs of a step are there and consistent."""
    _, metrics, per_sample = reference
    batch, terms, _ = random_batch
    for key in ("loss", "pg_loss", "grad_norm", "update_norm", "lr", "kl", "mismatch_p99"):
        assert np.isfinite(metrics[key]), key
    for key in ("is_weight_mean", "frac_tokens_dropped", "tokens_out_of_support"):
        assert key in metrics
    assert metrics["lr"] == pytest.approx(1e-3)
    assert metrics["grad_norm"] > 0 and metrics["update_norm"] > 0
    assert metrics["target_tokens"] == batch["target_mask"].sum()
    assert 0 < metrics["frac_tokens_dropped"] < 0.05  # the p99 filter drops about 1%
    # k1 is nonzero wherever tokens are kept (the top_k=16 rows' random targets all fall out).
    kept_rows = (batch["top_k"] != 16) & batch["valid"]
    assert (per_sample["kl"][kept_rows] != 0).all() and kept_rows.sum() == 6
    signed = [per_sample[f"reward/{n}"] for n in ("task", "style", "tool_call_penalty")]
    signed += [per_sample["reward/kl"], per_sample["reward/length_penalty"]]
    np.testing.assert_allclose(sum(signed), per_sample["reward"], atol=1e-6)
    np.testing.assert_allclose(per_sample["reward/tool_call_penalty"], -terms["tool_call_penalty"])
    np.testing.assert_allclose(per_sample["reward/kl"], -0.05 * per_sample["kl"], rtol=1e-6)
    assert (per_sample["reward/length_penalty"] < 0).all()
    adv = per_sample["advantage"].reshape(-1, G)
    np.testing.assert_allclose(adv.sum(-1), 0.0, atol=1e-5)  # group mean baseline
    assert metrics["reward/total"] == pytest.approx(per_sample["reward"].mean(), rel=1e-5)


def test_micro_batches_give_the_same_update(params, reference, random_batch):
    """8 micro-batches of 1 row give the update of 2 micro-batches of 4 rows (and the sharded
    test below, 1 micro-batch of 8 rows). Metrics and per-sample values differ by float noise
    of the forward at another batch shape (k1 sums ~20 token differences of ~4-nat log-probs)."""
    new, _, metrics, per_sample = run_update(make_learner(ONE_DEVICE, 1), params, *random_batch)
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)


def test_chunked_logits_give_the_same_update(params, learner, reference, random_batch):
    """The LM head and log-probs over 4 chunks of 8 positions (`logit_chunk_tokens`): the same
    log-probs and update, and the compiled step holds no whole [micro-batch, T, V] logits."""
    chunked = make_learner(ONE_DEVICE, MICRO, logit_chunk_tokens=8)
    batch = random_batch[0]
    np.testing.assert_allclose(
        np.asarray(chunked.logprobs(params, batch)),
        np.asarray(learner.logprobs(params, batch)),
        rtol=1e-6,
        atol=1e-6,
    )
    new, _, metrics, per_sample = run_update(chunked, params, *random_batch)
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)

    def sorted_rows(lrn):
        """Rows of the [rows, V] logits the top-k/top-p support sorts, in the compiled step."""
        placed = lrn._put_batch(batch)
        hlo = lrn._logp_jit.lower(lrn.shard_params(params), placed).compile().as_text()
        return set(re.findall(rf"= f32\[(\d+),{CFG.vocab_size}\]\S* sort\(", hlo))

    assert sorted_rows(learner) == {str(MICRO * T)} and sorted_rows(chunked) == {str(MICRO * 8)}
    with pytest.raises(ValueError, match="logit_chunk_tokens=5 does not divide"):
        make_learner(ONE_DEVICE, MICRO, logit_chunk_tokens=5).logprobs(params, batch)


def test_single_forward_gives_the_same_update(params, reference, random_batch):
    """single_forward: the current policy's log-probs and the gradient from one forward (jax.vjp
    keeps its activations) give the update of a forward then a gradient per micro-batch."""
    learner = make_learner(ONE_DEVICE, MICRO, single_forward=True)
    forwards = []  # the separate log-prob passes: the reference's only
    logp_jit, ref_logp_jit = learner._logp_jit, learner._ref_logp_jit
    learner._logp_jit = lambda p, batch: forwards.append("current") or logp_jit(p, batch)
    learner._ref_logp_jit = lambda p, batch: forwards.append("ref") or ref_logp_jit(p, batch)
    new, _, metrics, per_sample = run_update(learner, params, *random_batch)
    assert forwards == ["ref"]
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("single_forward", [False, True])
def test_sharded_equals_single_device(params, reference, random_batch, single_forward):
    """On 8 devices (data 2, fsdp 2, expert 2; experts exchanged all-to-all) the update, its
    metrics and per-sample outputs equal one device's, and params and optimiser state keep
    their shardings; with one forward of the current policy too."""
    mesh = sharding.make_mesh(data=2, fsdp=2, expert=2)
    learner8 = make_learner(mesh, 8, single_forward=single_forward)
    new, opt_state, metrics, per_sample = run_update(learner8, params, *random_batch)
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)
    same = lambda a, s: a.sharding.is_equivalent_to(s, a.ndim)  # noqa: E731
    assert all(jax.tree.leaves(jax.tree.map(same, new, learner8.param_shardings)))
    assert all(jax.tree.leaves(jax.tree.map(same, opt_state, learner8.opt_shardings)))
    assert new["moe_layers"]["mlp"]["w_gate"].sharding.spec[1] == "expert"


def test_context_parallel_update_equals_single_device(params, reference, random_batch):
    """rl_kimi_k2's trainer layout in miniature: each sequence split over a context axis,
    experts exchanged, every weight sharded over fsdp x context: the update, its metrics and
    per-sample outputs equal one device's."""
    over = ("fsdp", "context")
    rules = {
        **sharding.RULES,
        **dict.fromkeys(("embed", "expert_embed", "q_lora", "kv_lora"), over),
    }
    layout = sharding.Layout(sharding.make_mesh(fsdp=2, expert=2, context=2), rules)
    learner = make_learner(layout, 4)
    assert learner.forwards.specs["target_mask"][1] == "context"  # each sequence split
    new, _, metrics, per_sample = run_update(learner, params, *random_batch)
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)
    assert new["embed"].sharding.spec == jax.sharding.PartitionSpec("tensor", over)


# Batch over data x fsdp x tensor, heads whole: rules that move the tensor axis to the rows.
BATCH_ON_TENSOR = {
    **sharding.RULES,
    "batch": ("data", "fsdp", "tensor"),
    "heads": None,
    "kv_heads": None,
}


def test_the_layouts_batch_rule_moves_the_rl_batch_and_activations(
    params, reference, random_batch, monkeypatch
):
    """A Layout whose `batch` rule is overridden (as `config.mesh.rules` makes it, through
    lm.make_layout) places the RL batch, spreads micro-batches and constrains the forwards'
    activations by that rule, not the default BATCH_AXES; the update equals one device's."""
    seen, original = [], jax.lax.with_sharding_constraint

    def spy(x, s):  # an array's (shape, spec); trees (the gradient's zeros) are the weights'
        if hasattr(x, "shape"):
            seen.append((tuple(x.shape), s.spec))
        return original(x, s)

    monkeypatch.setattr(jax.lax, "with_sharding_constraint", spy)
    config = stage_defaults()
    for k in ("batch", "heads", "kv_heads"):
        config.mesh.rules[k] = BATCH_ON_TENSOR[k]
    layout = lm.make_layout(config, dict(data=2, fsdp=2, tensor=2))
    assert dict(layout.rules) == BATCH_ON_TENSOR
    rows = ("data", "fsdp", "tensor")
    with pytest.raises(ValueError, match=r"batch axes \('data', 'fsdp', 'tensor'\) of size 8"):
        make_learner(layout, 4)
    learner8 = make_learner(layout, 8)
    assert learner8.mesh is layout.mesh and learner8.batch_devices == 8
    placed = learner8._put_batch(random_batch[0])
    assert placed["inputs"].sharding.spec == P(rows, "context")
    assert placed["valid"].sharding.spec == P(rows)
    new, _, metrics, per_sample = run_update(learner8, params, *random_batch)
    # Every token activation of the forwards (the micro-batches, q, the hidden states) and the
    # micro-batches' [n, mb, ...] inputs: the rows over the overridden batch axes.
    activations = [spec for shape, spec in seen if shape[:1] == (B,) and len(shape) >= 3]
    assert activations and all(spec[0] == rows for spec in activations), activations
    micro = [spec for shape, spec in seen if shape[:2] == (1, B)]
    assert micro and all(spec[1] == rows for spec in micro), micro
    assert not any(sharding.BATCH_AXES in spec for _, spec in seen), seen
    want_params, want_metrics, want_per_sample = reference
    chex.assert_trees_all_close(host(metrics), want_metrics, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(per_sample), want_per_sample, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(host(new), want_params, rtol=1e-5, atol=1e-5)
    # The RL config's batch check follows the same rule.
    cfg = load_config(EXPERIMENTS / "rl_tiny.py")
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 2, 1, 2
    cfg.mesh.rules.batch, cfg.mesh.rules.heads, cfg.mesh.rules.kv_heads = rows, None, None
    cfg.rl.micro_batch_size = 2
    with pytest.raises(ConfigError, match=r"batch axes \('data', 'fsdp', 'tensor'\) of total"):
        rl_config.validate_rl(cfg, 4, load_files=False)


def grouped_samples(n_groups, seed=0):
    """Groups whose samples share their prompt (ids and experts) and sampling settings that vary
    within the group: what packing shares, and what it must keep apart."""
    rng = np.random.default_rng(seed)
    settings = [{}, {"temperature": 0.7}, {"top_p": 0.9}, {"top_k": 16, "temperature": 0.8}]
    samples = []
    for g in range(n_groups):
        n_prompt = int(rng.integers(6, 11))
        prompt = rng.integers(0, CFG.vocab_size, n_prompt)
        routing = np.argsort(rng.random((n_prompt, CFG.n_moe_layers, CFG.n_experts)), -1)
        for i in range(G):
            n = int(rng.integers(n_prompt + 2, T + 1))
            tokens = np.concatenate([prompt, rng.integers(0, CFG.vocab_size, n - n_prompt)])
            own = np.argsort(rng.random((n, CFG.n_moe_layers, CFG.n_experts)), -1)
            own[:n_prompt] = routing
            rewards = {
                "task": float(rng.integers(0, 2)),
                "style": float(rng.random()),
                "tool_call_penalty": float(rng.integers(0, 3)),
            }
            samples.append(
                make_sample(
                    tokens,
                    n_prompt,
                    g,
                    i,
                    rng,
                    routing=own[..., : CFG.n_experts_per_token],
                    reward_terms=rewards,
                    **settings[i],
                )
            )
    return samples


PACK = (64, 128)


@pytest.fixture(scope="module")
def grouped(params, learner):
    """The same grouped samples as plain rows and as packed groups (one row per prompt)."""
    samples = grouped_samples(B // G)
    kw = dict(batch_size=B, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    plain = with_behaviour(learner, params, make_batch(samples, **kw), noise=0.05)
    packed = make_batch(samples, pack_buckets=PACK, **kw)
    packed["behaviour_logp"] = plain["behaviour_logp"]
    terms, effort = reward_arrays(samples, B)
    return plain, packed, terms, effort


def test_packed_groups_give_the_same_logprobs_and_update(params, learner, grouped):
    """One row per group (the prompt once, each sample a branch that sees it): the log-probs of
    every target, and the update, equal the plain rows' (one forward or two, logits chunked
    or whole); the packed rows are shorter than the plain rows' tokens."""
    plain, packed, terms, effort = grouped
    assert packed["packed_inputs"].shape == (B // G, 128)
    assert (packed["packed_segment_ids"] > 0).sum() < (plain["segment_ids"] > 0).sum()
    mask = plain["target_mask"] > 0
    np.testing.assert_array_equal(
        packed["packed_targets"].reshape(-1)[packed["packed_index"]][mask], plain["targets"][mask]
    )
    want_logp = np.asarray(learner.logprobs(params, plain))
    got_logp = np.asarray(learner.logprobs(params, packed))
    np.testing.assert_allclose(got_logp[mask], want_logp[mask], atol=2e-5)
    want = host(run_update(learner, params, plain, terms, effort)[::2])
    for kw in ({}, {"single_forward": True}, {"single_forward": True, "logit_chunk_tokens": 16}):
        got = host(
            run_update(make_learner(ONE_DEVICE, MICRO, **kw), params, packed, terms, effort)[::2]
        )
        chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_groups_sharded_equal_single_device(params, learner, grouped):
    """Packed rows over 8 devices (data 2, fsdp 2, expert 2) give the one-device update."""
    plain, packed, terms, effort = grouped
    want = host(run_update(learner, params, plain, terms, effort)[::2])
    wide = make_learner(sharding.make_mesh(data=2, fsdp=2, expert=2), 8, single_forward=True)
    with pytest.raises(ValueError, match=r"packed rows R=2 \(one per group\) are not divisible"):
        run_update(wide, params, packed, terms, effort)
    samples = grouped_samples(8, seed=1)
    kw = dict(batch_size=4 * G * 2, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    plain8 = with_behaviour(learner, params, make_batch(samples, **kw), noise=0.05)
    packed8 = make_batch(samples, pack_buckets=PACK, **kw)
    packed8["behaviour_logp"] = plain8["behaviour_logp"]
    terms8, effort8 = reward_arrays(samples, 4 * G * 2)
    want = host(run_update(make_learner(ONE_DEVICE, 8), params, plain8, terms8, effort8)[::2])
    got = host(run_update(wide, params, packed8, terms8, effort8)[::2])
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("single_forward", [False, True])
def test_compile_update_compiles_what_update_runs(params, grouped, single_forward):
    """compile_update for a larger bucket's batch runs nothing (its inputs stay alive) and
    compiles every program the update of such a batch then runs: that update compiles none."""
    _, _, terms, effort = grouped
    samples = grouped_samples(B // G)
    kw = dict(batch_size=B, seq_buckets=(T, 2 * T), cfg=CFG, pad_id=0, group_size=G)
    batch = make_batch(samples, pack_buckets=PACK, min_seq=2 * T, min_pack=PACK[-1], **kw)
    learner = make_learner(ONE_DEVICE, MICRO, single_forward=single_forward)
    p = learner.shard_params(copy(params))
    opt_state = learner.init_opt_state(p)
    ref = jax.tree.map(lambda x: x * 0.99, p)
    compiles = []
    listener = lambda event, secs, **_: compiles.append(event)  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        learner.compile_update(p, opt_state, ref, batch, terms, effort, 0)
        compiled = compiles.count(BACKEND_COMPILE_EVENT)
        assert compiled >= 2  # the update and the reference's forward, at least
        assert not any(x.is_deleted() for x in jax.tree.leaves((p, opt_state)))
        new, _, metrics, _ = learner.update(p, opt_state, ref, batch, terms, effort, 0)
        jax.block_until_ready(new)
        assert compiles.count(BACKEND_COMPILE_EVENT) == compiled
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert np.isfinite(float(metrics["loss"]))


def test_router_bias_and_frozen_leaves_do_not_move(params, reference):
    """No aux-loss-free bias update in RL, and the optimiser's frozen leaves (router bias, final
    norm) stay bit for bit; the other leaves move."""
    new, _, _ = reference
    old = host(params)
    labels = param_labels(old, FROZEN)
    np.testing.assert_array_equal(
        new["moe_layers"]["mlp"]["router_bias"], old["moe_layers"]["mlp"]["router_bias"]
    )
    moved = jax.tree.map(lambda a, b: bool(np.any(a != b)), new, old)
    flat_labels = jax.tree_util.tree_leaves_with_path(labels)
    flat_moved = jax.tree.leaves(moved)
    frozen = [
        jax.tree_util.keystr(p)
        for (p, lab), m in zip(flat_labels, flat_moved)
        if lab == "frozen" and m
    ]
    assert not frozen, f"frozen leaves moved: {frozen}"
    n_frozen = sum(lab == "frozen" for _, lab in flat_labels)
    assert n_frozen == 2  # the router bias and the final norm
    trained = [m for (_, lab), m in zip(flat_labels, flat_moved) if lab == "train"]
    assert sum(trained) >= 0.9 * len(trained)


def kl_logp_by_hand(p, batch, replay: bool):
    """[B, T] float64: each target's log-prob under logits / temperature (what k1 compares), the
    recorded experts replayed or routed live."""
    logits, _ = model.forward(
        p,
        batch["inputs"],
        CFG,
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        routing=batch["routing"] if replay else None,
    )
    z = np.asarray(logits, np.float64) / batch["temperature"][:, None, None]
    top = z.max(-1, keepdims=True)
    logz = z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))
    return np.take_along_axis(logz, batch["targets"][..., None], -1)[..., 0]


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_k1_is_to_the_reference_policy(params, learner, random_batch, placement):
    """k1 by hand: per sample, the sum over its kept targets of log pi(y) - log pi_ref(y) under
    logits / temperature, the current policy with the recorded experts, the reference routing
    every token itself (the reference policy). The recorded experts are random, so a reference
    that replayed them gives other values. kl_placement="loss" (the ablation): the loss is the
    policy-gradient term plus beta * sum k1 / loss_constant, with one forward or two."""
    objective = dataclasses.replace(
        OBJECTIVE, kl_placement=placement, mismatch_quantile=None, mismatch_threshold=None
    )
    batch, terms, effort = random_batch
    _, _, metrics, per_sample = host(
        run_update(make_learner(ONE_DEVICE, MICRO, objective), params, batch, terms, effort)
    )
    ref = jax.tree.map(lambda x: x * 0.99, params)  # run_update's reference
    support = np.asarray(learner.logprobs(params, batch)) > OUT_OF_SUPPORT_LOGP
    kept = (batch["target_mask"] > 0) & batch["valid"][:, None] & support
    policy = kl_logp_by_hand(params, batch, replay=True)
    k1 = np.where(kept, policy - kl_logp_by_hand(ref, batch, replay=False), 0.0).sum(-1)
    replayed = np.where(kept, policy - kl_logp_by_hand(ref, batch, replay=True), 0.0).sum(-1)
    assert np.abs(k1 - replayed).max() > 0.1  # the two references are told apart
    np.testing.assert_allclose(per_sample["kl"], k1, rtol=1e-4, atol=1e-4)
    if placement == "reward":
        np.testing.assert_allclose(per_sample["reward/kl"], -0.05 * k1, rtol=1e-4, atol=1e-5)
        assert "kl_loss" not in metrics
        return
    assert "reward/kl" not in per_sample
    want = 0.05 * k1.sum() / OBJECTIVE.loss_constant
    assert metrics["kl_loss"] == pytest.approx(want, rel=1e-4)
    assert metrics["loss"] == pytest.approx(metrics["pg_loss"] + want, rel=1e-4)
    one = make_learner(ONE_DEVICE, MICRO, objective, single_forward=True)
    _, _, single, _ = host(run_update(one, params, batch, terms, effort))
    assert single["kl_loss"] == pytest.approx(want, rel=1e-4)


def test_bad_inputs_are_named(params, learner, random_batch):
    batch, terms, effort = random_batch
    p = learner.shard_params(params)
    ref = copy(p)

    def update(b=batch, t=terms, e=effort, r=ref):
        return learner.update(p, None, r, b, t, e, 0)

    with pytest.raises(ValueError, match=r"batch lacks \['routing'\]"):
        update(b={k: v for k, v in batch.items() if k != "routing"})
    with pytest.raises(ValueError, match=r"batch\['target_mask'\] has shape \(8, 31\)"):
        update(b=batch | {"target_mask": batch["target_mask"][:, 1:]})
    with pytest.raises(ValueError, match=r"batch\['routing'\] has shape"):
        update(b=batch | {"routing": batch["routing"][:, :, :, :2]})
    with pytest.raises(ValueError, match="B=6 is not divisible by micro_batch_size=4"):
        update(b={k: v[:, :6] if k == "routing" else v[:6] for k, v in batch.items()})
    with pytest.raises(ValueError, match=r"terms lack \['style'\]"):
        update(t={k: v for k, v in terms.items() if k != "style"})
    with pytest.raises(ValueError, match=r"terms\['task'\] has shape \(4,\)"):
        update(t=terms | {"task": terms["task"][:4]})
    with pytest.raises(ValueError, match=r"terms\['kl'\]: the learner computes"):
        update(t=terms | {"kl": terms["task"]})
    with pytest.raises(ValueError, match=r"effort_counts lack \['thinking_tokens'\]"):
        update(e={k: v for k, v in effort.items() if k != "thinking_tokens"})
    with pytest.raises(ValueError, match="ref_params is None"):
        update(r=None)
    with pytest.raises(ValueError, match="ref_params shares arrays with params"):
        update(r=p)
    with pytest.raises(ValueError, match=r"micro_batch_size=4 is not divisible by the mesh's"):
        make_learner(sharding.make_mesh(data=2, fsdp=2, expert=2), 4)
    with pytest.raises(ValueError, match=r"reward_weights \['speed'\]"):
        make_learner(ONE_DEVICE, 4, reward_weights={"speed": 1.0})
    with pytest.raises(ValueError, match="length_penalty_k"):
        make_learner(ONE_DEVICE, 4, length_penalty_k=None)


def test_router_replay_off_routes_every_token_itself(params, learner, random_batch):
    """The ablation switch: with replay off the train forward ignores the recorded experts (other
    recorded experts give the same log-probs), with replay on they decide the log-probs."""
    batch = random_batch[0]
    other = dict(batch, routing=(batch["routing"] + 1) % CFG.n_experts)
    off = make_learner(ONE_DEVICE, MICRO, router_replay=False)
    p = learner.shard_params(copy(params))
    np.testing.assert_array_equal(off.logprobs(p, batch), off.logprobs(p, other))
    assert not np.allclose(learner.logprobs(p, batch), learner.logprobs(p, other))


def test_segments_of_a_chain_share_the_chains_advantage(params, learner):
    """Four chains of one group, cut into 3, 1, 2 and 1 segments (7 rows, padded to 8): each row
    takes its chain's advantage, computed over chains, not over rows. A chain's reward is its
    terms once (every segment carries them) less beta times the k1 of all its tokens: the sum of
    its segments' KL, as if the same tokens were one segment (a mean would charge a K-segment
    chain 1/K of it)."""
    rng = np.random.default_rng(3)
    chains = []
    for i, (n_seg, task) in enumerate([(3, 1.0), (1, 0.0), (2, 0.0), (1, 1.0)]):
        terms = {"task": task, "style": 0.0, "tool_call_penalty": 0.0}
        segs = [
            make_sample(
                rng.integers(0, CFG.vocab_size, 20), 8, 0, i, rng, reward_terms=terms, segment=k
            )
            for k in range(n_seg)
        ]
        segs[-1].segments = segs[:-1]
        chains.append(segs[-1])
    batch = make_batch(chains, batch_size=G, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    assert batch["inputs"].shape[0] == 8 and batch["valid"].sum() == 7
    np.testing.assert_array_equal(batch["chain"][:7], [0, 0, 0, 1, 2, 2, 3])
    batch = with_behaviour(learner, params, batch)
    terms, effort = reward_arrays(chains, G)
    np.testing.assert_array_equal(terms["task"], [1, 1, 1, 0, 0, 0, 1, 0])
    _, _, _, per_sample = run_update(learner, params, batch, terms, effort)
    reward = np.asarray(per_sample["reward"])[:7]
    kl = np.asarray(per_sample["kl"])[:7]
    np.testing.assert_allclose(per_sample["reward/kl"][:7], -0.05 * kl, rtol=1e-6)
    chain = batch["chain"][:7]
    terms_c = np.array(
        [(reward - per_sample["reward/kl"][:7])[chain == c].mean() for c in range(4)]
    )
    kl_c = np.array([kl[chain == c].sum() for c in range(4)])
    reward_c = terms_c - 0.05 * kl_c
    want = (reward_c - reward_c.mean())[chain]
    np.testing.assert_allclose(np.asarray(per_sample["advantage"])[:7], want, rtol=1e-5, atol=1e-6)
    mean_kl_c = np.array([kl[chain == c].mean() for c in range(4)])
    averaged = terms_c - 0.05 * mean_kl_c
    assert np.abs((averaged - averaged.mean())[chain] - want).max() > 1e-4  # told apart
    assert np.asarray(per_sample["advantage"])[7] == 0.0
    # Counting rows instead of chains would give chain 0 (three rows) three votes.
    assert abs(np.mean(want[[0, 3, 4, 6]])) < 1e-6 and abs(np.mean(want)) > 1e-3


@pytest.mark.parametrize("tokens", ["fresh", "all"])
def test_the_mismatch_filter_judges_the_tokens_it_is_told(params, learner, random_batch, tokens):
    """At step 2, rows 4-7 were sampled by version 0 and the engine's log-probs of them are 1-1.1
    nats off (the policy moved since), one of them 3 nats (broken), rows 0-3 by version 2 with
    three tokens 1 nat off. The 0.9 quantile ranks the tokens it is told: with "fresh" it drops
    those three and no stale token; with "all" stale tokens too. The 2-nat threshold judges
    every token: the broken one goes either way."""
    batch, terms, effort = random_batch
    batch = {k: v.copy() for k, v in batch.items()}
    logp = np.asarray(learner.logprobs(params, batch))
    targets = (batch["target_mask"] > 0) & batch["valid"][:, None]
    judged = targets & (logp != OUT_OF_SUPPORT_LOGP)  # the top_k=16 rows' targets fall out
    stale = judged & (np.arange(B) >= 4)[:, None]
    batch["target_versions"] = np.where(targets, np.where(stale, 0, 2), -1).astype(np.int32)
    drift = np.where(stale, 1.0 + 0.1 * np.random.default_rng(2).random(logp.shape), 0.0)
    odd = np.zeros_like(judged)
    for row in range(3):
        odd[row, np.flatnonzero(judged[row])[0]] = True
    broken = np.zeros_like(judged)
    broken[4, np.flatnonzero(judged[4])[0]] = True
    off = drift + odd + np.where(broken, 3.0 - drift, 0.0)
    batch["behaviour_logp"] = np.where(targets, logp + off, 0.0).astype(np.float32)
    objective = dataclasses.replace(OBJECTIVE, mismatch_quantile=0.9, mismatch_threshold=2.0)
    filtered = make_learner(ONE_DEVICE, B, objective, mismatch_tokens=tokens)
    p = filtered.shard_params(copy(params))
    _, _, metrics, _ = filtered.update(
        p, filtered.init_opt_state(p), copy(p), batch, terms, effort, 2
    )
    metrics = host(metrics)
    fresh = judged & ~stale
    assert 4 < stale.sum() < judged.sum() and 0.1 * fresh.sum() > 3
    dropped = judged.sum() - metrics["kept_tokens"]
    if tokens == "fresh":
        assert dropped == 3 + 1  # the three fresh outliers, the broken stale token
        assert metrics["frac_tokens_fresh"] == pytest.approx(fresh.sum() / judged.sum())
    else:  # the quantile of every token: the 10% largest, all stale (drift 1-1.1 nats)
        n = judged.sum()
        assert dropped == n - 1 - np.floor(0.9 * (n - 1)) and dropped > 4
    assert metrics["frac_tokens_dropped"] == pytest.approx(dropped / judged.sum())
    # the statistics describe every judged token either way
    assert metrics["mismatch_max"] == pytest.approx(3.0, abs=1e-4)
    assert metrics["mismatch_mean"] == pytest.approx(off[judged].sum() / judged.sum(), abs=1e-4)


def test_the_shipped_filter_drops_a_broken_token_of_a_stale_sample(params, learner, random_batch):
    """rl_tiny's objective and filter at its staleness bound S = 2: every token is two versions
    old (no fresh token for the p99 to rank), the engine's log-probs differ by two updates'
    drift (0.05 nats, the p99 measured in rl_tiny) and one token of sample 1 by 5 nats. The
    filter drops that token, and nothing else."""
    config = load_config(EXPERIMENTS / "rl_tiny.py")
    assert config.rl.max_staleness == 2
    shipped = rl_config.objective_config(config)
    objective = dataclasses.replace(shipped, group_size=G, loss_constant=float(G * T))
    filtered = make_learner(ONE_DEVICE, MICRO, objective, mismatch_tokens=config.rl.mismatch_tokens)
    batch, terms, effort = random_batch
    batch = {k: v.copy() for k, v in batch.items()}
    logp = np.asarray(learner.logprobs(params, batch))
    targets = (batch["target_mask"] > 0) & batch["valid"][:, None]
    judged = targets & (logp != OUT_OF_SUPPORT_LOGP)
    batch["target_versions"] = np.where(targets, 0, -1).astype(np.int32)
    drift = 0.05 * np.random.default_rng(5).standard_normal(logp.shape)
    drift[1, np.flatnonzero(judged[1])[0]] = 5.0
    batch["behaviour_logp"] = np.where(targets, logp + drift, 0.0).astype(np.float32)
    p = filtered.shard_params(copy(params))
    _, _, metrics, _ = filtered.update(
        p, filtered.init_opt_state(p), copy(p), batch, terms, effort, 2
    )
    metrics = host(metrics)
    assert metrics["frac_tokens_fresh"] == 0
    assert metrics["kept_tokens"] == judged.sum() - 1
    assert metrics["frac_samples_with_drops"] == pytest.approx(1 / judged.any(-1).sum())


def test_failed_samples_leave_the_baseline_and_are_counted(params, learner):
    """Three groups of four. Group 0: tasks 1, 0, 1 and a rollout error; group 1: one pass and
    three failures (two rollout errors, a prompt too long); group 2: four fails. A failed sample
    trains nothing and is left out of its group's mean (group 0's baseline is the mean of three);
    group 1 has one valid sample, so no baseline: no advantage; group 2 has advantages (its k1
    differs) but no task signal. Counted: 4 failed samples, 1 group too small, 2 of 3 groups
    with equal task rewards."""
    rng = np.random.default_rng(6)
    plan = [[1, 0, 1, "rollout_error"], [1, "rollout_error", "prompt_too_long", "rollout_error"]]
    plan += [[0, 0, 0, 0]]
    samples = []
    for g, group in enumerate(plan):
        for i, outcome in enumerate(group):
            failed = isinstance(outcome, str)
            tokens = rng.integers(0, CFG.vocab_size, 10 if failed else 20)
            terms = {"task": 0.0 if failed else float(outcome), "style": 0.0}
            terms["tool_call_penalty"] = 0.0
            samples.append(
                make_sample(
                    tokens, len(tokens) if failed else 8, g, i, rng, reward_terms=terms,
                    stop_reason=outcome if failed else "submit",
                )
            )  # fmt: skip
    kw = dict(batch_size=3 * G, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    batch = with_behaviour(learner, params, make_batch(samples, **kw))
    failed = np.array([isinstance(x, str) for group in plan for x in group])
    np.testing.assert_array_equal(batch["valid"], ~failed)
    assert batch["chain_valid"].all()
    terms, effort = reward_arrays(samples, 3 * G)
    _, _, metrics, per_sample = host(run_update(learner, params, batch, terms, effort))
    reward = per_sample["reward"].reshape(3, G)
    ok = ~failed.reshape(3, G)
    want = np.zeros((3, G))
    for g in (0, 2):
        want[g] = np.where(ok[g], reward[g] - reward[g][ok[g]].mean(), 0.0)
    np.testing.assert_allclose(per_sample["advantage"].reshape(3, G), want, atol=1e-6)
    assert np.abs(want[0, :3]).min() > 0.3 and np.abs(want[2]).max() > 0  # A = +-1/3, +-2/3
    assert metrics["failed_samples"] == 4 and metrics["groups_too_few_valid"] == 1
    assert metrics["groups_zero_advantage"] == pytest.approx(2 / 3)
    assert metrics["valid_samples"] == 8


@pytest.mark.parametrize("credit", ["episode", "turn"])
def test_tool_call_credit_lands_where_it_is_told(params, credit):
    """One group of two-turn episodes; sample 0 passes after a malformed first turn (penalty 1,
    weight 1), sample 1 passes cleanly, 2 and 3 fail. "episode": sample 0's reward is 1 - 1 and
    both its turns take advantage -0.25, so its good second turn falls too. "turn": its
    advantage is that of a clean pass (+0.5, like sample 1's), its good turn rises and the
    malformed turn alone takes +0.5 - 1 and falls. The loss is the hand-computed one."""
    learner = make_learner(ONE_DEVICE, MICRO, tool_call_credit=credit)
    rng = np.random.default_rng(4)
    prompt, obs = [1, 2, 3, 4, 5, 6], 60
    samples = []
    for i, (first, second, task) in enumerate(
        [(BAD, GOOD, 1.0), (20, 21, 1.0), (30, 31, 0.0), (40, 41, 0.0)]
    ):
        tokens = prompt + [first, obs, second]
        sample = make_sample(
            tokens,
            len(prompt),
            0,
            i,
            rng,
            routing=live_routing(params, tokens),  # the engine's: k1 to the start is 0
            reward_terms={"task": task, "style": 0.0, "tool_call_penalty": float(i == 0)},
            loss_mask=np.array([0] * len(prompt) + [1, 0, 1], np.uint8),  # turn, observation, turn
            turn_penalties=[1, 0] if i == 0 else [0, 0],
        )
        samples.append(sample)
    batch = make_batch(samples, batch_size=B, seq_buckets=(T,), cfg=CFG, pad_id=0, group_size=G)
    batch = with_behaviour(learner, params, batch)
    terms, effort = reward_arrays(samples, B)
    np.testing.assert_array_equal(batch["target_penalty"][0, 5:8], [1, 0, 0])

    def probs(p):  # P(BAD) as sample 0's first turn, P(GOOD) as its second
        logp = np.asarray(learner.logprobs(p, batch))
        return np.exp(logp[0, 5]), np.exp(logp[0, 7])

    p = learner.shard_params(copy(params))
    before = probs(p)
    p, _, metrics, per_sample = learner.update(
        p, learner.init_opt_state(p), copy(p), batch, terms, effort, 0
    )
    after = probs(p)
    adv = [-0.25, 0.75, -0.25, -0.25] if credit == "episode" else [0.5, 0.5, -0.5, -0.5]
    np.testing.assert_allclose(np.asarray(per_sample["advantage"])[:4], adv, atol=1e-6)
    np.testing.assert_allclose(per_sample["reward"][:4], [0, 1, 0, 0], atol=1e-6)
    per_token = [[a, a] for a in adv]  # each sample's two targets
    if credit == "turn":
        per_token[0][0] -= 1.0
    want_loss = -np.sum(per_token) / OBJECTIVE.loss_constant
    assert float(metrics["pg_loss"]) == pytest.approx(want_loss, abs=1e-6)
    assert float(metrics["penalised_tokens"]) == 1
    assert after[0] < before[0], (before, after)  # the malformed turn falls either way
    if credit == "turn":
        assert after[1] > before[1], (before, after)
    else:
        assert after[1] < before[1], (before, after)
