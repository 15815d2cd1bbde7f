"""Fixtures for the environment tests: one sandbox for the session and fresh workspaces.

Without bubblewrap namespaces the tests that need them skip on a developer's machine, but fail
in CI (tests/_support.py's skip_or_fail): there a missing sandbox must not quietly remove the
tests that check containment.
"""

import pytest
from _support import skip_or_fail

from c2.envs.isolation import probe
from c2.envs.sandbox import Sandbox, SandboxLimits


def _missing_isolation(what: str) -> None:
    """Skip locally; fail in CI, naming what is missing and what this machine has."""
    skip_or_fail(f"{what}; this machine has {probe().describe()}", "sandbox isolation")


@pytest.fixture(scope="session")
def missing_isolation():
    """missing_isolation(what): skip here, fail in CI."""
    return _missing_isolation


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    sb = Sandbox(SandboxLimits(timeout_s=30, memory_mb=512))
    if not sb.isolated:
        _missing_isolation(
            "bubblewrap namespaces are missing (`make setup` installs bubblewrap as root)"
        )
    return sb


@pytest.fixture
def workspace(tmp_path, sandbox):
    d = tmp_path / "ws"
    d.mkdir()
    sandbox.give_workspace(d)
    return d
