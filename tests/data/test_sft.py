import collections
import json

import numpy as np
import pytest

from c2.data import corpus as corpus_lib
from c2.data import pipeline, sft
from c2.data import tokenizer as tk
from c2.train import sft_sources  # noqa: F401 - registers "functions" and ":agent"'s prompt

MODULE = (
    '''\
import functools


def no_doc(x):
    y = x + 1
    return y


@functools.cache
def add(
    a: int,
    b: int = 2,
) -> int:
    """Add two numbers.

    Returns a + b.
    """
    total = a + b
    # a comment stays in the body
    return total


class Box:
    def get(self, key):
        """Look a key up."""

        if key in self.items:
            return self.items[key]
        return None

    def abstract(self):
        """Subclasses implement this."""
        raise NotImplementedError("abstract")

    def stub(self):
        """Nothing."""
        pass

    def too_long(self):
        """Fifty lines."""
'''
    + "        x = 1\n" * 50
    + '''

def one_line_body():
    """Doc."""; return 1
'''
)


def test_format_chat_exact_ids_and_mask(byte_tokenizer):
    tok = byte_tokenizer
    s = tok.specials
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1."},
        {"role": "assistant", "content": "x + 1"},
    ]
    ids, mask = sft.format_chat(messages, tok)
    pieces = [
        ([tok.bos_id, s[tk.IM_START], *b"system\n"], 0),
        ([*b"Be brief.", s[tk.IM_END]], 0),
        ([*b"\n", s[tk.IM_START], *b"user\n"], 0),
        ([*b"Add 1.", s[tk.IM_END]], 0),
        ([*b"\n", s[tk.IM_START], *b"assistant\n"], 0),
        ([*b"x + 1", s[tk.IM_END]], 1),
        ([*b"\n", tok.eos_id], 0),
    ]
    np.testing.assert_array_equal(ids, np.concatenate([p for p, _ in pieces]).astype(np.int32))
    np.testing.assert_array_equal(mask, np.concatenate([[m] * len(p) for p, m in pieces]))
    assert ids.dtype == np.int32 and mask.dtype == np.float32

    prompt = sft.format_prompt(messages[:2], tok)
    assert tok.decode(prompt) == (
        "<|bos|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nAdd 1.<|im_end|>\n<|im_start|>assistant\n"
    )
    np.testing.assert_array_equal(prompt, ids[: len(prompt)])


def test_format_chat_validates(byte_tokenizer):
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] = 'robot'"):
        sft.format_chat([{"role": "robot", "content": "x"}], byte_tokenizer)
    with pytest.raises(ValueError, match=r"messages\[1\]: a system message may only come first"):
        sft.format_chat(
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            byte_tokenizer,
        )
    with pytest.raises(ValueError, match="needs a string field 'response'"):
        sft.example_messages({"prompt": "p"})


def test_extract_functions():
    examples = sft.extract_functions(MODULE, "m.py")
    assert [e["name"] for e in examples] == ["add", "get"]
    add, get = examples
    assert add["path"] == "m.py:10"
    assert add["prompt"] == sft.PROMPT_PREFIX + (
        "@functools.cache\n"
        "def add(\n"
        "    a: int,\n"
        "    b: int = 2,\n"
        ") -> int:\n"
        '    """Add two numbers.\n'
        "\n"
        "    Returns a + b.\n"
        '    """\n'
    )
    assert add["response"] == (
        "    total = a + b\n    # a comment stays in the body\n    return total\n"
    )
    assert get["prompt"] == sft.PROMPT_PREFIX + 'def get(self, key):\n    """Look a key up."""\n'
    assert get["response"] == (
        "    if key in self.items:\n        return self.items[key]\n    return None\n"
    )

    loose = sft.extract_functions(MODULE, "m.py", require_docstring=False, max_body_lines=60)
    assert [e["name"] for e in loose] == ["no_doc", "add", "get", "too_long"]
    assert loose[0]["prompt"] == sft.PROMPT_PREFIX + "def no_doc(x):\n"
    assert loose[0]["response"] == "    y = x + 1\n    return y\n"
    assert [e["name"] for e in sft.extract_functions(MODULE, min_body_lines=4)] == []
    assert sft.extract_functions("def broken(:\n", "bad.py") == []


def test_function_examples_come_from_the_train_split(source_dir):
    corpus = corpus_lib.DirectoryCorpus(source_dir, heldout_fraction=0.3)
    train_paths = set(corpus.documents("train").paths)
    heldout_paths = set(corpus.documents("heldout").paths)
    assert train_paths and heldout_paths
    examples = sft.function_examples(corpus, "train")
    assert examples and examples == sft.function_examples(corpus, "train")
    assert {e["path"].rsplit(":", 1)[0] for e in examples} <= train_paths
    held = sft.function_examples(corpus, "heldout")
    assert {e["path"].rsplit(":", 1)[0] for e in held} <= heldout_paths
    # A directory spec reads the same way (default 2% held out).
    by_spec = sft.load_sft_examples(source_dir, "all")
    assert by_spec == sft.function_examples(corpus, "all")


def test_sft_features(byte_tokenizer):
    tok = byte_tokenizer
    short = {"prompt": "Double x.", "response": "return 2 * x"}
    f = pipeline.sft_features
    feats = f(short, tok, 64)
    trained = feats["targets"][feats["loss_mask"] > 0]
    assert tok.decode(trained) == "return 2 * x<|im_end|>"
    trained_bytes = (feats["loss_mask"] > 0) & (feats["targets"] < 256)  # <|im_end|>: 0 bytes
    np.testing.assert_array_equal(feats["target_bytes"], trained_bytes.astype(np.int32))
    # Truncated to the window; a prompt that fills the window leaves nothing to train: dropped.
    long_response = {"prompt": "p", "response": "y" * 500}
    assert len(f(long_response, tok, 64)["inputs"]) == 64
    assert f({"prompt": "p" * 100, "response": "r"}, tok, 64) is None


def test_sft_packing(byte_tokenizer, check_rows):
    tok = byte_tokenizer
    examples = [
        {"prompt": f"Count to {i}.", "response": " ".join(map(str, range(i)))} for i in range(1, 25)
    ]
    examples.append({"prompt": "p" * 200, "response": "never fits"})
    examples.append({"prompt": "Long.", "response": "z" * 300})
    batches = list(
        pipeline.make_sft_dataset(
            examples,
            tok,
            96,
            1,
            seed=0,
            num_epochs=1,
            shuffle=False,
            shard_index=0,
            shard_count=1,
        )
    )
    segments = []
    for b in batches:
        check_rows(b, tok.pad_id)
        seg = b["segment_ids"][0]
        for s in range(1, seg.max() + 1):
            sel = seg == s
            segments.append(
                tuple(tuple(b[k][0][sel].tolist()) for k in ("inputs", "targets", "loss_mask"))
            )
    expected = []
    for ex in examples:
        feats = pipeline.sft_features(ex, tok, 96)
        if feats is not None:
            expected.append(
                tuple(tuple(feats[k].tolist()) for k in ("inputs", "targets", "loss_mask"))
            )
    assert len(expected) == len(examples) - 1
    # Every example is packed whole, exactly once (first-fit never splits an example).
    assert collections.Counter(segments) == collections.Counter(expected)


def test_sft_jsonl_and_eval_batches(tmp_path, byte_tokenizer, check_rows):
    path = tmp_path / "sft.jsonl"
    # 40 rows: the split hashes "file:line" and tmp_path varies, so 10 rows at 0.3 would leave the
    # held-out side empty in ~3% of runs; 40 make that 0.7**40 ~ 1e-6.
    n = 40
    rows = [{"prompt": f"Q{i}", "response": f"A{i}", "system": "S"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert sft.load_sft_jsonl(str(path)) == rows
    train = sft.load_sft_jsonl(str(path), "train", heldout_fraction=0.3)
    heldout = sft.load_sft_jsonl(str(path), "heldout", heldout_fraction=0.3)
    assert 0 < len(heldout) < n and len(train) + len(heldout) == n
    assert heldout == [
        r for i, r in enumerate(rows) if corpus_lib.heldout_score(f"{path}:{i + 1}") < 0.3
    ]
    ds = pipeline.make_sft_dataset(
        str(path), byte_tokenizer, 64, 2, seed=0, split="all", shard_index=0, shard_count=1
    )
    batch = next(iter(ds))
    assert batch["inputs"].shape == (2, 64)
    check_rows(batch, byte_tokenizer.pad_id)

    first = pipeline.make_sft_eval_batches(
        str(path), byte_tokenizer, 64, 2, split="all", shard_index=0, shard_count=1
    )
    second = pipeline.make_sft_eval_batches(
        str(path), byte_tokenizer, 64, 2, split="all", shard_index=0, shard_count=1
    )
    assert len(first) == len(second) >= 1
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
    trained = sum(int(b["loss_mask"].sum()) for b in first)
    assert trained == sum(len(f"A{i}") + 1 for i in range(n))  # response bytes + <|im_end|>

    path.write_text('{"prompt": "Q"}\n')
    with pytest.raises(ValueError, match=r"sft.jsonl:1: SFT example needs a string field"):
        sft.load_sft_jsonl(str(path))
    with pytest.raises(ValueError, match="expected 'stdlib', a source directory or a .jsonl"):
        sft.load_sft_examples("data.csv")


def test_extract_functions_finds_defs_in_every_block():
    source = "\n".join(
        [
            "if True:",
            "    pass",
            "else:",
            "    def in_else():",
            '        """Doc."""',
            "        a = 1",
            "        return a",
            "try:",
            "    import os",
            "except ImportError:",
            "    async def in_except():",
            '        """Doc."""',
            "        a = 1",
            "        return a",
            "match 1:",
            "    case 1:",
            "        def in_case():",
            '            """Doc."""',
            "            a = 1",
            "            return a",
            "def outer():",
            '    """Doc."""',
            "    def inner():",
            '        """Doc."""',
            "        a = 1",
            "        return a",
            "    return inner",
            "",
        ]
    )
    names = [e["name"] for e in sft.extract_functions(source)]
    assert names == ["in_else", "in_except", "in_case", "outer", "inner"]


def test_copy_examples_repeat_the_prompts_strings_deterministically_with_disjoint_splits():
    train = sft.load_sft_examples("copy:200", "train")
    again = sft.load_sft_examples("copy:200", "train")
    held = sft.load_sft_examples("copy:200", "eval")
    assert train == again and len(train) == 200
    # The response holds the prompt's strings, not always in the prompt's order.
    assert all(sorted(e["response"].split()) == sorted(e["prompt"].split()) for e in train)
    assert any(e["response"] != e["prompt"] for e in train)
    words = [w for e in train for w in e["prompt"].split(" ")]
    assert all(4 <= len(w) <= 12 and w.isalnum() for w in words)
    assert {len(e["prompt"].split(" ")) for e in train} == {1, 2, 3, 4}
    assert not {e["prompt"] for e in train} & {e["prompt"] for e in held}
    assert len(sft.load_sft_examples("copy", "eval")) == sft.COPY_COUNTS["eval"]
    with pytest.raises(ValueError, match="'copy:N' with N >= 1"):
        sft.load_sft_examples("copy:0")
    # ":ordered": the same strings, said in the prompt's order.
    ordered = sft.load_sft_examples("copy:200:ordered", "train")
    assert [e["prompt"] for e in ordered] == [e["prompt"] for e in train]
    assert all(e["response"] == e["prompt"] for e in ordered)
    agent = sft.load_sft_examples("copy:200:ordered:agent", "train")
    assert [e["response"] for e in agent] == [e["response"] for e in ordered]
    assert all(e["system"] for e in agent)
    for bad in ("copy:3:agent:ordered", "copy:ordered:ordered", "recall:3:ordered"):
        with pytest.raises(ValueError, match="N:agent"):
            sft.load_sft_examples(bad)


def test_a_mixture_spec_holds_each_parts_examples():
    mix = sft.load_sft_examples("functions:basic+copy:30", "eval")
    agent = sft.load_sft_examples("functions:basic", "eval")
    copies = sft.load_sft_examples("copy:30", "eval")
    assert list(mix) == [*agent, *copies]
    with pytest.raises(ValueError, match="an empty part"):
        sft.load_sft_examples("copy:30+", "train")
    with pytest.raises(ValueError, match="'nope'"):
        sft.load_sft_examples("copy:30+nope", "train")


def test_an_environment_spec_needs_its_source_registered(monkeypatch):
    """c2.data knows no environment: without c2.train.sft_sources' registrations, the
    environments' specs and ":agent" fail naming the spec and the module to import."""
    monkeypatch.setattr(sft, "SOURCES", sft.ExampleSources())
    for spec, named in (
        ("functions:basic",) * 2,
        ("notes:fixed",) * 2,
        ("copy:3+functions", "functions"),
    ):
        with pytest.raises(ValueError, match=f"'{named}'.*import c2.train.sft_sources"):
            sft.load_sft_examples(spec, "eval")
    with pytest.raises(ValueError, match=r"'copy:3:agent'.*import c2\.train\.sft_sources"):
        sft.load_sft_examples("copy:3:agent")
    # A registered source answers its spec by its head, and may not shadow a built-in one.
    sft.SOURCES.register("toy", lambda spec, split: [{"prompt": spec, "response": split}])
    sft.SOURCES.register_agent_system_prompt(lambda: "be brief")
    assert sft.load_sft_examples("toy:2", "eval") == [{"prompt": "toy:2", "response": "eval"}]
    assert {e["system"] for e in sft.load_sft_examples("copy:3:agent")} == {"be brief"}
    for name in ("copy", "toy"):
        with pytest.raises(ValueError, match="registered already"):
            sft.SOURCES.register(name, lambda spec, split: [])


def test_functions_wide_spec_counts_train_tasks_and_holds_out_256():
    train = sft.load_sft_examples("functions:wide:40", "train")
    held = sft.load_sft_examples("functions:wide:40", "eval")
    assert len(train) == 40 and len(held) == sft.WIDE_COUNTS["eval"] == 256
    assert len(sft.load_sft_examples("functions:wide", "train")) == sft.WIDE_COUNTS["train"]
    assert [e["path"] for e in train] == [f"fnw-train-s0-{i:05d}" for i in range(40)]
    consts = {int(e["messages"][2]["content"].split("return n ")[1][2:4].strip("\\")) for e in held}
    assert len(consts) > 50  # constants 1-99, not basic's 2 and 3
    for bad in ("functions:wide:0", "functions:basic:5", "functions:wide:x"):
        with pytest.raises(ValueError, match="functions"):
            sft.load_sft_examples(bad)


def test_recall_examples_answer_each_asked_key_with_its_value():
    train = sft.load_sft_examples("recall:300", "train")
    held = sft.load_sft_examples("recall:300", "eval")
    assert train == sft.load_sft_examples("recall:300", "train") and len(train) == 300
    for e in train:
        table = dict(line.split(" = ") for line in e["prompt"].split("\n"))
        asked = [line.split(" = ") for line in e["response"].split("\n")]
        assert 2 <= len(table) <= 6 and 1 <= len(asked) <= min(3, len(table))
        assert all(table[k] == v for k, v in asked) and len({k for k, _ in asked}) == len(asked)
        assert all(k.isalpha() and k.islower() and 3 <= len(k) <= 8 for k in table)
        assert all(v in sft.RECALL_VALUES for v in table.values())
    # A prompt's values almost always differ, so only the key tells which one to write.
    distinct = [len({line.split(" = ")[1] for line in e["prompt"].split("\n")}) for e in train]
    assert np.mean([d > 1 for d in distinct]) > 0.95
    assert {len(e["prompt"].split("\n")) for e in train} == {2, 3, 4, 5, 6}
    assert not {e["prompt"] for e in train} & {e["prompt"] for e in held}
    with pytest.raises(ValueError, match="'recall:N' with N >= 1"):
        sft.load_sft_examples("recall:x")


def test_agent_option_puts_the_agent_system_prompt_before_the_same_examples():
    from c2.data.tokenizer import ByteTokenizer
    from c2.envs.episode import compact_system_prompt

    for name in ("copy", "recall"):
        plain = sft.load_sft_examples(f"{name}:20", "train")
        agent = sft.load_sft_examples(f"{name}:20:agent", "train")
        assert [{**e, "system": compact_system_prompt()} for e in plain] == agent
        assert len(sft.load_sft_examples(f"{name}:agent", "eval")) == sft.COPY_COUNTS["eval"]
        for bad in (f"{name}:agent:3", f"{name}:3:agents", f"{name}:3:agent:1"):
            with pytest.raises(ValueError, match=f"'{name}:N:agent'"):
                sft.load_sft_examples(bad)
    # Rendered, the system turn comes first and only the reply is trained.
    tok = ByteTokenizer()
    ids, mask = sft.format_chat(sft.example_messages(agent[0]), tok)
    text = tok.decode(ids)
    assert text.index(compact_system_prompt()) < text.index(agent[0]["prompt"])
    assert tok.decode(np.asarray(ids)[np.asarray(mask, bool)]).startswith(agent[0]["response"])
