"""The environments' SFT specs (docs/recipe.md §1.3), registered in `c2.data.sft.SOURCES` on
import: "functions[:full|basic|wide[:N]]" (oracle conversations of generated function tasks,
c2/envs/functions.py), "notes[...]" (the notes tasks' oracle chains, c2/envs/notes.py) and the
agent system prompt that a ":agent" spec puts first. c2.data and c2.envs know nothing of each
other; this module joins them, and every path that loads SFT data imports it (c2.train.lm,
c2.eval.copying).
"""

from c2.data import sft
from c2.data.sft import BASIC_COUNTS, FUNCTIONS_COUNTS, FUNCTIONS_SEED, NOTES_COUNTS, WIDE_COUNTS
from c2.envs import functions, notes
from c2.envs.episode import compact_system_prompt


def function_task_conversations(split: str = "train", level: str = "full") -> list[dict]:
    """{"messages", "path"} oracle conversations of generated function tasks: split "train" ->
    the train templates, "heldout" (or "eval") -> the held-out templates; ~1 s, no sandbox.
    level "basic": the basic level's tasks; "wide" (or "wide:N"): the wide level's first N
    (default 8,000; held out: always the first 256) (c2/envs/functions.py)."""
    level, _, count = level.partition(":")
    if level not in functions.LEVELS:
        raise ValueError(f"'functions:{level}': the level is not one of {functions.LEVELS}")
    if count and (level != "wide" or not (count.isdigit() and int(count) > 0)):
        raise ValueError(f"'functions:{level}:{count}': expected 'functions:wide:N' with N >= 1")
    if level in ("basic", "wide"):
        s = "eval" if split in ("heldout", "eval") else "train"
        n = (BASIC_COUNTS if level == "basic" else WIDE_COUNTS)[s]
        n = int(count) if count and s == "train" else n  # held out: always the first 256
        tasks = functions.function_tasks(n, FUNCTIONS_SEED, s, level)
        return [{"messages": functions.task_conversation(t), "path": t.task_id} for t in tasks]

    split = "heldout" if split == "eval" else split
    if split not in FUNCTIONS_COUNTS:
        raise ValueError(
            f"'functions' SFT split {split!r}: expected one of {list(FUNCTIONS_COUNTS)}"
        )
    tasks = functions.function_tasks(
        FUNCTIONS_COUNTS[split], FUNCTIONS_SEED, "train" if split == "train" else "eval"
    )
    return [{"messages": functions.task_conversation(t), "path": t.task_id} for t in tasks]


def notes_conversations(spec: str, split: str = "train") -> list[dict]:
    """ "notes[:full|fixed|keyed][:files[:note_chars]]": oracle chains of the notes tasks
    (c2/envs/notes.py), each cut once so that writing a summary and going on from one are both
    learned; a conversation per segment."""
    level, files, chars = notes.parse_spec(spec)
    s = "eval" if split in ("heldout", "eval") else "train"
    return notes.chain_conversations(NOTES_COUNTS[s], FUNCTIONS_SEED, s, files, chars, level)


sft.SOURCES.register(
    "functions",
    lambda spec, split: function_task_conversations(split, spec.partition(":")[2] or "full"),
)
sft.SOURCES.register("notes", notes_conversations)
sft.SOURCES.register_agent_system_prompt(compact_system_prompt)
