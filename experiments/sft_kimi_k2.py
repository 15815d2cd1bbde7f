"""Stage 3 at real scale: targeted SFT of Kimi-K2 on coding tasks, loss on responses only
(docs/recipe.md §1.3), 32k tokens, the stage-1 layout on 256 GPUs, keeping the 256k YaRN setting.

Command (after experiments/long_context_kimi_k2.py):
    python -m c2.main --config=experiments/sft_kimi_k2.py --workdir=runs/sft_kimi_k2 --distributed
with the SFT set in /data/sft.jsonl ({"prompt", "response"} per line; --config.data.corpus).
Runtime: 500 steps x 256 x 32,768 tokens = 4.2B packed tokens at 3.26e11 FLOPs per token =
1.4e21 FLOPs: about 4 hours on 256 H200 at 40% of the bf16 peak.
Expected: held-out response bits per byte falls below the stage-2 model's; held-out code bits per
byte rises by at most a few hundredths (targeted, small SFT).
Layout: stage 1's (experiments/cpt_kimi_k2.py): expert parallelism 8, context parallelism 4,
FSDP 8, every weight over fsdp x context, Adam's first moment in bf16, 4 micro-batches of one
sequence per 4 GPUs. Memory per GPU, the whole step compiled by XLA:GPU for 256 H200 (`python -m
c2.bench.plan --config=experiments/sft_kimi_k2.py --compile_for h200`, device-less): 136.6 GB of
141 (parameters 17.6, Adam 26.4, temporaries 92.6); FSDP 32 without context parallelism (32k
tokens a GPU) needs 174.1 GB.
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_kimi_k2"
    c.init_from = "runs/lc_kimi_k2"
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
    c.model.yarn.factor = 64.0
    c.model.yarn.original_max_position_embeddings = 4096
    c.model.yarn.beta_fast = 1.0
    c.model.yarn.beta_slow = 1.0
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.kind = "sft"
    c.data.corpus = "/data/sft.jsonl"
    c.data.tokenizer = "/data/Kimi-K2-Instruct/tokenizer.json"
    c.data.seq_len = 32768
    c.data.batch_size = 256
    c.data.eval_batches = 16
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.context, c.mesh.tensor = 1, 8, 8, 4, 1
    # Every weight sharded over fsdp x context, as in stage 1 (experiments/cpt_kimi_k2.py).
    for axis in ("embed", "expert_embed", "q_lora", "kv_lora"):
        c.mesh.rules[axis] = ("fsdp", "context")
    c.optimizer.lr = 5e-6
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 20
    c.optimizer.end_lr_ratio = 0.1
    c.optimizer.mu_dtype = "bfloat16"  # 8.8 GB a GPU less; the second moment stays float32
    c.train.steps = 500
    c.train.checkpoint_every = 100
    c.train.eval_every = 100
    c.train.log_every = 10
    c.train.mtp_weight = 0.3
    # The LM head + losses over chunks of positions: the whole [tokens, vocab] float32 logits
    # (5.4 GB a copy per GPU at 8,192 tokens x 163,840) never exist (c2.bench.plan).
    c.train.loss_chunk_tokens = 2048
    # Gradient accumulation: each 4-GPU context group's 4 sequences one at a time.
    c.train.micro_batches = 4
    c.train.progress_bar = False
    return c
