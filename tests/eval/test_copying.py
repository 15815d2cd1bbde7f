"""The copying probe scores a perfect copier 1, a model that ignores its context at chance, and
runs on a real (untrained) model."""

import numpy as np
import pytest

from c2.eval import copying

V = 512  # the byte tokenizer with its specials fits


def encode(text: str) -> list[int]:
    return list(text.encode())


def copier(ids: np.ndarray) -> np.ndarray:
    """Predicts the token that followed the latest earlier occurrence of the last two tokens
    (an induction head), else token 0."""
    out = np.zeros((len(ids), V))
    for t in range(len(ids)):
        nxt = 0
        for j in range(t - 1, 0, -1):
            if ids[j] == ids[t] and ids[j - 1] == ids[t - 1]:
                nxt = ids[j + 1]
                break
        out[t, nxt] = 1.0
    return out


def unigram(ids: np.ndarray) -> np.ndarray:
    """Ignores the context: always the same most likely letter."""
    out = np.zeros((len(ids), V))
    out[:, ord("e")] = 1.0
    return out


def test_a_copier_scores_one_and_a_context_free_model_scores_near_chance():
    exact = copying.copy_accuracy(copier, encode, gaps=(0, 200), strings=8, length=40)
    # It misses only where its two-token match is ambiguous or absent (the string's first token
    # has no predecessor in the first copy).
    assert set(exact) == {0, 200} and all(a > 0.9 for a in exact.values())
    blind = copying.copy_accuracy(unigram, encode, gaps=(0, 200), strings=8, length=40)
    assert all(a < 0.06 for a in blind.values())  # 'e' is 1 of 62 characters


def test_probe_texts_hold_the_string_twice_around_the_filler():
    (text, s), *_ = copying.probe_texts(gap=100, strings=2, length=12, seed=3)
    assert text.startswith(s + "\n") and text.endswith("\n" + s)
    assert len(text) == 2 * 12 + 2 + 100
    assert copying.probe_texts(100, 2, 12, 3) == copying.probe_texts(100, 2, 12, 3)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="length=1"):
        copying.copy_accuracy(unigram, encode, length=1)
    with pytest.raises(ValueError, match="gaps: -5"):
        copying.copy_accuracy(unigram, encode, gaps=(-5,))


def test_an_untrained_model_does_not_copy():
    import jax

    from c2 import model as model_lib
    from c2.data.tokenizer import load_tokenizer
    from c2.eval.models import LoadedModel
    from c2.model.presets import PRESETS

    cfg = PRESETS["tiny_kimi_k2"]().replace(dtype="float32")
    params = model_lib.init_params(cfg, jax.random.key(0))
    loaded = LoadedModel("init", cfg, params, load_tokenizer("byte"), None)
    acc = copying.copy_accuracy(
        copying.model_logits_fn(loaded), loaded.tokenizer.encode, gaps=(0,), strings=2
    )
    assert 0.0 <= acc[0] < 0.2


def test_the_chat_probe_tells_copying_by_content_from_copying_by_offset():
    from c2.data.sft import IM_START
    from c2.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    im_start = tok.specials[IM_START]

    def by_offset(ids: np.ndarray) -> np.ndarray:
        """Predicts the token as far back as the assistant's text starts after the user's: the
        prompt again, in its order."""
        user, assistant = (int(i) + len("user\n") + 1 for i in np.flatnonzero(ids == im_start)[:2])
        d = assistant - user + (len("assistant\n") - len("user\n"))
        out = np.zeros((len(ids), V))
        for t in range(len(ids)):
            out[t, ids[t + 1 - d] if 0 <= t + 1 - d < len(ids) else 0] = 1.0
        return out

    content = copying.chat_copy_accuracy(copier, tok, prompts=12)
    offset = copying.chat_copy_accuracy(by_offset, tok, prompts=12)
    blind = copying.chat_copy_accuracy(unigram, tok, prompts=12)
    assert min(content.values()) > 0.8
    assert offset["in_order"] == 1.0 and offset["reversed"] < 0.3
    assert max(blind.values()) < 0.1
    with pytest.raises(ValueError, match="prompts=0"):
        copying.chat_copy_accuracy(copier, tok, prompts=0)
    with pytest.raises(ValueError, match=r"prompts=10000: expected 1\.\.\d+"):
        copying.chat_copy_accuracy(copier, tok, prompts=10_000)


def longest_match_copier(ids: np.ndarray, longest: int = 16) -> np.ndarray:
    """Predicts the token that followed the earlier position whose preceding tokens match the
    current ones longest (an induction head that matches on a whole key)."""
    ids = np.asarray(ids)
    out = np.zeros((len(ids), V))
    for t in range(1, len(ids)):
        run = np.zeros(t, int)  # run[j]: how many tokens before and at j match those up to t
        alive = np.ones(t, bool)
        for k in range(min(longest, t)):
            j = np.arange(t)
            ok = alive & (j - k >= 0) & (ids[np.maximum(j - k, 0)] == ids[t - k])
            run += ok
            alive = ok
        out[t, ids[int(np.argmax(run)) + 1] if run.max() > 0 else 0] = 1.0
    return out


def test_the_recall_probe_scores_a_copy_that_matches_the_key():
    from c2.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    for system_chars in (0, 40, 10_000):
        exact = copying.recall_accuracy(longest_match_copier, tok, 12, system_chars)
        assert exact["values"] == 1.0 and exact["keys"] > 0.95
    # Matching only the two tokens before the value (`= `) copies the wrong line's value.
    short = copying.recall_accuracy(copier, tok, prompts=12)
    assert short["values"] < 0.6 and short["keys"] > 0.9
    blind = copying.recall_accuracy(unigram, tok, prompts=12)
    assert blind["values"] == 0.0 and blind["keys"] < 0.2
    with pytest.raises(ValueError, match="prompts=0"):
        copying.recall_accuracy(copier, tok, prompts=0)
    with pytest.raises(ValueError, match="system_chars=-1"):
        copying.recall_accuracy(copier, tok, system_chars=-1)


def test_a_bad_recall_system_list_is_named_before_the_model_loads(capsys):
    with pytest.raises(SystemExit):
        copying.main(["--policy", "no/such/dir", "--recall", "--recall_system", "0,x"])
    assert "--recall_system: 'x' is not a count" in capsys.readouterr().err


def answering(answer):
    """A logits function that writes `answer(the conversation's text)` after the reply's
    `return n ` and is a unigram elsewhere (byte ids; the specials lie above 255)."""

    def logits(ids: np.ndarray) -> np.ndarray:
        out = unigram(ids)
        text = bytes(int(i) if i < 256 else ord("|") for i in ids).decode()
        head = text.index("    return n ") + len("    return n ") - 1  # the code's, not the task's
        written = answer(text)
        for k, ch in enumerate(written):
            out[head + k] = 0.0
            out[head + k, ord(ch)] = 1.0
        return out

    return logits


def read_instruction(text: str) -> str:
    """Reads `n <op word or symbol> <constant>.` from the task, as a reading policy would."""
    import re

    op, const = re.search(r"n (\S+) (\d+)\.\n", text).groups()
    return f"{ {'times': '*', 'plus': '+', 'minus': '-'}.get(op, op) } {const}"


def test_the_task_probe_scores_reading_the_instruction_not_a_fixed_answer():
    from c2.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    reader = copying.task_reading_accuracy(answering(read_instruction), tok, "wide", prompts=40)
    assert reader == {"operation": 1.0, "constant": 1.0, "both": 1.0}
    guess = copying.task_reading_accuracy(answering(lambda _: "* 47"), tok, "wide", prompts=40)
    assert 0.1 < guess["operation"] < 0.6 and guess["constant"] < 0.3 and guess["both"] < 0.1
    with pytest.raises(ValueError, match="level='full'"):
        copying.task_reading_accuracy(unigram, tok, "full")
    with pytest.raises(ValueError, match="prompts=0"):
        copying.task_reading_accuracy(unigram, tok, "wide", prompts=0)


def test_the_notes_probe_scores_the_copied_values_digits():
    from c2.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")

    def oracle(ids: np.ndarray) -> np.ndarray:  # knows every next token
        out = np.zeros((len(ids), V))
        out[np.arange(len(ids) - 1), ids[1:]] = 1.0
        return out

    def twos(ids: np.ndarray) -> np.ndarray:  # the form, not the values: always "2"
        out = np.zeros((len(ids), V))
        out[:, ord("2")] = 1.0
        return out

    perfect = copying.notes_reading_accuracy(oracle, tok, "notes:fixed:4:80", segments=12)
    assert perfect["values"] == 1.0 and perfect["digits"] >= 24  # >= one 2-digit value each
    guess = copying.notes_reading_accuracy(twos, tok, "notes:fixed:4:80", segments=12)
    assert guess["digits"] == perfect["digits"] and 0.02 < guess["values"] < 0.25
    with pytest.raises(ValueError, match="segments=0"):
        copying.notes_reading_accuracy(twos, tok, "notes:fixed:4:80", segments=0)


def test_the_format_probe_tells_a_sure_reply_from_a_garbled_one_per_template():
    from c2.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")

    def oracle(ids: np.ndarray) -> np.ndarray:
        out = np.full((len(ids), V), -30.0)
        out[np.arange(len(ids) - 1), ids[1:]] = 30.0
        return out

    def uniform(ids: np.ndarray) -> np.ndarray:
        return np.zeros((len(ids), V))

    sure = copying.task_format_logprob(oracle, tok, "wide", prompts=40)
    assert set(sure) == {"make_words", "put_code", "should_words"}  # the held-out templates
    assert all(-1e-6 < v <= 0.0 for v in sure.values())
    lost = copying.task_format_logprob(uniform, tok, "wide", prompts=40)
    np.testing.assert_allclose(list(lost.values()), -np.log(V), rtol=1e-9)
    with pytest.raises(ValueError, match="prompts=0"):
        copying.task_format_logprob(uniform, tok, "wide", prompts=0)
