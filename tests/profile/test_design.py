"""The designed points fit the server's limits (no request past max_model_len,
no batch past max_num_seqs or the KV cache)."""

from __future__ import annotations

from kvsched.profile.design import design_points


def test_points_fit_max_model_len_max_num_seqs_and_the_kv_cache() -> None:
    points = design_points(max_model_len=2048, max_num_seqs=16, kv_cache_tokens=20000)
    names = [p.name for p in points]
    assert names[0] == "warmup"
    assert "prefill-1024" in names and "prefill-2048" not in names  # 2,048 + 1 output > 2,048
    assert "decode-16x16" in names and "decode-32x16" not in names  # max_num_seqs
    # 16 x (1,024 + 32) = 16,896 > 0.8 x 20,000: would preempt.
    assert "decode-8x1024" in names and "decode-16x1024" not in names
    for p in points:
        for w in p.waves:
            assert len(w.requests) <= 16
            assert all(prompt + out <= 2048 for prompt, out in w.requests)
    # Prefills run twice (the first is the warm-up of its shape); mixed points inject after the batch.
    single = next(p for p in points if p.name == "prefill-512")
    assert [w.requests for w in single.waves] == [((512, 1),), ((512, 1),)]
    mixed = next(p for p in points if p.name == "mixed-4")
    assert len(mixed.waves[0].requests) == 4 and [w.requests for w in mixed.waves[1:]] == [
        ((16, 1),), ((16, 1),), ((64, 1),), ((64, 1),), ((256, 1),), ((256, 1),), ((512, 1),), ((512, 1),)]


def test_unknown_kv_cache_caps_nothing_but_the_limits() -> None:
    names = [p.name for p in design_points(4096, 64, None)]
    assert "decode-64x16" in names and "prefill-3072" in names and "prefill-4096" not in names
    # Long prompts decode in batches of 16 at most (each costs its prefill).
    assert "decode-16x1024" in names and "decode-32x1024" not in names
