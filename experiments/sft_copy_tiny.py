"""Copying, tiny: teach the tiny model to repeat what its context holds, before agent SFT.

A policy conditions on its task only by copying from its context (a constant in the
instruction, a value in a file it read, its own summary). The tiny model does not learn that
from the agent SFT data: after 1,900 steps on 6,000 notes tasks its copying probe is at chance
and its value digits 16% right (BENCHMARKS.md, issue 16). Here every response repeats the
strings of its prompt in a shuffled order (`data.corpus = "copy"`: 1-4 random alphanumeric
strings of 4-12 characters; the loss on the response only), so the loss falls only by copying,
and only by finding each string by its content (an induction head), not by its offset.

Command:
    python -m c2.main --config=experiments/sft_copy_tiny.py --workdir=runs/sft_copy_tiny
    python -m c2.eval.copying --policy runs/sft_copy_tiny --chat
Runtime: about 45 minutes on the 2-core reference machine (~0.95 s a step).
Expected: the loss per response token falls from ~4.1 nats (a random character) towards what
the shuffled order costs (which string comes next: ~0.06 nats a token) once the model copies,
and the chat probe's accuracy rises from chance (1/62) towards 1, the same in order and reversed.
Measured (2026-12-03), started from a model that had learnt to copy by offset (1,790 steps of
the in-order spec, below): held-out loss 2.21 nats a token at step 250, 1.51 at 500, 0.92 at
1,000, 0.60 at 1,500, 0.37 at 2,500; chat probe in order / reversed 0.51 / 0.50 at 500, 0.78 /
0.76 at 1,200, 0.92 / 0.92 at 2,500: it finds each string by its content. The plain-text probe
(a 40-character string repeated after filler, no chat markers) stays at chance: the copying is
specific to the format it was taught in. With the prompt repeated in order
(`--config.data.corpus=copy:ordered`, the chain's first stage) the loss left its plateau after
~1,000 steps (3.24 nats at 1,000, 1.62 at 1,500, 0.57 at 1,790) by learning the offset: at step
1,750, 83% of the characters after each string's first right in order, 8% with the strings
reversed (BENCHMARKS.md, issue 16). Rerun 2026-12-04 (1,500 steps of one cosine, then 1,200
shuffled: 37 minutes): chat probe 0.71 / 0.70, but a copy learnt after a bare user turn is lost,
not carried over, once the agent's system turn comes first (BENCHMARKS.md, issue 16).
Then agent SFT from here, keeping the copy data in the mixture (agent SFT alone erases the
copying in 300 steps: chat probe 0.92 -> 0.015):
    python -m c2.main --config=experiments/sft_agent_tiny.py --workdir=runs/sft_agent_copy \
        --config.init_from=runs/sft_copy_tiny --config.model.yarn.factor=0. \
        --config.data.corpus=functions:basic+copy:2000 --config.train.steps=1000
Measured: the mixture keeps the copying (chat probe 0.93 / 0.91 after 1,000 steps) but the
policy does not use it on the agent task: teacher-forced, the operation and the constant it
writes get 0.34 and 0.49 of its probability, on train and held-out templates alike, a uniform
guess among the three operations and two constants, even where the instruction spells the
exact code ("return n * 3"); held-out pass@1 0.16 (best-of-4 0.48), chance. With the full level
in the mixture (`functions:full+functions:basic+copy:4000`, 1,500 steps) it copies function
names (70% / 65% of their characters after the first, train / held-out templates; 17-27% at 500
steps) but still not the one-character operation or constant (basic level 0.43 / 0.46 of those
characters, chance 0.42; the chat probe fell to 0.65).
Recall by key (`--config.data.corpus=recall+copy:20000`, 1,500 steps from here): held-out
values 62% right, keys 97%. But the skill is tied to its context: behind any system turn (even
the agent system prompt's first 40 characters, answers still inside the trained positions) the
values fall to 0-3%, and the first agent-SFT steps from it cost 11 nats a token. `:agent` on the
spec puts that system prompt before each example (`recall:12000:agent+copy:4000:agent+
functions:basic+functions:basic`, lr 1e-3, 1,200 steps): values behind it 16% at 400 steps, 32%
at 600, 41% at 1,200, the basic level's operation and constant still at chance (0.43 / 0.35).
"""

from c2.train.config import stage_defaults


def get_config(arg=None):
    del arg
    c = stage_defaults()
    c.name = "sft_copy_tiny"
    c.model.preset = "tiny_kimi_k2"
    c.model.dtype = "float32"
    c.data.kind = "sft"
    c.data.corpus = "copy"
    c.data.seq_len = 256
    c.data.batch_size = 16
    c.data.eval_batches = 4
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.schedule = "cosine"
    c.train.steps = 2500
    c.train.checkpoint_every = 250
    c.train.eval_every = 250
    return c
