"""Every test sees 8 simulated CPU devices and shares one compilation cache; this must run before
jax is imported anywhere."""

import os
from pathlib import Path

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
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
