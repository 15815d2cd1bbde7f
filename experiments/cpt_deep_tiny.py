"""Stage 1 (docs/recipe.md §1.1) at a deep, narrow shape: 16 layers and one MTP module, CPU.

What it is for: measuring MTP speculative decoding where one MTP module is a small part of the
model (1/16 of the layers, as in real models: DeepSeek-V3 / Kimi-K2 have 1 MTP layer vs 61), not
a third of it as in experiments/cpt_tiny.py's 4 layers. Same data, optimiser and MTP
self-distillation loss as cpt_tiny; the model is tiny_kimi_k2 with 16 layers and half the width.

Command:
    python -m c2.main --config=experiments/cpt_deep_tiny.py --workdir=runs/cpt_deep_tiny
    python -m c2.bench.generate_throughput --workdir=runs --stage=cpt_deep_tiny
Runtime: about 6 minutes on the 2-core machine with nothing else running (450 steps of
16 x 128 bytes, ~0.65 s each), compilation ~20 s.
Expected: held-out bits per byte on the standard library falls from 8.4 (untrained) to about 2.8
(3.56 at step 150, 3.03 at 300, 2.81 at 450); held-out MTP depth-1 acceptance (argmax agreement
with the main head) about 0.7 (0.65, 0.69, 0.70). Speculative decoding results: BENCHMARKS.md,
"Speculative decoding at a realistic depth".
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "cpt_deep_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    o = c.model.overrides
    o.n_layers = 16
    o.mtp_depth = 1
    o.d_model = 64
    o.d_ff = 192
    o.d_ff_expert = 48
    o.q_lora_rank = 32
    o.kv_lora_rank = 32
    o.qk_nope_head_dim = 16
    o.qk_rope_head_dim = 16
    o.v_head_dim = 16
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
    c.train.steps = 450
    c.train.checkpoint_every = 150
    c.train.eval_every = 150
    c.train.mtp_weight = 0.3
    return c
