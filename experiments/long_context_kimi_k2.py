"""Stage 2 at real scale: Kimi-K2 long-context extension to 256k tokens with YaRN (docs/recipe.md
§1.2), context parallelism 32 and expert parallelism 8 on 256 GPUs.

Command (after experiments/cpt_kimi_k2.py):
    python -m c2.main --config=experiments/long_context_kimi_k2.py --workdir=runs/lc_kimi_k2 \\
        --distributed
with long code documents in /data/long_code.array_record (--config.data.corpus to change).
Runtime: 1,600 steps x 8 x 262,144 tokens = 3.4B tokens at 1.2e12 FLOPs per token (attention
dominates at this length) = 4.0e21 FLOPs: about 11 hours on 256 H200 at 40% of the bf16 peak.
Expected: held-out bits per byte at 256k tokens falls to about the 32k value (the model uses the
long context); at 32k it stays within a few hundredths of stage 1.

Layout: each 256k sequence is split over the 32-way context axis (8k tokens per GPU), expert
parallelism 8, no FSDP axis: every weight is sharded over context (`mesh.rules`, 32 ways), so
each 32-GPU group holds one sequence and a step is 8 sequences with no gradient accumulation.
YaRN factor 64 over Kimi-K2's original 4,096 positions. Attention is blockwise (c2/model/flash.py)
with ring attention over the context axis (c2/model/ring.py): no [heads, T, S] scores. Memory per
GPU, the whole step compiled by XLA:GPU for 256 H200 (`python -m c2.bench.plan
--config=experiments/long_context_kimi_k2.py --compile_for h200`, device-less): 119.7 GB of 141
(parameters 17.6, Adam with its first moment in bf16 26.4, temporaries 75.7). What fitting cost:
a 2M-token step where 8M were (4x the optimizer steps for the same tokens) and a 32-step ring.
Context 8 with FSDP 4 (32k tokens a GPU) needs 174.6 GB; context 32 with 32 sequences in 4
micro-batches 144.8 (the float32 gradient's accumulator and its copies take ~25 GB).
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "long_context_kimi_k2"
    c.init_from = "runs/cpt_kimi_k2"
    c.model.preset = "kimi_k2"
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.quant = "mxfp8"
    c.model.overrides.mtp_depth = 1
    c.model.overrides.remat = True
    # The Pallas MXFP8 kernels, dense and grouped, per device: XLA:GPU's own ragged_dot is no
    # grouped GEMM (a 1.7 TB working set per GPU; BENCHMARKS.md, `c2.bench.plan --compile_for`).
    c.model.overrides.mxfp8_impl = "pallas"
    # A GPU's 32k tokens through the expert exchange 8k at a time (its buffers a quarter; the
    # backward runs each chunk's experts forward once more), the experts gathered over FSDP in
    # bf16, not their float32 masters (half the bytes; gradients summed over FSDP in bf16).
    c.model.overrides.moe_token_chunk = 8192
    c.model.overrides.expert_gather_in_dtype = True
    c.model.overrides.max_seq_len = 262144
    c.model.overrides.attention_impl = "blockwise"
    c.model.overrides.attention_block_q = 512
    c.model.overrides.attention_block_kv = 512
    c.model.yarn.factor = 64.0
    c.model.yarn.original_max_position_embeddings = 4096
    c.model.yarn.beta_fast = 1.0
    c.model.yarn.beta_slow = 1.0
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.kind = "pretrain"
    c.data.corpus = "/data/long_code.array_record"
    c.data.tokenizer = "/data/Kimi-K2-Instruct/tokenizer.json"
    c.data.seq_len = 262144
    c.data.batch_size = 8  # one sequence per 32-GPU context group: no gradient accumulation
    c.data.eval_batches = 64
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.context, c.mesh.tensor = 1, 1, 8, 32, 1
    # Every weight sharded over fsdp x context (here the context axis alone): what the default
    # rules replicate too, the expert weights and the MLA low-rank projections.
    for axis in ("embed", "expert_embed", "q_lora", "kv_lora"):
        c.mesh.rules[axis] = ("fsdp", "context")
    c.optimizer.lr = 1e-5
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 80
    c.optimizer.end_lr_ratio = 0.1
    c.optimizer.mu_dtype = "bfloat16"  # 8.8 GB a GPU less; the second moment stays float32
    c.train.steps = 1600
    c.train.checkpoint_every = 200
    c.train.eval_every = 400
    c.train.log_every = 1
    c.train.mtp_weight = 0.3
    # The LM head + losses over chunks of positions (512 per GPU: each chunk is spread over the
    # context shards): the whole [tokens, vocab] float32 logits (5.4 GB per copy per GPU at 8,192
    # tokens x 163,840) never exist (c2.bench.plan).
    c.train.loss_chunk_tokens = 16384
    c.train.progress_bar = False
    return c
