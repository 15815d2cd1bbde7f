"""Every test sees 8 simulated CPU devices, compiles at LLVM's optimisation level 0 and shares one
compilation cache; this must run before jax is imported anywhere."""

import os
from pathlib import Path

# The tests compile far more than they run (tiny models, a few steps each), and XLA:CPU's LLVM
# passes are a large share of a compile: at level 0 the suite took 24 min instead of 35 on the
# 2-core machine. The level picks LLVM's code-generation passes only: the HLO, its fusions and its
# floating-point semantics (no fast-math at any level) are the same, and every exact-equality and
# tolerance check passes at both. Subprocesses that set XLA_FLAGS take these (`xla_flags` below).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = " ".join(
    (os.environ.get("XLA_FLAGS", ""), TEST_XLA_FLAGS, "--xla_force_host_platform_device_count=8")
).strip()
# One persistent compilation cache for the whole run, its xdist workers and the subprocesses the
# tests start (they inherit the environment): many tests compile the same tiny models' programs,
# and on 2 CPU cores compiling is most of their time. Entries are keyed by the program's HLO, the
# compile options, XLA flags and the jax/jaxlib versions, so a kept cache (`make test` again) only
# skips identical compiles. `JAX_COMPILATION_CACHE_DIR=` (empty) turns it off.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).parents[1] / ".cache" / "jax-tests")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def xla_flags():
    """XLA_FLAGS for a subprocess (`python -m c2.main ...`) on `devices` simulated CPU devices,
    compiled like the tests' own programs."""
    return lambda devices=1: f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count={devices}"
