"""The decode-prefix benchmark: attending the cache's first slots gives the whole cache's
greedy tokens, and the report says which length `attend_len` picks for each cache."""

import pytest

from c2.bench import decode_prefix


def test_prefix_and_whole_cache_decode_the_same_tokens():
    res = decode_prefix.main(
        [
            "--preset=tiny_kimi_k2",
            "--batch=2",
            "--cache_lens=224,528",
            "--filled=16",
            "--calls=2",
            "--repeats=2",
        ]
    )
    rows = {r["cache_len"]: r for r in res["results"]}
    assert set(rows) == {224, 528}
    for r in rows.values():
        assert r["identical_tokens"] == 1.0
        assert r["timings"]["whole cache"]["n"] == 2
    # 128 slots are more than half of 224 (the whole cache is attended), under half of 528.
    assert rows[224]["attend_len_picks"] is None
    assert rows[528]["attend_len_picks"] == 128


def test_calls_that_would_overrun_the_prefix_are_refused():
    with pytest.raises(SystemExit):
        decode_prefix.main(["--preset=tiny_kimi_k2", "--filled=100", "--calls=5"])
