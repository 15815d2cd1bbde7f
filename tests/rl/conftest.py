"""Fixtures shared by the RL tests: the agent chat rendering and a namespace sandbox.

Without bubblewrap namespaces (or another piece the RL tests need, such as Ray) the tests that
need it skip on a developer's machine but fail in CI (tests/_support.py's skip_or_fail): there a
missing sandbox must not quietly remove the RL stage's tests.
"""

import pytest
from _support import skip_or_fail

from c2.data.chat import AgentChat
from c2.data.tokenizer import ByteTokenizer
from c2.envs.sandbox import Sandbox


@pytest.fixture(scope="module")
def chat():
    return AgentChat(ByteTokenizer())


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox()
    if not sb.isolated:
        skip_or_fail(f"needs a namespace sandbox; this machine has {sb.isolation.describe()}")
    return sb


@pytest.fixture(scope="session")
def ray_installed():
    """The Ray fleet's tests need the distributed extra (CI installs it)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        skip_or_fail("the Ray fleet needs the distributed extra: pip install -e '.[distributed]'")
