"""The entry point: python -m c2.main --config=experiments/X.py[:arg] --workdir=DIR [--config.a.b=v]

A config with `stages` runs the pipeline (stages, evaluation, report); any other config trains one
stage. Either resumes by itself from an existing DIR. Logic lives in c2/pipeline.py.
"""

import logging as std_logging
import re
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from c2 import pipeline
from c2.train.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and reports.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "Several hosts: start jax.distributed first (one process per host, all with the same "
    "flags but --process_id). Settings from the three flags below, else JAX_COORDINATOR_ADDRESS, "
    "JAX_NUM_PROCESSES, JAX_PROCESS_ID, else the cluster (Slurm, Open MPI, TPU).",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "HOST:PORT of process 0's coordinator (implies --distributed)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in the run, one per host (implies --distributed)."
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index in [0, num_processes) (implies --distributed)."
)
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
    """absl parsing; an override of an unknown config field exits with one line naming it."""
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as e:
        hint = re.search(r'Did you mean "[^"]+"', str(e))
        given = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
        sys.exit(
            f"config error: unknown field in an override {given}"
            + (f" ({hint.group(0)}?)" if hint else "")
        )


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # libraries (orbax) stay quiet
    std_logging.getLogger("c2").setLevel(std_logging.INFO)  # c2 reports its progress
    import jax

    explicit = dict(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
    )
    if _DISTRIBUTED.value or any(v is not None for v in explicit.values()):
        from c2 import distributed

        try:
            distributed.initialize(**explicit)
        except ValueError as e:
            sys.exit(f"flag error: {e}")
    if not jax.config.jax_compilation_cache_dir:  # unless JAX_COMPILATION_CACHE_DIR says where
        # a restarted or resumed run (and every later stage) reuses compiled programs
        jax.config.update("jax_compilation_cache_dir", f"{_WORKDIR.value}/jax_cache")
    run(_CONFIG.value, _WORKDIR.value)


def run(config, workdir: str):
    """The whole job; a config mistake exits with one line naming the field, no traceback."""
    try:
        return pipeline.run(config, workdir)
    except ConfigError as e:
        sys.exit(f"config error: {e}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
