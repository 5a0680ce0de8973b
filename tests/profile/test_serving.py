"""The serving path measured from a profile's own streamed requests.

A synthetic engine runs designed points step by step with known host terms:
each step takes its logged (iteration) time plus a gap of ``step_s +
per_sampled_request_s x requests sampling`` plus kvsched's own CPU time per
step, a request reaches the scheduler ``arrival_s + per_prompt_token_s x
prompt tokens`` after its send, and its tokens reach the client at the end
of the step that sampled them, some several to a chunk (a CPU server's
output loop falling behind). The log lines go through the real ledger, the
client times through :func:`request_sample`, and :func:`fit_serving` must
give the terms back.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.serving_fit import RequestSample, ServingFit, fit_serving
from kvsched.perf.step_profile import StepRecord
from kvsched.perf.step_time import CPU_PER_REQUEST_S, CPU_STEP_S
from kvsched.profile.attribution import PointLedger, SentRequest
from kvsched.profile.iteration_log import IterationLine
from kvsched.profile.server import read_stream
from kvsched.profile.serving import StreamTiming, request_sample

TRUE = {"step_s": 1.8e-3, "per_sampled_request_s": 0.12e-3, "arrival_s": 6e-3, "per_prompt_token_s": 2e-6}
BUDGET = 512


def forward_ms(ctx_tokens: int, gen: int) -> float:
    """A step's logged time: what the profile's step fit is for; here any
    positive number the serving fit must subtract."""
    return 4.0 + 0.15 * ctx_tokens + 0.4 * gen


class Engine:
    """Steps one point's requests (all sent at ``t``) the way vLLM's
    scheduler does for the ledger: decodes first, then prompt chunks in
    send order within the token budget."""

    def __init__(self, rng: random.Random, noise: float, merge: int = 1) -> None:
        self.rng, self.noise, self.merge = rng, noise, merge
        self.iteration = 0

    def run(self, point: str, shapes: list[tuple[int, int]], t0: float
            ) -> tuple[list[StepRecord], list[tuple[SentRequest, StreamTiming]], float]:
        reqs = [SentRequest(p, o, sent=True) for p, o in shapes]
        ledger = PointLedger(point, reqs)
        arrive = [t0 + TRUE["arrival_s"] + TRUE["per_prompt_token_s"] * p for p, _ in shapes]
        t = max(arrive)  # the batch starts once every request is in
        token_times: list[list[float]] = [[] for _ in reqs]
        records = []
        while not all(r.finished for r in reqs):
            decodes = [i for i, r in enumerate(reqs) if r.in_decode]
            left = BUDGET - len(decodes)
            ctx_reqs = ctx_tokens = 0
            chunked = []
            for i, r in enumerate(reqs):
                if r.computed < r.prompt_len and left > 0:
                    n = min(r.prompt_len - r.computed, left)
                    left -= n
                    ctx_reqs += 1
                    ctx_tokens += n
                    chunked.append((i, r.computed + n == r.prompt_len))
            ms = forward_ms(ctx_tokens, len(decodes)) * (1 + self.rng.uniform(-self.noise, self.noise))
            record = ledger.step(IterationLine(self.iteration, ctx_reqs, ctx_tokens, len(decodes),
                                               len(decodes), ms, engine=0))
            assert record is not None, ledger.problem
            records.append(record)
            self.iteration += 1
            sampled = len(decodes) + sum(done for _, done in chunked)
            gap = (TRUE["step_s"] + TRUE["per_sampled_request_s"] * sampled + CPU_STEP_S
                   + CPU_PER_REQUEST_S * record.num_reqs) * (1 + self.rng.uniform(-self.noise, self.noise))
            t += ms / 1e3 + gap
            for i in decodes + [i for i, done in chunked if done]:
                token_times[i].append(t)
        timings = []
        for r, times, sent in zip(reqs, token_times, [t0] * len(reqs)):
            # Tokens several to a chunk: the chunk comes with its last token.
            chunks = tuple((times[min(k + self.merge, len(times)) - 1], min(k + self.merge, len(times)))
                           for k in range(0, len(times), self.merge))
            timings.append((r, StreamTiming(sent, chunks, times[-1] + 1e-3)))
        return records, timings, t


def profile_samples(noise: float, merge: int = 1, seed: int = 0) -> list[RequestSample]:
    """The samples of a small design: lone prompts of several lengths (some
    in chunks) and decode batches of several sizes."""
    rng = random.Random(seed)
    engine = Engine(rng, noise, merge)
    t = 0.0
    samples = []
    points: list[tuple[str, list[tuple[int, int]]]] = []
    for p in (8, 64, 256, 700, 1500, 2000):
        points += [(f"prefill-{p}", [(p, 1)])] * 2
    for b in (1, 2, 4, 8, 16, 32):
        points.append((f"decode-{b}x16", [(16, 24)] * b))
    for name, shapes in points:
        records, timings, t = engine.run(name, shapes, t + 0.5)
        steps = {s.iteration: s for s in records}
        for r, timing in timings:
            sample = request_sample(name, r, timing, steps, alone=len(shapes) == 1)
            assert sample is not None
            samples.append(sample)
    return samples


def check(fit: ServingFit, rel: float) -> None:
    for name, want in TRUE.items():
        assert getattr(fit, name) == pytest.approx(want, rel=rel), name


def test_the_fit_recovers_the_true_terms() -> None:
    fit = fit_serving(profile_samples(noise=0.0), CPU_STEP_S, CPU_PER_REQUEST_S)
    check(fit, 1e-6)
    assert fit.gap_median_abs_error < 1e-9 and fit.arrival_median_abs_error < 1e-9
    assert fit.gap_rows == 1 + 2 + 4 + 8 + 16 + 32 and fit.arrival_rows == 12 + 1


def test_tokens_merged_into_chunks_change_nothing() -> None:
    """A server behind on its output streams three tokens a chunk: the spans
    run chunk to chunk, so the per-step gap is the same."""
    samples = profile_samples(noise=0.0, merge=3)
    # Each span starts at the first chunk (tokens 1-3) and ends at the last (24).
    assert {s.span.steps for s in samples if s.point.startswith("decode-")} == {21}
    fit = fit_serving(samples, CPU_STEP_S, CPU_PER_REQUEST_S)
    check(fit, 1e-6)
    # The lone decode request's first chunk brought 3 tokens: its TTFT is not an arrival's.
    assert fit.arrival_rows == 12


def test_noise_and_a_stall() -> None:
    samples = profile_samples(noise=0.03, seed=3)
    # One request stalled 300 ms between two of its tokens (the shared machine).
    i = next(k for k, s in enumerate(samples) if s.point == "decode-4x16")
    samples[i] = dataclasses.replace(samples[i], span_s=samples[i].span_s + 0.3)
    fit = fit_serving(samples, CPU_STEP_S, CPU_PER_REQUEST_S)
    assert fit.gap_trimmed >= 1
    check(fit, 0.1)
    assert fit.gap_median_abs_error < 0.03


def test_the_simulations_own_cpu_time_is_netted_out() -> None:
    """Fitted net of other CPU terms, the host terms for this simulation's
    CPU time keep the measured gap whole."""
    fit = fit_serving(profile_samples(noise=0.0), 0.0, 0.0)
    host = fit.host_terms("0.32.0", "cpu", "p.json", CPU_STEP_S, CPU_PER_REQUEST_S)
    assert host.step_s == pytest.approx(TRUE["step_s"], rel=1e-6)
    assert host.per_sampled_request_s == pytest.approx(TRUE["per_sampled_request_s"], rel=1e-6)
    # (The CPU time per request of a prompt chunk that samples nothing moves it by a hair.)
    assert host.arrival_s == pytest.approx(TRUE["arrival_s"], rel=1e-3)
    assert "kvsched profile" in host.provenance


def test_too_few_requests_is_one_clear_line() -> None:
    samples = [s for s in profile_samples(noise=0.0) if not s.point.startswith("decode-")]
    with pytest.raises(UserInputError, match="decode span"):
        fit_serving(samples, CPU_STEP_S, CPU_PER_REQUEST_S, "step profile 'p.json'")
    samples = [s for s in profile_samples(noise=0.0) if not s.idle]
    with pytest.raises(UserInputError, match="idle server"):
        fit_serving(samples, CPU_STEP_S, CPU_PER_REQUEST_S)


def test_request_sample_needs_every_step_and_token() -> None:
    engine = Engine(random.Random(0), 0.0)
    records, timings, _ = engine.run("decode-2x16", [(16, 5), (16, 5)], 0.0)
    steps = {s.iteration: s for s in records}
    r, timing = timings[0]
    full = request_sample("decode-2x16", r, timing, steps, alone=False)
    assert full is not None and full.span.steps == 4 and not full.idle
    assert full.prefill.steps == 1 and full.prefill.reqs == 2
    # A step the ledger did not attribute, a token the stream lost: no sample.
    missing = {k: v for k, v in steps.items() if k != records[2].iteration}
    assert request_sample("decode-2x16", r, timing, missing, alone=False) is None
    short = StreamTiming(timing.sent_s, timing.chunks[:-1], timing.done_s)
    assert request_sample("decode-2x16", r, short, steps, alone=False) is None


def _sse(events: list[object]) -> Iterator[bytes]:
    for e in events:
        yield b"data: " + json.dumps(e).encode() + b"\n"
        yield b"\n"
    yield b"data: [DONE]\n"


def test_read_stream_counts_tokens_from_each_chunks_usage() -> None:
    def chunk(text: str, tokens: int) -> dict[str, object]:
        return {"choices": [{"text": text, "finish_reason": None}],
                "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
    events: list[object] = [chunk("a", 1), chunk("bcd", 4), chunk("", 4),
                            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}]
    chunks = read_stream(_sse(events), "test")
    assert [k for _, k in chunks] == [1, 4]
    assert chunks[0][0] <= chunks[1][0]
    # No usage per chunk: one token a chunk with text.
    plain = read_stream(_sse([{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}]), "test")
    assert [k for _, k in plain] == [1, 2]
    with pytest.raises(UserInputError, match="failed a streamed request"):
        read_stream(_sse([{"error": {"message": "boom"}}]), "test")
    with pytest.raises(UserInputError, match="not JSON"):
        read_stream(iter([b"data: {nope\n"]), "test")
