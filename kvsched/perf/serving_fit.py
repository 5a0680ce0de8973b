"""The serving path's cost, fitted to a profile's own streamed requests.

vLLM's iteration clock times the model's execution only. Everything around
it (the engine core's scheduling and output handling between iterations,
the API server's detokenisation and streaming, HTTP; on a CPU machine all
of it shares the cores with the model) reaches the user as the gap between
two streamed tokens beyond the logged step, and as the delay from the send
to the first step. ``kvsched profile`` streams its requests and records
when each token reached it (:class:`RequestSample`);
this module fits the host terms of :mod:`kvsched.perf.host` to them:

- **per-step gap**, from the decode points' requests: the client time over
  a span of pure-decode steps less their logged time (and less kvsched's
  own CPU time per step, ``RuntimeConfig.cpu_step_s + cpu_per_request_s x
  requests``, which the simulator adds to every step anyway) is
  ``step_s x steps + per_sampled_request_s x Σ requests sampling``;
- **arrival**, from the requests sent alone to an idle server: the time to
  the first token less the logged steps of its prompt and their gaps (the
  fit above) is ``arrival_s + per_prompt_token_s x prompt tokens``.

Both are non-negative least squares (SciPy's ``nnls``) made robust to the
stalls of a shared machine: a first fit through each designed point's
median row, then a fit over every row but those far off the first
(:data:`TRIM_MADS` robust deviations and :data:`TRIM_FLOOR` of the row's
client time). The
residual errors are kept with the terms: the relative error of each row's
predicted client time (a decode span's mean period between tokens; a
request's TTFT). The profile's requests send prompt token ids: the API
server's tokenisation of a text prompt is not in ``per_prompt_token_s``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, get_type_hints

import numpy as np
from numpy.typing import NDArray

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import field_mismatch
from kvsched.perf.host import MAX_TERM_S, HostTerms


@dataclass(frozen=True, slots=True)
class StepWindow:
    """A run of one request's logged steps, summed: how many, their logged
    (iteration clock) time, the requests sampling in them and the requests
    in them. The client's time over the same run, less these, is the
    serving path's (the fit below)."""

    steps: int
    elapsed_s: float
    sampled: int
    reqs: int


# No steps: a request without a pure-decode span.
NO_STEPS = StepWindow(0, 0.0, 0, 0)


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One streamed request of a profile: its client-side times against the
    logged steps that produced its tokens (what the serving path's terms,
    :mod:`kvsched.perf.serving_fit`, are fitted to).

    The *prefill* part: ``ttft_s`` from the client's send to the first
    streamed token, against ``prefill``, the steps that ran its prompt (its
    chunks; the last one samples the first token); ``idle``: it was sent
    alone to an idle server and ran alone in those steps, so nothing but its
    own path is in its TTFT. The *span* part (:data:`NO_STEPS`: none):
    ``span_s``, the client time between the chunk that brought token ``k``
    and the one that brought the last token, against ``span``, the steps
    that produced tokens ``k+1..N``, all of them pure decode (a chunk may
    carry several tokens when the server's output loop falls behind: the
    span runs from chunk to chunk, never between single tokens).
    """

    point: str
    prompt_tokens: int
    output_tokens: int
    idle: bool
    ttft_s: float
    prefill: StepWindow
    span_s: float = 0.0
    span: StepWindow = NO_STEPS

    def to_json(self) -> dict[str, Any]:
        """The sample as a profile file holds it (:data:`SAMPLE_KEYS`): flat,
        a window's figures under its field's name (``prefill_steps``,
        ``span_elapsed_s``), in declaration order."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _WINDOWS:
                out.update({f"{f.name}_{k}": v for k, v in asdict(value).items()})
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestSample:
        """The sample from its flat keys (their values checked by the
        reader, :mod:`kvsched.perf.step_profile`)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in _WINDOWS:
                values[f.name] = StepWindow(**{w.name: data[f"{f.name}_{w.name}"]
                                               for w in fields(StepWindow)})
            else:
                values[f.name] = data[f.name]
        return cls(**values)


def _windows() -> frozenset[str]:
    """The names of RequestSample's StepWindow fields (read off the
    annotations, so a window added to the declaration is flattened too)."""
    hints = get_type_hints(RequestSample)
    return frozenset(f.name for f in fields(RequestSample) if hints[f.name] is StepWindow)


# RequestSample's step windows: a file holds each flat, under its name.
_WINDOWS = _windows()


def _flat_keys() -> tuple[tuple[str, type], ...]:
    """Each key of a sample in a profile file and the type of its value,
    read off the declarations."""
    hints, window = get_type_hints(RequestSample), get_type_hints(StepWindow)
    keys: list[tuple[str, type]] = []
    for f in fields(RequestSample):
        if f.name in _WINDOWS:
            keys += [(f"{f.name}_{w.name}", window[w.name]) for w in fields(StepWindow)]
        else:
            keys.append((f.name, hints[f.name]))
    return tuple(keys)


# Every key of a sample as a profile file holds it, in order, with its type.
SAMPLE_KEYS = _flat_keys()


# Rows each fit needs (two terms each, plus a check on them).
MIN_GAP_ROWS = 4
MIN_ARRIVAL_ROWS = 4
# A row further from the first fit than this many robust deviations
# (1.4826 x the median absolute residual), and than this fraction of its
# own client time, is a stall, not the serving path.
TRIM_MADS = 5.0
TRIM_FLOOR = 0.1
# The designed points whose requests' spans measure the per-step gap.
GAP_POINT_PREFIX = "decode-"
SERVING_TERMS = ("step_s", "per_sampled_request_s", "arrival_s", "per_prompt_token_s")


@dataclass(frozen=True, slots=True)
class ServingFit:
    """The serving path's host terms (seconds; :mod:`kvsched.perf.host`'s
    meanings), kvsched's own CPU time per step they are net of, and how well
    they explain the requests they were fitted to."""

    step_s: float
    per_sampled_request_s: float
    arrival_s: float
    per_prompt_token_s: float
    # RuntimeConfig's CPU terms subtracted from each gap (the simulator adds
    # them to every step beside the host terms).
    cpu_step_s: float
    cpu_per_request_s: float
    gap_rows: int            # decode spans fitted (after trimming)
    gap_trimmed: int         # spans left out as stalls
    gap_median_abs_error: float   # relative, of the mean period between tokens
    gap_p90_abs_error: float
    gap_median_period_s: float    # the spans' median client period between tokens
    gap_median_elapsed_s: float   # ... and the logged step time in it
    arrival_rows: int
    arrival_trimmed: int
    arrival_median_abs_error: float  # relative, of the TTFT
    arrival_p90_abs_error: float

    def host_terms(self, vllm_version: str, hardware: str, source: str, cpu_step_s: float,
                   cpu_per_request_s: float) -> HostTerms:
        """The host terms a simulation adds beside its own CPU time
        ``cpu_step_s`` / ``cpu_per_request_s``: the measured gap stays the
        same total where the simulation's CPU terms differ from those this
        fit is net of (clamped at 0)."""
        return HostTerms(
            prefill_step_per_layer_s=0.0, vllm_version=vllm_version, hardware_class=hardware,
            provenance=f"serving path measured by kvsched profile ({source})",
            step_s=max(0.0, self.step_s + self.cpu_step_s - cpu_step_s),
            per_sampled_request_s=max(0.0, self.per_sampled_request_s + self.cpu_per_request_s
                                      - cpu_per_request_s),
            arrival_s=self.arrival_s, per_prompt_token_s=self.per_prompt_token_s)

    def describe(self) -> str:
        return (f"serving path: {1e3 * self.step_s:.2f} ms a step + "
                f"{1e3 * self.per_sampled_request_s:.3f} ms a streamed token (median |error| "
                f"{100 * self.gap_median_abs_error:.1f} % of the period between tokens, "
                f"{self.gap_rows} decode spans), arrival {1e3 * self.arrival_s:.2f} ms + "
                f"{1e6 * self.per_prompt_token_s:.2f} us a prompt token (median |error| "
                f"{100 * self.arrival_median_abs_error:.1f} % of TTFT, {self.arrival_rows} idle requests)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, where: str) -> ServingFit:
        """The fit a profile file holds, every field checked (``where``
        names the file; the error names the field, its value and the fix)."""
        fix = "write the profile again with kvsched profile (or set serving to null)"
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: serving={data!r}: must be an object; {fix}")
        fields = cls.__dataclass_fields__
        if mismatch := field_mismatch(data, set(fields)):
            raise UserInputError(f"{where}: serving: {mismatch}; {fix}")
        values: dict[str, Any] = {}
        for name in fields:
            v = data[name]
            if name in ("gap_rows", "gap_trimmed", "arrival_rows", "arrival_trimmed"):
                if not is_int(v) or v < 0:
                    raise UserInputError(f"{where}: serving.{name}={v!r}: must be an integer >= 0; {fix}")
            elif not is_number(v) or not math.isfinite(v) or v < 0 \
                    or (name in (*SERVING_TERMS, "cpu_step_s", "cpu_per_request_s") and v > MAX_TERM_S):
                raise UserInputError(f"{where}: serving.{name}={v!r}: must be a number >= 0 (seconds, at "
                                     f"most {MAX_TERM_S:g} for a term); {fix}")
            values[name] = v if name.endswith(("rows", "trimmed")) else float(v)
        return cls(**values)


def _nnls(X: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Non-negative least squares, columns scaled to unit maximum for the
    solver's conditioning."""
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    # Imported here, as in profile_fit: only a fit needs SciPy (no stubs).
    from scipy.optimize import nnls  # type: ignore[import-untyped, unused-ignore]

    coef, _ = nnls(X / scale, y, maxiter=50 * X.shape[1])
    result: NDArray[np.float64] = coef / scale
    return result


def _trimmed_fit(X: NDArray[np.float64], y: NDArray[np.float64], groups: Sequence[str],
                 size: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """A fit robust to stalls, and the rows it kept. First through each
    group's (designed point's) median row: the requests of a point run in
    lockstep, so a stall of one is out-voted. Then over every row but those
    off that fit by more than TRIM_MADS robust deviations and more than
    TRIM_FLOOR of the row's own ``size`` (its client time: lockstep rows
    agree so closely that their deviation alone is no scale)."""
    names = sorted(set(groups))
    g = np.array(groups)
    Xm = np.array([np.median(X[g == name], axis=0) for name in names])
    ym = np.array([np.median(y[g == name]) for name in names])
    coef = _nnls(Xm, ym)
    res = y - X @ coef
    mad = float(np.median(np.abs(res - np.median(res))))
    keep = np.abs(res) <= np.maximum(TRIM_MADS * 1.4826 * mad, TRIM_FLOOR * size)
    if keep.sum() < X.shape[1] + 1:
        keep = np.ones(len(y), dtype=bool)
    return _nnls(X[keep], y[keep]), keep


def _errors(rel: NDArray[np.float64]) -> tuple[float, float]:
    a = np.abs(rel)
    return float(np.median(a)), float(np.percentile(a, 90))


def fit_serving(samples: Sequence[RequestSample], cpu_step_s: float, cpu_per_request_s: float,
                where: str = "step profile") -> ServingFit:
    """Fit the serving path's terms to a profile's streamed requests (see
    the module). Raises :class:`UserInputError` naming what is missing when
    the requests cannot pin the terms down (a profile cut short)."""
    spans = [s for s in samples if s.point.startswith(GAP_POINT_PREFIX) and s.span.steps > 0]
    batches = {round(s.span.sampled / s.span.steps) for s in spans}
    if len(spans) < MIN_GAP_ROWS or len(batches) < 2:
        raise UserInputError(f"{where}: {len(spans)} decode span(s) at {len(batches)} batch size(s) "
                             f"streamed; the serving path's per-step gap needs {MIN_GAP_ROWS} at 2 sizes "
                             "or more (run kvsched profile to the end: its decode points give them)")
    n = np.array([s.span.steps for s in spans], dtype=np.float64)
    # Per row: the mean gap of a step in the span (seconds), net of the
    # logged step time and kvsched's own CPU time.
    gap = np.array([s.span_s - s.span.elapsed_s - cpu_step_s * s.span.steps
                    - cpu_per_request_s * s.span.reqs for s in spans]) / n
    X = np.column_stack([np.ones_like(n), np.array([s.span.sampled for s in spans]) / n])
    period = np.array([s.span_s for s in spans]) / n
    gcoef, gkeep = _trimmed_fit(X, gap, [s.point for s in spans], period)
    g_med, g_p90 = _errors((X @ gcoef - gap) / period)
    step_s, per_sampled = float(gcoef[0]), float(gcoef[1])

    idle = [s for s in samples if s.idle and s.point != "warmup" and s.prefill.steps > 0]
    if len(idle) < MIN_ARRIVAL_ROWS:
        raise UserInputError(f"{where}: {len(idle)} request(s) sent alone to an idle server; the arrival "
                             f"delay needs {MIN_ARRIVAL_ROWS} or more (run kvsched profile to the end: its "
                             "prefill points give them)")
    # Each prompt step's gap as the simulator prices it: host terms plus its own CPU time.
    arrival = np.array([s.ttft_s - s.prefill.elapsed_s
                        - (step_s + cpu_step_s) * s.prefill.steps - per_sampled * s.prefill.sampled
                        - cpu_per_request_s * s.prefill.reqs for s in idle])
    A = np.column_stack([np.ones(len(idle)), np.array([s.prompt_tokens for s in idle], dtype=np.float64)])
    ttft = np.array([s.ttft_s for s in idle])
    acoef, akeep = _trimmed_fit(A, arrival, [s.point for s in idle], ttft)
    a_med, a_p90 = _errors((A @ acoef - arrival) / ttft)
    return ServingFit(
        step_s=step_s, per_sampled_request_s=per_sampled, arrival_s=float(acoef[0]),
        per_prompt_token_s=float(acoef[1]), cpu_step_s=cpu_step_s, cpu_per_request_s=cpu_per_request_s,
        gap_rows=int(gkeep.sum()), gap_trimmed=int((~gkeep).sum()), gap_median_abs_error=g_med,
        gap_p90_abs_error=g_p90, gap_median_period_s=float(np.median(period)),
        gap_median_elapsed_s=float(np.median([s.span.elapsed_s / s.span.steps for s in spans])),
        arrival_rows=int(akeep.sum()), arrival_trimmed=int((~akeep).sum()),
        arrival_median_abs_error=a_med, arrival_p90_abs_error=a_p90)
