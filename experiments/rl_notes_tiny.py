"""Long episodes on the tiny model: RL on notes tasks whose episodes outgrow the context, with
self-summarisation, prompt-based compaction, or no context management (c2/rl/episodes.py).

A notes task (c2/envs/notes.py, level "fixed", 2 notes of ~80 bytes) takes 822-843 tokens from
prompt to submit in a context of 800, so an episode finishes only as a chain of segments. The
summary trigger (400) cuts after each read, where the start policy's SFT chains were cut: the
agent writes its own summary ("self_summary", trained like any other action: "Found a = 11,
b = 35. Still to read: nothing. Then write total.py."), or the next segment starts from a digest
of the calls ("compaction"), or ("none") the context ends the episode. Every segment of a chain
takes the chain's advantage. Pick the mode with --config.rl.context_management.

The start policy, runs/notes_chain/3_notes, is not shipped: make it first with
    bash experiments/notes_chain_tiny.sh runs/notes_chain       (~35 min on the 2-core machine)
Command:
    python -m c2.main --config=experiments/rl_notes_tiny.py --workdir=runs/rl_notes_tiny
Runtime: about 6 minutes on the 2-core machine (12 steps of 16 episodes, two held-out
evaluations of 48 episodes).
Expected: self_summary keeps held-out pass@1 near the start's ~0.10 at temperature 1 (12 steps at
lr 3e-5 move it within noise); compaction and none pass nothing. The three modes over three
seeds: python -m c2.bench.context_management (BENCHMARKS.md, issue 16).
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
    # 1e-4 collapses this policy within ~11 steps (pass rate 0, chains ending at their budget).
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
