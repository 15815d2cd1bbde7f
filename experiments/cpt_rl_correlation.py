"""CPT loss predicts RL accuracy (the report's Figure 2, small): CPT at several compute scales,
identical later stages (long context, SFT, agent SFT, RL) after each, then held-out CE after CPT
vs the RL stage's held-out pass@1, a linear fit, r^2 and a plot (c2/eval/correlation.py).

As a config, one point: the main job (experiments/pipeline_tiny.py) with stage 1 at ARG steps and
every later stage at fixed steps, so only the CPT compute differs between points:
    python -m c2.main --config=experiments/cpt_rl_correlation.py:100 --workdir=runs/corr/steps_100
As a driver, every point (each a resumable pipeline workdir), then the fit:
    python experiments/cpt_rl_correlation.py --out runs/corr --scales 75,150,300,600
    (--quick: the pipeline's smoke-size model and stages, a check of the plumbing: measured 10.4
    minutes for --scales 8,16,24 on the 2-core machine under load; held-out CE 6.76, 5.58, 4.93
    bits per byte, RL pass@1 0 at every point, so no fit: r^2 is None)
Writes OUT/correlation.json (points, slope, intercept, r^2) and OUT/correlation.png.
Runtime: estimated from the main job's measured stages (not measured as a whole): ~45 minutes a
point on the 2-core machine (CPT ~1.8 s a step; RL, 120 steps, ~25 minutes of it), so ~3 hours for
four scales. Expected: the main job from its base (2026-12-07) says CPT on code erases the reading
RL reinforces at this scale: the more CPT, the lower code CE and the lower the RL start's reading
(0.625 in the base, 0.40 after 100 CPT steps and agent SFT), and RL gained +0.005 after 100
steps: one point, so the slope's sign here is the first thing the study measures.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).parent
# Later stages' steps, fixed for every point (the main job's at its default 100 CPT steps).
LATER_STEPS = {"long_context": 20, "sft": 33}


def get_config(arg=None):
    from c2.train.config import load_config

    quick = arg is not None and str(arg).endswith("quick")
    steps = str(arg).split(",")[0] if arg else "300"
    if not steps.isdigit() or int(steps) < 1:
        raise ValueError(
            f"--config=experiments/cpt_rl_correlation.py:{arg}: expected CPT steps, e.g. :150 "
            "(or :150,quick)"
        )
    c = load_config(HERE / "pipeline_tiny.py", "quick" if quick else None)
    c.name = f"cpt_rl_correlation_{steps}"
    c.train.steps = int(steps)
    for name, n in LATER_STEPS.items():
        c.stages[name].train.steps = max(2, n // 10) if quick else n
    c.stages.cpt.train.eval_every = 0  # held-out CE at the end only
    c.train.checkpoint_every = max(1, int(steps))
    return c


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--scales", default="75,150,300,600", help="CPT steps per point (>= 3)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    scales = [int(s) for s in args.scales.split(",") if s]
    if len(scales) < 3:
        parser.error(f"--scales={args.scales}: a fit needs at least 3 points")
    import jax

    from c2 import main as c2_main
    from c2.eval import correlation

    out = Path(args.out)
    if not jax.config.jax_compilation_cache_dir:  # the points compile the same programs
        jax.config.update("jax_compilation_cache_dir", str(out / "jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    points = []
    for steps in scales:
        run_dir = out / f"steps_{steps}"
        c2_main.run(get_config(f"{steps},quick" if args.quick else str(steps)), str(run_dir))
        points.append(correlation.read_point(run_dir))
        print(points[-1], flush=True)
    result = correlation.write(points, out)
    print(result["fit"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
