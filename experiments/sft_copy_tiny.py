"""Copying, tiny: teach the tiny model to repeat what its context holds, before agent SFT.

A policy conditions on its task only by copying from its context (a constant in the
instruction, a value in a file it read, its own summary). The tiny model does not learn that
from the agent SFT data: after 1,900 steps on 6,000 notes tasks its copying probe is at chance
and its value digits 16% right (BENCHMARKS.md, issue 16). Here every response repeats the
strings of its prompt in a shuffled order (`data.corpus = "copy"`: 1-4 random alphanumeric
strings of 4-12 characters; the loss on the response only), so the loss falls only by copying,
and only by finding each string by its content (an induction head), not by its offset.

Command:
    python -m c2.main --config=experiments/sft_copy_tiny.py --workdir=runs/sft_copy_tiny
    python -m c2.eval.copying --policy runs/sft_copy_tiny
Runtime: about 45 minutes on the 2-core reference machine (~1.1 s a step).
Expected: the loss per response token falls from ~4.1 nats (a random character) towards what
the shuffled order costs (which string comes next) once the model copies, and the probe's
second-copy accuracy rises from chance (1/62) towards 1.
Measured so far (2026-12-03), with the prompt repeated in order (the spec before shuffling):
the loss left its plateau after ~1,000 steps (3.24 nats at 1,000, 1.62 at 1,500, 0.57 at
1,790), but the model learnt to copy by offset: at step 1,750, 83% of the characters after each
string's first right in order, 8% with the strings reversed, the probe at chance (BENCHMARKS.md,
issue 16). The shuffled spec is not yet measured.
Then agent SFT from here:
    python -m c2.main --config=experiments/sft_notes_tiny.py --workdir=runs/sft_notes_copy \\
        --config.init_from=runs/sft_copy_tiny
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_copy_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.data.kind = "sft"
    c.data.corpus = "copy"
    c.data.seq_len = 256
    c.data.batch_size = 16
    c.data.eval_batches = 4
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.schedule = "cosine"
    c.train.steps = 2500
    c.train.checkpoint_every = 250
    c.train.eval_every = 250
    return c
