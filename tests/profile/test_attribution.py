"""Each logged step's work from the requests sent (PointLedger)."""

from __future__ import annotations

from kvsched.profile.attribution import PointLedger, SentRequest
from kvsched.profile.iteration_log import IterationLine


def line(i: int, ctx_reqs: int, ctx_tokens: int, gen: int, ms: float = 10.0) -> IterationLine:
    return IterationLine(0, i, ctx_reqs, ctx_tokens, gen, gen, ms)


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
