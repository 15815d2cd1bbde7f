"""Long episodes on the tiny model: RL on notes tasks whose episodes outgrow the context, with
self-summarisation, prompt-based compaction, or no context management (c2/rl/episodes.py).

A notes task (c2/envs/notes.py, level "fixed", 4 notes of ~80 bytes) takes ~1,230 tokens from
prompt to submit; the context here is 1,024, so an episode only finishes as a chain of segments.
At the trigger (700 tokens, or sooner if no summary would fit after the next observation) the
agent either writes its own summary ("self_summary", trained like any other action; budget 96
tokens), or the run starts the next segment from a digest of its tool calls and their last
output ("compaction"), or ("none") the context ends the episode. Every segment of a chain gets
the chain's advantage. With byte tokens the reference chain cuts after the second and the
fourth read (3 segments); the last reply writes the file and submits (~235 tokens, so turns get
256).

Pick the mode with --config.rl.context_management=self_summary|compaction|none; the comparison
across modes and seeds is c2/bench/context_management.py (BENCHMARKS.md).

Command (after experiments/sft_notes_tiny.py has run into runs/sft_notes_tiny):
    python -m c2.main --config=experiments/rl_notes_tiny.py --workdir=runs/rl_notes_tiny
"""

from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    del arg
    c = rl_stage_defaults()
    c.name = "rl_notes_tiny"
    c.init_from = "runs/sft_notes_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.optimizer.lr = 3e-4
    c.train.steps = 12
    c.train.checkpoint_every = 6
    c.rl.tasks = "notes:fixed:4:80"
    c.rl.heldout_tasks = "notes:fixed:4:80"
    c.rl.group_size = 4
    c.rl.prompts_per_step = 4
    c.rl.micro_batch_size = 4
    c.rl.max_staleness = 2
    c.rl.seq_buckets = (1024,)
    c.rl.context_management = "self_summary"
    c.rl.summary.trigger_tokens = 700
    c.rl.summary.max_tokens = 96
    c.rl.summary.max_segments = 4
    c.rl.rollout.max_tokens = 1024
    c.rl.rollout.max_turn_tokens = 256
    c.rl.rollout.max_turns = 8
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 24
    c.rl.eval.samples = 2
    return c
