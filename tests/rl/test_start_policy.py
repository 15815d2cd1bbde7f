"""The RL stage's shipped start policy (experiments/policies/reader_tiny) reads its task.

experiments/rl_tiny.py starts from it by default: RL can only reinforce a policy whose answers
depend on the task, so the property that matters is that it copies the operation and constant
of held-out instructions (templates it never trained on) far above chance, teacher-forced.
"""

from pathlib import Path

import pytest

from c2.eval.copying import model_logits_fn, task_format_logprob, task_reading_accuracy
from c2.eval.models import load_model
from c2.train.config import load_config

ROOT = Path(__file__).parents[2]
POLICY = ROOT / "experiments" / "policies" / "reader_tiny"


def test_rl_tiny_starts_from_the_shipped_policy():
    config = load_config(ROOT / "experiments" / "rl_tiny.py")
    assert config.init_from == "hf:experiments/policies/reader_tiny"
    assert config.model.yarn.factor == 0.0  # the chain trained without YaRN


@pytest.fixture(scope="module")
def reader():
    return load_model(f"hf:{POLICY}")


def test_the_policy_reads_held_out_instructions(reader):
    r = task_reading_accuracy(model_logits_fn(reader), reader.tokenizer, "wide", prompts=40)
    # Chance: 1/3 for the operation, ~1/10 a digit (a policy that ignores the instruction).
    assert r["operation"] >= 0.55, r  # measured 0.625 (40 conversations)
    assert r["constant"] >= 0.8, r  # measured 1.000


def test_the_policy_keeps_its_call_s_form_on_every_held_out_template(reader):
    """Stage 5's reworded tasks: no held-out phrasing garbles the first reply's tool call (the
    policy before them: -0.194 nats a token on "... it gives back n * 94.")."""
    f = task_format_logprob(model_logits_fn(reader), reader.tokenizer, "wide", prompts=40)
    assert sorted(f) == ["make_words", "put_code", "should_words"]
    assert all(v > -0.05 for v in f.values()), f  # measured -0.002 to -0.003


def test_the_main_job_s_reading_probe_is_the_copying_probe(reader):
    """The main job's evaluation (c2.eval.pipeline_eval.reading_probe, a row of its report)
    measures what `python -m c2.eval.copying --task wide` does: the same numbers on this policy."""
    from c2.eval.pipeline_eval import reading_probe

    got = reading_probe(reader.params, reader.cfg, reader.tokenizer, 40)
    logits = model_logits_fn(reader)
    r = task_reading_accuracy(logits, reader.tokenizer, "wide", prompts=40)
    f = task_format_logprob(logits, reader.tokenizer, "wide", prompts=40)
    assert got["reads_operation"] == r["operation"] >= 0.55
    assert got["reads_constant"] == r["constant"]
    assert got["call_head_nats"] == pytest.approx(sum(f.values()) / len(f), rel=1e-6)


def test_the_chain_s_system_turn_data():
    """experiments/system_turns.py (stage 3b of the chain): stage 3's examples in order, each
    with no system turn, a prefix of the agent system prompt or random text, seeded."""
    import importlib.util

    from c2.data.sft import copy_examples, recall_examples
    from c2.envs.episode import compact_system_prompt

    spec = importlib.util.spec_from_file_location(
        "system_turns", ROOT / "experiments" / "system_turns.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    examples = module.system_turn_examples()
    plain = recall_examples("recall:15000") + copy_examples("copy:5000")
    assert [(e["prompt"], e["response"]) for e in examples] == [
        (e["prompt"], e["response"]) for e in plain
    ]
    agent = compact_system_prompt()
    systems = [e.get("system", "") for e in examples]
    none = sum(not s for s in systems) / len(systems)
    prefix = sum(bool(s) and agent.startswith(s) for s in systems) / len(systems)
    assert abs(none - 1 / 4) < 0.02 and abs(prefix - 3 / 8) < 0.02, (none, prefix)
    assert all(len(s) <= len(agent) for s in systems)
    assert max(len(s) for s in systems) == len(agent)  # the whole prompt is among them
    assert module.system_turn_examples() == examples  # the same file on every run


def test_tool_recall_data_asks_for_lines_its_tool_response_holds():
    """experiments/tool_recall.py: stage 3's recall examples played as agent conversations; the
    reply recalls exactly the asked lines, every one of which the read_file response holds,
    rendered as the notes tasks' chains render a read (and the same file on every run)."""
    import importlib.util
    import re

    from c2.data.chat import AgentChat
    from c2.data.sft import recall_examples
    from c2.data.tokenizer import load_tokenizer
    from c2.train.sft_sources import notes_conversations

    spec = importlib.util.spec_from_file_location(
        "tool_recall", ROOT / "experiments" / "tool_recall.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    examples = module.tool_recall_conversations(200)
    plain = recall_examples("recall:200")
    chat = AgentChat(load_tokenizer("byte"))
    for e, p in zip(examples, plain, strict=True):
        system, user, call, tool, reply = e["messages"]
        asked = p["response"].split("\n")
        assert reply["content"] == f"Found {', '.join(asked)}."
        held = [line.split("\t", 1)[1] for line in tool["content"][0].split("\n")]
        assert all(line in held for line in asked)  # every recalled value is there to copy
        assert [x for x in held if " = " in x] == p["prompt"].split("\n")  # in the same order
        assert re.fullmatch(r"Report [a-z, ]+ \(see notes/[a-j]\.txt\)\.\n", user["content"])
        ids, mask = chat.conversation(e["messages"])
        assert mask.sum() > 0
    chain_call = next(
        m["content"]
        for m in notes_conversations("notes:fixed:4:80")[0]["messages"]
        if m["role"] == "assistant"
    )
    assert re.sub(r"notes/\w\.txt", "X", chain_call) == re.sub(
        r"notes/\w\.txt", "X", examples[0]["messages"][2]["content"]
    )  # a read as the chains write it
    assert module.tool_recall_conversations(200) == examples


def test_reworded_tasks_keep_the_task_and_never_use_a_held_out_frame():
    """experiments/reworded_tasks.py: the wide level's train tasks, each told in a frame drawn
    from a grammar; the operation and constant (as code or in words), function, file, tag and
    the oracle's replies are the task's own, no held-out frame's words appear, every episode fits
    a 512-token row, and the file is the same on every run."""
    import importlib.util
    import re

    from c2.data.chat import AgentChat
    from c2.data.sft import FUNCTIONS_SEED
    from c2.data.tokenizer import load_tokenizer
    from c2.envs import functions

    spec = importlib.util.spec_from_file_location(
        "reworded_tasks", ROOT / "experiments" / "reworded_tasks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    examples = module.reworded_conversations(300)
    tasks = functions.function_tasks(300, FUNCTIONS_SEED, "train", "wide")
    chat = AgentChat(load_tokenizer("byte"))
    held_out = [t.frame.split("{")[0] for t in functions.templates("eval")]
    instructions = set()
    for e, t in zip(examples, tasks, strict=True):
        original = functions.task_conversation(t)
        user = e["messages"][1]["content"]
        instructions.add(user)
        assert [m for i, m in enumerate(e["messages"]) if i != 1] == [
            m for i, m in enumerate(original) if i != 1
        ]  # the same system turn, replies and tool output: only the instruction differs
        m, op = t.metadata, functions.OPS[t.metadata["op"]]
        spellings = [s.format(a=m["arg"], c=m["const"]) for s in (op.code, op.words)]
        assert any(re.search(rf"{re.escape(s)}\b", user) for s in spellings), user
        assert user.startswith(t.instruction.split("] ")[0] + "] ") and user.endswith("\n")
        assert f"{m['function']}({m['arg']})" in user and m["file"] in user
        assert not any(w in user for w in module.HELD_OUT_WORDS), user
        assert not any(h and h in user for h in held_out), user
        ids, mask = chat.conversation(e["messages"])
        assert len(ids) <= 512 and mask.sum() > 0
    assert len(instructions) == len(examples)  # reworded, not one frame
    frames = {re.sub(r"\[\w+\] |\d+", "", x) for x in instructions}
    assert len(frames) > 200  # many frames, not the six train templates
    assert module.reworded_conversations(300) == examples
