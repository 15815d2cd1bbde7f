"""Generated "read the notes, then write the function" tasks: episodes longer than the context.

A task's workspace holds `files` notes (notes/<key>.txt), each about `note_chars` bytes of filler
lines with one line "<key> = <value>". The instruction asks for a one-line function of them:

    Write total(n) in total.py: return n plus the values of red, oak and ten (see notes/).

The agent must read every note (each observation is ~note_chars tokens with the byte tokenizer),
keep the values, then write the function and submit; hidden tests ("functions" grader) check
f(n) == n + sum(values) on three inputs. With `files * note_chars` above the context, an episode
only finishes as a chain of segments (c2/rl/episodes.py, context management): the values must
survive the cut, in the model's own summary ("self_summary"), or in a digest written without the
model ("compaction": the calls made and the last output, so earlier values are lost unless the
agent wrote them down). Without context management the context ends the episode.

Splits share the function names and the task's shape; they differ in the keys (train: colours and
trees; eval: numbers and animals) and the filler sentences, so an eval task is text of a kind
never trained on. Level "fixed" (for tiny models, which do not learn to read names from an
instruction) always names the notes a, b, c, ... and the function total: what changes is the
values, which the agent must carry from the notes to its code (and across a cut). Level "keyed"
is "fixed" with each task's notes named by three random letters found nowhere else in its
text ("... the values of qzv, hbk, wyo and jtd"): byte-level keys a, b, c also occur in every
filler sentence, a keyed note's line can be found by its key alone (the tiny policy copied its
values no better for it: BENCHMARKS.md, issue 16).
Deterministic by seed: task i of (seed, split, level) comes from
random.Random(f"notes:{seed}:{split}:{i}:{level}").

`oracle_chain(task, cuts)` is the reference episode cut into segments after the given numbers of
reads, with the summary the model should write: SFT data for chains.

    python -m c2.envs.notes --out DIR --n N --seed S --split train|eval [--files 3 --note_chars 320
        --level full|fixed|keyed]
    python -m c2.envs.notes --chains --out FILE.jsonl --n N ... [--cuts 1,2]   (their oracle
        chains: SFT data)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from c2.envs.agents import tool_call
from c2.envs.chain_prompts import SUMMARY_INSTRUCTION, segment_head
from c2.envs.episode import compact_system_prompt
from c2.envs.functions import write_file_output
from c2.envs.tasks import Task, write_task

SPLITS = ("train", "eval")
KEYS = {
    "train": ("red", "blue", "green", "amber", "teal", "oak", "elm", "ash", "fir", "yew"),
    "eval": ("one", "two", "six", "ten", "cat", "dog", "owl", "fox", "elk", "ant"),
}
FILLER = {
    "train": (
        "The build passed on the second try.",
        "Remember to rotate the logs weekly.",
        "This note was copied from the wiki.",
        "Ask before changing the schema.",
        "The old parser is kept for reference.",
        "Tests run in about a minute.",
    ),
    "eval": (
        "Nothing here has been reviewed yet.",
        "The cache is cleared on every deploy.",
        "Numbers below were measured by hand.",
        "Keep this file short and plain.",
        "The release branch is frozen on Fridays.",
        "Old entries are removed each quarter.",
    ),
}
FUNCTIONS = ("total", "combine", "tally", "merge_sum")
LEVELS = ("full", "fixed", "keyed")
TEST_TIMEOUT_S = 10


def parse_spec(spec: str) -> tuple[str, int, int]:
    """ "notes[:full|fixed|keyed][:files[:note_chars]]" -> (level, files, note_chars); a ValueError
    naming what is wrong."""
    kind, _, rest = spec.partition(":")
    if kind != "notes":
        raise ValueError(f"{spec!r}: expected 'notes[:full|fixed|keyed][:files[:note_chars]]'")
    parts = rest.split(":") if rest else []
    level = parts.pop(0) if parts and parts[0] in LEVELS else "full"
    try:
        given = [int(x) for x in parts]
    except ValueError:
        raise ValueError(
            f"{spec!r}: expected 'notes[:full|fixed|keyed][:files[:note_chars]]' (integers)"
        ) from None
    if len(given) > 2:
        raise ValueError(f"{spec!r}: expected at most two numbers (files, note_chars)")
    files, chars = given + [3, 320][len(given) :]
    notes_task(0, "train", 0, files, chars, level)  # the arguments' own checks
    return level, files, chars


def _note(key: str, value: int, split: str, chars: int, rng: random.Random) -> str:
    """Filler lines around the one line that matters, about `chars` bytes."""
    lines = []
    while sum(len(x) + 1 for x in lines) < chars - 20:
        lines.append(rng.choice(FILLER[split]))
    lines.insert(rng.randrange(len(lines) + 1), f"{key} = {value}")
    return "\n".join(lines) + "\n"


def _instruction(f: str, keys: Sequence[str]) -> str:
    named = ", ".join(keys[:-1]) + (" and " if len(keys) > 1 else "") + keys[-1]
    return f"Write {f}(n) in {f}.py: return n plus the values of {named} (see notes/)."


def _source(f: str, values: Sequence[int]) -> str:
    return f"def {f}(n):\n    return n + {' + '.join(str(v) for v in values)}\n"


@functools.cache
def _fixed_text() -> str:
    """Every episode text of the notes tasks that is not a key or a value, lower case."""
    instruction = _instruction("total", ["", ""])  # the template's words, no keys
    summary = summary_text({"keys": ["k"], "values": [1], "file": "total.py"}, 0)
    parts = [*FILLER["train"], *FILLER["eval"], compact_system_prompt(), SUMMARY_INSTRUCTION]
    calls = [
        tool_call("read_file", path="notes/.txt"),
        tool_call("write_file", path="total.py", content=_source("total", [1])),
        tool_call("submit", message="Added total."),
    ]
    parts += [segment_head(instruction), summary, *calls, "system", "user", "assistant"]
    return "\n".join(parts).lower()


def _random_keys(rng: random.Random, n: int) -> list[str]:
    """n distinct three-letter keys found nowhere in the text around them (filler, instruction,
    prompts, summaries): a key occurs in an episode only where it names its note."""
    keys: list[str] = []
    text = _fixed_text()
    while len(keys) < n:
        k = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))
        if k not in text and k not in keys:
            keys.append(k)
    return keys


def _tests_source(module: str, function: str, calls: list[tuple[int, int]]) -> str:
    body = "\n".join(f"    assert {function}({x}) == {y}" for x, y in calls)
    return f"from {module} import {function}\n\n\ndef test_values():\n{body}\n"


def notes_task(
    seed: int, split: str, index: int, files: int = 3, note_chars: int = 320, level: str = "full"
) -> dict:
    """Task `index` of (seed, split), in memory: instruction, workspace, tests, solution."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: expected one of {LEVELS}")
    if not 1 <= files <= len(KEYS[split]):
        raise ValueError(f"files={files}: expected 1..{len(KEYS[split])}")
    if note_chars < 40:
        raise ValueError(f"note_chars={note_chars}: expected >= 40")
    rng = random.Random(f"notes:{seed}:{split}:{index}:{level}")
    if level == "full":
        keys = rng.sample(KEYS[split], files)
    elif level == "keyed":
        keys = _random_keys(rng, files)
    else:
        keys = list("abcdefghij"[:files])
    values = [rng.randrange(2, 50) for _ in keys]
    f = rng.choice(FUNCTIONS) if level == "full" else "total"
    instruction = _instruction(f, keys)
    workspace = {
        f"notes/{k}.txt": _note(k, v, split, note_chars, rng) for k, v in zip(keys, values)
    }
    source = _source(f, values)
    calls = [(x, x + sum(values)) for x in rng.sample(range(-20, 100), 3)]
    tag = {"full": "", "fixed": "x", "keyed": "k"}[level]
    task_id = f"notes{tag}-{split}-s{seed}-{index:05d}"
    metadata = {
        "task_id": task_id,
        "source": "notes",
        "split": split,
        "seed": seed,
        "index": index,
        "difficulty": files,
        "level": level,
        "function": f,
        "file": f"{f}.py",
        "keys": keys,
        "values": values,
        "fail_to_pass": [f"tests/test_{f}.py::test_values"],
        "pass_to_pass": [],
        "grader": "functions",
        "prompt_style": "compact",
        "test_timeout_s": TEST_TIMEOUT_S,
    }
    return dict(
        instruction=instruction,
        metadata=metadata,
        workspace=workspace,
        tests={f"test_{f}.py": _tests_source(f, f, calls)},
        solution={f"{f}.py": source},
    )


def generate_notes_tasks(
    out_dir: str | Path,
    n: int,
    seed: int,
    split: str,
    files: int = 3,
    note_chars: int = 320,
    level: str = "full",
) -> list[Task]:
    """Write tasks 0..n-1 of (seed, split) under out_dir/<task_id>/."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for i in range(n):
        t = notes_task(seed, split, i, files, note_chars, level)
        tasks.append(write_task(out / t["metadata"]["task_id"], **t))
    return tasks


# ---------------------------------------------------------------------- the oracle


def read_file_output(content: str) -> str:
    """What Tools.read_file answers for a short text file (numbered lines)."""
    lines = content.splitlines()
    return "\n".join(f"{i:>5}\t{line}" for i, line in enumerate(lines, 1))


def summary_text(metadata: dict, read: int) -> str:
    """The summary the reference agent writes after reading the first `read` notes."""
    keys, values = metadata["keys"], metadata["values"]
    found = ", ".join(f"{k} = {v}" for k, v in zip(keys[:read], values[:read]))
    left = ", ".join(f"notes/{k}.txt" for k in keys[read:]) or "nothing"
    return f"Found {found}. Still to read: {left}. Then write {metadata['file']}."


def oracle_chain(
    task: Task | dict, cuts: Sequence[int] = (), *, submit_with_write: bool = False
) -> list[list[dict]]:
    """The reference episode as conversations, one per segment: read every note, write the
    function, submit. `task`: a Task, or notes_task's dict. `cuts`: numbers of notes read after
    which the episode is cut; there the observation comes with the summary instruction
    (c2.envs.chain_prompts.SUMMARY_INSTRUCTION), the agent writes summary_text, and the next segment
    starts from the task and that summary. submit_with_write: one reply writes the file and
    submits (two calls)."""
    if isinstance(task, Task):
        meta, instruction, mount_at = dict(task.metadata), task.instruction, task.mount_at
        notes = {k: (task.workspace_dir / "notes" / f"{k}.txt").read_text() for k in meta["keys"]}
        source = (task.solution_dir / meta["file"]).read_text()
    else:
        meta, mount_at = task["metadata"], "/workspace"
        instruction = task["instruction"].rstrip() + "\n"  # as instruction.md holds it
        notes = {k: task["workspace"][f"notes/{k}.txt"] for k in meta["keys"]}
        source = task["solution"][meta["file"]]
    f, file = meta["function"], meta["file"]
    system = compact_system_prompt(mount_at)
    segments, messages = (
        [],
        [
            {"role": "system", "content": system},
            {"role": "user", "content": instruction},
        ],
    )
    for i, k in enumerate(meta["keys"], 1):
        read = tool_call("read_file", path=f"notes/{k}.txt")
        messages.append({"role": "assistant", "content": read})
        output = read_file_output(notes[k])
        if i in cuts:  # the observation goes in with the summary instruction, in one user turn
            messages.append({"role": "tool", "content": [output], "note": SUMMARY_INSTRUCTION})
            messages.append({"role": "assistant", "content": summary_text(meta, i)})
            segments.append(messages)
            head = segment_head(instruction) + summary_text(meta, i)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": head}]
        else:
            messages.append({"role": "tool", "content": [output]})
    write = tool_call("write_file", path=file, content=source)
    submit = tool_call("submit", message=f"Added {f}.")
    if submit_with_write:
        messages.append({"role": "assistant", "content": write + submit})
    else:
        messages.append({"role": "assistant", "content": write})
        messages.append({"role": "tool", "content": [write_file_output(file, source)]})
        messages.append({"role": "assistant", "content": submit})
    segments.append(messages)
    return segments


def _seeded_plans(seed: int, split: str, i: int, files: int) -> list[tuple[int, ...]]:
    """Task i's cut points (chain_conversations): once after 1..files-1 reads; every other task
    also uncut; every third also cut twice."""
    rng = random.Random(f"notes-sft:{seed}:{split}:{i}")
    plans = [(rng.randrange(1, files),)] if files > 1 else [()]
    if i % 2:
        plans.append(())
    if i % 3 == 0 and files > 1:
        a = rng.randrange(1, files)
        plans.append((a, rng.randrange(a + 1, files + 1)))
    return plans


def chain_conversations(
    n: int,
    seed: int,
    split: str,
    files: int = 3,
    note_chars: int = 320,
    level: str = "full",
    cuts: Sequence[int] | None = None,
) -> list[dict]:
    """SFT data for chains: {"messages", "path"} per segment of the oracle chains of tasks
    0..n-1, each chain cut once after a seeded number of reads (1..files-1: the summary, and
    going on from one, both seen), every other chain also uncut, and every third also cut twice
    (after a and b reads, a < b <= files: a summary written from a segment that began with one,
    as a tight context asks for). The last reply writes the file and submits (no observation
    after the fix, so no cut between the two). `cuts`: instead, every chain cut exactly there
    (the points a run's trigger cuts at: a summary trigger below every segment's length after
    its first read cuts after every read)."""
    if cuts is not None and not all(1 <= c <= files for c in cuts):
        raise ValueError(f"cuts={tuple(cuts)}: expected numbers of reads in 1..{files}")
    out = []
    for i in range(n):
        t = notes_task(seed, split, i, files, note_chars, level)
        plans = (
            [tuple(sorted(set(cuts)))] if cuts is not None else _seeded_plans(seed, split, i, files)
        )
        for plan in plans:
            for k, messages in enumerate(oracle_chain(t, plan, submit_with_write=True)):
                path = f"{t['metadata']['task_id']}/cut{'-'.join(map(str, plan))}/{k}"
                out.append({"messages": messages, "path": path})
    return out


def _write_jsonl(path: Path, records: Sequence[dict]) -> None:
    """`records` one JSON object a line (the SFT JSONL c2.data.sft reads), written to a
    temporary file first: never a half-written file under the name."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=SPLITS, default="train")
    p.add_argument("--files", type=int, default=3)
    p.add_argument("--note_chars", type=int, default=320)
    p.add_argument("--level", choices=LEVELS, default="full")
    p.add_argument(
        "--chains",
        action="store_true",
        help="write the tasks' oracle chains as agent-SFT conversations (JSONL, one segment per "
        "line: data.corpus=FILE) to --out instead of the tasks: SFT data of any size",
    )
    p.add_argument(
        "--cuts",
        default=None,
        help="with --chains: every chain cut after these numbers of reads (e.g. 1,2) instead "
        "of the seeded mix of cut points",
    )
    a = p.parse_args(argv)
    if a.chains:
        cuts = None
        if a.cuts is not None:
            try:
                cuts = [int(x) for x in a.cuts.split(",") if x.strip()]
            except ValueError:
                p.error(f"--cuts={a.cuts!r}: expected comma-separated integers, e.g. 1,2")
        convs = chain_conversations(a.n, a.seed, a.split, a.files, a.note_chars, a.level, cuts)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_jsonl(out, convs)
        print(f"wrote {len(convs)} conversations of {a.n} tasks to {out}")
        return 0
    tasks = generate_notes_tasks(a.out, a.n, a.seed, a.split, a.files, a.note_chars, a.level)
    print(f"wrote {len(tasks)} tasks to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
