"""The RL stage (docs/recipe.md §2), tiny, on CPU: asynchronous policy-gradient RL of the agent-SFT
model on generated function tasks, played as tool-calling episodes in the sandbox.

Episodes are generated continuously; each step trains 4 finished prompts x 8 samples (group size
8, single epoch: every prompt once), none with a token more than 2 versions older than the
weights being updated (max_staleness 2; 0 would be synchronous), and takes one Adam step with
the recipe's objective: group-mean advantages (no std normalisation), the constant-normalised
token sum (no length normalisation), k1 KL to the RL start weights in the reward, MoE router
replay of the recorded experts, the p99 train/inference mismatch filter and truncated importance
sampling. Held-out pass@1 and best-of-4 on 50 tasks of templates never trained on, at the start
and end.

Command (after experiments/sft_agent_tiny.py has run into runs/sft_agent_tiny):
    python -m c2.main --config=experiments/rl_tiny.py --workdir=runs/rl_tiny
(`--config.init_from=DIR` takes another workdir or `hf:DIR`.)
Runtime: 17 minutes measured synchronously (max_staleness 0) on the 2-core reference machine with
the test suite running beside it (36 steps at ~26 s: rollouts ~10 s, the update ~16 s; two
held-out evaluations ~1 minute each); asynchronously, generation overlaps the updates (see
BENCHMARKS.md "Asynchronous RL"). Expected (measured synchronously, BENCHMARKS.md "RL stage")
from a policy that has learned the tool-call format but not to read the instruction: held-out
pass@1 0.19 -> 0.17 and best-of-4 0.56 -> 0.48 (paired change -0.02 [-0.10, +0.06]): no gain;
DIR/final_metrics.json holds the gain and its interval, DIR/*.png the curves, DIR/rollouts/
every sample.
"""

from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    del arg
    c = rl_stage_defaults()
    c.name = "rl_tiny"
    c.init_from = "runs/sft_agent_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    # The model the pipeline's stages 2-3 produce: YaRN 8x over 128 positions.
    c.model.yarn.factor = 8.0
    c.model.yarn.original_max_position_embeddings = 128
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.optimizer.lr = 3e-4  # 1e-4 barely moves the tiny policy; 1e-3 breaks it (BENCHMARKS.md)
    c.train.steps = 36  # 144 of the basic level's 156 train prompts, each once
    c.train.checkpoint_every = 6
    c.rl.tasks = "functions:basic"
    c.rl.heldout_tasks = "functions:basic"
    c.rl.group_size = 8
    c.rl.prompts_per_step = 4
    c.rl.micro_batch_size = 8
    c.rl.max_staleness = 2
    c.rl.seq_buckets = (512,)
    c.rl.rollout.max_tokens = 512
    c.rl.rollout.max_turn_tokens = 192
    c.rl.rollout.max_turns = 3
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 50
    c.rl.eval.samples = 4
    return c
