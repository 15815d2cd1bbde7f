"""Agent SFT examples ({"messages": [...]}): the "functions" spec and JSONL, via AgentChat."""

import json

import numpy as np
import pytest

from c2.data import pipeline, sft
from c2.data.tokenizer import IM_END, ByteTokenizer
from c2.envs import functions as fn
from c2.train import sft_sources  # noqa: F401 - registers the "functions" spec


def _replies(messages):
    return IM_END.join(m["content"] for m in messages if m["role"] == "assistant") + IM_END


def test_functions_spec_train_and_heldout_templates():
    train = sft.load_sft_examples("functions", "train")
    held = sft.load_sft_examples("functions", "heldout")
    assert (
        len(train) == sft.FUNCTIONS_COUNTS["train"] and len(held) == sft.FUNCTIONS_COUNTS["heldout"]
    )
    assert all(e["path"].startswith("fn-train-") for e in train)
    assert all(e["path"].startswith("fn-eval-") for e in held)
    for e in train[:50] + held[:50]:
        sft.check_example(e)
    assert sft.load_sft_examples("functions", "eval") == held
    assert train[:5] == [
        {"messages": fn.task_conversation(t), "path": t.task_id}
        for t in fn.function_tasks(5, sft.FUNCTIONS_SEED, "train")
    ]
    with pytest.raises(ValueError, match="split"):
        sft.load_sft_examples("functions", "all")


def test_functions_batches_train_exactly_the_oracle_replies():
    tok = ByteTokenizer()
    expected = {_replies(e["messages"]) for e in sft.load_sft_examples("functions", "train")}
    ds = pipeline.make_sft_dataset("functions", tok, 512, 4, seed=0)
    it = iter(ds)
    n = 0
    for _ in range(3):
        b = next(it)
        for row in range(4):
            seg, mask = b["segment_ids"][row], b["loss_mask"][row]
            for s in set(seg[seg > 0].tolist()):
                sel = (seg == s) & (mask > 0)
                assert tok.decode(b["targets"][row][sel]) in expected
                assert (b["target_bytes"][row][sel] == (b["targets"][row][sel] < 256)).all()
                n += 1
    assert n >= 12
    held = pipeline.make_sft_eval_batches("functions", tok, 512, 4, max_batches=2)
    held_expected = {_replies(e["messages"]) for e in sft.load_sft_examples("functions", "heldout")}
    b = held[0]
    for row in range(4):
        sel = b["loss_mask"][row] > 0
        assert tok.decode(b["targets"][row][sel]) in held_expected


def test_messages_jsonl_and_prompt_response_side_by_side(tmp_path):
    tok = ByteTokenizer()
    convo = fn.task_conversation(fn.function_tasks(1, 0, "train")[0])
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"messages": convo, "path": "a"},
        {"prompt": "Add 1.", "response": "x + 1", "path": "b"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = sft.load_sft_examples(str(path), "all")
    assert examples == rows
    agent = pipeline.sft_features(examples[0], tok, 512)
    plain = pipeline.sft_features(examples[1], tok, 512)
    assert tok.decode(agent["targets"][agent["loss_mask"] > 0]) == _replies(convo)
    ids, mask = sft.format_chat(sft.example_messages(rows[1]), tok)  # unchanged rendering
    np.testing.assert_array_equal(plain["targets"], ids[1:])
    np.testing.assert_array_equal(plain["loss_mask"], mask[1:])


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "assistant", "content": "x"}], "roles"),
        ([{"role": "user", "content": "t"}], "roles"),
        ([{"role": "user", "content": "t"}, {"role": "assistant", "content": "a"},
          {"role": "tool", "content": "not a list"}, {"role": "assistant", "content": "b"}],
         "list of strings"),
        ([{"role": "user", "content": "t"}, {"role": "assistant", "content": "a"},
          {"role": "tool", "content": ["out"]}], "roles"),
        ("nope", "list of objects"),
    ],
)  # fmt: skip
def test_bad_agent_examples_name_the_line(tmp_path, messages, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(ValueError, match=match) as e:
        sft.load_sft_jsonl(str(path), "all")
    assert "bad.jsonl:1" in str(e.value)
