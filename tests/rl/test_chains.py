"""Long episodes as chains of segments (self-summarisation, compaction): a scripted policy that
crosses the trigger twice gives three segments with the right tokens and masks, the workspace
persists across segments, an overlong summary is cut and the chain goes on, the chain budget
ends an episode with its reason, and every segment takes the chain's advantage in a batch."""

import numpy as np
import pytest

from c2.envs.agents import tool_call
from c2.envs.episode import task_system_prompt
from c2.rl.batching import make_batch, reward_arrays
from c2.rl.episodes import (
    SUMMARY_HEADER,
    SUMMARY_INSTRUCTION,
    EpisodeRequest,
    EpisodeRunner,
    RolloutConfig,
)
from c2.rl.records import read_rollouts, write_rollouts
from tests.rl.test_episodes import ScriptedEngine, _task


class ChainEngine(ScriptedEngine):
    """Scripts handed out in submission order (one per segment: each has a new prompt), and
    the prompts submitted, to check what each segment started from."""

    def __init__(self, scripts, **kw):
        super().__init__({}, **kw)
        self.scripts, self.prompts = list(scripts), []

    def submit(self, prompt, max_new, *, multi_turn, **sampling):
        self.prompts.append(np.asarray(prompt).copy())
        self.replies = {bytes(np.asarray(prompt, np.int32)): self.scripts.pop(0)}
        return super().submit(prompt, max_new, multi_turn=multi_turn, **sampling)


SOURCE = "def triple(n):\n    return n * 3\n"
S1 = "Summary: marker in notes.txt. Next: triple."  # fits the budget
S2 = "Summary: notes.txt holds the marker. " + "z" * 200  # longer than the summary budget
BUDGET = 48


def scripts(chat):
    return [
        [  # segment 0: a call, then (asked at the trigger) the summary
            chat.reply(tool_call("write_file", path="notes.txt", content="marker-41")),
            chat.reply(S1),
        ],
        [  # segment 1: reads the file written in segment 0, then a summary that overruns
            chat.reply(tool_call("run", command="cat notes.txt")),
            chat.tokenizer.encode(S2),
        ],
        [  # segment 2: the fix and submit, in one reply
            chat.reply(
                tool_call("write_file", path="triple.py", content=SOURCE)
                + tool_call("submit", message="Added triple to triple.py.")
            ),
        ],
    ]


def config(prompt_len, mode="self_summary", segments=4):
    # Past the trigger as soon as an observation comes (every segment's prompt is longer).
    return RolloutConfig(
        max_tokens=1024,
        max_turn_tokens=200,
        context_management=mode,
        summary_trigger=prompt_len + 10,
        summary_trigger_max=prompt_len + 10,
        summary_max_tokens=BUDGET,
        max_segments=segments,
    )


def run_chain(tmp_path, chat, sandbox, mode="self_summary", segments=4, scripts_=None):
    task = _task(tmp_path)
    system = task_system_prompt(task)
    prompt_len = len(chat.prompt(system, task.instruction))
    engine = ChainEngine(scripts_ or scripts(chat), max_len=1024, im_end=chat.im_end)
    cfg = config(prompt_len, mode, segments)
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep", cfg)
    (s,) = runner.run([EpisodeRequest(task, "p0", "g0", 0)])
    return task, engine, s


def test_self_summary_chain_of_three_segments(tmp_path, chat, sandbox):
    task, engine, s = run_chain(tmp_path, chat, sandbox)
    chain = s.chain
    assert [x.segment for x in chain] == [0, 1, 2] and s.segments == chain[:2]
    assert s.passed and s.stop_reason == "submit" and s.info["segments"] == 3
    assert s.info["summaries_cut"] == 1
    system = task_system_prompt(task)
    sc = scripts(chat)
    out0 = f"Wrote {len('marker-41')} characters to notes.txt."
    obs0 = chat.observation([out0], note=SUMMARY_INSTRUCTION)
    # Segment 0: prompt, the call, the observation with the summary instruction, the summary.
    p0 = chat.prompt(system, task.instruction)
    want0 = np.concatenate([p0, sc[0][0], obs0, sc[0][1]])
    np.testing.assert_array_equal(chain[0].tokens, want0)
    mask0 = np.concatenate(
        [0 * p0, np.ones(len(sc[0][0])), np.zeros(len(obs0)), np.ones(len(sc[0][1]))]
    )
    np.testing.assert_array_equal(chain[0].loss_mask, mask0)  # the summary is trained
    # Segment 1 starts from system + task + the summary, in the same workspace: the file
    # written in segment 0 is read back. Its prompt: the task (without its file's final
    # newline), a blank line, the header, the summary.
    p1 = chat.prompt(system, f"{task.instruction.rstrip()}\n\n{SUMMARY_HEADER}\n{S1}")
    np.testing.assert_array_equal(engine.prompts[1], p1)
    np.testing.assert_array_equal(chain[1].tokens[: len(p1)], p1)
    fed = chain[1].tokens[len(p1) :][chain[1].loss_mask[len(p1) :] == 0]
    obs1_text = chat.tokenizer.decode([int(t) for t in fed])
    assert "marker-41" in obs1_text
    # The overlong summary was cut at its budget (no <|im_end|>) and the chain went on from it.
    summary1 = chain[1].tokens[chain[1].loss_mask > 0][-BUDGET:]
    np.testing.assert_array_equal(summary1, sc[1][1][:BUDGET])
    assert chat.tokenizer.decode(sc[1][1][:BUDGET]) in chat.tokenizer.decode(
        list(engine.prompts[2])
    )
    # One reward for the chain: every segment carries its grade and terms.
    for x in chain:
        assert x.passed and x.reward_terms == s.reward_terms and x.chain_id == "g0/0"
        assert x.versions[x.loss_mask > 0].min() == 7
        assert x.routing.shape == (x.length, 2, 2)
    assert s.effort["num_turns"] == 5  # every generated turn of the chain, summaries included


def test_records_and_batch_of_a_chain(tmp_path, chat, sandbox):
    _, _, s = run_chain(tmp_path, chat, sandbox)
    path = write_rollouts(tmp_path / "rollouts", "step_000001", [s])
    records = read_rollouts(path)
    assert [(r["chain_id"], r["segment"], r["segments"]) for r in records] == [
        ("g0/0", 0, 3),
        ("g0/0", 1, 3),
        ("g0/0", 2, 3),
    ]
    for r, x in zip(records, s.chain):
        assert r["tokens"] == x.tokens.tolist() and r["passed"]
        np.testing.assert_array_equal(r["routed_experts"], x.routing)
    cfg = ScriptedEngine({}).cfg
    batch = make_batch([s], batch_size=1, seq_buckets=(1024,), cfg=cfg, pad_id=0, group_size=1)
    assert batch["inputs"].shape[0] == 3 and batch["valid"].all()
    np.testing.assert_array_equal(batch["chain"], [0, 0, 0])
    terms, _ = reward_arrays([s], 1)
    np.testing.assert_array_equal(terms["task"], [1.0, 1.0, 1.0])


def test_chain_budget_ends_the_episode_with_its_reason(tmp_path, chat, sandbox):
    _, _, s = run_chain(tmp_path, chat, sandbox, segments=2)
    assert s.stop_reason == "chain_budget" and len(s.chain) == 2 and not s.passed
    assert all(x.stop_reason == "chain_budget" for x in s.chain)


def test_compaction_starts_segments_from_a_digest(tmp_path, chat, sandbox):
    sc = scripts(chat)
    # No summaries are asked for: each segment is its first reply, then the next segment.
    compact = [[sc[0][0]], [sc[1][0]], sc[2]]
    task, engine, s = run_chain(tmp_path, chat, sandbox, mode="compaction", scripts_=compact)
    assert s.passed and len(s.chain) == 3 and s.info["summaries_cut"] == 0
    prompt1 = chat.tokenizer.decode(list(engine.prompts[1]))
    assert "write_file(path='notes.txt', content='marker-41')" in prompt1
    prompt2 = chat.tokenizer.decode(list(engine.prompts[2]))
    assert "run(command='cat notes.txt')" in prompt2 and "marker-41" in prompt2  # last output
    for x in s.chain[:2]:  # a segment ends at its observation: nothing after the reply
        assert x.loss_mask[-1] == 1


def test_trigger_is_shared_by_a_group_and_config_errors_name_the_field():
    cfg = RolloutConfig(
        max_tokens=1024, context_management="self_summary", summary_trigger=300,
        summary_trigger_max=700,
    )  # fmt: skip
    triggers = {cfg.trigger(f"p{i}") for i in range(50)}
    assert min(triggers) >= 300 and max(triggers) <= 700 and len(triggers) > 10
    assert cfg.trigger("p1") == cfg.trigger("p1")  # a group (one prompt id) shares it
    with pytest.raises(ValueError, match="summary_trigger=1000"):
        RolloutConfig(max_tokens=1024, context_management="self_summary", summary_trigger=1000)
    with pytest.raises(ValueError, match="context_management='summary'"):
        RolloutConfig(context_management="summary")


def test_the_cut_comes_while_the_next_turn_still_leaves_room_for_the_summary(chat, sandbox):
    """Below the trigger, a chain still cuts at the last observation after which the summary
    will fit: one more reply as long as the chain's longest action and an observation like this one
    would leave no room for the summary instruction and the summary (cutting later would end
    the episode at the context, a summary never asked for)."""
    import types

    limit, budget = 1024, 64
    cfg = RolloutConfig(
        max_tokens=limit,
        max_turn_tokens=200,
        context_management="self_summary",
        summary_trigger=limit - budget,  # as late as allowed: never reached below
        summary_max_tokens=budget,
    )
    engine = ChainEngine([], max_len=limit, im_end=chat.im_end)
    runner = EpisodeRunner(engine, chat, sandbox, "/tmp/unused", cfg)
    outputs = ["x" * 100]
    obs = chat.observation(outputs)
    asked = chat.observation(outputs, note=SUMMARY_INSTRUCTION)
    reply = 60

    def live(length):
        prompt = np.zeros(length - reply, np.int32)
        turn = np.zeros(reply, np.int32)
        return types.SimpleNamespace(
            prompt=prompt,
            turns=[turn],
            tool_output_tokens=0,
            trigger=960,
            longest_action=reply,  # a longer summary (below) is not the next reply
        )

    # The latest length at which the summary fits after one more turn like the last:
    last = limit - budget - len(asked) - reply - len(obs)
    assert not runner._cut_now(live(last), outputs, obs)
    assert runner._cut_now(live(last + 1), outputs, obs)  # one token later: cut now
    # ... while the summary itself would still fit now (what the check used to look at):
    assert last + 1 + len(asked) + budget <= limit
    assert runner._cut_now(live(960 - len(obs) + 1), outputs, obs)  # past the trigger
