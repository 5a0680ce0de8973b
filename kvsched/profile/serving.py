"""A streamed request's client-side times, set against its logged steps.

The profile streams every request (``stream: true`` on
``/v1/completions``) and notes when each chunk that carried tokens reached
it (:class:`StreamTiming`). With the steps the ledger
(:mod:`.attribution`) says ran the request's prompt and sampled each of its
tokens, :func:`request_sample` makes the
:class:`~kvsched.perf.serving_fit.RequestSample` the serving path's fit
(:mod:`kvsched.perf.serving_fit`) reads:

- its TTFT against its prompt's steps (``idle`` where it was sent alone to
  an idle server and ran alone in them);
- the client time between two of its chunks against the pure-decode steps
  that produced the tokens between them. A CPU server's output loop may
  fall behind and stream several tokens in one chunk; a chunk's time is
  then its last token's, and the span runs from the first chunk at or past
  the request's last non-decode step to its last chunk (never a single
  gap between tokens, which a merged chunk makes zero).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvsched.perf.serving_fit import RequestSample, StepWindow
from kvsched.perf.step_profile import StepRecord
from kvsched.profile.attribution import SentRequest


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """One streamed completion as the client saw it (seconds on one
    monotonic clock): the send, each chunk that carried output tokens with
    the tokens received so far, and the end of the response."""

    sent_s: float
    chunks: tuple[tuple[float, int], ...]
    done_s: float

    @property
    def tokens(self) -> int:
        return self.chunks[-1][1] if self.chunks else 0


def window(steps: Sequence[StepRecord]) -> StepWindow:
    """The logged steps ``steps`` summed, as a sample sets a client time against them."""
    return StepWindow(steps=len(steps), elapsed_s=sum(s.elapsed_ms for s in steps) / 1e3,
                      sampled=sum(s.num_sampled for s in steps), reqs=sum(s.num_reqs for s in steps))


def request_sample(point: str, request: SentRequest, timing: StreamTiming,
                   steps: Mapping[int, StepRecord], alone: bool) -> RequestSample | None:
    """The request's sample, or None where its steps or tokens are not all
    known (the ledger stopped explaining the point, a chunk went missing).
    ``steps``: the point's attributed steps by iteration; ``alone``: nothing
    else was in flight when it was sent."""
    n = request.max_tokens
    if not timing.chunks or timing.tokens != n or len(request.token_steps) != n or not request.chunk_steps:
        return None
    if any(it not in steps for it in (*request.chunk_steps, *request.token_steps)):
        return None
    prefill = [steps[it] for it in request.chunk_steps]
    first_t, first_tokens = timing.chunks[0]
    # Idle: sent alone, its first chunk its first token only, and no other
    # request in its prompt's steps.
    idle = alone and first_tokens == 1 and all(s.num_reqs == 1 for s in prefill)
    sample = RequestSample(point=point, prompt_tokens=request.prompt_len, output_tokens=n, idle=idle,
                           ttft_s=max(0.0, first_t - timing.sent_s), prefill=window(prefill))
    # Token j (1-based) came from token_steps[j-1]. The span starts at the
    # first chunk whose tokens reach past every token of a step with prompt
    # work: the steps after it are pure decode.
    last_mixed = max((j for j, it in enumerate(request.token_steps, 1) if steps[it].context_requests),
                     default=0)
    start = next(((t, k) for t, k in timing.chunks if k >= last_mixed), None)
    if start is None or start[1] >= n:
        return sample
    t1, k1 = start
    tn = timing.chunks[-1][0]
    span = [steps[it] for it in request.token_steps[k1:]]
    if len(span) < 2 or tn <= t1:
        return sample
    return dataclasses.replace(sample, span_s=tn - t1, span=window(span))
