"""In-context copying probe: can the model reproduce a string it has just read?

A policy can only condition on its task (the constant in an instruction, a value in a file it
read, its own summary) if it copies from its context. This probe measures that directly: a
random alphanumeric string, then `gap` bytes of filler prose, then the same string again; the
score is the argmax accuracy of the next-token prediction over the second copy (after its
first character, which nothing announces). A model that copies scores near 1; one that does
not scores near chance (1/62 for the alphabet here), whatever its loss on ordinary text.

    python -m c2.eval.copying --policy runs/main/sft [--gaps 0,200,600] [--strings 16]
        [--length 40] [--seed 0] [--chat [--chat_prompts 48]]
        [--recall [--recall_prompts 48] [--recall_system 0,all]]
        [--task wide|basic [--task_prompts 40]] [--notes SPEC [--notes_segments 48]]

Prints one line per gap and, with --out, writes {"policy", "gaps": {gap: accuracy}, ...}.

`--chat` adds the probe in the chat format the copy SFT trains (`c2.data.sft.copy_examples`):
held-out prompts of 2-4 random strings, answered with the strings in their order and reversed;
the score is the accuracy over the response's tokens after each string's first. A model that
finds each string by its content scores the same both ways; one that learnt to copy at a fixed
offset from the prompt scores well in order only (83% vs 8% for the tiny model trained on
in-order copies, BENCHMARKS.md issue 16).
`--recall` adds the probe in the form a constant or a note's value is read in: held-out
`c2.data.sft.recall_examples` (`key = value` lines, the response recalling some of them by key),
scored on the recalled values' tokens and on the keys' tokens after their first; `--recall_system
0,40,all` puts that many characters of the agent system prompt before each prompt (a system turn,
as in `recall:N:agent`). The tiny model trained on recall without one gets 62% of the values
right with none and 0-3% behind any (BENCHMARKS.md, issue 16): the copy is tied to its context.
`--task wide` adds what the agent policy copies from a generated function task's instruction
(`task_reading_accuracy`): teacher-forced on held-out oracle conversations, the operation and
the constant's digits of its `return n <op> <c>`; the quick read of whether agent SFT has taught
the policy to read its task (the RL stage's start needs it: experiments/rl_tiny.py).
`--notes notes:fixed:4:80` adds the same for the notes tasks (`notes_reading_accuracy`): the
digits of the values the policy's summaries and final write copy from the notes, teacher-forced
on held-out oracle chain segments (the self-summary comparison needs a policy that copies them).
Runtime: seconds for the tiny models.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ALPHABET = string.ascii_letters + string.digits
FILLER = (
    "The cache is cleared on every deploy.",
    "Keep this file short and plain.",
    "Nothing here has been reviewed yet.",
    "Old entries are removed each quarter.",
)


def probe_texts(gap: int, strings: int, length: int, seed: int) -> list[tuple[str, str]]:
    """(text, the string) pairs: string, newline, `gap` characters of filler, newline, string."""
    rng = random.Random(f"copying:{seed}:{gap}")
    out = []
    for _ in range(strings):
        s = "".join(rng.choice(ALPHABET) for _ in range(length))
        filler = " ".join(rng.choice(FILLER) for _ in range(gap // 20 + 1))[:gap]
        out.append((f"{s}\n{filler}\n{s}", s))
    return out


def copy_accuracy(
    logits_fn: Callable[[np.ndarray], np.ndarray],
    encode: Callable[[str], Sequence[int]],
    gaps: Sequence[int] = (0, 200, 600),
    strings: int = 16,
    length: int = 40,
    seed: int = 0,
) -> dict[int, float]:
    """{gap: argmax accuracy over the second copy's predictable tokens}. `logits_fn` maps token
    ids [T] to next-token logits [T, V]; `encode` maps text to ids (no special tokens added)."""
    if length < 2 or strings < 1:
        raise ValueError(f"length={length} must be >= 2 and strings={strings} >= 1")
    out = {}
    for gap in gaps:
        if gap < 0:
            raise ValueError(f"gaps: {gap} is negative")
        hits = total = 0
        for text, s in probe_texts(gap, strings, length, seed):
            ids = np.asarray(encode(text))
            k = len(ids) - len(encode(text[: -len(s)]))  # the second copy's tokens
            pred = np.asarray(logits_fn(ids))[: len(ids) - 1].argmax(-1)
            # Positions predicting the second copy's tokens 2..k (its first is unannounced).
            hits += int((pred[len(ids) - k : len(ids) - 1] == ids[len(ids) - k + 1 :]).sum())
            total += k - 1
        out[gap] = hits / total
    return out


def _response_tokens(logits_fn, tokenizer, example: dict) -> tuple[np.ndarray, np.ndarray, list]:
    """The chat-rendered `example`'s response tokens, the model's argmax prediction of each, and
    each token's (start, end) character span in the response."""
    from c2.data import sft

    ids, mask = sft.format_chat(sft.example_messages(example), tokenizer)
    first = int(np.flatnonzero(mask)[0])  # the response's tokens start here
    resp = tokenizer.encode(example["response"])
    ends = [len(tokenizer.decode(resp[: i + 1])) for i in range(len(resp))]
    pred = np.asarray(logits_fn(ids))[first - 1 : first - 1 + len(resp)].argmax(-1)
    return np.asarray(resp), pred, list(zip([0, *ends[:-1]], ends))


def chat_copy_accuracy(
    logits_fn: Callable[[np.ndarray], np.ndarray], tokenizer, prompts: int = 48
) -> dict[str, float]:
    """{"in_order", "reversed"}: argmax accuracy over the response tokens that lie inside a
    string after its first character, for the first `prompts` held-out copy prompts holding
    two or more strings, answered in their order and reversed (see the module doc)."""
    from c2.data import sft

    examples = [e for e in sft.copy_examples("copy", "eval") if " " in e["prompt"]]
    if not 1 <= prompts <= len(examples):
        raise ValueError(f"prompts={prompts}: expected 1..{len(examples)}")
    examples = examples[:prompts]
    out = {}
    for name, order in (("in_order", lambda w: w), ("reversed", lambda w: w[::-1])):
        hits = total = 0
        for e in examples:
            words = order(e["prompt"].split())
            response = " ".join(words)
            example = {"prompt": e["prompt"], "response": response}
            resp, pred, spans = _response_tokens(logits_fn, tokenizer, example)
            # The scored tokens: inside a string, not holding its first character.
            inside = np.zeros(len(response) + 1, bool)
            heads = np.zeros(len(response) + 1, bool)
            at = 0
            for w in words:
                inside[at : at + len(w)] = True
                heads[at] = True
                at += len(w) + 1
            scored = np.array([inside[a:b].all() and not heads[a:b].any() for a, b in spans])
            hits += int(((pred == resp) & scored).sum())
            total += int(scored.sum())
        out[name] = hits / total
    return out


def recall_accuracy(
    logits_fn: Callable[[np.ndarray], np.ndarray],
    tokenizer,
    prompts: int = 48,
    system_chars: int = 0,
) -> dict[str, float]:
    """{"values", "keys"}: argmax accuracy over the response tokens that lie inside a recalled
    value, and inside a recalled key after its first character (which key comes next is the
    response's choice), for the first `prompts` held-out recall examples, each behind the first
    `system_chars` characters of the agent system prompt as a system turn (0: none)."""
    from c2.data import sft
    from c2.envs.episode import compact_system_prompt

    examples = sft.recall_examples("recall", "eval")
    if not 1 <= prompts <= len(examples):
        raise ValueError(f"prompts={prompts}: expected 1..{len(examples)}")
    if system_chars < 0:
        raise ValueError(f"system_chars={system_chars}: expected >= 0")
    system = compact_system_prompt()[:system_chars]
    hits = {"values": 0, "keys": 0}
    total = {"values": 0, "keys": 0}
    for e in examples[:prompts]:
        resp, pred, spans = _response_tokens(logits_fn, tokenizer, {**e, "system": system})
        kind = np.full(len(e["response"]) + 1, "", object)  # per character: "keys", "values", ""
        at = 0
        for line in e["response"].split("\n"):
            key = line.split(" = ")[0]
            kind[at + 1 : at + len(key)] = "keys"
            kind[at + len(key) + 3 : at + len(line)] = "values"
            at += len(line) + 1
        for i, (a, b) in enumerate(spans):
            if len(names := set(kind[a:b])) == 1 and (name := names.pop()):
                hits[name] += int(pred[i] == resp[i])
                total[name] += 1
    return {name: hits[name] / total[name] for name in hits}


def _after(ids, head: list[int], start: int) -> int:
    """The index just past the first occurrence of `head` in `ids` at or after `start`."""
    return next(
        i + len(head)
        for i in range(start, len(ids) - len(head))
        if list(ids[i : i + len(head)]) == head
    )


def task_reading_accuracy(
    logits_fn: Callable[[np.ndarray], np.ndarray],
    tokenizer,
    level: str = "wide",
    prompts: int = 40,
) -> dict[str, float]:
    """{"operation", "constant", "both"}: what the agent policy copies from a generated function
    task's instruction, teacher-forced on the first `prompts` held-out oracle conversations of
    that level ("basic" or "wide": "... it gives back n - 62.", "... return n times 40."),
    rendered as RL plays them: the argmax accuracy on the operation character after `return n `
    in the first reply (copied, or translated from a word), on the constant's digits, and the
    share of conversations with all of them right. A policy that does not read its task scores
    chance on the held-out templates (wide: 1/3 and ~1/10 a digit)."""
    import re

    from c2.data.chat import AgentChat
    from c2.train import sft_sources

    if level not in ("basic", "wide"):
        raise ValueError(f"level={level!r}: expected 'basic' or 'wide'")
    examples = sft_sources.function_task_conversations("eval", level)
    if not 1 <= prompts <= len(examples):
        raise ValueError(f"prompts={prompts}: expected 1..{len(examples)}")
    chat, head = AgentChat(tokenizer), list(tokenizer.encode("return n "))
    hits = {"operation": 0, "constant": 0, "both": 0}
    digits = 0
    for e in examples[:prompts]:
        ids, mask = chat.conversation(e["messages"])
        reply = next(m["content"] for m in e["messages"] if m["role"] == "assistant")
        op, const = re.search(r"return n (\S) (\d+)", reply).groups()
        answer = list(tokenizer.encode(f"{op} {const}"))
        if len(answer) != len(op) + 1 + len(const):
            raise ValueError("task_reading_accuracy needs a tokenizer with a token per character")
        first = int(np.flatnonzero(mask)[0])  # the first reply's first token
        at = _after(ids, head, first)
        pred = np.asarray(logits_fn(ids))[at - 1 : at - 1 + len(answer)].argmax(-1)
        right = pred == np.asarray(ids[at : at + len(answer)])
        hits["operation"] += int(right[0])
        hits["constant"] += int(right[2:].sum())
        hits["both"] += int(right[0] and right[2:].all())
        digits += len(const)
    total = {"operation": prompts, "constant": digits, "both": prompts}
    return {name: hits[name] / total[name] for name in hits}


def task_format_logprob(
    logits_fn: Callable[[np.ndarray], np.ndarray],
    tokenizer,
    level: str = "wide",
    prompts: int = 40,
) -> dict[str, float]:
    """{template: nats}: how sure the agent policy is of its first reply's form on each held-out
    template of a generated function task level, teacher-forced on the first `prompts` held-out
    oracle conversations: the mean log-probability per token of the reply's head, the tool
    call's fixed text before the operation (`<tool_call>` ... `return n `). Near 0: the
    instruction's wording leaves the call's form intact; well below (-0.19 for a tiny policy whose
    agent SFT saw only the six train templates, on "... it gives back n * 94.", against -0.002
    on "Make ... return n times 14."; -0.003 after reworded ones, experiments/reworded_tasks.py): a
    phrasing it has not seen garbles its tool calls, whatever it would have read from the
    task."""
    from c2.data import sft
    from c2.data.chat import AgentChat
    from c2.envs import functions

    if level not in ("basic", "wide"):
        raise ValueError(f"level={level!r}: expected 'basic' or 'wide'")
    count = (sft.BASIC_COUNTS if level == "basic" else sft.WIDE_COUNTS)["eval"]
    tasks = functions.function_tasks(count, sft.FUNCTIONS_SEED, "eval", level)
    if not 1 <= prompts <= len(tasks):
        raise ValueError(f"prompts={prompts}: expected 1..{len(tasks)}")
    chat, head = AgentChat(tokenizer), list(tokenizer.encode("return n "))
    by_template: dict[str, list[float]] = {}
    for t in tasks[:prompts]:
        ids, mask = chat.conversation(functions.task_conversation(t))
        ids = np.asarray(ids)
        first = int(np.flatnonzero(mask)[0])
        end = _after(ids, head, first)
        logits = np.asarray(logits_fn(ids), np.float64)[first - 1 : end - 1]
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        mean = float(logp[np.arange(end - first), ids[first:end]].mean())
        by_template.setdefault(t.metadata["template"], []).append(mean)
    return {name: float(np.mean(v)) for name, v in sorted(by_template.items())}


def notes_reading_accuracy(
    logits_fn: Callable[[np.ndarray], np.ndarray],
    tokenizer,
    spec: str = "notes:fixed:4:80",
    segments: int = 48,
) -> dict[str, float]:
    """{"values", "digits"}: what the agent policy copies from the notes it read, teacher-forced
    on the first `segments` held-out oracle chain segments of the notes tasks `spec`
    (`c2.train.sft_sources.notes_conversations`, rendered as RL plays them): the argmax accuracy on
    the digits its replies write (the values in its summaries, "Found a = 28.", and in the final
    `return n + 28 + ...`; every one is a note's value, read earlier in the segment or carried
    in its summary), and `digits`, how many were scored. A policy that has the episode's form
    but does not copy scores chance (~1/10)."""
    from c2.data.chat import AgentChat
    from c2.train import sft_sources

    examples = sft_sources.notes_conversations(spec, "eval")
    if not 1 <= segments <= len(examples):
        raise ValueError(f"segments={segments}: expected 1..{len(examples)}")
    if any(len(tokenizer.encode(d)) != 1 for d in "0123456789"):
        raise ValueError("notes_reading_accuracy needs a tokenizer with a token per digit")
    chat, digit_ids = AgentChat(tokenizer), [tokenizer.encode(d)[0] for d in "0123456789"]
    hits = total = 0
    for e in examples[:segments]:
        ids, mask = chat.conversation(e["messages"])
        ids = np.asarray(ids)
        scored = np.flatnonzero((np.asarray(mask) > 0) & np.isin(ids, digit_ids))
        if scored.size == 0:
            continue
        pred = np.asarray(logits_fn(ids)).argmax(-1)
        hits += int((pred[scored - 1] == ids[scored]).sum())
        total += int(scored.size)
    if total == 0:
        raise ValueError(f"no value digits in the first {segments} held-out segments of {spec!r}")
    return {"values": hits / total, "digits": float(total)}


def forward_logits_fn(params, cfg) -> Callable[[np.ndarray], np.ndarray]:
    """The model's forward as `copy_accuracy` wants it: ids -> [len, vocab] logits (inputs padded
    to a power of two, so a few lengths compile)."""
    import jax

    from c2 import model as model_lib

    fwd = jax.jit(lambda p, t: model_lib.forward(p, t, cfg)[0])

    def logits(ids: np.ndarray) -> np.ndarray:
        n = len(ids)
        x = np.zeros((1, 1 << max(n - 1, 1).bit_length()), np.int32)
        x[0, :n] = ids
        return np.asarray(fwd(params, x))[0, :n]

    return logits


def model_logits_fn(loaded) -> Callable[[np.ndarray], np.ndarray]:
    """A `LoadedModel`'s forward (`forward_logits_fn`)."""
    return forward_logits_fn(loaded.params, loaded.cfg)


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m c2.eval.copying")
    p.add_argument("--policy", required=True, help="a c2 workdir or hf:DIR")
    p.add_argument("--gaps", default="0,200,600")
    p.add_argument("--strings", type=int, default=16)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", action="store_true", help="also the chat-format probe")
    p.add_argument("--chat_prompts", type=int, default=48)
    p.add_argument("--recall", action="store_true", help="also the recall-by-key probe")
    p.add_argument("--recall_prompts", type=int, default=48)
    p.add_argument(
        "--recall_system",
        default="0,all",
        help="characters of the agent system prompt before each recall prompt ('all': all)",
    )
    p.add_argument(
        "--task",
        default=None,
        choices=("basic", "wide"),
        help="also what the policy copies from a function task's instruction, at this level",
    )
    p.add_argument("--task_prompts", type=int, default=40)
    p.add_argument(
        "--notes",
        default=None,
        help="also what the policy copies from the notes it read, on these notes tasks "
        "(a notes spec, e.g. notes:fixed:4:80)",
    )
    p.add_argument("--notes_segments", type=int, default=48)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    recall_system = args.recall_system.split(",")
    for chars in recall_system:
        if not (chars == "all" or chars.isdigit()):
            p.error(f"--recall_system: {chars!r} is not a count of characters or 'all'")
    from c2.eval.models import load_model

    loaded = load_model(args.policy)
    logits_fn = model_logits_fn(loaded)
    gaps = [int(g) for g in args.gaps.split(",")]
    acc = copy_accuracy(
        logits_fn,
        loaded.tokenizer.encode,
        gaps,
        args.strings,
        args.length,
        args.seed,
    )
    for gap, a in acc.items():
        print(f"{args.policy}: gap {gap}: second-copy accuracy {a:.3f} (chance {1 / 62:.3f})")
    result = {"policy": args.policy, "gaps": acc, "strings": args.strings, "length": args.length}
    if args.chat:
        chat = chat_copy_accuracy(logits_fn, loaded.tokenizer, args.chat_prompts)
        print(
            f"{args.policy}: chat format, response tokens after each string's first: "
            f"in order {chat['in_order']:.3f}, reversed {chat['reversed']:.3f}"
        )
        result["chat"] = chat
    if args.recall:
        from c2.envs.episode import compact_system_prompt

        whole = len(compact_system_prompt())
        result["recall"] = {}
        for chars in recall_system:
            n = whole if chars == "all" else min(int(chars), whole)
            r = recall_accuracy(logits_fn, loaded.tokenizer, args.recall_prompts, n)
            print(
                f"{args.policy}: recall by key behind {n} characters of the agent system "
                f"prompt: values {r['values']:.3f}, keys after their first {r['keys']:.3f}"
            )
            result["recall"][str(n)] = r
    if args.task:
        r = task_reading_accuracy(logits_fn, loaded.tokenizer, args.task, args.task_prompts)
        print(
            f"{args.policy}: {args.task} function tasks, held out, teacher-forced: operation "
            f"{r['operation']:.3f}, constant's digits {r['constant']:.3f}, both {r['both']:.3f}"
        )
        fmt = task_format_logprob(logits_fn, loaded.tokenizer, args.task, args.task_prompts)
        print(
            f"{args.policy}: {args.task} function tasks, held out: the first reply's fixed head, "
            "mean log-probability per token by template: "
            + ", ".join(f"{name} {v:.3f}" for name, v in fmt.items())
        )
        result["task"] = {"level": args.task, **r, "format": fmt}
    if args.notes:
        r = notes_reading_accuracy(logits_fn, loaded.tokenizer, args.notes, args.notes_segments)
        print(
            f"{args.policy}: {args.notes} chains, held out, teacher-forced: the values' digits "
            f"{r['values']:.3f} (of {int(r['digits'])})"
        )
        result["notes"] = {"spec": args.notes, **r}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
