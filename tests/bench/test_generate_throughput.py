"""The generation benchmark streams more prompts than slots (continuous batching) and every
greedy variant (the engine without run-ahead, speculative, transformers' batched generate)
yields the same tokens."""

import pytest

from c2.bench import generate_throughput


def test_requests_stream_through_fewer_slots_with_identical_greedy_tokens():
    pytest.importorskip("transformers")
    res = generate_throughput.main(
        [
            "--preset=tiny_kimi_k2",
            "--batch=2",
            "--requests=5",
            "--prompt_len=16",
            "--new_tokens=6",
            "--drafts=2",
            "--repeats=1",
            "--skip_mismatch",
        ]
    )
    assert (res["batch"], res["requests"]) == (2, 5)
    runs = res["runs"]
    assert set(runs) == {
        "c2 T=0",
        "c2 no run-ahead T=0",
        "c2 T=1",
        "c2 speculative k=2 T=0",
        "c2 speculative k=2 T=1",
        "transformers T=0",
    }
    # 5 prompts through 2 slots: every prompt's 6 tokens were generated, none twice.
    assert runs["c2 T=0"]["generated_tokens"] == 5 * 6
    assert runs["c2 speculative k=2 T=1"]["generated_tokens"] == 5 * 6
    # Greedy: speculative and transformers (in batches of 2, the last of 1) give plain's tokens.
    assert runs["c2 speculative k=2 T=0"]["identical_to_plain"] == 1.0
    assert runs["c2 no run-ahead T=0"]["identical_to_plain"] == 1.0
    assert runs["c2 no run-ahead T=0"]["generated_tokens"] == 5 * 6
    assert runs["transformers T=0"]["identical_to_plain"] == 1.0
    assert 0.0 <= runs["c2 speculative k=2 T=1"]["acceptance_rate"] <= 1.0


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="--requests 0"):
        generate_throughput.main(["--preset=tiny_kimi_k2", "--requests=0", "--skip_hf"])
