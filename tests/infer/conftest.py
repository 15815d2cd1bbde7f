"""Tiny float32 models shared by the engine tests (built once per session: compiles are costly)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model

MAX_LEN = 48  # every engine in these tests uses this context, so compiled steps are shared
ENGINE = dict(max_slots=3, max_len=MAX_LEN, prefill_chunk=16)


class Model:
    def __init__(self, name, params=None, **overrides):
        self.cfg = model.presets.get(name, dtype="float32", **overrides)
        # rbg keys: the init compiles twice as fast as with threefry; any weights will do here.
        key = jax.random.key(0, impl="unsafe_rbg")
        self.params = model.init_params(self.cfg, key) if params is None else params
        self._logits = jax.jit(functools.partial(_padded_forward, cfg=self.cfg))

    def logits(self, tokens, params=None, routing=None):
        """Full-forward logits [T, V] of one sequence (padded to MAX_LEN: one compile)."""
        T = len(tokens)
        padded = np.zeros((1, MAX_LEN), np.int32)
        padded[0, :T] = tokens
        if routing is not None:
            r = np.zeros((routing.shape[0], 1, MAX_LEN, routing.shape[-1]), np.int32)
            r[:, 0, :T] = routing
            routing = r
        return np.asarray(self._logits(params or self.params, padded, routing)[0])[0, :T]

    def mtp_logprobs(self, tokens):
        """[T, V]: MTP depth 1's log-softmax at position t, for token t + 2 (training path)."""
        padded = np.zeros((1, MAX_LEN), np.int32)
        padded[0, : len(tokens)] = tokens
        return np.asarray(self._logits(self.params, padded, None)[2])[0, : len(tokens)]

    def live_routing(self, tokens, params=None):
        """[T, L_moe, k] experts the full forward picks itself."""
        padded = np.zeros((1, MAX_LEN), np.int32)
        padded[0, : len(tokens)] = tokens
        topk = self._logits(self.params if params is None else params, padded, None)[1]
        return np.asarray(topk)[:, 0, : len(tokens)].transpose(1, 0, 2)

    def greedy(self, prompt, n, params=None, stop=None):
        """Repeated argmax of the full forward on the growing prefix."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(np.argmax(self.logits(seq, params)[-1])))
            if seq[-1] == stop:
                break
        return seq[len(prompt) :]


def _padded_forward(params, tokens, routing, cfg):
    logits, aux = model.forward(params, tokens, cfg, routing=routing)
    mtp = jax.nn.log_softmax(model.mtp_logits(params, aux, cfg)[0]) if cfg.mtp_depth else logits
    return logits, aux["topk_idx"], mtp


@pytest.fixture(scope="session")
def kimi():
    return Model("tiny_kimi_k2", vocab_size=64, max_seq_len=64)


@pytest.fixture(scope="session")
def kimi_vocab8(kimi):
    """kimi's weights cut to an 8-token vocabulary, the head scaled up: peaked distributions,
    and MTP drafts far from the main model's."""
    p = kimi.params
    params = dict(p, embed=p["embed"][:8], lm_head=p["lm_head"][:, :8] * 8)
    return Model("tiny_kimi_k2", params=params, vocab_size=8, max_seq_len=64)


@pytest.fixture(scope="session")
def qwen():
    return Model("tiny_qwen3_moe", vocab_size=64, max_seq_len=64)


def log_softmax(x, temperature=1.0):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(x, jnp.float32) / temperature, axis=-1))
