"""Recall by key from a tool response: the notes tasks' copy, in their own form (stage 1 of
experiments/notes_chain_tiny.sh).

The reading policy (experiments/policies/reader_tiny) recalls `key = value` lines from its user
turn behind the agent prompt, but the copy a tiny model learns is tied to the form it was taught
in, and a note's value arrives in a tool response (`    2\ta = 28`, after the reply's
`<tool_call>`). Here stage 3's recall examples (`recall:N`, seeded per example) are played as
agent conversations: the agent prompt, a user turn asking for some keys from a notes file, the
reply reading it (`read_file`), the tool response holding the `key = value` lines numbered as
`read_file` shows them among filler lines of the notes tasks' train split, and the reply
recalling the asked lines in the notes summaries' form ("Found k = v, ...").

    python experiments/tool_recall.py OUT.jsonl [N]

writes N (default 20,000) {"messages", "path"} lines (an SFT corpus: `--config.data.corpus=
OUT.jsonl`), the same file on every run. Runtime: seconds (3.5 s on the 2-core machine under load).
Expected: without this stage, notes SFT reaches value digits 0.10-0.21; with it the chain ends at
0.905 (BENCHMARKS.md, issue 16).
"""

import json
import random
import sys

from c2.data.sft import recall_examples, write_sft_jsonl
from c2.envs.episode import compact_system_prompt
from c2.envs.notes import FILLER


def tool_recall_conversations(n: int = 20_000, seed: int = 0) -> list[dict]:
    system = compact_system_prompt()
    rng = random.Random(seed)
    out = []
    for e in recall_examples(f"recall:{n}"):
        lines = e["prompt"].split("\n")
        asked = e["response"].split("\n")
        for _ in range(rng.randint(0, 2)):  # filler lines, as a note has them
            lines.insert(rng.randint(0, len(lines)), rng.choice(FILLER["train"]))
        name = rng.choice("abcdefghij")
        keys = [line.split(" = ")[0] for line in asked]
        call = {"name": "read_file", "arguments": {"path": f"notes/{name}.txt"}}
        body = "\n".join(f"{i:>5}\t{line}" for i, line in enumerate(lines, 1))
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Report {', '.join(keys)} (see notes/{name}.txt).\n"},
            {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"},
            {"role": "tool", "content": [body]},
            {"role": "assistant", "content": f"Found {', '.join(asked)}."},
        ]
        out.append({"messages": messages, "path": f"tool_recall/{e['path']}"})
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python experiments/tool_recall.py OUT.jsonl [N]")
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 20_000
    write_sft_jsonl(sys.argv[1], tool_recall_conversations(n))
