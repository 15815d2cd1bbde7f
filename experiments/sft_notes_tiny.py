"""Agent SFT for long episodes, tiny: oracle chains of the notes tasks (c2/envs/notes.py).

Data: `data.corpus = "notes:fixed:4:80"`: the reference episodes of 600 notes tasks (read four
notes of ~80 bytes, write total(n) = n + their values and submit in one reply), each cut once
after one to three reads where the agent is asked for a summary
(c2.rl.episodes.SUMMARY_INSTRUCTION) and writes it ("Found a = 17, b = 4. Still to read:
notes/c.txt, notes/d.txt. Then write total.py."), then goes on in a new sequence from the task and
its summary; every other task also uncut, every third also cut twice (a summary written in a
segment that began from one). One conversation per segment (2,100, up to 1,266 tokens), the
loss on the replies and summaries. Held-out batches: the eval split's filler
text. This is the start of experiments/rl_notes_tiny.py.

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
    c.data.kind = "sft"
    c.data.corpus = "notes:fixed:4:80"
    c.data.seq_len = 1280
    c.data.batch_size = 4
    c.data.eval_batches = 4
    c.optimizer.lr = 2e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.schedule = "cosine"
    c.train.steps = 500
    c.train.checkpoint_every = 100
    c.train.eval_every = 250
    return c
