"""The wide level's agent SFT with its instructions reworded: data for a reader robust to the
wording (stage 5 of experiments/reader_chain_tiny.sh, which made experiments/policies/reader_tiny).

The train split's wide tasks told in frames drawn from a small grammar (an opening, a way to say
what the function gives, a prefix and an ending, in any combination) built from words none of the
held-out frames uses: the held-out templates stay text never trained on, and the policy learns
that the operation and constant, not the frame around them, decide its reply. Each line is the
oracle episode (c2.envs.functions.task_conversation) of train-split wide task i with its
instruction replaced; the task's operation, constant, function, file and tests are unchanged.

    python experiments/reworded_tasks.py OUT.jsonl [N]

writes N (default 20,000) {"messages", "path"} lines, the same file on every run: an SFT corpus
(`--config.data.corpus=functions:wide:20000+OUT.jsonl` keeps the train templates too).
Runtime: seconds (8 s on the 2-core machine under load).
Expected: trained on the six train frames alone, the policy garbled its tool call on one held-out
phrasing ("Put f(n) into f.py; it gives back n * 94.": 27% of held-out samples); with these
frames too its held-out pass@1 at the RL start is 0.383, not 0.225 (BENCHMARKS.md, "RL stage").
"""

import dataclasses
import random
import sys

from c2.data.sft import FUNCTIONS_SEED, write_sft_jsonl
from c2.envs import functions

OPENINGS = (
    "Write {fa} in {file}",
    "Create {file} with {fa}",
    "Define {fa} in {file}",
    "Implement {fa} in {file}",
    "In {file}, add {fa}",
    "{file} needs {fa}",
    "Add {fa} to {file}",
    "Code {fa} in {file}",
    "Provide {fa} in {file}",
    "Build {fa} inside {file}",
    "Give {file} a function {fa}",
    "Set up {fa} in {file}",
    "Write a function {fa} in {file}",
    "Edit {file} to define {fa}",
    "We need {fa} in {file}",
    "Have {file} define {fa}",
    "{fa} goes in {file}",
    "Add a helper {fa} to {file}",
)
CONNECTORS = (
    ": return {spec}",
    " that returns {spec}",
    " returning {spec}",
    ": it returns {spec}",
    ", which gives {spec}",
    ", which yields {spec}",
    " to output {spec}",
    " producing {spec}",
    ": the result is {spec}",
    "; it outputs {spec}",
    " whose value is {spec}",
    ", evaluating to {spec}",
    "; result: {spec}",
    " and have it return {spec}",
    " so it yields {spec}",
    "; the answer is {spec}",
    " that hands over {spec}",
    ", equal to {spec}",
    " - output {spec}",
    " with the value {spec}",
)
PREFIXES = ("", "", "", "Please: ", "Task: ", "Next, ", "Quick one: ", "Now ", "Hi! ")
ENDINGS = (".", ".", ".", "!", ". Thanks.", ", please.", ". One line.", " :)")
# The held-out frames' own words (c2/envs/functions.py TEMPLATES, split "eval"): never drawn.
HELD_OUT_WORDS = ("Put", "into", "gives back", "Make", "should", "compute")
INT_SPELLINGS = ("code", "words")


def reworded_instruction(t: functions.FunctionTask, rng: random.Random) -> str:
    """A new instruction for wide task `t`: the same tag, function, file and operation (as code
    or in words, drawn), in a frame drawn from the grammar above."""
    m = t.metadata
    op = functions.OPS[m["op"]]
    arg, c = m["arg"], m["const"]
    spec = op.code if rng.choice(INT_SPELLINGS) == "code" else op.words
    body = rng.choice(OPENINGS).format(fa=f"{m['function']}({arg})", file=m["file"])
    body += rng.choice(CONNECTORS).format(spec=spec.format(a=arg, c=c))
    prefix = rng.choice(PREFIXES)
    if prefix not in ("", "Hi! "):
        body = body[0].lower() + body[1:]
    tag = t.instruction.split("] ", 1)[0] + "] "
    return tag + prefix + body + rng.choice(ENDINGS)


def reworded_conversations(n: int = 20_000, seed: int = 0) -> list[dict]:
    """The oracle episodes of train-split wide tasks 0..n-1 (c2.data.sft's seed) with their
    instructions reworded; an instruction that would make the episode too long for a 512-token
    row (functions.MAX_EPISODE_BYTES) is drawn again."""
    rng = random.Random(seed)
    out = []
    for t in functions.function_tasks(n, FUNCTIONS_SEED, "train", "wide"):
        for _ in range(100):
            new = dataclasses.replace(t, instruction=reworded_instruction(t, rng))
            if functions.episode_bytes(new) <= functions.MAX_EPISODE_BYTES:
                break
        else:
            raise RuntimeError(f"{t.task_id}: no reworded instruction fits a 512-token row")
        out.append({"messages": functions.task_conversation(new), "path": f"reworded/{t.task_id}"})
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python experiments/reworded_tasks.py OUT.jsonl [N]")
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 20_000
    write_sft_jsonl(sys.argv[1], reworded_conversations(n))
