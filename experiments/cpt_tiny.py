"""Stage 1 of the recipe (docs/recipe.md §1.1): continued pretraining on code, tiny model, CPU.

Command:
    python -m c2.main --config=experiments/cpt_tiny.py --workdir=runs/cpt_tiny
Runtime: about 8 minutes on the 2-core reference machine (300 steps of 16 x 128 bytes, ~1.2 s
each measured while other jobs shared the cores; compilation ~30 s).
Expected: held-out bits per byte on the standard library falls from 8.4 (untrained, 320-way
byte vocabulary) to about 3.1 (3.65 at step 100, 3.30 at 200); MTP depth-1 acceptance (argmax
agreement with the main head) settles near 0.7. The same stage at real scale is
experiments/cpt_kimi_k2.py.
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "cpt_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"  # XLA:CPU runs bf16 matmuls through conversions, slower than f32
    c.data.kind = "pretrain"
    c.data.corpus = "stdlib"
    c.data.tokenizer = "byte"
    c.data.seq_len = 128
    c.data.batch_size = 16
    c.data.eval_batches = 8
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.schedule = "cosine"
    c.optimizer.end_lr_ratio = 0.1
    c.train.steps = 300
    c.train.checkpoint_every = 100
    c.train.eval_every = 100
    c.train.mtp_weight = 0.3
    return c
