"""Each logged step's work from the requests sent (PointLedger)."""

from __future__ import annotations

from kvsched.profile.attribution import PointLedger, SentRequest
from kvsched.profile.iteration_log import IterationLine


def line(i: int, ctx_reqs: int, ctx_tokens: int, gen: int, ms: float = 10.0) -> IterationLine:
    return IterationLine(i, ctx_reqs, ctx_tokens, gen, gen, ms, engine=0)


def test_two_prompts_chunked_by_the_budget_then_decoding() -> None:
    # Two prompts of 300 tokens under a 512-token budget, 3 output tokens each.
    a, b = SentRequest(300, 3, sent=True), SentRequest(300, 3, sent=True)
    ledger = PointLedger("p", [a, b])
    s1 = ledger.step(line(0, 2, 512, 0))
    assert s1 is not None
    # a: 300 at context 0 (done, samples); b: 212 at context 0.
    assert (s1.num_tokens, s1.num_reqs, s1.num_sampled) == (512, 2, 1)
    assert s1.prefill_attn_pairs == 300 * 301 // 2 + 212 * 213 // 2
    assert s1.decode_kv_tokens == 0
    assert not ledger.past_prefill()
    s2 = ledger.step(line(1, 1, 88, 1))
    assert s2 is not None
    # b: its last 88 at context 212; a decodes at context 300 (reads 301).
    assert s2.prefill_attn_pairs == 88 * 212 + 88 * 89 // 2
    assert (s2.decode_kv_tokens, s2.num_sampled, s2.num_reqs, s2.num_tokens) == (301, 2, 2, 89)
    assert ledger.past_prefill()
    s3 = ledger.step(line(2, 0, 0, 2))
    assert s3 is not None
    assert s3.decode_kv_tokens == 302 + 301
    assert not ledger.done  # b has one more token to go
    s4 = ledger.step(line(3, 0, 0, 1))
    assert s4 is not None and s4.decode_kv_tokens == 302
    assert ledger.done and not ledger.problem


def test_one_output_token_finishes_at_the_prompt() -> None:
    r = SentRequest(64, 1, sent=True)
    ledger = PointLedger("p", [r])
    s = ledger.step(line(0, 1, 64, 0))
    assert s is not None and s.num_sampled == 1 and ledger.done


def test_a_step_the_requests_cannot_explain_stops_the_ledger() -> None:
    ledger = PointLedger("p", [SentRequest(100, 5, sent=True)])
    assert ledger.step(line(0, 1, 100, 0)) is not None
    # Two generation requests logged, one decoding: a stray request.
    assert ledger.step(line(1, 0, 0, 2)) is None
    assert "2 generation requests" in ledger.problem
    assert ledger.done  # nothing more is attributed
    assert ledger.step(line(2, 0, 0, 1)) is None


def test_context_tokens_past_the_prompts_are_refused() -> None:
    ledger = PointLedger("p", [SentRequest(100, 1, sent=True)])
    assert ledger.step(line(0, 1, 120, 0)) is None
    assert "do not fit" in ledger.problem


def test_unsent_requests_are_not_scheduled() -> None:
    first, later = SentRequest(50, 1, sent=True), SentRequest(50, 1)
    ledger = PointLedger("p", [first, later])
    assert ledger.step(line(0, 2, 100, 0)) is None  # only one prompt was sent


def test_a_prefix_cache_hit_in_a_step_under_the_budget() -> None:
    # Run 2's iteration 444-445: a 256-token prompt logged as one context
    # request of 128 tokens in a step that used 128 of its 512 tokens, then
    # decoding: its first 128-token block came from the prefix cache.
    r = SentRequest(256, 3, sent=True)
    ledger = PointLedger("serve", [r], token_budget=512)
    s1 = ledger.step(line(444, 1, 128, 0))
    assert s1 is not None and not ledger.problem
    assert r.cached == 128
    assert s1.num_sampled == 1
    # 128 queries over a context of 128 cached tokens, causal among themselves.
    assert s1.prefill_attn_pairs == 128 * 128 + 128 * 129 // 2
    s2 = ledger.step(line(445, 0, 0, 1))
    assert s2 is not None and s2.decode_kv_tokens == 257
    s3 = ledger.step(line(446, 0, 0, 1))
    assert s3 is not None and s3.decode_kv_tokens == 258
    assert ledger.done and not ledger.problem


def test_without_the_budget_a_short_first_chunk_stays_a_chunk() -> None:
    # The profile's own ledger (fresh prompts, no budget given): the rest of
    # the prompt is expected in the next step, so a decode then is a problem.
    r = SentRequest(256, 3, sent=True)
    ledger = PointLedger("p", [r])
    assert ledger.step(line(0, 1, 128, 0)) is not None
    assert r.cached == 0 and r.computed == 128
    assert ledger.step(line(1, 0, 0, 1)) is None
    assert "1 generation requests" in ledger.problem


def test_a_step_that_fills_the_budget_chunks_without_a_hit() -> None:
    # 500 prompt tokens and 12 decodes fill the 512 budget: the chunk was cut there.
    decoding = [SentRequest(4, 5, computed=4, generated=1, sent=True) for _ in range(12)]
    r = SentRequest(600, 2, sent=True)
    ledger = PointLedger("p", [*decoding, r], token_budget=512)
    s = ledger.step(line(0, 1, 500, 12))
    assert s is not None and r.cached == 0 and r.computed == 500
    assert s.prefill_attn_pairs == 500 * 501 // 2


def test_two_new_prompts_short_in_one_step_are_refused() -> None:
    a, b = SentRequest(256, 2, sent=True), SentRequest(256, 2, sent=True)
    ledger = PointLedger("p", [a, b], token_budget=1024)
    assert ledger.step(line(0, 2, 384, 0)) is None
    assert "prefix-cache hit" in ledger.problem
