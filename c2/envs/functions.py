"""Generated "write a short Python function" tasks: a family a tiny byte-level model can learn.

Each task asks for one one-line function in one file ("Write add_3(n) in add_3.py: return
n + 3."); the agent calls write_file, then submit; hidden tests (two test functions, 3-4 asserts)
grade it with the fast "functions" grader (grading_runner.py, no pytest). Episodes are short
(compact system prompt, ~60-character instruction, two replies: ~500 tokens with ByteTokenizer).

What is shared and what is not:
  * An operation (OPS) is what the function computes: `n + c`, `n // c`, `max(n, c)`,
    `s[::-1]`, `len(s) + c`, ... Every operation, with every constant, appears in both splits,
    so the skill "operation -> Python expression" transfers.
  * A template (TEMPLATES) is the instruction's surface: its sentence frame, whether the
    operation is spelled as code ("n // 3") or in words ("n floor-divided by 3"), and how the
    function is named: after the operation ("div_3"), a noun ("scale") or a letter and digit
    ("g7"). Each template belongs to one split, and train and eval templates share no sentence
    frame, so every held-out instruction is text of a kind never trained on, while both splits
    mix code and word spellings and all three naming schemes.
  * Shared by both splits, so that only the wording is new: the operations and constants, the
    argument names (n, x; s) and the file (always {f}.py). (Held-out argument and file names
    never seen in training made the first design fail: a tiny model after a short SFT does not
    copy a name it has never emitted; see experiments/sft_agent_tiny.py.)

Levels (LEVELS): "full" as above; "basic" (six answers: a policy that does not read passes by
chance, ~1/6) and "wide" (the same form with constants 1-99). Agent SFT on basic's 720 tasks
never taught the tiny model to read: it fitted them by their tags and frames, and its answer did
not depend on the operation in the instruction. On wide tasks nothing but reading fits, and it
learns to read within a few hundred steps (BENCHMARKS.md, "RL stage").

Deterministic by seed: task i of (seed, split) is drawn from random.Random(f"functions:{seed}:
{split}:{i}") (redrawn while its instruction repeats an earlier task's or is too long); the
train split holds ~12,700 distinct instructions, the eval split ~6,600 (a single-epoch RL run
of 60 steps x 4 prompts uses 240).

    python -m c2.envs.functions --out DIR --n N --seed S --split train|eval
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from c2.envs.agents import tool_call
from c2.envs.episode import compact_system_prompt
from c2.envs.tasks import Task, write_task

SPLITS = ("train", "eval")
# "full": every operation, named and placed as the template says. "basic": f(n) in f.py, only
# n + c, n - c, n * c with c in {2, 3} (6 answers), under a ticket tag that only makes prompts
# distinct: a byte-level model that has not learnt to read the instruction passes by chance
# (~1/6), so RL has a signal to teach reading from. "wide": the basic level's form with constants
# 1-99 (35,640 distinct instructions per split against basic's 720): SFT data in which only
# reading the constant and the operation from the instruction fits, where basic's 720 tasks can
# be fitted by remembering (tag, template) -> answer.
LEVELS = ("full", "basic", "wide")
FIXED_FORM_LEVELS = ("basic", "wide")  # f(n) in f.py under a tag; only the op and constant vary
BASIC_OPS = ("add", "sub", "mul")
BASIC_CONSTS = (2, 3)
WIDE_CONSTS = tuple(range(1, 100))
BASIC_TAGS = ("api", "cli", "db", "ui", "docs", "auth", "cache", "core", "io", "net", "ops",
              "perf", "sync", "test", "web", "jobs", "mail", "log", "pay", "search")  # fmt: skip
TEST_TIMEOUT_S = 10


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str  # "int" or "str": the argument's type
    consts: tuple[int, ...] | None  # None: the operation takes no constant
    code: str  # the returned expression, with {a} (argument) and {c} (constant)
    words: str  # the same in words
    stem: str  # its name in the "op" naming scheme


OPS = {
    "add": Op("int", tuple(range(1, 10)), "{a} + {c}", "{a} plus {c}", "add"),
    "sub": Op("int", tuple(range(1, 10)), "{a} - {c}", "{a} minus {c}", "sub"),
    "mul": Op("int", tuple(range(2, 10)), "{a} * {c}", "{a} times {c}", "mul"),
    "floordiv": Op("int", tuple(range(2, 10)), "{a} // {c}", "{a} floor-divided by {c}", "div"),
    "mod": Op("int", tuple(range(2, 10)), "{a} % {c}", "{a} modulo {c}", "mod"),
    "max": Op("int", tuple(range(0, 10)), "max({a}, {c})", "the larger of {a} and {c}", "least"),
    "min": Op("int", tuple(range(0, 10)), "min({a}, {c})", "the smaller of {a} and {c}", "most"),
    "abs": Op("int", None, "abs({a})", "the absolute value of {a}", "absval"),
    "neg": Op("int", None, "-{a}", "{a} negated", "neg"),
    "square": Op("int", None, "{a} * {a}", "{a} squared", "square"),
    "upper": Op("str", None, "{a}.upper()", "{a} in upper case", "shout"),
    "lower": Op("str", None, "{a}.lower()", "{a} in lower case", "hush"),
    "reverse": Op("str", None, "{a}[::-1]", "{a} reversed", "flip"),
    "strip": Op("str", None, "{a}.strip()", "{a} without outer spaces", "trim"),
    "repeat": Op("str", (2, 3, 4), "{a} * {c}", "{a} repeated {c} times", "rep"),
    "lenplus": Op(
        "str", tuple(range(1, 10)), "len({a}) + {c}", "the length of {a} plus {c}", "size"
    ),  # fmt: skip
    "head": Op("str", (1, 2, 3, 4), "{a}[:{c}]", "the first {c} characters of {a}", "head"),
    "tail": Op("str", (1, 2, 3, 4), "{a}[-{c}:]", "the last {c} characters of {a}", "tail"),
}


@dataclasses.dataclass(frozen=True)
class Template:
    """A task's surface (see the module doc): `frame` has {f} (function), {a} (argument),
    {file} and {spec} (the operation, as code or words)."""

    name: str
    split: str
    frame: str
    spelling: str  # "code" or "words"
    naming: str  # "op", "noun" or "letter"


TEMPLATES = (
    Template("return_code", "train", "Write {f}({a}) in {file}: return {spec}.", "code", "op"),
    Template("define_words", "train", "Define {f}({a}) in {file} that returns {spec}.", "words",
             "noun"),
    Template("create_code", "train", "Create {file} with {f}({a}) returning {spec}.", "code",
             "letter"),
    Template("add_words", "train", "In {file}, add {f}({a}): it returns {spec}.", "words", "op"),
    Template("impl_code", "train", "Implement {f}({a}) = {spec} in {file}.", "code", "noun"),
    Template("need_words", "train", "{file} needs {f}({a}), which gives {spec}.", "words",
             "letter"),
    Template("put_code", "eval", "Put {f}({a}) into {file}; it gives back {spec}.", "code",
             "noun"),
    Template("make_words", "eval", "Make {f}({a}) in {file} return {spec}.", "words", "op"),
    Template("should_words", "eval", "{f}({a}) in {file} should compute {spec}.", "words",
             "letter"),
)  # fmt: skip
# Shared by both splits: the file is always {f}.py, the argument one of these.
INT_ARGS, STR_ARGS = ("n", "x"), ("s",)
NOUNS = ("calc", "step", "apply", "convert", "compute", "solve", "answer", "result", "value",
         "adjust", "shift", "scale", "check", "handle", "update")  # fmt: skip
MAX_INSTRUCTION_CHARS = 64
# The oracle episode's text (every message's content); ByteTokenizer's AgentChat adds 14 ids, so
# every conversation fits a 512-token SFT row. Longer draws are redrawn.
MAX_EPISODE_BYTES = 490
WORDS = ("cat", "Hello", "abc", "Zebra", "hi there", " pad ", "Python", "a1b2", "  x", "MiXeD")


def templates(split: str) -> list[Template]:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    return [t for t in TEMPLATES if t.split == split]


@dataclasses.dataclass(frozen=True)
class FunctionTask:
    """One generated task in memory (what write_task puts on disk)."""

    task_id: str
    instruction: str
    function: str
    file: str
    source: str  # the solution file's text
    tests: dict[str, str]
    metadata: dict


def _function_name(template: Template, op: Op, c: int | None, rng: random.Random) -> str:
    if template.naming == "op":
        return op.stem if c is None else f"{op.stem}_{c}"
    if template.naming == "noun":
        return rng.choice(NOUNS)
    return rng.choice("fgh") + str(rng.randrange(1, 10))


def _inputs(op: Op, c: int | None, rng: random.Random) -> list:
    """Four distinct inputs; max/min get values on both sides of the constant, strip a padded
    word, so a test tells the operation from the identity."""
    if op.kind == "str":
        xs = rng.sample(WORDS, 4)
        if op.code.endswith(".strip()") and not any(w != w.strip() for w in xs):
            xs[0] = " pad "
        return xs
    xs = rng.sample(range(-9, 21), 4)
    if op.consts is not None and op.code.startswith(("max", "min")):
        xs[0], xs[1] = c - rng.randrange(1, 6), c + rng.randrange(1, 6)
        xs = list(dict.fromkeys(xs)) + [v for v in (c + 7, c - 7) if v not in xs]
    return xs[:4]


def _tests_source(module: str, function: str, calls: list[tuple[object, object]]) -> str:
    lines = [f"from {module} import {function}", "", ""]
    split = 2 if len(calls) > 3 else len(calls) - 1
    for name, group in (("test_basic", calls[:split]), ("test_more", calls[split:])):
        lines.append(f"def {name}():")
        lines += [f"    assert {function}({x!r}) == {y!r}" for x, y in group]
        lines += ["", ""]
    return "\n".join(lines[:-2]) + "\n"


def draw_task(
    seed: int, split: str, index: int, rng: random.Random, level: str = "full"
) -> FunctionTask:
    """One task from `rng` (the caller owns the stream; see function_tasks)."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: expected one of {LEVELS}")
    template = rng.choice(templates(split))
    op_name = rng.choice(BASIC_OPS if level in FIXED_FORM_LEVELS else sorted(OPS))
    op = OPS[op_name]
    c = rng.choice(op.consts) if op.consts is not None else None
    if level in FIXED_FORM_LEVELS:
        arg, f = "n", "f"
        c = rng.choice(BASIC_CONSTS if level == "basic" else WIDE_CONSTS)
    else:
        arg = rng.choice(INT_ARGS if op.kind == "int" else STR_ARGS)
        f = _function_name(template, op, c, rng)
    file = f"{f}.py"
    code = op.code.format(a=arg, c=c)
    spec = code if template.spelling == "code" else op.words.format(a=arg, c=c)
    instruction = template.frame.format(f=f, a=arg, file=file, spec=spec)
    if level in FIXED_FORM_LEVELS:
        instruction = f"[{rng.choice(BASIC_TAGS)}] {instruction}"
    source = f"def {f}({arg}):\n    return {code}\n"
    module = file.removesuffix(".py")
    namespace: dict = {}
    exec(source, namespace)  # the expected values come from the solution itself
    xs = _inputs(op, c, rng)[: rng.choice((3, 4))]
    calls = [(x, namespace[f](x)) for x in xs]
    test_file = f"test_{module}.py"
    tests = {test_file: _tests_source(module, f, calls)}
    prefix = {"full": "fn", "basic": "fnb", "wide": "fnw"}[level]
    task_id = f"{prefix}-{split}-s{seed}-{index:05d}"
    metadata = {
        "task_id": task_id,
        "source": "functions",
        "split": split,
        "template": template.name,
        "op": op_name,
        "const": c,
        "function": f,
        "file": file,
        "arg": arg,
        "difficulty": 1,
        "level": level,
        "seed": seed,
        "index": index,
        "fail_to_pass": [f"tests/{test_file}::test_basic", f"tests/{test_file}::test_more"],
        "pass_to_pass": [],
        "grader": "functions",
        "prompt_style": "compact",
        "test_timeout_s": TEST_TIMEOUT_S,
    }
    return FunctionTask(task_id, instruction, f, file, source, tests, metadata)


def function_tasks(n: int, seed: int, split: str, level: str = "full") -> list[FunctionTask]:
    """Tasks 0..n-1 of the (seed, split, level) stream, in memory (no files, no sandbox); no two
    share an instruction; none is longer than MAX_INSTRUCTION_CHARS or MAX_EPISODE_BYTES."""
    templates(split)  # validates split
    out, seen = [], set()
    for i in range(n):
        stream = f"functions:{seed}:{split}:{i}"
        rng = random.Random(stream if level == "full" else f"{stream}:{level}")
        for _ in range(1000):
            t = draw_task(seed, split, i, rng, level)
            short = len(t.instruction) <= MAX_INSTRUCTION_CHARS
            if short and t.instruction not in seen and episode_bytes(t) <= MAX_EPISODE_BYTES:
                break
        else:
            raise RuntimeError(f"functions: {split} split exhausted after {i} distinct tasks")
        seen.add(t.instruction)
        out.append(t)
    return out


def write_function_task(out_dir: str | Path, t: FunctionTask) -> Task:
    return write_task(
        Path(out_dir) / t.task_id,
        instruction=t.instruction,
        metadata=t.metadata,
        workspace={},
        tests=t.tests,
        solution={t.file: t.source},
    )


def generate_function_tasks(
    out_dir: str | Path, n: int, seed: int, split: str, level: str = "full"
) -> list[Task]:
    """Write tasks 0..n-1 of the (seed, split, level) stream under out_dir/<task_id>/."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return [write_function_task(out_dir, t) for t in function_tasks(n, seed, split, level)]


# ---------------------------------------------------------------------- the oracle


def write_file_output(path: str, content: str) -> str:
    """What Tools.write_file answers for a new file at a plain relative path."""
    return f"Wrote {len(content)} characters to {path}."


def _replies(function: str, file: str, source: str) -> list[str]:
    return [
        tool_call("write_file", path=file, content=source),
        tool_call("submit", message=f"Added {function}."),
    ]


def _conversation(instruction: str, function: str, file: str, source: str, system: str):
    write, submit = _replies(function, file, source)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": instruction},
        {"role": "assistant", "content": write},
        {"role": "tool", "content": [write_file_output(file, source)]},
        {"role": "assistant", "content": submit},
    ]


def _solution(task: Task) -> tuple[str, str]:
    files = [p for p in sorted(task.solution_dir.iterdir()) if p.is_file()]
    if task.metadata.get("source") != "functions" or len(files) != 1:
        raise ValueError(f"task {task.task_id}: not a generated function task")
    return files[0].name, files[0].read_text()


def oracle_replies(task: Task) -> list[str]:
    """The oracle's two assistant texts: write the solution file, then submit."""
    file, source = _solution(task)
    return _replies(task.metadata["function"], file, source)


def oracle_conversation(task: Task) -> list[dict]:
    """The oracle's whole episode in AgentChat.conversation's message format: the messages
    run_episode sends and receives (system, task.instruction, replies, tool outputs)."""
    from c2.envs.episode import task_system_prompt

    file, source = _solution(task)
    return _conversation(
        task.instruction, task.metadata["function"], file, source, task_system_prompt(task)
    )


def task_conversation(t: FunctionTask, mount_at: str = "/workspace") -> list[dict]:
    """oracle_conversation of an in-memory task (SFT data without writing files). The user turn
    is the instruction as instruction.md holds it (with its final newline), as run_episode
    sends it."""
    system = compact_system_prompt(mount_at)
    return _conversation(t.instruction + "\n", t.function, t.file, t.source, system)


def episode_bytes(t: FunctionTask) -> int:
    """UTF-8 bytes of the oracle conversation's text (what a byte-level model reads)."""
    texts = [m["content"] for m in task_conversation(t)]
    return sum(len(x.encode()) for c in texts for x in ([c] if isinstance(c, str) else c))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.envs.functions", description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=SPLITS, default="train")
    parser.add_argument("--level", choices=LEVELS, default="full")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n {args.n}: expected n >= 1")
    tasks = generate_function_tasks(args.out, args.n, args.seed, args.split, args.level)
    for t in tasks:
        print(f"{t.task_id}\t{t.metadata['template']}\t{t.instruction.strip()}")
    print(
        json.dumps({"n": len(tasks), "out": str(args.out), "split": args.split, "seed": args.seed})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
