"""Agent SFT for long episodes, tiny: oracle chains of the notes tasks (c2/envs/notes.py), one
conversation per segment, the loss on the replies and summaries.

Data: `data.corpus = "notes:fixed:2:80"`: the reference episodes of 600 notes tasks (read two
notes of ~80 bytes, write total(n) = n + their values and submit in one reply), each cut after one
or two reads where the agent is asked for a summary (c2.envs.chain_prompts) and writes it ("Found
a = 17. Still to read: notes/b.txt. Then write total.py."), then goes on from the task and its
summary; every other task also uncut, every third also cut twice. Segments run to 846 tokens
(seq_len 800 is the RL context); held-out batches: the eval split's filler text.

From scratch it teaches the episode's form, not the values (a tiny model must learn to copy
first). experiments/notes_chain_tiny.sh runs it as its stages 2 and 3, on 6,000 tasks' chains cut
where experiments/rl_notes_tiny.py cuts, from the shipped reader taught tool recall (stage 1):
    python -m c2.main --config=experiments/sft_notes_tiny.py --workdir=DIR/2_notes_mix
        --config.init_from=DIR/1_tool_recall
        --config.data.corpus=DIR/chains.jsonl+DIR/tool_recall.jsonl       (one command)
Runtime: ~19 minutes on the 2-core machine (800 steps at ~1.4 s).
Expected: as that stage 2 (2026-12-06), held-out value digits (teacher-forced) 0.63 / 0.78 / 0.82
at steps 200 / 400 / 800; after stage 3 (the chains alone, 400 steps) 0.905 (BENCHMARKS.md,
issue 16).
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_notes_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.yarn.factor = 0.0  # as the reading policy it starts from was trained
    c.data.kind = "sft"
    c.data.corpus = "notes:fixed:2:80"
    c.data.seq_len = 800  # rl_notes_tiny's context
    c.data.batch_size = 6
    c.data.eval_batches = 4
    c.optimizer.lr = 5e-4
    c.optimizer.warmup_steps = 30
    c.optimizer.schedule = "cosine"
    c.train.steps = 800
    c.train.checkpoint_every = 100
    c.train.eval_every = 250
    return c
