"""MTP speculative sampling keeps the main model's output distribution (tiny vocabulary)."""

import numpy as np
from conftest import MAX_LEN, log_softmax
from scipy import stats

from c2.infer import Engine


def test_speculative_sampling_matches_the_model_distribution(kimi_vocab8):
    """1024 samples of three tokens: the first comes from the prefill, the next two from
    speculative steps (2 MTP drafts per step, many rejected). The joint frequency of tokens
    2 and 3 matches sum_t1 p(t1) p(t2|t1) p(t3|t1,t2) from the full forward (chi-square)."""
    m = kimi_vocab8
    V, prompt, n = 8, [1, 2, 3], 1024
    engine = Engine(
        m.params,
        m.cfg,
        max_slots=64,
        max_len=MAX_LEN,
        prefill_chunk=16,
        speculative=True,
        num_draft_tokens=2,
        temperature=1.0,
        seed=7,
    )
    out = engine.generate([prompt] * n, 3)
    acceptance = engine.stats["acceptance_rate"]
    assert 0.05 < acceptance < 0.95, acceptance  # drafts are both kept and rejected
    p1 = np.exp(log_softmax(m.logits(prompt)[-1]))
    expected = np.zeros((V, V))
    for t1 in range(V):
        p2 = np.exp(log_softmax(m.logits(prompt + [t1])[-1]))
        for t2 in range(V):
            p3 = np.exp(log_softmax(m.logits(prompt + [t1, t2])[-1]))
            expected[t2] += p1[t1] * p2[t2] * p3
    counts = np.zeros((V, V))
    for c in out:
        counts[c.tokens[1], c.tokens[2]] += 1
    exp = expected.reshape(-1) * n / expected.sum()
    big = exp >= 5  # pool the rare cells, as the chi-square approximation needs
    obs = np.append(counts.reshape(-1)[big], counts.reshape(-1)[~big].sum())
    exp = np.append(exp[big], exp[~big].sum())
    assert big.sum() >= 10
    assert stats.chisquare(obs, exp).pvalue > 1e-3
