"""Stage 2 of the recipe (docs/recipe.md §1.2): long-context extension with YaRN, tiny, CPU.

Eight times the stage-1 length (128 -> 1024 tokens): RoPE is rescaled with YaRN (factor 8 over
the original 128 positions) and the model trains briefly on long packed sequences. Attention is
blockwise (c2/model/flash.py), as at real scale (experiments/long_context_kimi_k2.py).

Command (after experiments/cpt_tiny.py has run into runs/cpt_tiny):
    python -m c2.main --config=experiments/long_context_tiny.py --workdir=runs/long_context_tiny
Runtime: about 3 minutes on the 2-core reference machine (40 steps of 2 x 1024 bytes, ~3.8 s
each measured while other jobs shared the cores).
Expected: held-out bits per byte at 1024 tokens drops from ~4.2 (the stage-1 model: plain RoPE
beyond its trained positions) to ~3.2, the 128-token value staying about unchanged.
"""

from c2.train.config import stage_defaults

STAGE1_SEQ_LEN = 128
FACTOR = 8


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "long_context_tiny"
    c.init_from = "runs/cpt_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.overrides.attention_impl = "blockwise"
    c.model.overrides.attention_block_q = 256
    c.model.overrides.attention_block_kv = 256
    c.model.yarn.factor = float(FACTOR)
    c.model.yarn.original_max_position_embeddings = STAGE1_SEQ_LEN
    c.model.yarn.beta_fast = 32.0
    c.model.yarn.beta_slow = 1.0
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.kind = "pretrain"
    c.data.seq_len = STAGE1_SEQ_LEN * FACTOR
    c.data.batch_size = 2
    c.data.eval_batches = 4
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 5
    c.optimizer.schedule = "cosine"
    c.train.steps = 40
    c.train.checkpoint_every = 20
    return c
