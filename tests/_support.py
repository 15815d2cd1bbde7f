"""Helpers for the tests of every directory: `from _support import skip_or_fail`.

tests/ is on sys.path in every pytest run (pytest's default `prepend` import mode puts the
directory of tests/conftest.py there before any test module is imported), so this module is
importable by name, unlike the conftest modules (all named `conftest`).
"""

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """CI services set `CI` (`.ci/run` sets CI=true); unset, "", 0, false or no: a dev machine."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def skip_or_fail(msg: str, expects: str = "it") -> NoReturn:
    """Skip on a developer's machine; fail under CI, naming what is missing (there a missing
    sandbox, container engine or Ray must not quietly remove the tests that need it)."""
    if in_ci():
        pytest.fail(f"CI={os.environ['CI']} expects {expects}: {msg}", pytrace=False)
    pytest.skip(msg)


def xla_flags(devices: int | None) -> str:
    """XLA_FLAGS for a test's subprocess: the run's own flags (tests/conftest.py's compile
    settings), its CPU device count replaced by `devices` (None: the default, one)."""
    from c2.distributed import cpu_xla_flags

    return cpu_xla_flags(devices)
