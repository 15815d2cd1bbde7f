"""THE MAIN JOB (the README's `make run`): the whole recipe, tiny, on CPU: continued pretraining
(cpt_tiny.py), the YaRN extension to 8x the length (long_context_tiny.py), targeted SFT
(sft_tiny.py), agent SFT (sft_agent_tiny.py) and RL in the sandbox (rl_tiny.py, 36 steps here),
each from the previous stage's checkpoint; then held-out bits per byte at 128 and 1024 tokens,
SFT response bits per byte and MTP acceptance, in DIR/report.md (with PNG plots), DIR/eval.json
and DIR/metrics.jsonl. Rerunning on the same DIR resumes where it stopped.

    python -m c2.main --config=experiments/pipeline_tiny.py --workdir=runs/main
    (`:quick`: a smoke run, a smaller model and a few steps a stage, RL included)

Runtime: ~35 minutes on the 2-core machine (stage 1 ~7, extension ~2.5, SFT ~2.5, evaluation ~1,
agent SFT ~6, RL ~14), summed from the stages' times, not timed as one job.
Expected: held-out bits per byte 8.4 untrained -> 3.2 after stage 1 (BENCHMARKS.md, "The main
job"); at 1024 tokens 4.2 before the extension -> 3.2 after it; SFT responses 2.9 -> 2.8; MTP
acceptance ~0.7. This job's agent SFT does not teach reading the instruction, so its RL shows the
stage's curves, not a gain (experiments/rl_tiny.py starts from a policy that reads).
`config.train.steps` sets stage 1's steps (the extension gets 1/12, SFT 1/5), `config.init_from`
stage 1's start ("" fresh, a workdir, or "hf:DIR").
"""

from pathlib import Path

import ml_collections

from c2.eval.pipeline_eval import eval_defaults
from c2.train.config import load_config

HERE = Path(__file__).parent


def get_config(arg=None):
    if arg not in (None, "quick"):
        raise ValueError(f"--config=experiments/pipeline_tiny.py:{arg}: arg must be empty or quick")
    c = ml_collections.ConfigDict()
    c.name = "pipeline_tiny"
    c.train = ml_collections.ConfigDict()
    c.train.steps = 300
    c.train.checkpoint_every = 100
    c.init_from = ""
    c.stage_order = ("cpt", "long_context", "sft", "sft_agent", "rl")
    c.stages = ml_collections.ConfigDict()
    c.stages.cpt = load_config(HERE / "cpt_tiny.py")
    c.stages.long_context = load_config(HERE / "long_context_tiny.py")
    c.stages.sft = load_config(HERE / "sft_tiny.py")
    c.stages.sft_agent = load_config(HERE / "sft_agent_tiny.py")
    c.stages.rl = load_config(HERE / "rl_tiny.py")
    # The RL stage plays the agent-SFT model it starts from, so with its positions (YaRN 8x).
    for key, value in c.stages.sft_agent.model.yarn.items():
        c.stages.rl.model.yarn[key] = value
    # The job's own agent-SFT model does not read its task (see Expected above): 36 RL steps, no
    # warmup, show the stage's curves without the 120 that experiments/rl_tiny.py takes.
    c.stages.rl.train.steps = 36
    c.stages.rl.optimizer.warmup_steps = 0
    c.eval = eval_defaults()
    c.eval.short_batches, c.eval.long_batches = 4, 2  # 8,192 held-out tokens at either length

    steps, every = c.train.get_ref("steps"), c.train.get_ref("checkpoint_every")
    c.stages.cpt.train.steps = steps
    c.stages.long_context.train.steps = steps // 12
    c.stages.sft.train.steps = steps // 5
    for name in c.stage_order:
        stage = c.stages[name]
        stage.name = name
        if name != "rl":  # RL checkpoints every few steps: its steps are long
            stage.train.checkpoint_every = every
        stage.init_from = ""  # chained to the previous stage by the pipeline
    c.stages.cpt.init_from = c.get_ref("init_from")
    c.stages.cpt.train.eval_every = steps // 3
    for name in ("long_context", "sft", "sft_agent"):
        c.stages[name].optimizer.warmup_steps = 2

    if arg == "quick":
        c.train.steps = 24  # stage 1: 24 steps, extension 2, SFT 4
        c.train.checkpoint_every = 8
        for name in c.stage_order:
            stage = c.stages[name]
            stage.model.overrides.d_model = 64
            stage.model.overrides.n_layers = 2
            stage.model.overrides.d_ff = 128
            stage.model.overrides.d_ff_expert = 32
            stage.model.overrides.n_experts = 8
            stage.model.overrides.n_experts_per_token = 2
            stage.data.eval_batches = 1
            stage.train.progress_bar = False
        c.stages.cpt.data.seq_len = 64
        c.stages.cpt.data.batch_size = 8
        c.stages.cpt.optimizer.warmup_steps = 4
        c.stages.long_context.optimizer.warmup_steps = 1
        c.stages.long_context.model.yarn.original_max_position_embeddings = 64
        c.stages.sft.model.yarn.original_max_position_embeddings = 64
        c.stages.long_context.data.seq_len = 256
        c.stages.long_context.data.batch_size = 2
        c.stages.sft.data.seq_len = 256
        c.stages.sft.data.batch_size = 2
        c.stages.sft_agent.model.yarn.original_max_position_embeddings = 64
        c.stages.sft_agent.train.steps = 4
        c.stages.sft_agent.data.batch_size = 2
        c.stages.rl.model.yarn.original_max_position_embeddings = 64
        c.stages.rl.train.steps = 2
        c.stages.rl.train.checkpoint_every = 1
        c.stages.rl.rl.group_size = 4
        c.stages.rl.rl.prompts_per_step = 2
        c.stages.rl.rl.micro_batch_size = 4
        c.stages.rl.rl.rollout.max_turn_tokens = 96
        c.stages.rl.rl.eval.tasks = 4
        c.stages.rl.rl.eval.samples = 2
        c.eval.short_seq_len, c.eval.short_batch_size, c.eval.short_batches = 64, 8, 1
        c.eval.long_seq_len, c.eval.long_batch_size, c.eval.long_batches = 256, 2, 1
        c.eval.sft_batches = 1
    return c
