"""Base-model selection (c2/eval/select.py): the measures separate a trained from an untrained
checkpoint, the ranking combines all three (mean rank), and the generated programs and questions
say what they claim."""

import json
import random

import jax.numpy as jnp
import pytest

from c2.eval import select as sel


def _tiny(steps, corpus="stdlib"):
    from c2.train.config import stage_defaults

    c = stage_defaults()
    c.name, c.model.dtype = "tiny_cpt", "float32"
    o = c.model.overrides
    o.d_model, o.n_layers, o.n_heads, o.d_ff, o.d_ff_expert = 32, 2, 2, 64, 16
    o.n_experts, o.n_experts_per_token, o.q_lora_rank, o.kv_lora_rank = 4, 2, 16, 16
    o.qk_nope_head_dim, o.qk_rope_head_dim, o.v_head_dim, o.mtp_depth = 8, 8, 8, 0
    c.data.corpus = corpus
    c.data.seq_len, c.data.batch_size, c.data.eval_batches = 64, 8, 1
    c.optimizer.lr, c.optimizer.warmup_steps = 1e-2, 0
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, steps, 0
    c.train.progress_bar = False
    return c


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """(trained, untrained): 40 CPT steps on half standard-library code (train split), half
    state-tracking programs (another seed than the measure's); and the initial weights."""
    from c2.data.corpus import load_corpus
    from c2.train import lm
    from c2.train.checkpoint import Checkpointer
    from c2.train.loop import init_key, train

    root = tmp_path_factory.mktemp("select")
    rng = random.Random("train")
    docs = ["".join(sel.state_program(rng.randrange(1, 4), rng)) for _ in range(2000)]
    stdlib = load_corpus("stdlib").documents("train")
    docs += [stdlib[i]["text"][:1000] for i in range(0, 100 * 7, 7)]
    corpus = root / "programs.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    trained = root / "trained"
    c = _tiny(40, str(corpus))
    train(c, trained, lm.build_task(c))
    untrained = root / "untrained"
    c = _tiny(1)
    ckpt = Checkpointer(untrained / "checkpoints", async_save=False)
    ckpt.save(0, lm.build_task(c).init_params(init_key(0)), {"unused": jnp.zeros(1)}, {})
    ckpt.close()
    (untrained / "config.json").write_text(c.to_json_best_effort())
    return str(trained), str(untrained)


def test_state_programs_compute_what_they_claim():
    rng = random.Random(0)
    for d in (1, 3, 8):
        prompt, answer = sel.state_program(d, rng)
        body, _, query = prompt.rpartition("\n# ")
        assert len(body.splitlines()) == 3 + d
        env = {}
        exec(body, {}, env)  # the program is real Python
        assert str(env[query.split(" ")[0]]) + "\n" == answer


def test_fresh_api_corpus_defines_what_the_questions_ask(tmp_path):
    from c2.data.corpus import load_corpus

    api = sel.fresh_api(6, 0)
    root = sel.write_api_corpus(api, tmp_path / "corpus")
    env = {}
    exec((root / "qorvath.py").read_text(), env)
    for f in api:
        assert env[f["name"]](7, 3) == eval(f["body"], {}, {"a": 7, "b": 3})
    assert len(load_corpus(str(root)).documents("heldout")) >= 1
    text = "".join(p.read_text() for p in root.glob("*.py"))
    for (question, answer), f in zip(sel.api_questions(api), api):
        assert answer == f["name"] + "(" and question not in text  # held out from the corpus


@pytest.mark.slow
def test_the_measures_separate_trained_from_untrained(workdirs, tmp_path):
    trained, untrained = workdirs
    opts = sel.SelectOptions(
        seq_len=64, bpb_batches=2, depths=(1, 2), programs=8, api_functions=8, api_steps=10
    )
    rows = sel.select([untrained, trained], tmp_path / "out", opts)
    by = {r["candidate"]: r for r in rows}
    t, u = by[trained], by[untrained]
    assert [r["candidate"] for r in rows] == [trained, untrained]  # the trained one ranks first
    assert t["rank"] == 1 and u["rank"] == 2
    assert t["ranks"]["codebase"] == 1 and t["ranks"]["state_tracking"] == 1
    for r in (t, u):
        assert r["mean_rank"] == pytest.approx(sum(r["ranks"].values()) / 3)
    assert t["codebase"]["bpb"] < u["codebase"]["bpb"]  # ~8.3 untrained
    for d in ("1", "2"):  # the trained model puts more mass on the right final values
        assert (
            t["state_tracking"]["per_depth"][d]["answer_bpb"]
            < u["state_tracking"]["per_depth"][d]["answer_bpb"]
        )
    after = t["fresh_api"]["after"]  # 10 CPT steps on the library's corpus
    assert after["answer_bpb"] < t["fresh_api"]["before"]["answer_bpb"]
    saved = json.loads((tmp_path / "out" / "selection.json").read_text())
    assert [r["candidate"] for r in saved["rows"]] == [trained, untrained]
    md = (tmp_path / "out" / "selection.md").read_text()
    assert f"| 1 | {t['mean_rank']:.2f} | {trained} |" in md


def _row(name, bpb, distance, answer_bpb, before, after):
    """A candidate's measures: fresh-API (accuracy, answer bits/byte) before and after CPT."""
    return {
        "candidate": name,
        "codebase": {"bpb": bpb},
        "state_tracking": {
            "distance": distance,
            "per_depth": {"1": {"answer_bpb": answer_bpb}, "2": {"answer_bpb": answer_bpb}},
        },
        "fresh_api": {
            "before": {"accuracy": before[0], "answer_bpb": before[1]},
            "after": after and {"accuracy": after[0], "answer_bpb": after[1]},
        },
    }


def test_the_ranking_combines_the_three_measures_by_mean_rank():
    """Bits per byte alone orders A, B, C; the measures together put B first (by hand below)."""
    rows = [
        _row("A", 1.0, 0, 3.0, (0.9, 0.5), (0.1, 2.0)),
        _row("B", 1.2, 4, 1.0, (0.0, 3.0), (0.5, 1.0)),
        _row("C", 1.5, 0, 2.0, (0.0, 3.0), (0.3, 1.5)),
    ]
    ranked = sel.rank_rows([dict(r) for r in rows])
    by = {r["candidate"]: r for r in ranked}
    # codebase A1 B2 C3; state B1 (distance 4), then at distance 0 C2 (2.0 bits/byte) A3;
    # fresh API after CPT B1 C2 A3. Means: A 7/3, B 4/3, C 7/3; A and C tie, A has fewer bits.
    assert by["A"]["ranks"] == {"codebase": 1, "state_tracking": 3, "fresh_api": 3}
    assert by["C"]["ranks"] == {"codebase": 3, "state_tracking": 2, "fresh_api": 2}
    assert [by[c]["mean_rank"] for c in "ABC"] == pytest.approx([7 / 3, 4 / 3, 7 / 3])
    assert [r["candidate"] for r in ranked] == ["B", "A", "C"]
    assert [r["rank"] for r in ranked] == [1, 2, 3]

    # C has no after-measure (an hf: candidate): all compare before CPT, like with like. A is
    # first there; B and C tie (0.0, 3.0) and share places 2 and 3. Means: A 5/3, B 11/6, C 5/2.
    rows[2]["fresh_api"]["after"] = None
    ranked = sel.rank_rows([dict(r) for r in rows])
    by = {r["candidate"]: r for r in ranked}
    assert [by[c]["ranks"]["fresh_api"] for c in "ABC"] == [1, 2.5, 2.5]
    assert [by[c]["mean_rank"] for c in "ABC"] == pytest.approx([5 / 3, 11 / 6, 5 / 2])
    assert [r["candidate"] for r in ranked] == ["A", "B", "C"]
