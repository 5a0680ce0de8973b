"""The step-cost fit: known terms recovered, held-out error, profiled range."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kvsched.perf.profile_fit import TERMS, ProfiledRange, fit_steps
from kvsched.perf.step_profile import StepRecord

# Seconds per unit of TERMS' work (step, token, request, sampled row,
# prefill pair, decode KV token): a tiny model on a CPU, about.
KNOWN = (4e-3, 60e-6, 150e-6, 300e-6, 2e-9, 1.5e-6)


def step(point: str, tokens: int, reqs: int, sampled: int, pairs: int, kv: int,
         terms: tuple[float, ...] = KNOWN, noise: float = 0.0) -> StepRecord:
    seconds = sum(c * x for c, x in zip(terms, (1, tokens, reqs, sampled, pairs, kv)))
    return StepRecord(0, reqs, tokens, 0, 0, 1e3 * seconds * (1 + noise), point, tokens, reqs, sampled,
                      tokens, pairs, kv)


def synthetic(noise: float = 0.0, seed: int = 0) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for n in (8, 32, 64, 128, 256, 512):  # single prefills at context 0
        for c in (0, 512, 1024):
            out.append(step(f"prefill-{n}-{c}", n, 1, 1, n * c + n * (n + 1) // 2, 0,
                            noise=rng.gauss(0, noise)))
    for b in (1, 2, 4, 8, 16, 32):  # decode batches at growing context
        for ctx in (16, 100, 1024, 2000):
            out.append(step(f"decode-{b}", b, b, b, 0, b * (ctx + 1), noise=rng.gauss(0, noise)))
    for b in (4, 16):  # mixed: one chunk beside a decode batch, not sampling
        for n in (64, 256):
            out.append(step(f"mixed-{b}", b + n, b + 1, b, n * 128 + n * (n + 1) // 2, b * 200,
                            noise=rng.gauss(0, noise)))
    return out


def test_fit_recovers_known_terms_within_one_percent() -> None:
    fit = fit_steps(synthetic())
    for name, want in zip(TERMS, KNOWN):
        assert fit.terms[name] == pytest.approx(want, rel=0.01), name
    assert fit.fit_median_abs_error < 1e-6
    assert fit.loo_median_abs_error < 1e-6


def test_leave_one_out_sees_the_noise() -> None:
    fit = fit_steps(synthetic(noise=0.05, seed=3))
    # Held-out errors are at least the in-sample ones, and of the noise's size.
    assert fit.loo_median_abs_error >= fit.fit_median_abs_error
    assert 0.01 < fit.loo_median_abs_error < 0.08
    assert fit.lopo_median_abs_error is not None
    assert fit.lopo_median_abs_error >= fit.fit_median_abs_error
    assert fit.num_points == 6 * 3 + 6 + 2


def test_a_term_left_out_of_the_data_is_not_made_up() -> None:
    # Decodes only: no prefill pair in any step, so its cost is zero.
    steps = [s for s in synthetic() if s.point.startswith("decode")]
    fit = fit_steps(steps)
    assert fit.terms["per_prefill_pair_s"] == 0.0
    assert fit.predict((1, 8, 8, 8, 0, 8 * 500)) == pytest.approx(
        sum(c * x for c, x in zip(KNOWN, (1, 8, 8, 8, 0, 8 * 500))), rel=1e-6)


def test_range_is_the_largest_step_seen() -> None:
    fit = fit_steps(synthetic())
    assert fit.range == ProfiledRange(num_tokens=512, num_reqs=32, prefill_attn_pairs=512 * 1024
                                      + 512 * 513 // 2, decode_kv_tokens=32 * 2001)
    assert fit.range.past(600, 1, 0, 0) == ["tokens"]
    assert fit.range.past(1, 33, 0, 32 * 2001 + 1) == ["requests", "decode KV tokens"]
    assert fit.range.past(512, 32, 0, 0) == []


def test_too_few_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than 12"):
        fit_steps(synthetic()[:5])


def test_the_smallest_steps_get_a_cost_of_their_own() -> None:
    """Steps of 1 and 2 tokens slower than the line through the rest (as
    vLLM's CPU build runs them): the fit finds each one's extra cost, gives
    none to 3- and 4-token steps that lie on the line, and a line alone
    would miss them."""
    extra = {1: 6e-3, 2: 5e-3}
    steps = []
    for s in synthetic():
        if s.point.startswith("decode") and s.num_tokens in extra:
            s = dataclasses.replace(s, elapsed_ms=s.elapsed_ms + 1e3 * extra[s.num_tokens])
        steps.append(s)
    steps += [step("decode-3", 3, 3, 3, 0, 3 * (ctx + 1)) for ctx in (16, 100, 1024)]
    fit = fit_steps(steps)
    assert fit.terms["step_1_token_s"] == pytest.approx(6e-3, rel=0.01)
    assert fit.terms["step_2_tokens_s"] == pytest.approx(5e-3, rel=0.01)
    assert fit.terms["step_3_tokens_s"] == pytest.approx(0.0, abs=1e-7)
    assert fit.terms["step_4_tokens_s"] == pytest.approx(0.0, abs=1e-7)
    for name, want in zip(TERMS[:6], KNOWN):
        assert fit.terms[name] == pytest.approx(want, rel=0.01), name
    assert fit.loo_median_abs_error < 1e-6
    # A one-token decode is priced with its own cost on top of the line.
    work_1 = (1, 1, 1, 1, 0, 17, 1, 0, 0, 0)
    assert fit.predict(work_1) == pytest.approx(sum(c * x for c, x in zip(KNOWN, work_1)) + 6e-3, rel=1e-6)
