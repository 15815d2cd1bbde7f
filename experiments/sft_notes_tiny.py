"""Agent SFT for long episodes, tiny: oracle chains of the notes tasks (c2/envs/notes.py).

Data: `data.corpus = "notes:fixed:2:80"`: the reference episodes of 600 notes tasks (read two
notes of ~80 bytes, write total(n) = n + their values and submit in one reply), each cut once
after one or two reads where the agent is asked for a summary
(c2.rl.episodes.SUMMARY_INSTRUCTION) and writes it ("Found a = 17. Still to read:
notes/b.txt. Then write total.py."), then goes on in a new sequence from the task and its
summary; every other task also uncut, every third also cut twice (a summary written in a segment
that began from one). One conversation per segment (up to 846 tokens: an uncut chain loses the
end of its last reply at seq_len 800, the RL context), the loss on the replies and summaries.
Held-out batches: the eval split's filler text.

From scratch this teaches the episode's form and not the values: a tiny model has to learn to
copy first. experiments/notes_chain_tiny.sh runs it twice from the shipped reading policy, on
6,000 tasks' chains cut where experiments/rl_notes_tiny.py cuts (`python -m c2.envs.notes
--chains --cuts 1,2`), and gives the policy that RL stage starts from (BENCHMARKS.md, issue 16).

Command:
    python -m c2.main --config=experiments/sft_notes_tiny.py --workdir=runs/sft_notes_tiny
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
