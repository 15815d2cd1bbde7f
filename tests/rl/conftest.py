"""Fixtures shared by the episode tests: the agent chat rendering and a namespace sandbox."""

import pytest

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
        pytest.skip(f"needs a namespace sandbox; this machine has {sb.isolation.describe()}")
    return sb
