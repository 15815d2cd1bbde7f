"""The engine against the model's full forward: greedy, logprobs with router replay, stops,
continuous batching, multi-turn, in-flight weight updates, bad input."""

import jax
import numpy as np
import pytest
from conftest import ENGINE, MAX_LEN, log_softmax

from c2 import model
from c2.infer import Engine, generate, steps

PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(16)), list(range(3, 20)), list(range(30, 60))]


def _decode_compiles():
    return steps.decode._cache_size()


@pytest.mark.parametrize("family", ["kimi", "qwen"])
def test_greedy_equals_repeated_argmax(family, request):
    """Five prompts through three slots (finished sequences hand their slot on): each output
    is the argmax of the full forward on the growing prefix, with its logprob; the decode step
    compiles once."""
    m = request.getfixturevalue(family)
    before = _decode_compiles()
    out = generate(m.params, m.cfg, PROMPTS, 10, **ENGINE)
    assert _decode_compiles() - before <= 1
    for prompt, comp in zip(PROMPTS, out):
        want = m.greedy(prompt, 10)
        assert comp.tokens.tolist() == want
        logits = m.logits(prompt + want)
        lp = log_softmax(logits[len(prompt) - 1 : -1])
        np.testing.assert_allclose(comp.logprobs, lp[np.arange(10), want], atol=2e-5)
        assert comp.finish_reason == "length" and comp.versions.tolist() == [0] * 10
        assert comp.routed_experts.dtype == np.uint8  # 16 experts
        assert comp.routed_experts.shape == (10, m.cfg.n_moe_layers, m.cfg.n_experts_per_token)
        assert comp.prompt_routed_experts.shape[0] == len(prompt)


@pytest.mark.parametrize("speculative", [False, True])
def test_prompts_admitted_together_share_their_prefill_calls(kimi, speculative):
    """Prompts admitted in one step are fed together, one forward pass per chunk size (the row
    count padded to a power of two: the padding row writes nothing), beside a row already
    decoding; each output is still the full forward's argmax with its logprob, and each prompt
    token's recorded routing is the one the full forward picks."""
    engine = Engine(
        kimi.params,
        kimi.cfg,
        max_slots=4,
        max_len=MAX_LEN,
        prefill_chunk=16,
        speculative=speculative,
    )
    prompts = [list(range(40, 45)), [5], list(range(3, 20)), list(range(30, 60))]
    rids = [engine.submit(prompts[0], 20)]
    done = {c.request_id: c for c in engine.step()}
    assert engine.stats["feed_calls"] == 1
    rids += [engine.submit(p, 10) for p in prompts[1:]]
    done.update({c.request_id: c for c in engine.step()})
    # Three rows (padded to four) take 16 tokens each, then the two longer prompts finish.
    assert engine.stats["feed_calls"] == 3
    while engine.has_work():
        done.update({c.request_id: c for c in engine.step()})
    for prompt, rid in zip(prompts, rids):
        comp = done[rid]
        want = kimi.greedy(prompt, len(comp.tokens))
        assert comp.tokens.tolist() == want and len(want) == (20 if rid == rids[0] else 10)
        lp = log_softmax(kimi.logits(prompt + want)[len(prompt) - 1 : -1])
        np.testing.assert_allclose(comp.logprobs, lp[np.arange(len(want)), want], atol=2e-5)
        np.testing.assert_array_equal(comp.prompt_routed_experts, kimi.live_routing(prompt))


@pytest.mark.parametrize("num_draft", [1, 2])
def test_speculative_greedy_equals_plain_greedy(kimi, num_draft):
    plain = generate(kimi.params, kimi.cfg, PROMPTS, 12, **ENGINE)
    engine = Engine(kimi.params, kimi.cfg, speculative=True, num_draft_tokens=num_draft, **ENGINE)
    spec = engine.generate(PROMPTS, 12)
    for a, b in zip(plain, spec):
        assert a.tokens.tolist() == b.tokens.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
        np.testing.assert_array_equal(a.routed_experts, b.routed_experts)
        np.testing.assert_array_equal(a.prompt_routed_experts, b.prompt_routed_experts)
    s = engine.stats
    assert s["generated_tokens"] == 12 * len(PROMPTS)
    assert s["drafted"] == num_draft * s["verify_rows"]
    assert 0 <= s["acceptance_rate"] <= 1
    assert s["mean_accepted_length"] == pytest.approx(1 + s["accepted"] / s["verify_rows"])
    # Tokens per verification: the first token of each prompt comes from the prefill.
    assert s["verify_rows"] * s["mean_accepted_length"] >= 11 * len(PROMPTS)


def test_mtp_drafts_follow_the_training_paths_mtp_head(kimi, monkeypatch):
    """Sampling at temperature 1 (most drafts accepted by this flat random model): the
    probability each first draft (for the token after pending position n) was drawn with is
    MTP depth 1's at position n-1 as the full forward computes it. So every MTP cache entry,
    written from prompt chunks and deferred after each verification, is right."""
    seen = []
    absorb = Engine._absorb

    def spy(self, out, version, events, owners, epochs):
        for slot, seq in enumerate(owners):
            if seq is not None and seq.status == "running" and out["n_emit"][0, slot]:
                draft = out["drafts"][0, slot, 0], out["draft_logprobs"][0, slot, 0]
                seen.append((seq.rid, seq.fed, *draft))
        absorb(self, out, version, events, owners, epochs)

    monkeypatch.setattr(Engine, "_absorb", spy)
    engine = Engine(
        kimi.params, kimi.cfg, speculative=True, num_draft_tokens=1, temperature=1.0, **ENGINE
    )
    out = engine.generate(PROMPTS, 12)
    mtp = [kimi.mtp_logprobs(p + c.tokens.tolist()) for p, c in zip(PROMPTS, out)]
    assert len(seen) == engine.stats["verify_rows"]
    got = np.array([lp for *_, lp in seen])
    want = np.array([mtp[rid][n - 1, d] for rid, n, d, _ in seen])
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert engine.stats["accepted"] >= len(seen) // 2  # many steps keep their draft


def _replayed_logprobs(m, comp, temperature):
    seq = np.concatenate([comp.prompt, comp.tokens])
    routing = np.concatenate([comp.prompt_routed_experts, comp.routed_experts])
    assert len(routing) == len(seq)  # the last token was flushed through the model too
    replay = routing.astype(np.int32).transpose(1, 0, 2)
    logits = m.logits(seq.tolist(), routing=replay)
    lp = log_softmax(logits[len(comp.prompt) - 1 : -1], temperature)
    return lp[np.arange(len(comp.tokens)), comp.tokens], routing


@pytest.mark.parametrize("speculative", [False, True])
def test_recorded_logprobs_equal_training_forward_with_router_replay(kimi, speculative):
    """Sampled at temperature 0.8: the recorded behaviour logprobs equal the full forward's
    log_softmax(logits / 0.8) of the same tokens with the recorded experts replayed, and the
    recorded experts are the ones the full forward picks itself."""
    out = generate(
        kimi.params,
        kimi.cfg,
        PROMPTS[:3],
        14,
        temperature=0.8,
        speculative=speculative,
        seed=3,
        **ENGINE,
    )
    for comp in out:
        want, routing = _replayed_logprobs(kimi, comp, 0.8)
        np.testing.assert_allclose(comp.logprobs, want, atol=5e-5)
        live = kimi.live_routing(np.concatenate([comp.prompt, comp.tokens]).tolist())
        assert np.mean(np.sort(live, -1) == np.sort(routing, -1)) > 0.99


def test_sampling_is_seeded(kimi):
    run = lambda seed: [  # noqa: E731
        c.tokens.tolist()
        for c in generate(kimi.params, kimi.cfg, PROMPTS, 8, temperature=1.0, seed=seed, **ENGINE)
    ]
    first = run(0)
    assert run(0) == first
    assert run(1) != first


def _detok(ids):
    return "".join(chr(0x100 + int(i)) for i in ids)  # one distinct character per id


@pytest.mark.parametrize("speculative", [False, True])
def test_stops_on_stop_token_stop_string_and_budget(kimi, speculative):
    prompt = PROMPTS[1]
    ref = kimi.greedy(prompt, 12)
    opts = dict(ENGINE, speculative=speculative, num_draft_tokens=2 if speculative else None)
    stop_tok = ref[5]
    engine = Engine(kimi.params, kimi.cfg, detokenize=_detok, **opts)
    by_token = engine.submit(prompt, 12, stop_tokens=[stop_tok])
    by_string = engine.submit(prompt, 12, stop_strings=[_detok(ref[3:5])])
    by_budget = engine.submit(prompt, 4)
    done = {}
    while engine.has_work():
        done.update({c.request_id: c for c in engine.step()})
    k = ref.index(stop_tok)
    c = done[by_token]
    assert c.tokens.tolist() == ref[: k + 1] and (c.finish_reason, c.stop) == ("stop", stop_tok)
    k = next(m for m in range(12) if _detok(ref[3:5]) in _detok(ref[: m + 1]))
    c = done[by_string]
    assert c.tokens.tolist() == ref[: k + 1] and c.stop == _detok(ref[3:5])
    c = done[by_budget]
    assert c.tokens.tolist() == ref[:4] and c.finish_reason == "length"
    for c in done.values():  # every generated token was fed back: its experts are recorded
        assert len(c.routed_experts) == len(c.tokens)
        want, _ = _replayed_logprobs(kimi, c, 1.0)
        np.testing.assert_allclose(c.logprobs, want, atol=2e-5)


@pytest.mark.parametrize("speculative", [False, True])
def test_multi_turn_appends_tool_tokens_to_the_kv_cache(kimi, speculative):
    """Turn 1 stops on a stop token, tool output is appended as tokens, turn 2 continues from
    the kept cache: it equals greedy decoding of the whole stream, and the released trajectory
    replays to the recorded logprobs."""
    prompt = PROMPTS[2]
    ref = kimi.greedy(prompt, 12)
    stop = ref[3]
    engine = Engine(kimi.params, kimi.cfg, speculative=speculative, **ENGINE)
    rid = engine.submit(prompt, 12, multi_turn=True, stop_tokens=[stop])
    turns = []
    while engine.has_work():
        turns += engine.step()
    assert len(turns) == 1 and turns[0].tokens.tolist() == ref[: ref.index(stop) + 1]
    tool = [7, 8, 9, 10, 11]
    engine.extend(rid, tool, max_new_tokens=6)
    while engine.has_work():
        turns += engine.step()
    assert len(turns) == 2
    stream = prompt + turns[0].tokens.tolist() + tool
    assert turns[1].turn == 1 and turns[1].prompt.tolist() == tool
    assert turns[1].tokens.tolist() == kimi.greedy(stream, 6, stop=stop)
    traj = engine.release(rid)
    full = stream + turns[1].tokens.tolist()
    assert traj.token_ids.tolist() == full
    gen = np.zeros(len(full), bool)
    gen[len(prompt) : len(prompt) + len(turns[0].tokens)] = True
    gen[len(stream) :] = True
    np.testing.assert_array_equal(traj.generated, gen)
    np.testing.assert_array_equal(traj.versions, np.where(gen, 0, -1))
    replay = traj.replay_routing()
    assert replay.shape == (kimi.cfg.n_moe_layers, 1, len(full), kimi.cfg.n_experts_per_token)
    lp = log_softmax(kimi.logits(full, routing=replay[:, 0]))
    want = lp[np.arange(len(full) - 1), traj.token_ids[1:]]
    np.testing.assert_allclose(traj.logprobs[1:][gen[1:]], want[gen[1:]], atol=2e-5)
    with pytest.raises(KeyError, match="released"):
        engine.trajectory(rid)


def test_no_work_while_paused_sequences_hold_every_slot(kimi):
    """A queued prompt waits while paused multi-turn sequences hold all slots: has_work() is
    False (a caller waits for its tools instead of stepping an idle engine), and True again once
    a slot is released; the queued prompt then runs."""
    engine = Engine(kimi.params, kimi.cfg, **dict(ENGINE, max_slots=1))
    first = engine.submit(PROMPTS[0], 3, multi_turn=True)
    second = engine.submit(PROMPTS[1], 3)
    turns = []
    while engine.has_work():
        turns += engine.step()
    assert [t.request_id for t in turns] == [first] and engine.free_slots == 0
    assert not engine.has_work() and engine.step() == []
    engine.release(first)
    assert engine.free_slots == 1 and engine.has_work()
    done = []
    while engine.has_work():
        done += engine.step()
    assert [c.request_id for c in done] == [second] and len(done[0].tokens) == 3


def _mixed_workload(engine, stop):
    """Seven requests through three slots: one-shot ones with a stop token and budgets of 1 to
    9 tokens; multi-turn ones extended with tool tokens each time a turn ends (two more turns),
    then released. Every completion and trajectory, in the order they came back."""
    extends = {}  # multi-turn request -> extends so far
    for i, prompt in enumerate(PROMPTS + [[9, 9, 9], list(range(20, 27))]):
        multi = i % 3 == 0
        rid = engine.submit(prompt, 1 + (2 * i) % 9, multi_turn=multi, stop_tokens=[stop])
        if multi:
            extends[rid] = 0
    results, paused = [], []
    while engine.has_work() or paused:
        for comp in engine.step() if engine.has_work() else []:
            results.append(comp)
            if comp.request_id in extends:
                paused.append(comp.request_id)
        for rid in paused:
            if extends[rid] < 2:
                engine.extend(rid, [7 + extends[rid], 8, 9], max_new_tokens=4)
                extends[rid] += 1
            else:
                results.append(engine.release(rid))
        paused = []
    return results


def test_running_ahead_changes_no_output(kimi):
    """Dispatching each decode call before reading the last one back (run_ahead, the default)
    gives the same completions and trajectories as reading every call back first: tokens,
    versions, recorded experts, finish reasons, logprobs (to float32 rounding), on a workload of
    continuous batching, stop tokens, budgets and multi-turn extends and releases."""
    stop = kimi.greedy(PROMPTS[2], 4)[-1]
    outs = []
    for run_ahead in (False, True):
        engine = Engine(kimi.params, kimi.cfg, temperature=1.0, run_ahead=run_ahead, **ENGINE)
        outs.append(_mixed_workload(engine, stop))
    # Admission waits for the read-back, so requests may finish in another order.
    slow, fast = (sorted(o, key=lambda r: (r.request_id, getattr(r, "turn", 99))) for o in outs)
    assert len(slow) == len(fast) > 10
    for a, b in zip(slow, fast):
        assert type(a) is type(b)
        for field in ("request_id", "turn", "finish_reason"):
            assert getattr(a, field, None) == getattr(b, field, None)
        arrays = ("tokens", "versions", "routed_experts", "token_ids", "generated")
        for field in arrays:
            if hasattr(a, field):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        # Other rows beside a row change the float summation order in the last bit.
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-6)


def _scaled(params, factor):  # other weights of the same shapes
    return jax.tree.map(lambda a: a * factor, params)


@pytest.mark.parametrize(
    "recompute,speculative,run_ahead",
    [
        (False, False, False),
        (False, False, True),
        (True, False, False),
        (True, False, True),
        (True, True, True),
    ],
)
def test_update_weights_mid_flight(kimi, recompute, speculative, run_ahead):
    """Two tokens under version 0, then new weights: the rest carry version 1. Recompute:
    they equal greedy decoding of the whole prefix under the new weights. Keep (default): they
    equal decoding with the new weights on top of the old KV cache (model.decode_step). Running
    ahead, the call after the first step was dispatched before the update: three old tokens."""
    from c2 import model

    new = _scaled(kimi.params, 1.5)
    prompt = PROMPTS[1]
    engine = Engine(
        kimi.params,
        kimi.cfg,
        recompute_kv=recompute,
        speculative=speculative,
        run_ahead=run_ahead,
        **ENGINE,
    )
    rid = engine.submit(prompt, 10)
    engine.step()  # prefill (first token) and one decode step: two tokens under version 0
    engine.update_weights(new, version=1)
    out = []
    while engine.has_work():
        out += engine.step()
    (comp,) = out
    n_old = 2 + (run_ahead and not speculative)
    if speculative:
        n_old = int((comp.versions == 0).sum())
    assert comp.versions.tolist() == [0] * n_old + [1] * (10 - n_old)
    old = comp.tokens[:n_old].tolist()
    assert old == kimi.greedy(prompt, n_old)
    if recompute:
        assert comp.tokens[n_old:].tolist() == kimi.greedy(prompt + old, 10 - n_old, params=new)
    else:
        cfg = kimi.cfg
        cache = model.init_cache(cfg, 1, MAX_LEN + 16)
        logits, _, cache = model.prefill(
            kimi.params,
            np.asarray([prompt + old[:-1]]),
            cache,
            np.asarray([len(prompt) + n_old - 1]),
            cfg=cfg,
        )
        toks, last = [], old[-1]
        for _ in range(10 - n_old):
            logits, _, cache = model.decode_step(new, np.asarray([[last]]), cache, cfg=cfg)
            last = int(np.argmax(logits[0, 0]))
            toks.append(last)
        assert comp.tokens[n_old:].tolist() == toks
    # The recorded experts of the prompt: under the new weights when the cache was recomputed
    # (the rebuild re-routes them), under the old ones when it was kept.
    routing = np.concatenate([comp.prompt_routed_experts, comp.routed_experts])
    P = len(prompt)
    live = kimi.live_routing(prompt + comp.tokens.tolist(), params=new if recompute else None)
    same = np.sort(routing[:P], -1) == np.sort(live[:P], -1)
    assert same.mean() > 0.99
    if recompute:  # and the whole sequence is what the new weights route
        assert np.mean(np.sort(routing, -1) == np.sort(live, -1)) > 0.99
    assert engine.stats["weight_updates"] == 1
    assert engine.stats["update_pause_s"] > 0
    del rid


def test_update_weights_rejects_other_shapes(kimi):
    engine = Engine(kimi.params, kimi.cfg, **ENGINE)
    bad = dict(kimi.params, embed=kimi.params["embed"][:10])
    with pytest.raises(ValueError, match="update_weights: a leaf changed"):
        engine.update_weights(bad, version=1)


@pytest.fixture
def no_compile(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("compiled/ran a step for bad input")

    for name in ("feed", "decode", "init_state", "set_rows"):
        monkeypatch.setattr(steps, name, fail)


@pytest.mark.parametrize(
    "prompts,kwargs,match",
    [
        ([list(range(64))], {}, r"prompts\[0\] has 64 tokens but the context holds"),
        ([list(range(20))], dict(max_len=20), "prompt has 20 tokens but the context holds"),
        ([[1], []], {}, r"prompts\[1\] is empty"),
        ([], {}, "prompts: expected a non-empty list"),
        ([[1, 64]], {}, r"token ids must lie in \[0, vocab_size=64\)"),
        ([[1]], dict(temperature=-1.0), "temperature=-1.0"),
        ([[1]], dict(top_p=0.0), "top_p=0.0"),
        ([[1]], dict(top_k=65), "top_k=65"),
        ([[1]], dict(max_slots=0), "max_slots=0"),
        ([[1]], dict(stop_strings=["x"]), "stop_strings need detokenize"),
        ([[1]], dict(stop_tokens=[99]), "stop_tokens: id 99 outside"),
    ],
)
def test_bad_input_fails_before_compiling(kimi, no_compile, prompts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(kimi.params, kimi.cfg, prompts, 4, **kwargs)


def test_bad_budget_and_speculative_without_mtp(kimi, qwen, no_compile):
    with pytest.raises(ValueError, match="max_new_tokens=0: expected an int >= 1"):
        generate(kimi.params, kimi.cfg, [[1]], 0)
    with pytest.raises(ValueError, match="speculative=True needs MTP modules"):
        generate(qwen.params, qwen.cfg, [[1]], 4, speculative=True)


def test_routing_dtype_follows_expert_count(kimi):
    import jax.numpy as jnp

    assert steps.routing_dtype(kimi.cfg.replace(n_experts=256)) == jnp.uint8
    assert steps.routing_dtype(kimi.cfg.replace(n_experts=384)) == jnp.uint16


@pytest.mark.parametrize("speculative", [False, True])
def test_attention_follows_the_filled_cache_not_its_length(kimi, speculative):
    """In a long cache, decode calls and prompt chunks attend only to a power-of-two prefix that
    holds every row they write (128, then 256, then the whole cache as sequences grow; a decode
    call takes a prefix only up to half the cache); the tokens and logprobs are still the full
    forward's (greedy: each token is its argmax)."""
    cfg = kimi.cfg.replace(max_seq_len=1024)
    spec = steps.StepSpec(cfg, 2, 616, 8, True, 2, 1)
    assert steps.attend_len(spec, 100) == 128
    assert steps.attend_len(spec, 126) == 256
    assert steps.attend_len(spec, 256) is None  # a 512 prefix is most of 616 slots
    assert steps.attend_len(spec, 256, 64) == 512  # a prompt chunk still reads only 512
    assert steps.attend_len(steps.StepSpec(cfg, 2, 316, 8, True, 2, 1), 126) is None
    assert steps.attend_len(steps.StepSpec(cfg, 2, 316, 8, False, 0, 1), 128, 64) == 256
    # 114 tokens (two 64-token chunks), 3, and 200 (chunks into the 256 prefix), two slots.
    prompts = [list(range(3, 60)) * 2, [7, 8, 9], list(range(1, 41)) * 5]
    before = _decode_compiles()
    out = generate(
        kimi.params,
        cfg,
        prompts,
        170,
        speculative=speculative,
        max_slots=2,
        max_len=600,
        prefill_chunk=64,
    )
    assert _decode_compiles() - before == 3  # attending 128, 256, then all 616 slots
    forward = jax.jit(lambda p, t: model.forward(p, t, cfg)[0])
    for prompt, comp in zip(prompts, out):
        n = 170
        assert len(comp.tokens) == n
        seq = np.concatenate([prompt, comp.tokens])[None]
        logits = np.asarray(forward(kimi.params, seq))[0, len(prompt) - 1 : -1]
        np.testing.assert_array_equal(comp.tokens, logits.argmax(-1))
        lp = log_softmax(logits)[np.arange(n), comp.tokens]
        np.testing.assert_allclose(comp.logprobs, lp, atol=5e-5)
