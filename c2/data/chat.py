"""Agent conversations as token ids: one rendering shared by agent SFT data and RL episodes.

ChatML (the same layout as `c2.data.sft.format_chat`), with the agent's tags as special ids:

    <bos><|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{task}<|im_end|>\\n
    <|im_start|>assistant\\n{reply}<|im_end|>                                  <- generated
    \\n<|im_start|>user\\n<tool_response>\\n{output}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n{reply}<|im_end|> ...

In a reply, `<tool_call>`, `</tool_call>`, `<think>`, `</think>` are special ids (the model emits
them as single tokens); every other character is literal text, so a file that contains the string
"<tool_call>" stays plain text. Tool outputs are literal between special `<tool_response>` ids.
An RL episode is built from exactly these pieces: `prompt` once, then the engine's generated ids
(ending in <|im_end|>), then `observation` ids appended as they are, never re-tokenised; an SFT
conversation is their concatenation, so SFT teaches the token stream RL samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from c2.data.tokenizer import (
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    Tokenizer,
)

REPLY_SPECIALS = (TOOL_CALL, TOOL_CALL_END, THINK, THINK_END)


class AgentChat:
    """Renders agent conversations with one tokenizer (see the module doc)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        sp = tokenizer.specials
        missing = [s for s in (IM_START, IM_END, *REPLY_SPECIALS, TOOL_RESPONSE) if s not in sp]
        if missing:
            raise ValueError(f"tokenizer {tokenizer!r} lacks the agent special tokens {missing}")
        self.im_start, self.im_end = sp[IM_START], sp[IM_END]
        self.tool_call, self.tool_call_end = sp[TOOL_CALL], sp[TOOL_CALL_END]
        self.think, self.think_end = sp[THINK], sp[THINK_END]
        self.tool_response, self.tool_response_end = sp[TOOL_RESPONSE], sp[TOOL_RESPONSE_END]
        self._reply_ids = {sp[s]: s for s in REPLY_SPECIALS}
        self._reply_by_text = {s: sp[s] for s in REPLY_SPECIALS}

    # Pieces ---------------------------------------------------------------------------------

    def _text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _turn_header(self, role: str) -> list[int]:
        return [self.im_start, *self._text(role + "\n")]

    def prompt(self, system: str, task: str) -> np.ndarray:
        """The episode's first ids: system and task turns, then the assistant header."""
        ids = [self.tokenizer.bos_id]
        for role, content in (("system", system), ("user", task)):
            ids += [*self._turn_header(role), *self._text(content), self.im_end, *self._text("\n")]
        ids += self._turn_header("assistant")
        return np.asarray(ids, np.int32)

    def reply(self, text: str) -> list[int]:
        """An assistant reply written as text (SFT data, scripted policies): its ids as the
        model emits them, tags as special ids, closed by <|im_end|>."""
        ids: list[int] = []
        rest = text
        while rest:
            hits = [(rest.find(s), s) for s in REPLY_SPECIALS if s in rest]
            if not hits:
                ids += self._text(rest)
                break
            at, tag = min(hits)
            ids += self._text(rest[:at]) + [self._reply_by_text[tag]]
            rest = rest[at + len(tag) :]
        return ids + [self.im_end]

    def observation(self, outputs: Sequence[str], note: str | None = None) -> list[int]:
        """What follows a reply's <|im_end|>: a user turn holding one tool response per output
        (then `note`, plain text, if given), then the next assistant header."""
        ids = [*self._text("\n"), *self._turn_header("user")]
        for i, out in enumerate(outputs):
            if i:
                ids += self._text("\n")
            ids += [self.tool_response, *self._text(f"\n{out}\n"), self.tool_response_end]
        if note:
            ids += self._text(("\n" if outputs else "") + note)
        ids += [self.im_end, *self._text("\n"), *self._turn_header("assistant")]
        return ids

    # Reading generated ids -------------------------------------------------------------------

    def reply_text(self, ids: Sequence[int]) -> str:
        """Generated ids -> text for reading (tags spelled out; the closing <|im_end|> dropped)."""
        ids = list(ids)
        if ids and ids[-1] == self.im_end:
            ids = ids[:-1]
        return self.tokenizer.decode(ids)

    def tool_call_spans(self, ids: Sequence[int]) -> tuple[list[str], bool]:
        """The JSON text inside each <tool_call> ... </tool_call> pair of special ids, and whether
        a <tool_call> was left unclosed. Literal "<tool_call>" text is not a call."""
        calls, inside, start = [], False, 0
        for i, t in enumerate(ids):
            if t == self.tool_call:
                if inside:  # a second opening tag: the first call was never closed
                    return calls, True
                inside, start = True, i + 1
            elif t == self.tool_call_end and inside:
                calls.append(self.tokenizer.decode(list(ids[start:i])))
                inside = False
        return calls, inside

    # Whole conversations (SFT) ----------------------------------------------------------------

    def conversation(self, messages: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray]:
        """[system], user task, then alternating assistant replies and tool turns ->
        (ids int32 [L], loss_mask float32 [L]: 1 on every reply id, <|im_end|> included).

        A tool turn is {"role": "tool", "content": [output, ...]} (one tool response each), with
        an optional "note": text after the responses, in the same user turn.
        """
        msgs = list(messages)
        system = ""
        if msgs and msgs[0].get("role") == "system":
            system = msgs.pop(0)["content"]
        if not msgs or msgs[0].get("role") != "user":
            raise ValueError("conversation: expected [system], then a user message (the task)")
        ids = list(self.prompt(system, msgs[0]["content"]))
        mask = [0.0] * len(ids)
        expect = "assistant"
        for i, m in enumerate(msgs[1:], 1):
            role = m.get("role")
            if role != expect:
                raise ValueError(f"conversation message {i}: role {role!r}, expected {expect!r}")
            if role == "assistant":
                piece = self.reply(m["content"])
                mask += [1.0] * len(piece)
                expect = "tool"
            else:
                outputs = m["content"]
                if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs):
                    raise ValueError(
                        f"conversation message {i}: a tool turn's content is a list of strings"
                    )
                piece = self.observation(outputs, note=m.get("note"))
                mask += [0.0] * len(piece)
                expect = "assistant"
            ids += piece
        if expect != "tool":
            raise ValueError("conversation: expected it to end with an assistant reply")
        return np.asarray(ids, np.int32), np.asarray(mask, np.float32)
