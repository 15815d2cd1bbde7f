"""Fixtures for the environment tests: one sandbox for the session and fresh workspaces."""

import pytest

from c2.envs.sandbox import Sandbox, SandboxLimits


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    sb = Sandbox(SandboxLimits(timeout_s=30, memory_mb=512))
    if not sb.isolated:
        pytest.skip(f"needs bubblewrap (`make setup` installs it); have {sb.isolation.describe()}")
    return sb


@pytest.fixture
def workspace(tmp_path, sandbox):
    d = tmp_path / "ws"
    d.mkdir()
    sandbox.give_workspace(d)
    return d
