"""A step's cost from the work it does, fitted to a step profile.

The model is linear in the work of the step, each term a cost per unit of
something the forward pass does (all non-negative, so the fit is a
non-negative least squares):

- ``step_s``: a fixed cost per step (kernel launches, input preparation,
  the sampler's setup);
- ``per_token_s``: every scheduled token goes through every GEMM of every
  layer;
- ``per_request_s``: per scheduled request (metadata, per-sequence kernels);
- ``per_sampled_s``: per row of logits (the LM head and the sampler run for
  the requests that sample only);
- ``per_prefill_pair_s``: prefill attention, per (query token x context
  token) pair, causal: Σ (n·c + n(n+1)/2) over the chunks;
- ``per_decode_kv_s``: decode attention, per context token read:
  Σ (c + 1) over the decodes;
- ``step_1_token_s`` ... ``step_4_tokens_s``: what a step of exactly 1, 2,
  3 or 4 tokens costs beyond the line through the larger steps. The
  smallest batches do not lie on it: a GEMM of one or two rows takes
  another kernel path (on vLLM's CPU build 1-2-token decodes took 14-17 ms
  where 4 tokens took 9 ms, 2026-12-05: a line under-priced them 23-40 %),
  and a GPU's CUDA graphs pad a batch of 3 to the graph captured for 4.
  Decode points of 1 to 4 requests give each its steps; a term the profile
  has no step for stays 0.

The fit minimises the squared *relative* error of each step (each row
weighted by 1 / its time), so a 5 ms decode counts as much as an 80 ms
prefill. Its error is judged by leaving out each step in turn (and each
designed point in turn: its steps share a shape, so leaving out one step of
a repeated decode is an easy test; leaving out the whole point is not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from kvsched.errors import UserInputError
from kvsched.perf.step_profile import StepRecord

# The steps with a cost of their own: 1 to SMALL_STEP_TOKENS tokens.
SMALL_STEP_TOKENS = 4
SMALL_STEP_TERMS = ("step_1_token_s", "step_2_tokens_s", "step_3_tokens_s", "step_4_tokens_s")
TERMS = ("step_s", "per_token_s", "per_request_s", "per_sampled_s", "per_prefill_pair_s", "per_decode_kv_s",
         *SMALL_STEP_TERMS)
# Fewer steps than this cannot pin the terms down with any held-out check.
MIN_FIT_STEPS = 12


def small_step_index(num_tokens: int) -> int:
    """Which of :data:`SMALL_STEP_TERMS` a step of ``num_tokens`` pays (-1:
    none)."""
    return num_tokens - 1 if 1 <= num_tokens <= SMALL_STEP_TOKENS else -1


def work_of(step: StepRecord) -> tuple[int, ...]:
    """A step's work in the order of :data:`TERMS` (the one owner of which
    aggregate each term multiplies)."""
    small = [0] * SMALL_STEP_TOKENS
    if (i := small_step_index(step.num_tokens)) >= 0:
        small[i] = 1
    return (1, step.num_tokens, step.num_reqs, step.num_sampled, step.prefill_attn_pairs,
            step.decode_kv_tokens, *small)


@dataclass(frozen=True, slots=True)
class ProfiledRange:
    """The largest step the profile holds, per aggregate: a step past any of
    them is priced by extrapolation (and counted)."""

    num_tokens: int
    num_reqs: int
    prefill_attn_pairs: int
    decode_kv_tokens: int

    def past(self, num_tokens: int, num_reqs: int, prefill_attn_pairs: int,
             decode_kv_tokens: int) -> list[str]:
        """The aggregates of a step past the profiled range, by name."""
        out = []
        if num_tokens > self.num_tokens:
            out.append("tokens")
        if num_reqs > self.num_reqs:
            out.append("requests")
        if prefill_attn_pairs > self.prefill_attn_pairs:
            out.append("prefill attention pairs")
        if decode_kv_tokens > self.decode_kv_tokens:
            out.append("decode KV tokens")
        return out


@dataclass(frozen=True, slots=True)
class ProfileFit:
    """Fitted step-cost terms (seconds per unit of :data:`TERMS`), the
    fit's in-sample and held-out relative errors, and the range it saw."""

    terms: dict[str, float]
    num_steps: int
    num_points: int
    fit_median_abs_error: float
    loo_median_abs_error: float
    loo_p90_abs_error: float
    lopo_median_abs_error: float | None  # None: one point only
    range: ProfiledRange

    def predict(self, work: Sequence[int]) -> float:
        """Seconds of a step with this work (:func:`work_of`'s order)."""
        t = 0.0
        for coef, x in zip(self.terms.values(), work):
            t += coef * x
        return t

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.num_steps} steps of {self.num_points} points; leave-one-out median |error| "
                f"{100 * self.loo_median_abs_error:.1f} % (p90 {100 * self.loo_p90_abs_error:.1f} %)"
                + (f", leave-one-point-out {100 * self.lopo_median_abs_error:.1f} %"
                   if self.lopo_median_abs_error is not None else ""))


def _solve(X: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Non-negative least squares of relative error: rows weighted by 1/y,
    columns scaled to unit maximum for the solver's conditioning."""
    W = X / y[:, None]
    scale = np.abs(W).max(axis=0)
    scale[scale == 0] = 1.0
    # Imported here: SciPy costs ~50 MB and half a second, and every
    # simulation imports this module (through the profiled backend) while
    # only a fit needs it. SciPy ships no type stubs.
    from scipy.optimize import nnls  # type: ignore[import-untyped, unused-ignore]

    coef, _ = nnls(W / scale, np.ones_like(y), maxiter=50 * X.shape[1])
    result: NDArray[np.float64] = coef / scale
    return result


def fit_steps(steps: Sequence[StepRecord], where: str = "step profile") -> ProfileFit:
    """Fit :data:`TERMS` to ``steps`` (warm-ups already left out) and judge
    the fit by leave-one-out (each step) and leave-one-point-out."""
    if len(steps) < MIN_FIT_STEPS:
        raise UserInputError(f"{where}: {len(steps)} step(s) to fit, fewer than {MIN_FIT_STEPS}; profile "
                             "more points (run kvsched profile to the end, or with --resume)")
    X = np.array([work_of(s) for s in steps], dtype=np.float64)
    y = np.array([s.elapsed_ms / 1e3 for s in steps], dtype=np.float64)
    coef = _solve(X, y)
    fit_err = np.abs(X @ coef / y - 1.0)
    n = len(steps)
    loo = np.empty(n)
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        keep[i] = False
        c = _solve(X[keep], y[keep])
        loo[i] = abs(float(X[i] @ c) / y[i] - 1.0)
        keep[i] = True
    points = sorted({s.point for s in steps})
    names = np.array([s.point for s in steps])
    lopo = np.empty(n)
    for p in points:
        out = names == p
        if out.all():
            lopo[out] = np.nan
            continue
        c = _solve(X[~out], y[~out])
        lopo[out] = np.abs(X[out] @ c / y[out] - 1.0)
    lopo_ok = lopo[~np.isnan(lopo)]
    rng = ProfiledRange(int(X[:, 1].max()), int(X[:, 2].max()), int(X[:, 4].max()), int(X[:, 5].max()))
    return ProfileFit(
        terms={name: float(c) for name, c in zip(TERMS, coef)},
        num_steps=n, num_points=len(points),
        fit_median_abs_error=float(np.median(fit_err)),
        loo_median_abs_error=float(np.median(loo)),
        loo_p90_abs_error=float(np.percentile(loo, 90)),
        lopo_median_abs_error=float(np.median(lopo_ok)) if lopo_ok.size else None,
        range=rng)
