"""Stage 3 of the recipe (docs/recipe.md §1.3): targeted SFT (loss on responses only), tiny.

The embedded default task: implement a standard-library function from its signature and
docstring (prompt) — the body is the response. The model keeps the stage-2 YaRN setting.

Command (after experiments/long_context_tiny.py has run into runs/long_context_tiny):
    python -m c2.main --config=experiments/sft_tiny.py --workdir=runs/sft_tiny
Runtime: about 2.5 minutes on the 2-core reference machine (60 steps of 4 x 512 tokens, ~1.8 s
each measured while other jobs shared the cores; extracting the functions takes ~10 s).
Expected: held-out response bits per byte falls from ~2.9 (the stage-2 model) to ~2.76.
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_tiny"
    c.init_from = "runs/long_context_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.yarn.factor = 8.0
    c.model.yarn.original_max_position_embeddings = 128
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.kind = "sft"
    c.data.corpus = "stdlib"
    c.data.seq_len = 512
    c.data.batch_size = 4
    c.data.eval_batches = 4
    c.optimizer.lr = 5e-4
    c.optimizer.warmup_steps = 5
    c.optimizer.schedule = "cosine"
    c.train.steps = 60
    c.train.checkpoint_every = 30
    return c
