"""Generation engine: batched KV-cache sampling with logprobs, policy versions and routed experts,
multi-turn token-in/token-out, in-flight weight updates, MTP speculative decoding."""

from c2.infer.engine import Engine, generate
from c2.infer.records import Completion, Trajectory
from c2.infer.sampling import SamplingParams

__all__ = ["Engine", "generate", "Completion", "Trajectory", "SamplingParams"]
