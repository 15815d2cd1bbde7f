"""Agent SFT (docs/recipe.md §1.3 and §3), tiny: oracle episodes of generated function tasks.

Data: `data.corpus = "functions:wide"`: oracle conversations of the wide level of
c2/envs/functions.py ("[db] Write f(n) in f.py: return n * 47.": compact system prompt, the
write_file call, its tool response, the submit call; constants 1-99), rendered by
c2.data.chat.AgentChat exactly as RL episodes are, the loss on the replies only.
`"functions:basic"` is the basic level (720 conversations, constants 2 and 3), `"functions"` the
full level (18 operations, varied names and files). Held-out batches come from the eval
templates (sentence frames never trained on). The model keeps the stage-2 YaRN setting (it
follows sft_tiny in experiments/pipeline_tiny.py).

Command (after experiments/sft_tiny.py has run into runs/sft_tiny):
    python -m c2.main --config=experiments/sft_agent_tiny.py --workdir=runs/sft_agent_tiny
Runtime: about 6 minutes on the 2-core machine (300 steps of 4 x 512 tokens).
Expected: the tool-call format within a few hundred steps, but from the stage-1 model not
reading: teacher-forced, the operation and constant it writes stay at chance (`python -m
c2.eval.copying --policy DIR --task wide`). A model that already copies in the agent format reads
within a few hundred steps of this data: experiments/reader_chain_tiny.sh.
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
    c.data.corpus = "functions:wide"
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
