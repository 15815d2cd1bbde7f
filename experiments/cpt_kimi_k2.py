"""Stage 1 at real scale: Kimi-K2 (1.04T total, 33B active with the added MTP layer) continued
pretraining on code at 32k tokens (docs/recipe.md §1.1), laid out for 256 GPUs.

Command (on a 256-GPU cluster, one process per host; --distributed initialises the JAX runtime
from the cluster environment):
    python -m c2.main --config=experiments/cpt_kimi_k2.py --workdir=runs/cpt_kimi_k2 --distributed
with the HF base model in /data/Kimi-K2-Instruct and the code corpus in /data/code.array_record
(or override --config.init_from=hf:DIR, --config.data.corpus, --config.data.tokenizer).
Runtime: 12,000 steps x 512 x 32,768 tokens = 201B tokens at 3.26e11 training FLOPs per token
(c2.model.flops_per_token) = 6.6e22 FLOPs: about 7.5 days on 256 H200 at 40% of the bf16 dense
peak (989 TFLOP/s each); MXFP8 matmuls raise the peak.
Expected: held-out bits per byte of the code corpus falls log-linearly with compute (docs/recipe.md
§0); MTP acceptance rises above 0.8 (the draft model for speculative decoding).

Layout: expert parallelism 8 (48 of the 384 experts per shard), context parallelism 4 (each 32k
sequence over 4 GPUs, ring attention: 8k tokens a GPU), FSDP 8; every weight, experts included,
sharded over fsdp x context (`mesh.rules`), 32 ways. bf16/MXFP8 compute, fp32 master weights,
Adam's first moment in bf16 (as DeepSeek-V3), rematerialised layers, the Pallas MXFP8 kernels,
8 micro-batches of one sequence per 4 GPUs. Memory per GPU, the whole step compiled by XLA:GPU
for 256 H200 (`python -m c2.bench.plan --config=experiments/cpt_kimi_k2.py --compile_for h200`,
device-less): 136.6 GB of 141 (parameters 17.6, Adam 26.4, temporaries 92.6, of which the
float32 gradient and its accumulator across micro-batches ~32). What fitting cost: the ring's
collective permutes (10 GB a step) and 8 smaller micro-batches where 2 were; without context
parallelism (FSDP 32, 32k tokens a GPU) the step needs 188.9 GB.
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "cpt_kimi_k2"
    c.init_from = "hf:/data/Kimi-K2-Instruct"
    c.model.preset = "kimi_k2"
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.quant = "mxfp8"
    c.model.overrides.mtp_depth = 1  # the recipe adds an MTP module, trained by self-distillation
    c.model.overrides.remat = True
    # The Pallas MXFP8 kernels, dense and grouped, per device: XLA:GPU's own ragged_dot is no
    # grouped GEMM (a 1.7 TB working set per GPU; BENCHMARKS.md, `c2.bench.plan --compile_for`).
    c.model.overrides.mxfp8_impl = "pallas"
    # A GPU's 32k tokens through the expert exchange 8k at a time (its buffers a quarter; the
    # backward runs each chunk's experts forward once more), the experts gathered over FSDP in
    # bf16, not their float32 masters (half the bytes; gradients summed over FSDP in bf16).
    c.model.overrides.moe_token_chunk = 8192
    c.model.overrides.expert_gather_in_dtype = True
    c.data.kind = "pretrain"
    c.data.corpus = "/data/code.array_record"
    c.data.tokenizer = "/data/Kimi-K2-Instruct/tokenizer.json"
    c.data.seq_len = 32768
    c.data.batch_size = 512
    c.data.eval_batches = 64
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.context, c.mesh.tensor = 1, 8, 8, 4, 1
    # Every weight sharded over fsdp x context (the context shards hold no weights of their own
    # otherwise): what the default rules replicate too, the expert weights and the MLA low-rank
    # projections (the only axes of wq_b / wkv_b that are not heads).
    for axis in ("embed", "expert_embed", "q_lora", "kv_lora"):
        c.mesh.rules[axis] = ("fsdp", "context")
    c.optimizer.lr = 2e-5  # continued pretraining: a fraction of the base model's peak
    c.optimizer.schedule = "wsd"
    c.optimizer.warmup_steps = 200
    c.optimizer.decay_fraction = 0.2
    c.optimizer.end_lr_ratio = 0.1
    c.optimizer.weight_decay = 0.1
    c.optimizer.mu_dtype = "bfloat16"  # 8.8 GB a GPU less; the second moment stays float32
    c.train.steps = 12000
    c.train.checkpoint_every = 250
    c.train.eval_every = 500
    c.train.log_every = 10
    c.train.mtp_weight = 0.3
    # The LM head + losses over chunks of positions: the whole [tokens, vocab] float32 logits
    # (5.4 GB a copy per GPU at 8,192 tokens x 163,840) never exist (c2.bench.plan).
    c.train.loss_chunk_tokens = 2048
    # Gradient accumulation: each 4-GPU context group's 8 sequences one at a time (c2.bench.plan).
    c.train.micro_batches = 8
    c.train.router_bias_rate = 1e-3
    c.train.progress_bar = False
    return c
