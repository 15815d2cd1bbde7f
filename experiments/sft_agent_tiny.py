"""Agent SFT (docs/recipe.md §1.3 and §3), tiny: oracle episodes of generated function tasks.

Data: `data.corpus = "functions:basic"`: the 720 oracle conversations of the basic level of
c2/envs/functions.py ("[db] Write f(n) in f.py: return n * 3.": compact system prompt, the
write_file call, its tool response, the submit call), rendered by c2.data.chat.AgentChat exactly
as RL episodes are (experiments/rl_tiny.py plays the same level), the loss on the two replies
only. `"functions"` is the full level (18 operations, varied names and files; 4,000
conversations). Held-out batches come from the eval templates (sentence frames never trained on).
The model keeps the stage-2 YaRN setting (it follows sft_tiny in experiments/pipeline_tiny.py).

Command (after experiments/sft_tiny.py has run into runs/sft_tiny):
    python -m c2.main --config=experiments/sft_agent_tiny.py --workdir=runs/sft_agent_tiny
Runtime: about 6 minutes on the 2-core reference machine (300 steps of 4 x 512 tokens, ~1.2 s
each with other jobs on the cores); not yet timed inside the full main job.
Expected (measured 2026-12-01 from a 150-step stage-1 model without YaRN): the format is learned
within a few hundred steps (93% of temperature-1 episodes end in a well-formed write_file and
submit), but the tiny model does not learn to read the instruction: on the full level, 1,000
steps (held-out response bits per byte 0.25) pass 0/100 held-out episodes at temperature 1; on
the basic level, response bits per byte settle at the entropy of a uniform guess among its six
answers (0.016), and held-out pass@1 is 0.19 (best-of-4 0.56): chance, 1/6. BENCHMARKS.md ("RL
stage") has what RL does from there.
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_agent_tiny"
    c.init_from = "runs/sft_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.model.yarn.factor = 8.0
    c.model.yarn.original_max_position_embeddings = 128
    c.model.yarn.mscale = 1.0
    c.model.yarn.mscale_all_dim = 1.0
    c.data.kind = "sft"
    c.data.corpus = "functions:basic"
    c.data.seq_len = 512
    c.data.batch_size = 4
    c.data.eval_batches = 8
    c.optimizer.lr = 2e-3
    c.optimizer.warmup_steps = 10
    c.optimizer.schedule = "cosine"
    c.train.steps = 300
    c.train.checkpoint_every = 150
    c.train.eval_every = 150
    return c
