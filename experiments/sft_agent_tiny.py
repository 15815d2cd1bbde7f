"""Agent SFT (RECIPE.md sections 1.3 and 3), tiny: oracle episodes of generated function tasks.

Data: `data.corpus = "functions"`: 4,000 oracle conversations of c2/envs/functions.py tasks from
the train templates (compact system prompt, "Write add_3(n) in add_3.py: return n + 3.", the
write_file call, its tool response, the submit call), rendered by c2.data.chat.AgentChat exactly
as RL episodes are, the loss on the two replies only (each conversation is <= 504 tokens: one per
512-token row). Held-out batches are conversations from the eval templates (sentence frames
never trained on), so their response bits per byte measure transfer, not memorisation.
The model keeps the stage-2 YaRN setting (it follows sft_tiny in experiments/pipeline_tiny.py).

Command (after experiments/sft_tiny.py has run into runs/sft_tiny):
    python -m c2.main --config=experiments/sft_agent_tiny.py --workdir=runs/sft_agent_tiny
Runtime: about 9 minutes on the 2-core reference machine (400 steps of 4 x 512 tokens, 1.3-1.6 s
each while other jobs shared the cores; compilation ~20 s).
Expected (measured 2026-12-01 from a 150-step stage-1 model, no YaRN:
`--config.init_from=/tmp/fn_cpt --config.model.yarn.factor=0
--config.model.yarn.original_max_position_embeddings=0`): held-out response bits per byte 0.42 at
step 200 and 0.32 at step 400 (train 0.16); 600 more steps (lr 1.5e-3) reach 0.25. The format
is learned (93% of temperature-1 episodes end in a well-formed write_file and submit) but the
model barely reads the instruction: pass rate 0/100 held-out and 0/100 train episodes at
temperature 1, 1/50 train greedy, after 1,000 steps. Swapping the instruction for another task's
changes the replies' negative log-likelihood by under 2 nats at step 400 and by 2-6 nats at step
1,000: conditioning on the task is only starting to emerge, so RL from this model sees almost no
reward. A pass rate RL can use needs a stronger stage-1 model or a much longer SFT than fits here.
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
    c.data.corpus = "functions"
    c.data.seq_len = 512
    c.data.batch_size = 4
    c.data.eval_batches = 8
    c.optimizer.lr = 2e-3
    c.optimizer.warmup_steps = 10
    c.optimizer.schedule = "cosine"
    c.train.steps = 400
    c.train.checkpoint_every = 200
    c.train.eval_every = 200
    return c
