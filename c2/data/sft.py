"""SFT data (docs/recipe.md §1.3): chat formatting with the loss on responses only, and the embedded
default task set: implement a standard-library function from its signature and docstring.
An example is either {"prompt", "response", "system"?} (rendered below) or a multi-turn agent
conversation {"messages": [...]}, rendered by c2.data.chat.AgentChat exactly as RL episodes are
(the "functions" spec: oracle episodes of c2/envs/functions.py tasks). c2.data knows no
environment: the specs built on one, and the agent system prompt of ":agent", are registered in
`SOURCES` by c2/train/sft_sources.py.

Chat format (ChatML, with the tokenizer's special ids):
    <bos><|im_start|>system\\n{system}<|im_end|>\\n            (optional)
    <|im_start|>user\\n{prompt}<|im_end|>\\n
    <|im_start|>assistant\\n{response}<|im_end|>\\n<eos>
The loss covers each assistant turn's content and its closing <|im_end|> (so the model learns to
stop); everything else is context. Texts are encoded literally: special strings inside a
prompt or a function body stay plain text.
"""

from __future__ import annotations

import ast
import json
import os
import random
import string
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from c2.data import corpus as corpus_lib
from c2.data.tokenizer import IM_END, IM_START, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
TRAINED_ROLES = ("assistant",)
PROMPT_PREFIX = "Implement this function:\n\n"


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    if not messages:
        raise ValueError("messages must not be empty")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}]['role'] = {m.get('role')!r}; expected one of {ROLES}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}]['content'] must be a string")
        if m["role"] == "system" and i != 0:
            raise ValueError(f"messages[{i}]: a system message may only come first")


def format_chat(
    messages: Sequence[Mapping[str, str]], tokenizer: Tokenizer, *, add_bos: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A whole conversation -> (ids int32 [L], loss_mask float32 [L], 1 on trained tokens)."""
    _check_messages(messages)
    im_start, im_end = tokenizer.specials[IM_START], tokenizer.specials[IM_END]
    ids: list[int] = [tokenizer.bos_id] if add_bos else []
    mask: list[float] = [0.0] * len(ids)

    def add(piece: list[int], trained: bool) -> None:
        ids.extend(piece)
        mask.extend([float(trained)] * len(piece))

    for m in messages:
        trained = m["role"] in TRAINED_ROLES
        add([im_start, *tokenizer.encode(m["role"] + "\n")], False)
        add([*tokenizer.encode(m["content"]), im_end], trained)
        add(tokenizer.encode("\n"), False)
    add([tokenizer.eos_id], False)
    return np.asarray(ids, np.int32), np.asarray(mask, np.float32)


def format_prompt(
    messages: Sequence[Mapping[str, str]], tokenizer: Tokenizer, *, add_bos: bool = True
) -> np.ndarray:
    """The ids a model continues to answer: the conversation then "<|im_start|>assistant\\n"."""
    ids, _ = format_chat(messages, tokenizer, add_bos=add_bos)
    head = ids[:-1]  # without the final eos
    tail = [tokenizer.specials[IM_START], *tokenizer.encode("assistant\n")]
    return np.concatenate([head, np.asarray(tail, np.int32)])


def example_messages(example: Mapping[str, str]) -> list[dict[str, str]]:
    """{"prompt", "response", "system"?} -> chat messages."""
    for field in ("prompt", "response"):
        if not isinstance(example.get(field), str):
            raise ValueError(
                f"SFT example needs a string field {field!r}; got keys {list(example)}"
            )
    messages = []
    if example.get("system"):
        messages.append({"role": "system", "content": example["system"]})
    messages.append({"role": "user", "content": example["prompt"]})
    messages.append({"role": "assistant", "content": example["response"]})
    return messages


def check_agent_messages(messages) -> None:
    """The structure AgentChat.conversation renders: [system], a user task, then assistant
    replies alternating with tool turns ({"role": "tool", "content": [output, ...]}), ending
    with an assistant reply."""
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise ValueError("an agent example's 'messages' must be a list of objects")
    roles = [m.get("role") for m in messages]
    if roles[:1] == ["system"]:
        roles = roles[1:]
    want = ["user"] + ["assistant", "tool"] * (len(roles) // 2)
    if len(roles) < 2 or roles != want[: len(roles)] or roles[-1] != "assistant":
        raise ValueError(
            f"agent messages roles {roles}: expected [system], user, then assistant/tool turns "
            "ending with an assistant reply"
        )
    for i, m in enumerate(messages):
        c = m.get("content")
        if m["role"] == "tool":
            if not (isinstance(c, list) and all(isinstance(x, str) for x in c)):
                raise ValueError(f"messages[{i}] (tool): content must be a list of strings")
        elif not isinstance(c, str):
            raise ValueError(f"messages[{i}] ({m['role']}): content must be a string")


def check_example(example: Mapping) -> None:
    """An SFT example: {"prompt", "response", "system"?} or an agent conversation
    {"messages": [...]} (AgentChat.conversation's format)."""
    if "messages" in example:
        check_agent_messages(example["messages"])
    else:
        example_messages(example)


def _strip_indent(lines: list[str], col: int) -> list[str]:
    """Removes up to `col` leading spaces (lines inside strings may be indented less)."""
    out = []
    for line in lines:
        n = len(line) - len(line.lstrip(" \t"))
        out.append(line[min(n, col) :])
    return out


def _is_trivial(body: list[ast.stmt]) -> bool:
    """pass / ... / raise NotImplementedError only: nothing to learn from."""
    for stmt in body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                continue
        return False
    return True


def _function_defs(tree: ast.Module):
    """Every (nested) def, visiting statement blocks only: ast.walk's trip through every
    expression node tripled the cost on the stdlib."""
    blocks = (ast.stmt, ast.excepthandler, ast.match_case)
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                stack.extend(c for c in children if isinstance(c, blocks))


def extract_functions(
    source: str,
    path: str = "<string>",
    *,
    require_docstring: bool = True,
    min_body_lines: int = 2,
    max_body_lines: int = 40,
    max_response_chars: int = 2000,
) -> list[dict[str, str]]:
    """Every function and method of a module -> {"prompt", "response", "path", "name"}.

    prompt = "Implement this function:" + the decorators, signature and docstring as written;
    response = the rest of the body, dedented to the def's column (one indent level remains).
    Skipped: unparsable sources, bodies on the def line, trivial bodies, bodies with fewer than
    `min_body_lines` or more than `max_body_lines` non-blank lines or over `max_response_chars`.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    examples = []
    for node in _function_defs(tree):
        body = node.body
        doc = ast.get_docstring(node, clean=False)
        if require_docstring and doc is None:
            continue
        rest = body[1:] if doc is not None else body
        if not rest or _is_trivial(rest):
            continue
        header_end = body[0].end_lineno if doc is not None else rest[0].lineno - 1
        if rest[0].lineno <= header_end or header_end < node.lineno:
            continue  # statements share a line with the signature or the docstring
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        header = _strip_indent(lines[start - 1 : header_end], node.col_offset)
        response_lines = _strip_indent(lines[header_end : node.end_lineno], node.col_offset)
        while response_lines and not response_lines[0].strip():
            response_lines.pop(0)
        n_body = sum(1 for line in response_lines if line.strip())
        response = "\n".join(response_lines) + "\n"
        if not min_body_lines <= n_body <= max_body_lines or len(response) > max_response_chars:
            continue
        example = {
            "prompt": PROMPT_PREFIX + "\n".join(header) + "\n",
            "response": response,
            "path": f"{path}:{node.lineno}",
            "name": node.name,
        }
        examples.append((node.lineno, example))
    return [e for _, e in sorted(examples, key=lambda x: x[0])]  # source order, not walk order


def function_examples(
    corpus: str | corpus_lib.Corpus = "stdlib", split: str = "train", **extract_kwargs
) -> list[dict[str, str]]:
    """Function-implementation tasks from a corpus split (default: the standard library's train
    split), in corpus order then source order. `extract_kwargs` go to `extract_functions`."""
    docs = corpus_lib.load_corpus(corpus).documents(split)
    examples = []
    for i in range(len(docs)):
        doc = docs[i]
        examples.extend(extract_functions(doc["text"], doc["path"], **extract_kwargs))
    return examples


def write_sft_jsonl(path: str | os.PathLike, examples: Sequence[Mapping]) -> None:
    """`examples` as the JSONL `load_sft_jsonl` reads (one object a line), written whole: to a
    temporary file first, so `path` is never half-written."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dict(e)) + "\n" for e in examples)
    os.replace(tmp, path)


def load_sft_jsonl(
    path: str, split: str = "all", heldout_fraction: float = 0.02
) -> list[dict[str, str]]:
    """One {"prompt", "response", "system"?, "path"?} or {"messages": [...], "path"?} object per
    line, validated; split like a JSONL corpus (by the hash of "path", else of "file:line")."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SFT file {path!r} does not exist")
    examples, keys = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e})") from e
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object")
            try:
                check_example(record)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from e
            examples.append(record)
            keys.append(str(record.get("path") or where))
    return [examples[i] for i in corpus_lib.select_split(keys, split, heldout_fraction)]


# The sizes of the environments' specs (c2/train/sft_sources.py): oracle conversations of
# generated function tasks, the train split's templates for training, the eval split's for
# held-out batches, and the notes tasks' chains.
FUNCTIONS_SEED = 0
FUNCTIONS_COUNTS = {"train": 4000, "heldout": 256}
BASIC_COUNTS = {"train": 720, "eval": 360}  # every distinct basic task of each split
WIDE_COUNTS = {"train": 8000, "eval": 256}  # of ~35,640 distinct wide tasks per split
NOTES_COUNTS = {"train": 600, "eval": 64}  # tasks; each gives 2-5 segment conversations

BUILTIN_SPECS = ("stdlib", "copy", "recall")
ENVIRONMENT_SOURCES = "c2.train.sft_sources"  # registers "functions", "notes" and the prompt


class ExampleSources:
    """The SFT specs a layer above c2.data supplies: `loader(spec, split) -> examples` by the
    spec's head (its text before the first ":"), and the agent system prompt that ":agent" puts
    before each prompt. `load_sft_examples` reads the module's `SOURCES`; c2/train/sft_sources.py
    fills it with the environments' specs on import, so that c2.data imports no environment."""

    def __init__(self):
        self.loaders: dict[str, Callable[[str, str], Sequence[Mapping]]] = {}
        self.agent_system_prompt: Callable[[], str] | None = None

    def register(self, name: str, loader: Callable[[str, str], Sequence[Mapping]]) -> None:
        if name in BUILTIN_SPECS or name in self.loaders:
            raise ValueError(f"SFT spec {name!r} is built in or registered already")
        self.loaders[name] = loader

    def register_agent_system_prompt(self, prompt: Callable[[], str]) -> None:
        if self.agent_system_prompt is not None:
            raise ValueError("the agent system prompt is registered already")
        self.agent_system_prompt = prompt

    def system_prompt(self, spec: str) -> str:
        """The registered agent system prompt, for the ":agent" spec `spec`."""
        if self.agent_system_prompt is None:
            raise ValueError(
                f"SFT spec {spec!r}: ':agent' needs the agent system prompt, which "
                f"`import {ENVIRONMENT_SOURCES}` registers"
            )
        return self.agent_system_prompt()


SOURCES = ExampleSources()

COPY_COUNTS = {"train": 50_000, "eval": 256}
COPY_ALPHABET = string.ascii_letters + string.digits


def copy_examples(spec: str, split: str = "train") -> list[dict[str, str]]:
    """ "copy[:N][:ordered]": N (default COPY_COUNTS[split]) examples whose response repeats the
    prompt's 1-4 random alphanumeric strings of 4-12 characters in a shuffled order: the loss
    falls only by copying from the context, the prerequisite for a policy that conditions on its
    task (c2.eval.copying probes it). The order is shuffled so that the copy has to find each
    string by its content (an induction head), not at the same offset from the prompt's start:
    with the prompt repeated verbatim the tiny model learnt the offset (83% of the characters
    after each string's first right in order, 8% with the strings reversed, the probe at
    chance). ":ordered" repeats the strings in the prompt's order (the same strings): the
    easier task, which leaves the from-scratch loss plateau sooner, and the first stage of the
    chain in experiments/sft_copy_tiny.py. Each example is drawn from its own seeded generator,
    so a split never changes."""

    def draw(rng: random.Random, ordered: bool) -> tuple[str, str]:
        words = [
            "".join(rng.choice(COPY_ALPHABET) for _ in range(rng.randint(4, 12)))
            for _ in range(rng.randint(1, 4))
        ]
        said = rng.sample(words, len(words))  # drawn either way: the same strings per example
        return " ".join(words), " ".join(words if ordered else said)

    return _seeded_examples(spec, split, draw, flags=("ordered",))


def _seeded_examples(
    spec: str, split: str, draw, flags: tuple[str, ...] = ()
) -> list[dict[str, str]]:
    """ "NAME[:N][:FLAG...][:agent]": N (default COPY_COUNTS[split]) {"prompt", "response",
    "path"} examples, the i-th from `draw(random.Random("NAME:split:i"), **{flag: bool})`, so a
    split never changes. `flags` are the spec's own options (given in that order).
    ":agent" puts the agent's system prompt (the one registered in `SOURCES`: the environments'
    `compact_system_prompt`, ~175 bytes) before each prompt, as every agent episode has it: a copy
    learnt in short contexts alone does not carry over to one that begins with it (BENCHMARKS.md,
    issue 16: recalled values 62% alone, 0-3% behind a system turn)."""
    name, *options = spec.split(":")
    known = (*flags, "agent")
    count = options[0] if options and options[0] not in known else ""
    given = options[1:] if count else options
    if (count and not (count.isdigit() and int(count) > 0)) or given != [
        f for f in known if f in given
    ]:
        extra = "".join(f"[:{f}]" for f in flags)
        raise ValueError(
            f"SFT spec {spec!r}: expected '{name}', '{name}:N' with N >= 1, "
            f"'{name}:agent' or '{name}:N:agent'"
            + (f" (in full '{name}[:N]{extra}[:agent]')" if flags else "")
        )
    agent = "agent" in given
    options_given = {f: f in given for f in flags}
    system = {"system": SOURCES.system_prompt(spec)} if agent else {}
    s = "eval" if split in ("heldout", "eval") else "train"
    out = []
    for i in range(int(count) if count else COPY_COUNTS[s]):
        prompt, response = draw(random.Random(f"{name}:{s}:{i}"), **options_given)
        out.append({"prompt": prompt, "response": response, **system, "path": f"{name}/{s}/{i}"})
    return out


RECALL_VALUES = tuple("+-*/%<>") + tuple(str(i) for i in range(100))


def recall_examples(spec: str, split: str = "train") -> list[dict[str, str]]:
    """ "recall[:N]": N (default COPY_COUNTS[split]) examples whose prompt lists 2-6 `key = value`
    lines (keys: random lowercase names of 3-8 letters; values: one operator character or a
    number below 100) and whose response recalls 1-3 of them, in a shuffled order, as the same
    lines. The value follows a context (` = ` after the key) that the prompt's other lines share,
    so only a copy that matches the key before the value lowers the loss: the form of a
    constant read from an instruction or a number read from a note, which copying whole strings
    (`copy_examples`) did not teach the agent policy to use. Seeded per example."""

    def draw(rng: random.Random) -> tuple[str, str]:
        keys: list[str] = []
        want = rng.randint(2, 6)
        while len(keys) < want:
            key = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))
            if key not in keys:
                keys.append(key)
        lines = [f"{k} = {rng.choice(RECALL_VALUES)}" for k in keys]
        return "\n".join(lines), "\n".join(rng.sample(lines, rng.randint(1, min(3, len(lines)))))

    return _seeded_examples(spec, split, draw)


def load_sft_examples(
    spec: str | Sequence[Mapping[str, str]], split: str = "train"
) -> Sequence[Mapping[str, str]]:
    """SFT examples from a spec.

    "stdlib" or a directory: the functions of its `split`; "copy[:N][:ordered]": copying examples
    (`copy_examples`); "recall[:N]": `key = value` lines recalled by key (`recall_examples`);
    either with ":agent" after the system prompt agent episodes begin with; a .jsonl of
    {"prompt", "response"} or {"messages"}: its `split` (2% held out); a spec registered in
    `SOURCES` by its head: with c2.train.sft_sources imported, "functions[:full|basic|wide[:N]]"
    (oracle agent conversations of generated function tasks of that level, train or held-out
    templates) and "notes..." (the notes tasks' oracle chains); "A+B": the examples of each (a
    mixture in proportion to their counts, shuffled together by the pipeline; for example
    "functions:basic+copy:720" keeps the copying the copy stage taught, which agent SFT alone
    erases); a sequence of example dicts: used as is.
    """
    if not isinstance(spec, str):
        return spec
    if "+" in spec and not os.path.exists(spec):
        parts = spec.split("+")
        if not all(parts):
            raise ValueError(f"SFT examples spec {spec!r}: an empty part in the mixture")
        return [e for part in parts for e in load_sft_examples(part, split)]
    if spec.endswith(".jsonl"):
        return load_sft_jsonl(spec, split)
    head = spec.partition(":")[0]
    if head in SOURCES.loaders:
        return SOURCES.loaders[head](spec, split)
    if head == "copy":
        return copy_examples(spec, split)
    if head == "recall":
        return recall_examples(spec, split)
    if spec == "stdlib" or os.path.isdir(spec):
        return function_examples(spec, split)
    raise ValueError(
        f"SFT examples spec {spec!r}: expected 'stdlib', a source directory or a .jsonl path, "
        "'copy[:N][:ordered][:agent]', 'recall[:N][:agent]', a mixture 'A+B' or a registered "
        f"spec {sorted(SOURCES.loaders)}; `import {ENVIRONMENT_SOURCES}` registers the "
        "environments' 'functions[:full|basic|wide[:N]]' and 'notes[:full|fixed|keyed]'"
    )
