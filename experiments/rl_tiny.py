"""The RL stage (docs/recipe.md §2), tiny, on CPU: asynchronous policy-gradient RL of the agent-SFT
model on generated function tasks, played as tool-calling episodes in the sandbox.

Tasks: the wide level of c2/envs/functions.py ("[db] Write f(n) in f.py: return n * 47.",
constants 1-99): only reading the instruction solves them. Episodes are generated continuously;
each step trains 8 finished prompts x 8 samples (group size 8, single epoch: every prompt
once), none with a token more than 2 versions older than the weights being updated
(max_staleness 2; 0 would be synchronous), and takes one Adam step with the recipe's objective:
group-mean advantages (no std normalisation), the constant-normalised token sum (no length
normalisation), k1 KL to the RL start weights in the reward, MoE router replay of the recorded
experts, the p99 train/inference mismatch filter and truncated importance sampling. Held-out
pass@1 and best-of-4 on 100 tasks of templates never trained on, at the start and end.

Command (after experiments/sft_agent_tiny.py has run into runs/sft_agent_tiny):
    python -m c2.main --config=experiments/rl_tiny.py --workdir=runs/rl_tiny
(`--config.init_from=DIR` takes another workdir or `hf:DIR`.)
Runtime: 13.4 minutes on the 2-core reference machine with nothing else running (36 steps at
~17 s, generation overlapping the updates; two held-out evaluations of 400 episodes).
Measured (2026-12-03, BENCHMARKS.md "RL stage"): held-out pass@1 0.41 -> 0.63, **+0.22 [+0.16,
+0.28]** (paired, 95%), best-of-4 0.75 -> 0.90; a replicate (--config.rl.task_seed=3) +0.08 [+0.01,
+0.15], best-of-4 -0.02; from a policy that partly reads its task. That policy came from this chain
(each a `python -m c2.main` run, ~2-3.5 hours on 2 cores in all; no YaRN in stages 1-3 and 5, nor
for this stage; stage 4's recorded command does not say, and rerun with YaRN 8x it fails too);
`bash experiments/reader_chain_tiny.sh DIR` runs it and exports the policy to hf:DIR/policy,
checking that it reads; run end to end with stage 1 as one 1,500-step cosine (2026-12-04) its
policy did not (0.28 / 0.05 at step 300: stage 4's recall behind the prompt came to 0.13, not
0.41), nor with stage 1 as below (stage 4 at 0.11-0.12, with or without YaRN; BENCHMARKS.md, issue
16). Shortening stage 2 to 1,200 steps loses it as well (wide-level operation / digits 0.43 / 0.13
after stage 5's 800 steps; BENCHMARKS.md, issue 16):
  1. experiments/sft_copy_tiny.py from scratch, --config.data.corpus=copy:ordered (strings
     repeated in order), 1,790 steps (its schedule: BENCHMARKS.md, issue 16; 1,500 steps of one
     cosine leave the plateau too): it learns to copy, by offset;
  2. the same config (shuffled strings), 2,500 steps from 1: it copies by content;
  3. the same with --config.data.corpus=recall+copy:20000, 1,500 steps from 2;
  4. experiments/sft_agent_tiny.py from 3, --config.data.corpus=functions:basic+functions:basic
     +recall:12000:agent+copy:4000:agent --config.data.batch_size=8 --config.optimizer.lr=1e-3
     --config.optimizer.warmup_steps=50 --config.train.steps=1200: recall behind the agent
     system prompt;
  5. experiments/sft_agent_tiny.py from 4, --config.data.corpus=functions:wide:20000
     --config.data.batch_size=8 --config.optimizer.lr=1e-3 --config.optimizer.warmup_steps=30
     --config.train.steps=800, its step-300 checkpoint (held-out pass@1 0.41 at T = 1).
The main job's own chain (stage 1 then 300 steps of agent SFT) gives a policy that does not
read its task (held-out pass@1 at chance): from it this stage has nothing to reinforce.
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
    # 1e-4 took a reading policy from 0.80 to 0.46 held-out pass@1 in 36 steps; 3e-5 moved it +4.5
    # points (BENCHMARKS.md, "RL stage"): Adam moves every weight by ~lr a step however weak the
    # signal, and at this size that soon outweighs what 32-64 samples a step teach.
    c.optimizer.lr = 5e-5
    c.train.steps = 36  # 288 prompts, each once
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
    c.rl.rollout.max_tokens = 512
    c.rl.rollout.max_turn_tokens = 192
    c.rl.rollout.max_turns = 3
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 100
    c.rl.eval.samples = 4
    return c
