"""Copying, tiny: teach the tiny model to repeat what its context holds, before agent SFT.

A policy conditions on its task only by copying from its context (a constant in the
instruction, a value in a file it read, its own summary), and the tiny model does not learn that
from agent SFT data. Here every response repeats the strings of its prompt in a shuffled order
(`data.corpus = "copy"`: 1-4 random alphanumeric strings of 4-12 characters, the loss on the
response only), so the loss falls only by finding each string by its content (an induction head),
not by its offset. `copy:ordered` keeps the prompt's order: the easier first stage of
experiments/reader_chain_tiny.sh, learnt by offset.

Command:
    python -m c2.main --config=experiments/sft_copy_tiny.py --workdir=runs/sft_copy_tiny
    python -m c2.eval.copying --policy runs/sft_copy_tiny --chat
Runtime: about 45 minutes on the 2-core machine (2,500 steps at ~1 s).
Expected: from a model that copies by offset (the `copy:ordered` stage), the loss per response
token falls from ~2.2 nats towards ~0.4 and the chat probe rises from chance (1/62) to ~0.9, the
same in order and reversed (from scratch, `copy:ordered` stays on a ~4-nat plateau for ~1,000
steps first). The copy is tied to the chat format it is taught in, so agent SFT after it keeps
copy data in its mixture (e.g. `functions:basic+copy:2000`): alone it erases the copy.
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
