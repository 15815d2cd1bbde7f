"""The RL stage at real scale: Kimi-K2 (1.04T total, 33B active) trained by policy-gradient RL
on software-engineering tasks (docs/recipe.md §2): the trainer on 256 GPUs (expert parallelism 8,
context parallelism 8, FSDP 4: one 32k-token episode per 8 GPUs), the rollouts on a Ray fleet
of 4 engines x 32 GPUs.

Command (on the cluster's Ray head, after experiments/sft_kimi_k2.py; tasks in /data/swe_tasks,
held-out ones in /data/swe_tasks_heldout, /data shared by every node):
    python -m c2.main --config=experiments/rl_kimi_k2.py --workdir=runs/rl_kimi_k2 --distributed
Asynchronous at the default staleness bound S = 2 (`config.rl.max_staleness`); bf16 weights
reach the engines through the weight store.
Runtime: 500 steps x 64 prompts x 16 samples; generation dominates: at 32k tokens per episode,
about 5e8 generated tokens in all.
Memory per GPU (`python -m c2.bench.plan --config=experiments/rl_kimi_k2.py --compile_for h200`:
every program compiled whole, device-less): the trainer 132.0 GB of 141 (parameters 17.6, Adam
with its first moment in bf16 26.4, the frozen reference with its experts in bf16 9.6, the RL
update's temporaries 78.2; 193.2 GB without context parallelism, at 32k tokens a GPU); what
fitting cost: 32 micro-batches a step where 4 were, an 8-step ring. Each engine 93.9 GB (bf16
weights 72.3, KV cache of 64 slots x 32k 18.4, one layer's experts gathered 3.2), so an engine
needs 32 GPUs, 4 nodes of 8: each Ray worker is a gang of 4 actors, one a node, in one
jax.distributed group (`rl.rollout_hosts`): a leader playing the episodes, 3 followers
replaying its engine calls, each reading its own shards of every version from the store.
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
    c.data.tokenizer = "/data/Kimi-K2-Instruct/tokenizer.json"
    # The trainer: context parallelism 8 (each 32k episode over 8 GPUs, ring attention: 4k
    # tokens a GPU), experts over 8, FSDP 4; every weight sharded over fsdp x context, 32 ways
    # (the engines' mesh has neither axis: no change there).
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.context, c.mesh.tensor = 1, 4, 8, 8, 1
    for axis in ("embed", "expert_embed", "q_lora", "kv_lora"):
        c.mesh.rules[axis] = ("fsdp", "context")
    # The engines' expert FFNs over their tensor axis (training has tensor 1: no change there).
    c.mesh.rules.expert_mlp = "tensor"
    c.optimizer.lr = 1e-6
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 10
    c.optimizer.mu_dtype = "bfloat16"  # 8.8 GB a GPU less; the second moment stays float32
    c.train.steps = 500
    c.train.checkpoint_every = 10
    c.train.progress_bar = False
    # The LM head and log-probs by chunks of 2,048 positions: no [1, 32k, 163,840] float32
    # logits (2.7 GB per copy per GPU at 4k tokens) in the step (RLLearner logit_chunk_tokens).
    c.train.loss_chunk_tokens = 2048
    c.rl.tasks = "/data/swe_tasks"
    c.rl.heldout_tasks = "/data/swe_tasks_heldout"
    c.rl.group_size = 16
    c.rl.prompts_per_step = 64
    c.rl.micro_batch_size = 32  # one 32k-token episode per 8-GPU context group per micro-batch
    c.rl.seq_buckets = (8192, 16384, 32768)
    # A packed row holds a whole group: 16 episodes of up to 32k tokens would be one 500k-token
    # row; at this length the group's shared prompt is a small part of each sample anyway.
    c.rl.pack_groups = False
    c.rl.rollout.max_tokens = 32768
    c.rl.rollout.max_turn_tokens = 8192
    c.rl.rollout.max_turns = 100
    # Rollouts on a Ray fleet beside the trainer: 4 engines of 32 GPUs (experts over 8, heads
    # and expert FFNs over 4), bf16 weights through the store, 64 slots each.
    c.rl.rollout_backend = "ray"
    c.rl.ray_address = "auto"
    c.rl.weight_store = "/data/runs/rl_kimi_k2/weight_store"
    c.rl.num_rollout_workers = 4
    c.rl.ray_worker_gpus = 1.0  # per device of rollout_mesh
    c.rl.rollout_mesh = "expert=8,tensor=4"  # tensor within a node, experts 2 a node
    c.rl.rollout_hosts = 4  # each engine a gang of 4 processes, one a node (c2/rl/fleet_gang.py)
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
