"""Long episodes on the tiny model: RL on notes tasks whose episodes outgrow the context, with
self-summarisation, prompt-based compaction, or no context management (c2/rl/episodes.py).

A notes task here (c2/envs/notes.py, level "fixed", 2 notes of ~80 bytes) takes 822-843 tokens
from prompt to submit; the context is 800, so an episode only finishes as a chain of segments.
The summary trigger (400 tokens) lies below every segment's length after its first read, so the
chain is cut after each read, where the agent SFT chains were cut (`--cuts 1,2`): the agent
either writes its own summary ("self_summary", trained like any other action; budget 96 tokens:
"Found a = 11, b = 35. Still to read: nothing. Then write total.py."), or the run starts the
next segment from a digest of its tool calls and their last output ("compaction": the first
note's value is gone after the second cut), or ("none") the context ends the episode. Every
segment of a chain gets the chain's advantage. The third segment writes the file and submits in
one reply (~235 tokens, so turns get 256).

Pick the mode with --config.rl.context_management=self_summary|compaction|none; the comparison
across modes and seeds is c2/bench/context_management.py (BENCHMARKS.md, issue 16). The start
policy comes from `bash experiments/notes_chain_tiny.sh` (~35 min: the shipped reading policy
taught to copy a note's value into its summary and from its summary into its code).

Command:
    python -m c2.main --config=experiments/rl_notes_tiny.py --workdir=runs/rl_notes_tiny
"""

from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    del arg
    c = rl_stage_defaults()
    c.name = "rl_notes_tiny"
    c.init_from = "runs/notes_chain/3_notes"  # bash experiments/notes_chain_tiny.sh
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.yarn.factor = 0.0  # the start policy's positions (trained at 800 tokens, no YaRN)
    # 1e-4 (3 warmup steps) took the start policy's training pass rate from 0.25-0.6 to 0 by
    # step 11, the k1 to the start from 0 to 36 nats by step 15, chains ending at their budget
    # (BENCHMARKS.md, issue 16); experiments/rl_tiny.py found the same at that rate.
    c.optimizer.lr = 3e-5
    c.optimizer.warmup_steps = 3
    c.rl.single_forward = True
    c.train.steps = 12
    c.train.checkpoint_every = 6
    c.rl.tasks = "notes:fixed:2:80"
    c.rl.heldout_tasks = "notes:fixed:2:80"
    c.rl.group_size = 4
    c.rl.prompts_per_step = 4
    c.rl.micro_batch_size = 4
    c.rl.max_staleness = 2
    c.rl.seq_buckets = (800,)
    c.rl.context_management = "self_summary"
    c.rl.summary.trigger_tokens = 400
    c.rl.summary.max_tokens = 96
    c.rl.summary.max_segments = 4
    c.rl.rollout.max_tokens = 800
    c.rl.rollout.max_turn_tokens = 256
    c.rl.rollout.max_turns = 8
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 24
    c.rl.eval.samples = 2
    return c
