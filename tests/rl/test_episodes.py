"""The episode driver: token stream exactness, masks, tool calls through the sandbox, budgets,
rewards, and the real engine under concurrency (never stepping an idle engine)."""

import dataclasses
import json
import sys
import threading
import time

import numpy as np
import pytest

from c2 import model
from c2.envs.agents import tool_call
from c2.envs.episode import task_system_prompt
from c2.envs.tasks import write_task
from c2.infer.engine import Engine
from c2.infer.records import Completion, Trajectory
from c2.rl import trainer
from c2.rl.episodes import EpisodeRequest, EpisodeRunner, RolloutConfig, error_metrics
from c2.rl.orchestrator import AsyncRollouts, Scheduler
from c2.rl.records import read_rollouts, sample_from_record, write_rollouts

L_MOE, K = 2, 2


class ScriptedEngine:
    """The engine's multi-turn contract, replaying scripted reply ids (a test double: the
    driver's bookkeeping is checked against ids we chose; the real engine is tested below)."""

    def __init__(self, replies_by_prompt, max_len=512, slots=2, im_end=None):
        self.replies = replies_by_prompt  # {prompt bytes: [reply ids, ...]}
        self.max_len, self.stop_tokens = max_len, (im_end,)
        self.cfg = model.presets.get("tiny_kimi_k2", n_layers=L_MOE + 1, n_experts_per_token=K)
        self.slots, self.seqs, self.stats, self.version = slots, {}, {"generated_tokens": 0}, 7
        self.max_active, self.next_rid = 0, 0

    @property
    def free_slots(self):
        return self.slots - len(self.seqs)

    def has_work(self):
        return any(s["status"] == "ready" for s in self.seqs.values())

    def submit(self, prompt, max_new, *, multi_turn, **sampling):
        assert multi_turn and self.free_slots > 0 and len(prompt) + 1 <= self.max_len
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        key = bytes(np.asarray(prompt, np.int32))
        self.seqs[rid] = dict(
            tokens=list(prompt),
            gen=[False] * len(prompt),
            status="ready",
            script=list(self.replies[key]),
            max_new=max_new,
            turn=0,
        )
        self.max_active = max(self.max_active, len(self.seqs))
        return rid

    def step(self):
        out = []
        for rid, s in self.seqs.items():
            if s["status"] != "ready":
                continue
            reply = s["script"].pop(0)[: s["max_new"]]
            s["tokens"] += reply
            s["gen"] += [True] * len(reply)
            s["status"] = "paused"
            self.stats["generated_tokens"] += len(reply)
            finish = "stop" if reply[-1] in self.stop_tokens else "length"
            z = np.zeros(0)
            out.append(Completion(rid, s["turn"], z, np.asarray(reply), z, z, z, z, finish))
        return out

    def extend(self, rid, tokens, max_new):
        s = self.seqs[rid]
        assert s["status"] == "paused" and len(s["tokens"]) + len(tokens) < self.max_len
        s["tokens"] += list(tokens)
        s["gen"] += [False] * len(tokens)
        s["status"], s["max_new"], s["turn"] = "ready", max_new, s["turn"] + 1

    def release(self, rid):
        s = self.seqs.pop(rid)
        T = len(s["tokens"])
        gen = np.asarray(s["gen"])
        return Trajectory(
            rid,
            np.asarray(s["tokens"], np.int32),
            gen,
            np.where(gen, -0.5, 0.0).astype(np.float32),
            np.where(gen, self.version, -1).astype(np.int32),
            (np.arange(T * L_MOE * K) % 7).reshape(T, L_MOE, K).astype(np.uint8),
        )


def _task(root, name="triple", body="return n * 3"):
    return write_task(
        root / name,
        instruction=f"Write {name}(n) in {name}.py: {body}.",
        metadata={
            "task_id": name,
            "fail_to_pass": [f"tests/test_{name}.py::test_it"],
            "pass_to_pass": [],
            "difficulty": "1",
            "seed": 0,
            "source": "test",
            "prompt_style": "compact",
        },
        workspace={"README": "functions go here\n"},
        tests={
            f"test_{name}.py": f"from {name} import {name}\n\ndef test_it():\n"
            f"    assert {name}(2) == 6\n"
        },
        solution={f"{name}.py": f"def {name}(n):\n    {body}\n"},
    )


def _oracle_replies(name="triple", body="return n * 3"):
    src = f"def {name}(n):\n    {body}\n"
    return [
        tool_call("write_file", path=f"{name}.py", content=src),
        tool_call("submit", message=f"Added {name} to {name}.py."),
    ]


def test_token_stream_is_the_sft_rendering_with_tool_output_masked(tmp_path, chat, sandbox):
    """The sample's ids are exactly prompt + reply ids + observation ids + reply ids: the same
    stream AgentChat.conversation renders for SFT; only the replies carry the loss mask."""
    task = _task(tmp_path)
    replies = _oracle_replies()
    prompt = chat.prompt(task_system_prompt(task), task.instruction)
    engine = ScriptedEngine({bytes(prompt): [chat.reply(r) for r in replies]}, im_end=chat.im_end)
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep", RolloutConfig())
    (s,) = runner.run([EpisodeRequest(task, "p0", "g0", 0)])
    source = "def triple(n):\n    return n * 3\n"
    tool_out = f"Wrote {len(source)} characters to triple.py."
    conversation = [
        {"role": "system", "content": task_system_prompt(task)},
        {"role": "user", "content": task.instruction},
        {"role": "assistant", "content": replies[0]},
        {"role": "tool", "content": [tool_out]},
        {"role": "assistant", "content": replies[1]},
    ]
    ids, mask = chat.conversation(conversation)
    np.testing.assert_array_equal(s.tokens, ids)
    np.testing.assert_array_equal(s.loss_mask, mask.astype(np.uint8))
    # the tool-call tags are single special ids, never bytes
    replies_ids = s.tokens[s.loss_mask > 0]
    assert (replies_ids == chat.tool_call).sum() == 2
    assert b"<tool_call>" not in bytes(replies_ids[replies_ids < 256].astype(np.uint8))
    assert s.passed and s.stop_reason == "submit"
    assert s.reward_terms == {
        "task": 1.0,
        "style": 1.0,
        "communication": 1.0,
        "tool_call_penalty": 0.0,
    }
    assert s.effort["num_turns"] == 2 and s.effort["num_tool_calls"] == 2
    # every generated id is inside a tool call except the two <|im_end|>, which are not counted
    assert s.effort["tool_call_tokens"] == s.generated_tokens - 2
    assert s.effort["final_message_tokens"] == 0
    assert s.effort["tool_output_tokens"] == len(chat.observation([tool_out]))
    np.testing.assert_array_equal(s.versions[s.loss_mask > 0], 7)
    assert s.routing.shape == (len(s.tokens), L_MOE, K)


def test_penalties_failures_and_budgets(tmp_path, chat, sandbox):
    """A malformed call and a call after submit are penalised; a wrong answer fails with its
    reason; a reply cut by the turn budget ends the episode; so does a reply without a call."""
    tasks = [_task(tmp_path, f"f{i}", "return n * 3") for i in range(4)]
    bad = [
        chat.reply("<tool_call>{not json}</tool_call>"),
        chat.reply(
            tool_call("write_file", path="f0.py", content="def f0(n):\n    return n\n")
            + tool_call("submit", message="Wrote f0.py.")
            + tool_call("list_dir", path=".")
        ),
    ]
    long_reply = chat.tokenizer.encode("x" * 400)  # no <|im_end|> within 300 tokens
    final = chat.reply("I changed f2.py.")
    literal = chat.tokenizer.encode('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    scripts = [bad, [long_reply], [final], [literal + [chat.im_end]]]
    engine = ScriptedEngine(
        {
            bytes(chat.prompt(task_system_prompt(t), t.instruction)): s
            for t, s in zip(tasks, scripts)
        },
        max_len=1024,
        im_end=chat.im_end,
    )
    runner = EpisodeRunner(
        engine, chat, sandbox, tmp_path / "ep", RolloutConfig(max_turn_tokens=300)
    )
    reqs = [EpisodeRequest(t, t.task_id, "g", i) for i, t in enumerate(tasks)]
    s0, s1, s2, s3 = runner.run(reqs)
    assert s0.reward_terms["tool_call_penalty"] == 2.0  # one malformed, one after submit
    assert s0.info["invalid_tool_calls"] == 1 and s0.info["calls_after_submit"] == 1
    assert s0.turn_penalties == [1, 1]  # each turn's own: the malformed one, the after-submit one
    assert s1.turn_penalties == [0] and s2.turn_penalties == [0]
    assert not s0.passed and "fail_to_pass still failing" in s0.failure_reason
    assert s0.reward_terms["communication"] == 1.0  # the message names f0.py
    assert s1.stop_reason == "turn_budget" and s1.generated_tokens == 300
    assert s2.stop_reason == "final_message" and s2.reward_terms["communication"] == 0.0
    # literal "<tool_call>" bytes are text, not a call: a final message
    assert s3.stop_reason == "final_message" and s3.info["tool_calls"] == 0
    assert engine.max_active <= engine.slots


def test_rollout_records_round_trip(tmp_path, chat, sandbox):
    task = _task(tmp_path)
    prompt = chat.prompt(task_system_prompt(task), task.instruction)
    engine = ScriptedEngine(
        {bytes(prompt): [chat.reply(r) for r in _oracle_replies()]}, im_end=chat.im_end
    )
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep")
    (tmp_path / "ep" / "g0-1").mkdir(parents=True)  # a workspace left by a killed run
    (tmp_path / "ep" / "g0-1" / "f.py").write_text("stale\n")
    samples = runner.run([EpisodeRequest(task, "p0", "g0", i) for i in range(2)])
    assert samples[1].passed and not (tmp_path / "ep" / "g0-1").exists()
    samples[0].trained_step, samples[0].reward = 3, 1.25
    path = write_rollouts(tmp_path / "rollouts", "step_000003", samples)
    records = read_rollouts(path)
    line = json.loads(path.read_text().splitlines()[0])
    for key in (
        "prompt_id",
        "group_id",
        "sample_index",
        "tokens",
        "loss_mask",
        "logprobs",
        "versions",
        "reward",
        "reward_terms",
        "passed",
        "trained_step",
    ):
        assert key in line
    assert (
        line["trained_step"] == 3 and line["reward"] == 1.25 and records[1]["trained_step"] is None
    )
    for s, r in zip(samples, records):
        assert r["tokens"] == s.tokens.tolist() and r["loss_mask"] == s.loss_mask.tolist()
        np.testing.assert_array_equal(r["routed_experts"], s.routing)
        back = sample_from_record(r)  # the sample as the trainer held it (logprobs to 1e-6)
        for field in dataclasses.fields(s):
            want, got = getattr(s, field.name), getattr(back, field.name)
            if isinstance(want, np.ndarray):
                np.testing.assert_allclose(got, want, atol=1e-6, err_msg=field.name)
            else:
                assert got == want, field.name
    assert (
        "routed_experts" not in line and (tmp_path / "rollouts" / line["routing"]["file"]).is_file()
    )


class _Counted:
    """An engine, counting what the runner asks of it: loop iterations (one `free_slots` read
    each), steps and steps with nothing to do, and episodes holding a slot (submit to release)."""

    def __init__(self, engine):
        self._engine, self.polls, self.steps, self.idle_steps = engine, 0, 0, 0
        self.holding, self.most_holding = set(), 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    @property
    def free_slots(self):
        self.polls += 1
        return self._engine.free_slots

    def step(self):
        self.steps += 1
        self.idle_steps += not self._engine.has_work()
        return self._engine.step()

    def submit(self, *args, **kwargs):
        rid = self._engine.submit(*args, **kwargs)
        self.holding.add(rid)
        self.most_holding = max(self.most_holding, len(self.holding))
        return rid

    def release(self, rid):
        self.holding.discard(rid)
        return self._engine.release(rid)


def test_real_engine_many_episodes_one_slot_each(tmp_path, chat, sandbox, monkeypatch):
    """Six episodes on a 2-slot engine (a random tiny model): in flight never exceeds the slots
    (and both are used), the engine is never stepped idle, the loop never spins (each of its
    iterations steps the engine, waits, or takes a finished tool run or grade), and each sample
    is the engine's own trajectory, replies masked in."""
    from c2.rl import episodes

    cfg = model.presets.get(
        "tiny_kimi_k2",
        dtype="float32",
        d_model=64,
        n_layers=2,
        n_heads=2,
        d_ff=128,
        d_ff_expert=32,
        n_experts=4,
        n_experts_per_token=2,
        max_seq_len=512,
        mtp_depth=0,
    )
    import jax

    params = model.init_params(cfg, jax.random.key(0))
    engine = _Counted(Engine(
        params,
        cfg,
        max_slots=2,
        max_len=384,
        temperature=1.0,
        stop_tokens=(chat.im_end,),
        prefill_chunk=256,
    ))  # fmt: skip
    waits = []
    real_wait, real_nap = episodes.cf.wait, episodes._nap
    monkeypatch.setattr(episodes.cf, "wait", lambda *a, **k: waits.append(1) or real_wait(*a, **k))
    monkeypatch.setattr(episodes, "_nap", lambda: waits.append(1) or real_nap())
    tasks = [_task(tmp_path, f"g{i}") for i in range(3)]
    runner = EpisodeRunner(
        engine, chat, sandbox, tmp_path / "ep", RolloutConfig(max_turn_tokens=24, max_tokens=384)
    )
    reqs = [EpisodeRequest(t, t.task_id, t.task_id, k) for t in tasks for k in range(2)]
    samples = runner.run(reqs)
    assert [s.task_id for s in samples] == [r.task.task_id for r in reqs]
    for s in samples:
        prompt = chat.prompt(task_system_prompt(tasks[0]), tasks[int(s.task_id[1])].instruction)
        np.testing.assert_array_equal(s.tokens[: len(prompt)], prompt)
        assert s.loss_mask[: len(prompt)].sum() == 0 and s.generated_tokens > 0
        assert (s.logprobs[s.loss_mask == 0] == 0).all() and (s.logprobs[s.loss_mask > 0] < 0).all()
        assert s.routing.shape == (len(s.tokens), cfg.n_moe_layers, 2)
        assert not s.passed  # a random model does not solve the task
    assert runner.stats["generated_tokens"] == sum(s.generated_tokens for s in samples)
    assert engine.most_holding == 2 and not engine.holding  # both slots used, none leaked
    assert engine.steps > 0 and engine.idle_steps == 0
    # Finished pool work: at most a tool run per turn and a grade per episode.
    pool_results = sum(s.info["turns"] for s in samples) + len(samples)
    assert engine.polls <= engine.steps + len(waits) + pool_results + len(reqs) + 1


def test_a_prompt_longer_than_the_context_is_a_failed_empty_sample(tmp_path, chat, sandbox):
    """Refused before the engine sees it: no generated ids, failed, and still batchable (its
    routing is valid) so its group stays complete."""
    from c2.rl.batching import make_batch

    task = _task(tmp_path)
    engine = ScriptedEngine({}, max_len=100, im_end=chat.im_end)
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep")
    (s,) = runner.run([EpisodeRequest(task, "p0", "g0", 0)])
    assert s.stop_reason == "prompt_too_long" and not s.passed and s.generated_tokens == 0
    assert engine.next_rid == 0  # never submitted
    batch = make_batch([s], batch_size=1, seq_buckets=(512,), cfg=engine.cfg, pad_id=256)
    assert batch["target_mask"].sum() == 0


def test_failures_are_played_again_then_given_up(tmp_path, chat, sandbox, monkeypatch):
    """An engine step that raises replays every episode in flight; grading that raises replays
    its episode; one that raises on every attempt becomes a failed, untrained sample. Nothing
    stops the run, no slot or workspace leaks, every error is recorded with its reason."""
    from c2.rl import episodes

    tasks = [_task(tmp_path, name) for name in ("ok", "flaky", "broken")]
    scripts = {
        bytes(chat.prompt(task_system_prompt(t), t.instruction)): [
            chat.reply(r) for r in _oracle_replies(t.task_id)
        ]
        for t in tasks
    }

    class FailingOnce(ScriptedEngine):
        calls = 0

        def step(self):
            FailingOnce.calls += 1
            if FailingOnce.calls == 2:
                raise RuntimeError("device lost")
            return super().step()

    real_grade, graded = episodes.grade, []

    def grade(task, *args, **kwargs):
        graded.append(task.task_id)
        if task.task_id == "broken" or (task.task_id == "flaky" and graded.count("flaky") == 1):
            raise OSError(f"sandbox failure on {task.task_id}")
        return real_grade(task, *args, **kwargs)

    monkeypatch.setattr(episodes, "grade", grade)
    engine = FailingOnce(scripts, slots=3, im_end=chat.im_end)
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep", RolloutConfig(max_attempts=3))
    ok, flaky, broken = runner.run(
        [EpisodeRequest(t, t.task_id, "g", i) for i, t in enumerate(tasks)]
    )
    assert ok.passed and flaky.passed and ok.stop_reason == flaky.stop_reason == "submit"
    assert broken.stop_reason == "rollout_error" and not broken.passed
    assert "OSError: sandbox failure on broken" in broken.failure_reason
    assert broken.generated_tokens == 0 and broken.reward_terms["task"] == 0.0
    # three attempts each: the engine failure counts as the first one
    assert graded.count("broken") == 2 and graded.count("flaky") == 2
    assert runner.counts == {"errors/engine": 3, "errors/grade": 3, "gave_up": 1}
    # six failed attempts, one episode given up (counted once, not also as an error)
    assert error_metrics(runner.error_counts()) == {"rollout_errors": 6, "rollout_gave_up": 1}
    # the given-up sample carries every key a graded one does: the trainer's metrics read them
    assert set(broken.info) == set(ok.info) and broken.info["invalid_tool_calls"] == 0
    m = trainer._episode_metrics([ok, flaky, broken])
    assert m["stop/rollout_error"] == pytest.approx(1 / 3) and m["invalid_tool_calls_mean"] == 0
    assert [r for g, i, r in runner.errors if i == 2][-1].startswith("grade: OSError")
    assert not engine.seqs and not list((tmp_path / "ep").iterdir())


def test_error_counts_can_be_read_while_episodes_fail(tmp_path, chat, sandbox):
    """The trainer reads the rollout errors (AsyncRollouts.metrics) while the rollout thread
    counts new kinds of failure: the read takes a snapshot under the runner's lock (iterating
    the live Counter raised "dictionary changed size during iteration")."""
    engine = ScriptedEngine({}, im_end=chat.im_end)
    runner = EpisodeRunner(engine, chat, sandbox, tmp_path / "ep")
    rollouts = AsyncRollouts(runner, Scheduler(1, 1, 0), [], None, version=0, limit=0)
    kinds, reading = 20000, threading.Event()

    def fail_in_new_places():  # the rollout thread's side: each failure a new key
        reading.wait()
        for i in range(kinds):
            runner._count(f"errors/place{i}")
            if i % 50 == 0:
                time.sleep(0)  # let the reader in

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as the interpreter allows
    writer = threading.Thread(target=fail_in_new_places)
    seen = []
    try:
        writer.start()
        while writer.is_alive():
            seen.append(rollouts.metrics()["rollout_errors"])
            reading.set()
    finally:
        writer.join()
        sys.setswitchinterval(switch)
    assert len(seen) > 1 and seen == sorted(seen)  # each a consistent snapshot
    assert rollouts.metrics() == {"rollout_errors": kinds, "rollout_gave_up": 0}
