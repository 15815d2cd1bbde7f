"""Sampling filters, the behaviour logprobs, and the speculative rejection rule (statistically)."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from c2.infer import SamplingParams, sampling


def _reference_logprobs(logits, temperature, top_k, top_p):
    """numpy: temperature, then top-k, then the smallest nucleus holding top_p of the mass."""
    x = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    keep = np.zeros_like(x, bool)
    n = len(x) if top_k == 0 else top_k
    kept = order[:n]
    p = np.exp(x[kept] - x[kept].max())
    p /= p.sum()
    mass_before = np.cumsum(p) - p
    kept = kept[(mass_before < top_p) | (top_p >= 1)]
    keep[kept] = True
    y = np.where(keep, x, -np.inf)
    return y - np.log(np.sum(np.exp(y[keep] - y[keep].max()))) - y[keep].max()


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.5, 7, 0.8)]
)
def test_sampling_logprobs_match_reference(temperature, top_k, top_p):
    logits = jax.random.normal(jax.random.key(0), (3, 20)) * 2
    B = logits.shape[0]
    got = sampling.sampling_logprobs(
        logits,
        jnp.full(B, temperature),
        jnp.full(B, top_k, jnp.int32),
        jnp.full(B, top_p),
    )
    for b in range(B):
        want = _reference_logprobs(logits[b], temperature, top_k, top_p)
        np.testing.assert_array_equal(np.isinf(got[b]), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(np.asarray(got[b])[finite], want[finite], atol=1e-5)
        if top_k:
            assert finite.sum() <= top_k


def test_rows_keep_their_own_settings_and_greedy_gets_model_logprobs():
    logits = jax.random.normal(jax.random.key(1), (3, 16)) * 3
    temp = jnp.array([0.0, 1.0, 0.5])
    top_k = jnp.array([2, 3, 0], jnp.int32)
    top_p = jnp.array([0.5, 1.0, 0.9])
    got = sampling.sampling_logprobs(logits, temp, top_k, top_p)
    # greedy: filters are ignored, the logprobs are the model's own
    np.testing.assert_allclose(got[0], jax.nn.log_softmax(logits[0]), atol=1e-6)
    np.testing.assert_allclose(
        got[1][np.isfinite(got[1])],
        _reference_logprobs(logits[1], 1.0, 3, 1.0)[np.isfinite(got[1])],
        atol=1e-5,
    )
    assert int(np.isfinite(got[1]).sum()) == 3
    keys = jax.random.split(jax.random.key(2), 3)
    toks = sampling.sample(keys, got, temp)
    assert int(toks[0]) == int(jnp.argmax(logits[0]))
    chex.assert_trees_all_equal(toks, sampling.sample(keys, got, temp))  # seeded


def test_greedy_is_argmax_first_of_ties():
    """The first index of each row's maximum, ties included, over any leading axes."""
    x = jnp.round(jax.random.normal(jax.random.key(4), (6, 5, 40)) * 2)  # many ties
    assert (x == x.max(-1, keepdims=True)).sum(-1).max() > 1
    np.testing.assert_array_equal(sampling.greedy(x), jnp.argmax(x, -1))
    assert sampling.greedy(x).dtype == jnp.int32


def test_sample_rows_makes_keys_only_when_a_row_samples():
    """Compiled, a greedy batch never runs the key function (a host callback in it counts the
    runs) and gives argmax; a batch with one sampling row runs it and draws as `sample` does."""
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(5), (4, 30)) * 2)
    keys = jax.random.split(jax.random.key(6), 4)
    runs = []

    def keys_fn():
        jax.debug.callback(lambda: runs.append(1))
        return keys

    step = jax.jit(lambda t: sampling.sample_rows(keys_fn, logp, t))
    np.testing.assert_array_equal(step(jnp.zeros(4)), jnp.argmax(logp, -1))
    jax.effects_barrier()
    assert runs == []
    mixed = jnp.array([0.0, 1.0, 0.0, 0.7])
    np.testing.assert_array_equal(step(mixed), sampling.sample(keys, logp, mixed))
    jax.effects_barrier()
    assert runs == [1]


def test_sample_follows_the_distribution():
    logp = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    n = 20000
    keys = jax.random.split(jax.random.key(3), n)
    toks = jax.jit(jax.vmap(lambda k: sampling.sample(k[None], logp, jnp.ones(1))[0]))(keys)
    assert _chi2_pvalue(np.asarray(toks), np.array([0.5, 0.3, 0.15, 0.05])) > 1e-3


def test_inverse_cdf_never_draws_a_zero_weight_token():
    """At both ends of the uniform's range and between, the draw lands on a token with weight:
    the zero-weight tokens before, between and after them (top-k/top-p cut, or an empty
    residual) are never drawn; equal halves split at u = 1/2."""
    w = jnp.array([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5)
    u = jnp.array([0.0, 0.25, 0.5 - 1e-6, 0.5 + 1e-6, 1.0 - 2**-24])
    np.testing.assert_array_equal(sampling.inverse_cdf(u, w), [3, 3, 3, 1, 1])


def _chi2_pvalue(tokens, probs):
    counts = np.bincount(tokens, minlength=len(probs))
    return stats.chisquare(counts, counts.sum() * probs / probs.sum()).pvalue


def _emitted_prefix(accepted, bonus, drafts):
    """The first two emitted tokens (-1 when the step emitted only one)."""
    first = np.where(accepted >= 1, drafts[:, 0], bonus)
    second = np.where(accepted >= 2, drafts[:, 1], np.where(accepted == 1, bonus, -1))
    return first, second


def test_speculative_rule_reproduces_the_target_distribution():
    """Draft from q, keep by the rule: the emitted tokens follow p exactly (chi-square), for a
    draft far from the target (many rejections). Position 0 is p_0; position 1, given draft 1
    was kept, is p_1; the all-accepted bonus is p_2."""
    V, K, n = 5, 2, 60000
    kp, kq, kd, ka = jax.random.split(jax.random.key(4), 4)
    p = jax.nn.log_softmax(jax.random.normal(kp, (K + 1, V)) * 1.5)
    q = jax.nn.log_softmax(jax.random.normal(kq, (K, V)) * 1.5)
    drafts = jax.vmap(lambda k: jax.random.categorical(k, q))(jax.random.split(kd, n))
    accept = jax.jit(sampling.speculative_accept)
    accepted, bonus = accept(
        jax.random.split(ka, n),
        jnp.broadcast_to(p, (n, K + 1, V)),
        jnp.broadcast_to(q, (n, K, V)),
        drafts.astype(jnp.int32),
        jnp.ones(n),
    )
    accepted, bonus, drafts = map(np.asarray, (accepted, bonus, drafts))
    assert 0.1 < (accepted > 0).mean() < 0.9  # both branches of the rule are exercised
    first, second = _emitted_prefix(accepted, bonus, drafts)
    pn = np.exp(np.asarray(p, np.float64))
    assert _chi2_pvalue(first, pn[0]) > 1e-3
    assert _chi2_pvalue(second[accepted >= 1], pn[1]) > 1e-3
    assert _chi2_pvalue(bonus[accepted == K], pn[2]) > 1e-3


def test_speculative_rule_greedy_keeps_matching_prefix():
    p = jnp.log(jnp.array([[[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.2, 0.6]]]) + 1e-9)
    q = jnp.zeros((1, 2, 3))
    key = jax.random.split(jax.random.key(0), 1)
    a, nxt = sampling.speculative_accept(key, p, q, jnp.array([[1, 2]]), jnp.zeros(1))
    assert (int(a[0]), int(nxt[0])) == (1, 0)  # draft 1 = argmax kept, draft 2 != 0 replaced
    a, nxt = sampling.speculative_accept(key, p, q, jnp.array([[1, 0]]), jnp.zeros(1))
    assert (int(a[0]), int(nxt[0])) == (2, 2)  # both kept, bonus = argmax of the last


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=-0.1), "temperature=-0.1"),
        (dict(temperature=float("nan")), "temperature=nan"),
        (dict(top_p=0.0), "top_p=0.0"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(top_k=-1), "top_k=-1"),
        (dict(top_k=11), r"top_k=11: expected an int in \[0, vocab_size=10\]"),
        (dict(top_k=2.0), "top_k=2.0"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs).validate(10)


def test_top_k_keeps_ties_with_the_threshold():
    logits = jnp.array([[3.0, 1.0, 2.0, 2.0, 0.0]])
    got = sampling.sampling_logprobs(logits, jnp.ones(1), jnp.array([2], jnp.int32), jnp.ones(1))
    np.testing.assert_array_equal(np.isfinite(got[0]), [True, False, True, True, False])


def test_filters_keep_rows_sharded():
    """The filters compile to no collective but a scalar's (whether any row filters) for a
    row-sharded batch: the RL trainer's log-prob chunks ([tokens, vocab]) stay on their devices
    (a scatter through the sort's permutation was gathered whole onto every device)."""
    mesh = jax.make_mesh((8,), ("rows",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))
    f = jax.jit(sampling.sampling_logprobs, in_shardings=rows, out_shardings=rows)
    args = (
        jax.ShapeDtypeStruct((64, 1000), jnp.float32),
        *(jax.ShapeDtypeStruct((64,), d) for d in (jnp.float32, jnp.int32, jnp.float32)),
    )
    hlo = f.lower(*args).compile().as_text()
    ops = re.findall(r"= (\S+) (all-gather|all-to-all|collective-permute|all-reduce)\(", hlo)
    assert ops and all(shape.endswith("[]") for shape, _ in ops), ops
