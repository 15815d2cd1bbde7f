"""THE MAIN JOB (the README's `make run`): the whole recipe, tiny, on CPU, from a base model. The
base is the shipped experiments/policies/reader_tiny (a tiny Kimi-K2 that reads its task; made by
experiments/reader_chain_tiny.sh). Then: continued pretraining on code at its 512 tokens, half the
rows replaying what it was trained on (`data.replay`); the YaRN extension to 2x (1024 tokens);
targeted SFT; agent SFT with stdlib functions mixed in; RL in the sandbox (experiments/rl_tiny.py's
stage, 120 steps). Then held-out bits per byte at 128 and 1024 tokens, SFT response bits per byte,
MTP acceptance and the reading probes of every stage's weights, in DIR/report.md (with PNG plots),
DIR/eval.json and DIR/metrics.jsonl. Rerunning on the same DIR resumes where it stopped.

    python -m c2.main --config=experiments/pipeline_tiny.py --workdir=runs/main
    (`:quick`: a smoke run, a smaller fresh model and a few steps a stage, RL included)

Runtime: 46 minutes on the 2-core AMD EPYC machine with other jobs sharing the cores for part of
it (CPT 3, extension 1.3, SFT 1.5, agent SFT 6, RL 34, evaluation 1); RL alone runs ~10.5 s a step.
Expected: (2026-12-07) code bits per byte at 128 tokens 16.3 (the base has never seen code) -> 5.4
after CPT -> 4.8 after agent SFT; the reading probe (held-out operation right, chance 0.33) 0.625
in the base -> 0.15 after CPT -> 0.00 after the extension -> 0.40 after agent SFT; held-out pass@1
0.268 -> 0.273 through RL (+0.005 [-0.028, +0.038]): at this scale continued pretraining on code
erases the reading RL reinforces (from the base itself RL gains +0.08 to +0.20: rl_tiny.py).
`config.train.steps` sets CPT's steps (the extension gets 1/5, SFT 1/3), `config.init_from` the
base ("" fresh, a workdir, or "hf:DIR").
"""

from pathlib import Path

import ml_collections

from c2.eval.pipeline_eval import eval_defaults
from c2.train.config import load_config

HERE = Path(__file__).parent


# The base the job starts from: the shipped reader policy (experiments/policies/reader_tiny, made
# by experiments/reader_chain_tiny.sh), trained on sequences of up to 512 tokens without YaRN.
BASE = "hf:experiments/policies/reader_tiny"
BASE_LEN = 512
FACTOR = 2  # the extension: YaRN 2x over the base's 512 positions
# What the base was trained to do, replayed in the pretraining stages (half their rows).
REPLAY = "functions:wide:4000+recall:4000:agent"


def get_config(arg=None):
    if arg not in (None, "quick"):
        raise ValueError(f"--config=experiments/pipeline_tiny.py:{arg}: arg must be empty or quick")
    c = ml_collections.ConfigDict()
    c.name = "pipeline_tiny"
    c.train = ml_collections.ConfigDict()
    c.train.steps = 100
    c.train.checkpoint_every = 50
    c.init_from = BASE
    c.stage_order = ("cpt", "long_context", "sft", "sft_agent", "rl")
    c.stages = ml_collections.ConfigDict()
    c.stages.cpt = load_config(HERE / "cpt_tiny.py")
    c.stages.long_context = load_config(HERE / "long_context_tiny.py")
    c.stages.sft = load_config(HERE / "sft_tiny.py")
    c.stages.sft_agent = load_config(HERE / "sft_agent_tiny.py")
    c.stages.rl = load_config(HERE / "rl_tiny.py")
    c.eval = eval_defaults()
    c.eval.short_batches, c.eval.long_batches = 4, 2  # 8,192 held-out tokens at either length

    # Continued pretraining on code at the base's length, half the rows replaying what the base
    # does. No learning rate that teaches code kept the reading here (BENCHMARKS.md, "The main
    # job"): 2e-4 takes code bpb 16.3 -> 5.4 and the reading 0.625 -> 0.15.
    cpt = c.stages.cpt
    cpt.data.seq_len, cpt.data.batch_size = BASE_LEN, 4
    cpt.data.replay, cpt.data.replay_fraction = REPLAY, 0.5
    cpt.optimizer.lr, cpt.optimizer.warmup_steps = 2e-4, 10
    # The extension: YaRN 2x, trained at 1024 tokens with the same replay.
    lc = c.stages.long_context
    lc.data.replay, lc.data.replay_fraction = REPLAY, 0.5
    lc.optimizer.lr = 1e-4
    # Targeted SFT (stdlib functions), gently.
    c.stages.sft.optimizer.lr = 1e-4
    # Agent SFT: the tool format of the wide function tasks, with stdlib functions mixed in so the
    # language model stays (without them held-out bits per byte went 3.25 -> 15.26).
    agent = c.stages.sft_agent
    agent.data.corpus = "functions:wide:20000+stdlib"
    agent.data.batch_size = 8
    agent.optimizer.lr, agent.optimizer.warmup_steps = 1e-3, 30
    agent.train.steps = 150
    for name in ("long_context", "sft", "sft_agent", "rl"):
        yarn = c.stages[name].model.yarn
        yarn.factor, yarn.original_max_position_embeddings = float(FACTOR), BASE_LEN
        yarn.mscale, yarn.mscale_all_dim = 1.0, 1.0
    lc.data.seq_len = BASE_LEN * FACTOR

    steps, every = c.train.get_ref("steps"), c.train.get_ref("checkpoint_every")
    cpt.train.steps = steps
    lc.train.steps = steps // 5
    c.stages.sft.train.steps = steps // 3
    for name in c.stage_order:
        stage = c.stages[name]
        stage.name = name
        if name != "rl":  # RL checkpoints every few steps: its steps are long
            stage.train.checkpoint_every = every
        stage.init_from = ""  # chained to the previous stage by the pipeline
    cpt.init_from = c.get_ref("init_from")
    cpt.train.eval_every = steps // 2
    for name in ("long_context", "sft"):
        c.stages[name].optimizer.warmup_steps = 2

    if arg == "quick":
        c.init_from = ""  # a fresh smaller model: the plumbing, not the gain
        c.train.steps = 24  # stage 1: 24 steps, extension 4, SFT 8
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
            if name != "cpt":
                stage.model.yarn.original_max_position_embeddings = 64
                stage.model.yarn.factor = 4.0
        cpt.data.seq_len, cpt.data.batch_size = 64, 8
        cpt.data.replay = "recall:200"
        cpt.optimizer.lr, cpt.optimizer.warmup_steps = 3e-3, 4  # from scratch
        lc.optimizer.lr, c.stages.sft.optimizer.lr = 1e-3, 5e-4
        lc.optimizer.warmup_steps = 1
        lc.data.replay = "recall:200"
        lc.data.seq_len, lc.data.batch_size = 256, 2
        c.stages.sft.data.seq_len, c.stages.sft.data.batch_size = 256, 2
        agent.data.corpus = "functions:wide:200+stdlib"
        agent.train.steps, agent.optimizer.warmup_steps = 4, 1
        agent.data.batch_size = 2
        c.stages.rl.init_from = ""
        c.stages.rl.train.steps = 2
        c.stages.rl.train.checkpoint_every = 1
        c.stages.rl.optimizer.warmup_steps = 0
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
