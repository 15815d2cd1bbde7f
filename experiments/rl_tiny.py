"""The RL stage (docs/recipe.md §2), tiny, on CPU: asynchronous policy-gradient RL of the agent-SFT
model on generated function tasks, played as tool-calling episodes in the sandbox.

Tasks: the wide level of c2/envs/functions.py ("[db] Write f(n) in f.py: return n * 47.",
constants 1-99): only reading the instruction solves them. Episodes are generated continuously;
each step trains 8 finished prompts x 8 samples (group size 8, single epoch: every prompt
once), none with a token more than 2 versions older than the weights being updated
(max_staleness 2; 0 would be synchronous), and takes one Adam step (one forward of the current
policy serving its log-probs and its gradient: `rl.single_forward`; each group's prompt through
the model once: `rl.pack_groups`) with the recipe's objective:
group-mean advantages (no std normalisation), the constant-normalised token sum (no length
normalisation), k1 KL to the RL start weights in the reward, MoE router replay of the recorded
experts, the p99 train/inference mismatch filter (on the tokens sampled by the weights a step
updates, `rl.mismatch_tokens`: here only the first step's, every later sample being older) and
truncated importance sampling. Held-out pass@1 and best-of-4 on 100 tasks of templates never
trained on, at the start and end.

Command (from the shipped start policy, experiments/policies/reader_tiny):
    python -m c2.main --config=experiments/rl_tiny.py --workdir=runs/rl_tiny
(`--config.init_from=DIR` takes another workdir or `hf:DIR`; a policy trained with YaRN needs
its `--config.model.yarn.*` too, which the stage checks.)
Runtime: 18 minutes on the 2-core reference machine with nothing else running (120 steps at
~8 s, generation overlapping the updates, and two held-out evaluations of 400 episodes:
17 min 54-59 s measured in three runs, 2026-12-05; 18 min 5 s to 19 min 38 s in five runs of
the same cost later that night).
Measured (BENCHMARKS.md "RL stage"), from the shipped policy (2026-12-05): these defaults,
held-out pass@1 0.383 -> 0.503, +0.120 [+0.06, +0.18] (paired, 95%), best-of-4 0.79 -> 0.80;
with `--config.rl.task_seed=7` 0.373 -> 0.530, +0.158 [+0.10, +0.22], best-of-4 0.77 -> 0.87;
with `--config.rl.task_seed=5` 0.363 -> 0.445, +0.083 [+0.02, +0.14], best-of-4 0.82 -> 0.75
(it ended in a k1 excursion, 19 nats over steps 106-113); with `--config.rl.task_seed=3`
(2026-12-06, 18 min 1 s alone) 0.305 -> 0.500, +0.195 [+0.14, +0.25], best-of-4 0.69 -> 0.86
(mean of the four seeds +0.139); seed 5 with the mismatch filter off
(the same from step 2 on) 0.363 -> 0.480, +0.118 [+0.06, +0.18], best-of-4 0.82 -> 0.79,
16 min 33 s; synchronously (`rl.max_staleness=0`)
+0.108, best-of-4 0.82 -> 0.81. The tool-call penalty on the malformed turn only
(`--config.rl.rewards.tool_call_credit=turn --config.rl.rewards.tool_call_penalty=1.0`,
2026-12-06), seeds 1 / 5 / 7: +0.120 / +0.085 / +0.090, best-of-4 +0.06 / -0.04 / -0.01, no k1
excursion (17-18.5 min each). Before the filter judged only fresh tokens
(`--config.rl.mismatch_tokens=all`; 120 steps, packed groups), held-out pass@1 0.383 -> 0.515,
+0.133 [+0.08, +0.19] (paired, 95%),
best-of-4 0.79 -> 0.84; with `--config.rl.task_seed=5` 0.363 -> 0.443, +0.080 [+0.02, +0.14],
best-of-4 0.82 -> 0.76 (-0.06 [-0.15, +0.03]; it ended in a k1 excursion, 15 nats over steps
112-119); with `--config.rl.task_seed=7` 0.373 -> 0.438, +0.065 [+0.01, +0.12], best-of-4
0.77 -> 0.79 (17 min 58 s; mean of the three +0.093). Variants on seed 5, none better
(BENCHMARKS.md, "what the excursions are"): the lr decayed over the last quarter
(`--config.optimizer.schedule=wsd --config.optimizer.decay_fraction=0.25`) +0.068, best-of-4
0.82 -> 0.78 (seed 7: +0.060, 0.77 -> 0.83; seed 1: +0.070, 0.79 -> 0.82); that with 4
prompts x 240 steps +0.078, 0.82 -> 0.81; `rewards.tool_call_penalty` 1.0 an earlier, deeper
excursion (stopped); `objective.kl_beta` 0.003 +0.040; `rollout.top_p`
0.95 +0.003 with best-of-4 0.85 -> 0.64. With 80 steps and packed groups (seed 1,
12 min 54 s) +0.083 [+0.04, +0.13], best-of-4 0.79 -> 0.85. Before packing, 80 steps at 12.7 s:
held-out pass@1 0.383 -> 0.478, +0.095 [+0.06, +0.13] (paired, 95%), best-of-4 0.79 -> 0.87;
with `--config.rl.task_seed=5` 0.363 -> 0.425, +0.063 [+0.02, +0.10], best-of-4 0.82 -> 0.88;
seed 1 again, beside the CI suite, +0.053 [+0.01, +0.09], best-of-4 0.79 -> 0.86; with the engine
running ahead (`--config.rl.run_ahead=True`) seed 1 twice: -0.088 [-0.15, -0.03] (it ended
inside an excursion) and +0.008 [-0.04, +0.06];
with 76 steps and two forwards a step (the same updates): 0.383 -> 0.478, +0.095 [+0.06, +0.13],
best-of-4 0.79 -> 0.88; with `--config.rl.task_seed=3` 0.305 -> 0.435, +0.130
[+0.08, +0.18], best-of-4 0.69 -> 0.82; with `--config.rl.task_seed=5` 0.363 -> 0.423, +0.060
[+0.02, +0.10], best-of-4 0.82 -> 0.85; with `--config.rl.task_seed=7` 0.373 -> 0.450, +0.078
[+0.02, +0.13], best-of-4 0.77 -> 0.80 (mean of the four +0.091). The same seed run again
varies by as much as seeds do (the episodes' order is asynchronous): seed 1 with 84 steps
+0.053 [+0.01, +0.09], best-of-4 0.79 -> 0.85. With no warmup and 60 steps +0.075 and +0.063,
at lr 3e-5 +0.080 and -0.013, with kl_beta 0.01 +0.075 (seed 1) and +0.043 (seed 5); from the
policy shipped before it (its stage 5 without reworded instructions, so one held-out phrasing
garbled its calls) +0.04 [-0.00, +0.09] in 36 steps; before both (2026-12-03), from an earlier
reading policy: +0.22 [+0.16, +0.28], best-of-4 0.75 -> 0.90, and a replicate
(--config.rl.task_seed=3) +0.08 [+0.01, +0.15], best-of-4 -0.02.
The start policy comes from `bash experiments/reader_chain_tiny.sh DIR` (~2 hours on 2 cores:
copy, recall, recall behind random system turns, agent SFT, the wide level with reworded
instructions; the probes are in experiments/policies/reader_tiny/README.md). The main job's own
chain (stage 1 then 300 steps of agent SFT) gives a policy that does not read its task (held-out
pass@1 at chance): from it this stage has nothing to reinforce.
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
    # 1e-4 took a reading policy from 0.80 to 0.46 held-out pass@1 in 36 steps (BENCHMARKS.md,
    # "RL stage"): Adam moves every weight by ~lr a step however weak the signal, and at this size
    # that soon outweighs what 64 samples a step teach. From the shipped policy, 60 steps at 5e-5
    # with no warmup gained +0.075 and +0.063 in two task seeds (the k1 to the start at 15-50 nats
    # over steps 9-35); 3e-5 kept k1 under 4 nats but gained +0.08 and -0.01. A 10-step warmup
    # (Adam's first updates are ~lr on every weight, however noisy the gradient) and 76 steps:
    # +0.095, +0.130, +0.060 and +0.078 in four task seeds. A 10x k1 weight (kl_beta 0.01) kept
    # the k1 under 14 nats but gained less in both seeds tried (+0.075, +0.043).
    c.optimizer.lr = 5e-5
    c.optimizer.warmup_steps = 10
    # One forward of the current policy a step, not two (the same update): 12.7 s a step, not
    # 13.7, so 80 steps fit the 20 minutes where 76 did.
    c.rl.single_forward = True
    # Packed groups (config.rl.pack_groups, on by default) took a step from 12.7 s to ~8 s, so
    # 120 steps fit the 20 minutes where 80 did.
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
    # ~2,020 positions; the longest of a step's 8 fit 2,304 in 78 of the seed-1 run's 80 steps.
    c.rl.pack_buckets = (2048, 2304, 2560, 3072, 4096)
    c.rl.rollout.max_tokens = 512
    c.rl.rollout.max_turn_tokens = 192
    c.rl.rollout.max_turns = 3
    c.rl.rollout.engine_slots = 16
    c.rl.eval.tasks = 100
    c.rl.eval.samples = 4
    return c
