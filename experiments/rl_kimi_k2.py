"""The RL stage at real scale: Kimi-K2 (1.04T total, 33B active) trained by policy-gradient RL
on software-engineering tasks (docs/recipe.md §2), laid out for 256 GPUs with expert parallelism
8 and FSDP 32 (one 32k-token episode per GPU; the recipe's context parallelism 8 is the
long-context config's layout).

Command (on a 256-GPU cluster, after experiments/sft_kimi_k2.py; tasks in /data/swe_tasks, one
task directory each, held-out ones in /data/swe_tasks_heldout):
    python -m c2.main --config=experiments/rl_kimi_k2.py --workdir=runs/rl_kimi_k2 --distributed
It runs asynchronously at the default staleness bound S = 2 (`config.rl.max_staleness`: no
trained token more than 2 versions older than the weights it updates), the engine in the
trainer's processes (`rollout_backend` "local"; `--config.rl.rollout_backend=ray` moves the
rollouts to a fleet, WORKSPACE.md).
Runtime: 500 steps x 64 prompts x 16 samples; generation dominates: at 32k tokens per episode,
about 5e8 generated tokens in all. Checked abstractly in tests/train/test_configs.py (layout and
memory); per-GPU memory: `python -m c2.bench.plan --config=experiments/rl_kimi_k2.py
--compile_for b300 --grouped_gemm xla`.
Expected: held-out pass@1 rises with best-of-16 not falling (docs/recipe.md §2: average and
best-of-K rose together); train/inference mismatch p99 stays small thanks to router replay.
"""

from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    del arg
    c = rl_stage_defaults()
    c.name = "rl_kimi_k2"
    c.init_from = "runs/sft_kimi_k2"
    c.model.preset = "kimi_k2"
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.quant = "mxfp8"
    c.model.overrides.mtp_depth = 1
    c.model.overrides.remat = True
    # The Pallas MXFP8 kernels, dense and grouped, per device: XLA:GPU's own ragged_dot is no
    # grouped GEMM (a 1.7 TB working set per GPU; BENCHMARKS.md, `c2.bench.plan --compile_for`).
    c.model.overrides.mxfp8_impl = "pallas"
    c.model.overrides.max_seq_len = 262144
    c.model.yarn.factor = 64.0
    c.model.yarn.original_max_position_embeddings = 4096
    c.model.yarn.beta_fast = 1.0
    c.model.yarn.beta_slow = 1.0
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.tokenizer = "/data/Kimi-K2-Instruct/tokenizer.json"
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.context, c.mesh.tensor = 1, 32, 8, 1, 1
    c.mesh.rules.expert_embed = "fsdp"
    c.mesh.rules.q_lora = "fsdp"
    c.mesh.rules.kv_lora = "fsdp"
    c.optimizer.lr = 1e-6
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 10
    c.train.steps = 500
    c.train.checkpoint_every = 10
    c.train.progress_bar = False
    # The LM head and log-probs by chunks of 2,048 positions: no [1, 32k, 163,840] float32
    # logits (21 GB per copy) in the step (c2.rl.step.RLLearner logit_chunk_tokens).
    c.train.loss_chunk_tokens = 2048
    c.rl.tasks = "/data/swe_tasks"
    c.rl.heldout_tasks = "/data/swe_tasks_heldout"
    c.rl.group_size = 16
    c.rl.prompts_per_step = 64
    c.rl.micro_batch_size = 256  # one 32k-token sequence per device per micro-batch
    c.rl.seq_buckets = (8192, 16384, 32768)
    # A packed row holds a whole group: 16 episodes of up to 32k tokens would be one 500k-token
    # row; at this length the group's shared prompt is a small part of each sample anyway.
    c.rl.pack_groups = False
    c.rl.rollout.max_tokens = 32768
    c.rl.rollout.max_turn_tokens = 8192
    c.rl.rollout.max_turns = 100
    c.rl.rollout.engine_slots = 64
    c.rl.rollout.tool_workers = 64
    c.rl.rollout.run_timeout_s = 120.0
    # The length penalty at this length: C_{0.01,0.5} is ~1,200 at 5k generated tokens and
    # ~2,600 at 20k, so 3e-5 (rl_tiny's 5e-4 scaled) moves an advantage by ~0.04 across that.
    c.rl.rewards.length_penalty = 3e-5
    c.rl.eval.tasks = 200
    c.rl.eval.samples = 16
    c.rl.eval.every = 50
    return c
