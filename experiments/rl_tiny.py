"""The RL stage (docs/recipe.md §2), tiny, on CPU: asynchronous policy-gradient RL of a policy that
reads its task, on generated function tasks played as tool-calling episodes in the sandbox.

Tasks: the wide level of c2/envs/functions.py ("[db] Write f(n) in f.py: return n * 47.",
constants 1-99), which only reading the instruction solves. Each step trains 8 prompts x 8
samples, each prompt once, no token more than 2 versions older than the weights it updates, with
the recipe's objective (group-mean advantages, constant-normalised sum, k1 in the reward, router
replay, the p99 mismatch filter on fresh tokens, truncated IS) and one Adam step. Held-out pass@1
and best-of-4 on 100 tasks of templates never trained on, at the start and end (DIR/eval.jsonl).

    python -m c2.main --config=experiments/rl_tiny.py --workdir=runs/rl_tiny

It starts from the shipped experiments/policies/reader_tiny (`bash experiments/reader_chain_tiny.sh
DIR` remakes it in ~2 h); another start: `--config.init_from=DIR|hf:DIR` with its
`--config.model.yarn.*`, which the stage checks.
Runtime: ~18 minutes on the 2-core machine with nothing else running (120 steps at ~7 s,
generation overlapping the updates, then two held-out evaluations of 400 episodes).
Expected: held-out pass@1 0.383 -> ~0.50 (+0.12, the 95% interval above zero), best-of-4 not
falling; a run moves by ~4 points with its episodes' order; other
`--config.rl.task_seed`s give +0.08 to +0.20, four seeds' mean +0.139 (BENCHMARKS.md, "RL stage").
"""

from c2.rl.config import rl_stage_defaults


def get_config(arg=None):
    del arg
    c = rl_stage_defaults()
    c.name = "rl_tiny"
    # The reader chain's policy, shipped in the repository (its README has the provenance).
    c.init_from = "hf:experiments/policies/reader_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    # The chain trained without YaRN (the pipeline's RL stage takes its agent SFT's YaRN 8x).
    c.model.yarn.factor = 0.0
    # Adam moves every weight by ~lr a step however weak the signal: 1e-4 breaks the tool-call
    # format, 3e-5 learns less; the warmup keeps the first, noisiest updates small.
    c.optimizer.lr = 5e-5
    c.optimizer.warmup_steps = 10
    c.rl.single_forward = True  # one forward serves log-probs and gradient: the same update, faster
    # With packed groups (config.rl.pack_groups, on by default) a step is ~7 s: 120 fit 20 minutes.
    c.train.steps = 120  # 960 prompts, each once: steps, not samples a step, move this policy
    c.train.checkpoint_every = 6
    # The wide level (constants 1-99): only reading the instruction solves it. Seed 1: the agent
    # SFT data are seed 0's first tasks, so these prompts are new draws; held out: the eval
    # templates (never trained on), seed 2.
    c.rl.tasks = "functions:wide"
    c.rl.heldout_tasks = "functions:wide"
    c.rl.task_seed = 1
    c.rl.group_size = 8
    c.rl.prompts_per_step = 8
    c.rl.micro_batch_size = 8
    c.rl.max_staleness = 2
    c.rl.seq_buckets = (512,)
    # A packed group (a 251-token prompt once, then 8 samples' ~217 generated tokens) fills
    # ~2,020 positions; the longest of a step's 8 nearly always fits 2,304 (one compile a width).
    c.rl.pack_buckets = (2048, 2304, 2560, 3072, 4096)
    c.rl.rollout.max_tokens = 512
    c.rl.rollout.max_turn_tokens = 192
    c.rl.rollout.max_turns = 3
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 100
    c.rl.eval.samples = 4
    return c
