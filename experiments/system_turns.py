"""The reader chain's stage 3b data: recall and copy examples behind random system turns.

The copy the tiny model learns after a bare user turn (stages 1-3 of
experiments/reader_chain_tiny.sh) is switched off by any system turn: one character of one drops
recall by key from 0.60 to 0.00 (BENCHMARKS.md, "RL stage", the start policy), so agent SFT,
whose every example begins with the agent's system prompt, cannot use it. Here stage 3's recall
and copy examples (`recall:15000` and `copy:5000`) each get no system turn (1/4), a prefix of
the agent system prompt of random length (3/8), or random printable text of random length (3/8).

    python experiments/system_turns.py OUT.jsonl

writes the 20,000 examples as {"prompt", "response", "path", "system"?} lines (an SFT corpus:
`--config.data.corpus=OUT.jsonl`), the same file on every run (one seeded generator).
Runtime: seconds (3 s on the 2-core machine under load).
Expected: 600 steps on them move the copy behind the whole agent prompt (keys 0.01 -> 0.57) and
keep it without one.
"""

import random
import string
import sys

from c2.data.sft import copy_examples, recall_examples, write_sft_jsonl
from c2.envs.episode import compact_system_prompt

ALPHABET = string.ascii_letters + string.digits + " \n.,:()_"


def system_turn_examples(seed: int = 0) -> list[dict[str, str]]:
    agent = compact_system_prompt()
    rng = random.Random(seed)
    out = []
    for e in recall_examples("recall:15000") + copy_examples("copy:5000"):
        draw = rng.random()
        if draw < 0.25:
            system = ""
        elif draw < 0.625:
            system = agent[: rng.randint(1, len(agent))]
        else:
            system = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, len(agent))))
        record = {"prompt": e["prompt"], "response": e["response"], "path": e["path"]}
        if system:
            record["system"] = system
        out.append(record)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/system_turns.py OUT.jsonl")
    write_sft_jsonl(sys.argv[1], system_turn_examples())
