"""The notes task family: deterministic, splits apart, the oracle passes and no-op fails, the
reference chain renders the same ids the episode runner produces when replayed through it."""

import shutil

import numpy as np
import pytest

from c2.data.chat import AgentChat
from c2.data.tokenizer import ByteTokenizer
from c2.envs.grading import run_hidden_tests
from c2.envs.notes import (
    KEYS,
    generate_notes_tasks,
    notes_task,
    oracle_chain,
    read_file_output,
    summary_text,
)
from c2.envs.sandbox import Sandbox
from c2.envs.tools import ToolCall, Tools
from c2.rl.episodes import EpisodeRequest, EpisodeRunner, RolloutConfig


def test_deterministic_and_splits_apart():
    a, b = notes_task(3, "train", 5), notes_task(3, "train", 5)
    assert a == b and a != notes_task(4, "train", 5)
    train = {k for i in range(30) for k in notes_task(0, "train", i)["metadata"]["keys"]}
    held = {k for i in range(30) for k in notes_task(0, "eval", i)["metadata"]["keys"]}
    assert train <= set(KEYS["train"]) and held <= set(KEYS["eval"]) and not train & held
    t = notes_task(0, "eval", 1, files=4, note_chars=200)
    meta = t["metadata"]
    assert len(meta["keys"]) == 4 and len(t["workspace"]) == 4
    for k, v in zip(meta["keys"], meta["values"]):
        note = t["workspace"][f"notes/{k}.txt"]
        assert f"{k} = {v}\n" in note and 180 <= len(note) <= 260
    with pytest.raises(ValueError, match="split='test'"):
        notes_task(0, "test", 0)


def test_keyed_level_keys_occur_only_where_they_name_their_note():
    """Level "keyed": three random letters per note, found nowhere else in the episode's text
    (so a summary's copy can find a value by its key), the fixed level's shape otherwise."""
    from c2.envs.notes import parse_spec

    assert parse_spec("notes:keyed:4:80") == ("keyed", 4, 80)
    chat = AgentChat(ByteTokenizer())
    seen = set()
    for split in ("train", "eval"):
        for i in range(40):
            t = notes_task(1, split, i, 4, 80, "keyed")
            keys, values = t["metadata"]["keys"], t["metadata"]["values"]
            assert t == notes_task(1, split, i, 4, 80, "keyed")
            assert t["metadata"]["task_id"] == f"notesk-{split}-s1-{i:05d}"
            assert len(set(keys)) == 4 and all(len(k) == 3 and k.isalpha() for k in keys)
            assert t["instruction"] == (
                f"Write total(n) in total.py: return n plus the values of {keys[0]}, {keys[1]}, "
                f"{keys[2]} and {keys[3]} (see notes/)."
            )
            assert t["solution"]["total.py"].endswith(f"n + {' + '.join(map(str, values))}\n")
            for cuts in ((), (2,), (1, 3)):
                for segment in oracle_chain(t, cuts, submit_with_write=True):
                    ids = chat.conversation(segment)[0]  # special ids are no text: dropped
                    text = chat.tokenizer.decode([x for x in ids if x < 256])
                    for k in keys:  # the task, its note's path and line, summaries, nothing else
                        want = text.count(f"{k},") + text.count(f"{k} ") + text.count(f"{k}.txt")
                        assert text.count(k) == want, (k, text)
            seen.update(keys)
    assert len(seen) > 250  # drawn per task, not from a list


def test_oracle_passes_noop_fails_and_reads_match_the_tool(tmp_path, sandbox: Sandbox):
    tasks = generate_notes_tasks(tmp_path / "tasks", 3, 0, "eval")
    for task in tasks:
        work = task.materialize(tmp_path / f"w-{task.task_id}")
        sandbox.give_workspace(work)
        fail = run_hidden_tests(task, work, sandbox)
        assert not any(fail.passed(t) for t in task.fail_to_pass)
        for name in task.solution_dir.iterdir():
            shutil.copy(name, work / name.name)
        assert all(run_hidden_tests(task, work, sandbox).passed(t) for t in task.fail_to_pass)
        tools = Tools(work, sandbox)
        k = task.metadata["keys"][0]
        got = tools(ToolCall("read_file", {"path": f"notes/{k}.txt"})).content
        assert got == read_file_output((task.workspace_dir / "notes" / f"{k}.txt").read_text())


def test_reference_chain_is_what_the_runner_plays(tmp_path, sandbox: Sandbox):
    """The oracle's chain (cut after every read), replayed through the runner with a trigger
    every observation crosses: the segments' ids and masks equal AgentChat's rendering of the
    reference conversations, and the chain passes."""
    from tests.rl.test_chains import ChainEngine

    chat = AgentChat(ByteTokenizer())
    (task,) = generate_notes_tasks(tmp_path / "tasks", 1, 2, "train", files=3, note_chars=120)
    convs = oracle_chain(task, cuts=(1, 2, 3), submit_with_write=True)
    assert len(convs) == 4
    rendered = [chat.conversation(c) for c in convs]
    replies = [[chat.reply(m["content"]) for m in c if m["role"] == "assistant"] for c in convs]
    engine = ChainEngine(replies, max_len=2048, im_end=chat.im_end)
    prompt_len = len(chat.prompt(convs[0][0]["content"], task.instruction))
    cfg = RolloutConfig(
        max_tokens=2048,
        max_turn_tokens=400,
        context_management="self_summary",
        summary_trigger=prompt_len + 10,
        summary_max_tokens=200,
        max_segments=4,
    )
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep", cfg)
    (s,) = runner.run([EpisodeRequest(task, "p", "g", 0)])
    assert s.passed and s.stop_reason == "submit" and len(s.chain) == 4
    for seg, (ids, mask) in zip(s.chain, rendered):
        np.testing.assert_array_equal(seg.tokens, ids)
        np.testing.assert_array_equal(seg.loss_mask, mask.astype(np.uint8))
    assert summary_text(task.metadata, 2) in convs[2][1]["content"]


def test_sft_chains_teach_summaries_and_going_on_from_them():
    from c2.data.sft import load_sft_examples
    from c2.rl.episodes import SUMMARY_HEADER, SUMMARY_INSTRUCTION
    from c2.train import sft_sources  # noqa: F401 - registers the "notes" spec

    chat = AgentChat(ByteTokenizer())
    examples = load_sft_examples("notes:fixed:4:80")
    # 600 tasks: one cut each (2 segments), every other also uncut, every third also cut twice
    assert len(examples) == 1200 + 300 + 3 * 200 and examples == load_sft_examples(
        "notes:fixed:4:80"
    )
    asked = [
        e for e in examples if any(m.get("note") == SUMMARY_INSTRUCTION for m in e["messages"])
    ]
    resumed = [e for e in examples if SUMMARY_HEADER in e["messages"][1]["content"]]
    assert len(asked) == len(resumed) == 600 + 2 * 200
    twice = [e for e in resumed if any(m.get("note") == SUMMARY_INSTRUCTION for m in e["messages"])]
    assert len(twice) == 200  # a summary written in a segment that began from one
    for e in asked[:20] + twice[:20]:  # the summary carries every value read so far, exactly
        meta = notes_task(0, "train", int(e["path"].split("/")[0][-5:]), 4, 80, "fixed")["metadata"]
        _, plan, segment = e["path"].split("/")  # task/cut<a>[-<b>]/<segment index>
        read = [int(c) for c in plan[3:].split("-")][int(segment)]
        assert e["messages"][-1]["content"] == summary_text(meta, read)
        ids, mask = chat.conversation(e["messages"])
        assert len(ids) <= 1280 and mask[-1] == 1.0


def test_sft_data_renders_the_ids_the_runner_feeds(tmp_path):
    """Agent SFT renders chains from the in-memory task; RL plays the task as written to disk
    (instruction.md ends with a newline): both must give the same ids, segment by segment
    (a trailing-newline difference once made the SFT'd policy garble its first reply)."""
    chat = AgentChat(ByteTokenizer())
    tasks = generate_notes_tasks(tmp_path, 3, 0, "train", files=4, note_chars=80, level="fixed")
    for i, task in enumerate(tasks):
        memory = notes_task(0, "train", i, 4, 80, "fixed")
        for cuts in ((), (1,), (2, 3)):
            want = [chat.conversation(c) for c in oracle_chain(task, cuts, submit_with_write=True)]
            got = [chat.conversation(c) for c in oracle_chain(memory, cuts, submit_with_write=True)]
            assert len(got) == len(want) == len(cuts) + 1
            for (a, ma), (b, mb) in zip(got, want):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(ma, mb)


def test_chains_cli_writes_sft_data_of_any_size(tmp_path):
    """`python -m c2.envs.notes --chains` writes the oracle chains as agent-SFT JSONL
    (data.corpus=FILE): the same conversations chain_conversations gives, every one loadable."""
    from c2.data.sft import load_sft_jsonl
    from c2.envs.notes import chain_conversations, main

    out = tmp_path / "sft" / "chains.jsonl"
    args = ["--chains", "--out", str(out), "--n", "7", "--seed", "3", "--files", "4"]
    assert main([*args, "--note_chars", "80", "--level", "fixed"]) == 0
    want = chain_conversations(7, 3, "train", 4, 80, "fixed")
    assert load_sft_jsonl(str(out)) == want
    assert len(want) == 2 * 7 + 3 + 3 * 3  # cut once (2 segments), 3 uncut, 3 cut twice
    assert not list(out.parent.glob("*.tmp"))


def test_chains_cut_where_asked(tmp_path):
    """--cuts 1,2: every chain cut after its first and second read (3 segments, the summaries
    carrying the values read so far); cut points beyond the notes are refused by name."""
    from c2.data.sft import load_sft_jsonl
    from c2.envs.notes import chain_conversations, main, notes_task, summary_text

    convs = chain_conversations(4, 3, "train", 2, 80, "fixed", cuts=(2, 1))
    assert [c["path"].rsplit("/", 2)[1:] for c in convs[:3]] == [
        ["cut1-2", "0"],
        ["cut1-2", "1"],
        ["cut1-2", "2"],
    ]
    assert len(convs) == 4 * 3
    meta = notes_task(3, "train", 0, 2, 80, "fixed")["metadata"]
    for k, conv in enumerate(convs[:2], 1):  # each of the first two segments ends in its summary
        assert conv["messages"][-1] == {"role": "assistant", "content": summary_text(meta, k)}
    assert summary_text(meta, 1) in convs[1]["messages"][1]["content"]
    assert summary_text(meta, 2) in convs[2]["messages"][1]["content"]
    out = tmp_path / "chains.jsonl"
    args = ["--chains", "--out", str(out), "--n", "4", "--seed", "3", "--files", "2"]
    assert main([*args, "--note_chars", "80", "--level", "fixed", "--cuts", "1,2"]) == 0
    assert load_sft_jsonl(str(out)) == convs
    with pytest.raises(ValueError, match=r"cuts=\(3,\): expected numbers of reads in 1..2"):
        chain_conversations(1, 3, "train", 2, 80, "fixed", cuts=(3,))
    with pytest.raises(SystemExit):
        main([*args, "--level", "fixed", "--cuts", "one"])
