"""``kvsched calibrate``: fit the measured backend's host terms to real runs.

The measured step-time backend prices kernels from tables; the host time
around them is a handful of named terms (:mod:`kvsched.perf.host`). This
module fits those terms for one deployment (given as ``kvsched simulate``'s
engine flags) to serving runs of it, and writes a file that ``simulate`` and
``compare`` take with ``--calibration FILE``.

A run is read from

* a ``vllm bench serve --save-result --save-detailed`` JSON (``--bench``):
  the per-request ``input_lens``, ``output_lens``, ``ttfts``, ``itls`` (or
  ``latencies``) and ``errors``, with ``request_rate``, ``burstiness`` and
  ``max_concurrency``; ``kvsched simulate --save-result --save-detailed``
  writes the same keys. A file without the per-request times (``ttfts``,
  ``itls``) but with the lengths is fitted on its ``mean_ttft_ms`` and
  ``mean_tpot_ms`` only;
* a JSON-lines file (``--requests``), one request per line:
  ``arrival_time`` (when the client sent it, seconds on any clock),
  ``first_token_time`` and ``last_token_time`` (same clock),
  ``prompt_tokens``, ``output_tokens``; optional ``model`` (checked against
  the deployment) and ``error`` (non-empty: the request failed, left out).

Each run is replayed as it ran (:func:`workload_of`): its requests in order
with their lengths; ``request_rate: inf`` all due at 0 with the file's
``max_concurrency`` in flight (closed loop); a JSONL's or a bench file's
``start_times`` (vLLM writes the send times with ``--save-detailed``) as
exact send times; otherwise vllm bench serve's own arrival draw (gamma gaps
from ``np.random.seed(seed)``, rescaled to end at ``n / rate``), which is
deterministic given the run's ``--seed``: the file's ``seed`` key (or
kvsched's ``workload.seed``) or ``--seed`` (default 0, vLLM's default).

The loss (:func:`loss_residuals`) is a sum over runs of the mean squared
relative error of the mean TTFT of each group of requests of similar prompt
length, and of the mean TPOT (time per output token after the first: the
request's mean ITL, from its first and last token times, so streamed chunks
of several tokens do not matter) of each group of similar output length;
every run and metric weighs the same, and a file without per-request times
contributes the relative errors of its two means. Groups, not single
requests: a replayed request's TTFT jumps by a whole step when a term moves
its arrival across a step's start, so a per-request loss is a staircase
(measured: Gauss-Newton stalls on it, terms up to 2x off) while a group's
mean moves smoothly. The per-request errors are still what the report
prints. Each evaluation is one deterministic simulation per run, so the
minimiser is a deterministic bounded Levenberg-Marquardt
(:func:`levenberg_marquardt`, central differences): the terms enter the
latencies nearly linearly, and a term never goes below 0.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.jsonfile import DuplicateKeyError, json_problem, strict_loads
from kvsched.perf.host import DEFAULT_FILE, TERMS, HostTerms, load_host_terms, save_host_terms
from kvsched.perf.measured import MeasuredStepTimeModel
from kvsched.perf.models import catalog_match
from kvsched.sim.deployment import Deployment
from kvsched.sim.simulator import SimConfig, SimResult
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest, arrival_times_of_rate

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# How each term is printed (unit, factor from seconds) and its typical size,
# the optimiser's unit for it: one unit moves a run's latencies by a
# comparable, small amount whichever the term.
TERM_UNITS: Mapping[str, tuple[str, float]] = {
    "prefill_step_per_layer_s": ("ms", 1e3), "step_s": ("ms", 1e3),
    "per_sampled_request_s": ("us", 1e6), "dp_sync_s": ("ms", 1e3),
    "arrival_s": ("ms", 1e3), "per_prompt_token_s": ("us", 1e6)}
TERM_SCALES: Mapping[str, float] = {
    "prefill_step_per_layer_s": 1e-4, "step_s": 1e-4, "per_sampled_request_s": 2e-6,
    "dp_sync_s": 1e-4, "arrival_s": 1e-3, "per_prompt_token_s": 1e-6}
# What a term means, one line each, for the summary.
TERM_MEANING: Mapping[str, str] = {
    "prefill_step_per_layer_s": "per model layer, per step with prefill tokens",
    "step_s": "per engine step",
    "per_sampled_request_s": "per request sampling in a step",
    "dp_sync_s": "per step, data parallel ranks' sync",
    "arrival_s": "per request, send to scheduler",
    "per_prompt_token_s": "per prompt token, at arrival (tokenisation)"}

DEFAULT_OUTPUT = "calibration.json"
DEFAULT_MAX_ITERATIONS = 20
# Requests are grouped by length in the loss (see loss_residuals): this many
# groups per run and metric at most, of MIN_GROUP requests at least.
DEFAULT_GROUPS = 8
MIN_GROUP = 20
# vllm bench serve's --seed default: its arrival gaps come from numpy's global
# RandomState after np.random.seed(seed).
VLLM_DEFAULT_SEED = 0
# The per-request lists whose presence makes a bench file "detailed".
_TIME_LISTS = ("ttfts", "itls", "latencies")
REQUEST_FIELDS = ("arrival_time", "first_token_time", "last_token_time", "prompt_tokens", "output_tokens")
# Bounds on the numbers read from a run's file, checked before anything is
# built from them; each is far above any real run:
# - a prompt or output length: 2**24 tokens (16.7M), above the longest
#   context any model ships (10M);
LENGTH_LIMIT = 2**24
# - a duration (a TTFT, a gap between tokens, a request's time, the span of
#   the sends): 10**6 s, 11.6 days (vllm bench serve runs last minutes); the
#   replay simulates the whole span, so it bounds the simulation too;
DURATION_LIMIT = 1e6
# - a clock reading (arrival_time, start_times: seconds on any clock; Unix
#   time is 1.8e9): 1e11 s, the year 5138, keeps differences exact to 10 us;
CLOCK_LIMIT = 1e11
# - burstiness (vllm bench serve's gamma shape; 1 is Poisson, "inf" a
#   fixed gap): within [1e-6, 1e6], where numpy's gamma draw is well defined;
BURSTINESS_RANGE = (1e-6, 1e6)
# - max_concurrency: 2**31 - 1; a seed: numpy's, [0, 2**32).
CONCURRENCY_LIMIT = 2**31 - 1
SEED_LIMIT = 2**32


# --------------------------------------------------------------------------
# Observed runs


@dataclass(frozen=True, slots=True)
class ObservedRun:
    """One serving run, as measured: the completed requests in send order
    (their lengths and when each was due at the client), and what the client
    saw. Per-request ``ttfts``/``tpots`` (seconds; a tpot is None for a
    one-token output) or, for a summary-only file, the two means."""

    source: str                    # the file, for messages
    model_id: str | None           # None: the file names no model
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    arrivals: tuple[float, ...]    # seconds from the run's start, due at the client
    max_concurrency: int | None
    arrivals_note: str             # how the arrival times were reconstructed
    ttfts: tuple[float, ...] | None = None
    tpots: tuple[float | None, ...] | None = None
    mean_ttft_s: float | None = None
    mean_tpot_s: float | None = None
    failed: int = 0                # failed requests in the file, left out
    hardware: str | None = None    # kvsched's own files name it

    @property
    def per_request(self) -> bool:
        return self.ttfts is not None

    def describe(self) -> str:
        kind = "per-request" if self.per_request else "means only"
        failed = f", {self.failed} failed left out" if self.failed else ""
        return f"{self.source}: {len(self.input_lens)} requests ({kind}{failed}), {self.arrivals_note}"


def _where(source: str, key: str) -> str:
    return f"{source}: {key}"


def _show(value: object) -> str:
    """A value for a one-line message: a huge integer by its size, a long
    list or text cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**24:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value) if not isinstance(value, list | dict) else repr(value)[:80]
    text = text.replace("\n", "\\n")
    return text if len(text) <= 60 else text[:57] + "..."


def _number(source: str, key: str, value: object, *, minimum: float | None = None,
            positive: bool = False, maximum: float | None = None) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value if isinstance(value, float) else 0.0)
            or (isinstance(value, int) and abs(value) > 10**300)):
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be a finite number")
    if positive and not value > 0:
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be > 0")
    if minimum is not None and value < minimum:
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be <= {maximum:g} (an absurd "
                         "value for a serving run; check the file)")
    return float(value)


def _count(source: str, key: str, value: object, minimum: int, maximum: int = LENGTH_LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be an integer in "
                         f"[{minimum}, {maximum}]")
    return value


def _seconds(source: str, key: str, value: object, *, positive: bool = False) -> float:
    """A duration in seconds: finite, >= 0 (> 0 if ``positive``), at most
    DURATION_LIMIT."""
    return _number(source, key, value, minimum=0.0, positive=positive, maximum=DURATION_LIMIT)


def _clock(source: str, key: str, value: object) -> float:
    """A clock reading in seconds (any clock): finite, |t| <= CLOCK_LIMIT."""
    t = _number(source, key, value)
    if abs(t) > CLOCK_LIMIT:
        raise ValueError(f"{_where(source, key)}={_show(value)}: must be within +-{CLOCK_LIMIT:g} s "
                         "(seconds on any clock; Unix time is 1.8e9)")
    return t


def _check_span(source: str, what: str, span: float) -> None:
    if span > DURATION_LIMIT:
        raise ValueError(f"{source}: {what} span {span:g} s, more than {DURATION_LIMIT:g} s (11.6 "
                         "days); a serving run is minutes or hours: check the file's times")


def _list(source: str, data: Mapping[str, Any], key: str, n: int | None) -> list[Any]:
    value = data[key]
    if not isinstance(value, list):
        raise ValueError(f"{_where(source, key)}: must be a list (one entry per request), "
                         f"got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise ValueError(f"{_where(source, key)}: {len(value)} entries but input_lens has {n}; "
                         "the per-request lists must have one entry per request")
    return value


def _request_rate(source: str, value: object) -> float:
    # vLLM writes an unlimited rate as the string "inf".
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if value is None:
        raise ValueError(f"{source}: request_rate is null (a trace replay): its send times are not in "
                         "the file; give the run as --requests FILE.jsonl with each request's "
                         "arrival_time")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return math.inf  # Python's json reads the literal Infinity
    return _number(source, "request_rate", value, positive=True)


def _file_seed(data: Mapping[str, Any], source: str) -> int | None:
    """The run's --seed when the file records it: a ``seed`` key (vllm bench
    serve --metadata seed=S) or kvsched's ``workload.seed``. A recorded seed
    that is not one is an error, not ignored."""
    key, seed = "seed", data.get("seed")
    workload = data.get("workload")
    if seed is None and isinstance(workload, Mapping):
        key, seed = "workload.seed", workload.get("seed")
    if seed is None:
        return None
    if isinstance(seed, str) and seed.strip().isdigit() and len(seed.strip()) <= 12:
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{_where(source, key)}={_show(seed)}: must be the run's --seed, an integer in "
                         f"[0, 2**32); fix it or remove the key and pass --seed")
    return seed


def parse_bench(data: object, source: str, *, seed: int = VLLM_DEFAULT_SEED) -> ObservedRun:
    """A ``vllm bench serve`` result (or ``kvsched simulate``'s) as a run;
    ``seed`` is the run's ``--seed`` when the file does not record it."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object (vllm bench serve --save-result's file), "
                         f"got {type(data).__name__}")
    model_id = data.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"{source}: model_id={model_id!r}: the file must name its model (vllm bench "
                         "serve writes model_id); add it")
    missing = [k for k in ("input_lens", "output_lens") if k not in data]
    if missing:
        raise ValueError(f"{source}: no {' or '.join(missing)}: the request lengths are written by "
                         "vllm bench serve --save-result --save-detailed; rerun with --save-detailed")
    if data.get("ramp_up_strategy"):
        raise ValueError(f"{source}: ramp_up_strategy={data['ramp_up_strategy']!r}: ramp-up runs are "
                         "not replayed; calibrate on fixed-rate or fixed-concurrency runs")
    inputs = _list(source, data, "input_lens", None)
    n = len(inputs)
    if not n:
        raise ValueError(f"{source}: input_lens is empty; the run has no requests")
    outputs = _list(source, data, "output_lens", n)
    errors = _list(source, data, "errors", n) if "errors" in data else [""] * n
    ok = [not e for e in errors]
    if not any(ok):
        raise ValueError(f"{source}: every request failed (errors); nothing to calibrate on")
    if "request_rate" not in data:
        raise ValueError(f"{source}: no request_rate (vllm bench serve writes it; \"inf\" for all at "
                         "once)")
    rate = _request_rate(source, data["request_rate"])
    concurrency = data.get("max_concurrency")
    if concurrency is not None:
        concurrency = _count(source, "max_concurrency", concurrency, 1, CONCURRENCY_LIMIT)
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, str) and burstiness.strip().lower() == "inf":
        burstiness = math.inf
    if not (isinstance(burstiness, float) and burstiness == math.inf):
        burstiness = _number(source, "burstiness", burstiness, minimum=BURSTINESS_RANGE[0],
                             maximum=BURSTINESS_RANGE[1])
    # Every entry typed, failed requests' too (their lengths may be 0).
    for key, values in (("input_lens", inputs), ("output_lens", outputs)):
        for i, v in enumerate(values):
            _count(source, f"{key}[{i}]", v, 1 if ok[i] else 0)
    for i, e in enumerate(errors):
        if e is not None and not isinstance(e, str):
            raise ValueError(f"{_where(source, f'errors[{i}]')}={_show(e)}: must be the request's error "
                             "text (\"\" when it succeeded)")

    # When each request was due at the client (all n, failed ones included:
    # the arrival draw counts them).
    if math.isinf(rate) and concurrency is not None:
        # A closed loop is replayed as a closed loop, whatever start_times
        # say: its sends follow its completions, which the simulator must
        # produce itself (fixed send times would freeze the measured ones).
        due = [0.0] * n
        note = f"closed loop: all due at 0, {concurrency} in flight"
    elif "start_times" in data:
        # A failed request's send may be unrecorded (null); it is left out.
        starts = [_clock(source, f"start_times[{i}]", v) if ok[i] or v is not None else 0.0
                  for i, v in enumerate(_list(source, data, "start_times", n))]
        kept = [s for s, good in zip(starts, ok) if good]
        t0 = min(kept)
        _check_span(source, "start_times", max(kept) - t0)
        # The actual send times: replayed as they were sent.
        due = [s - t0 for s in starts]
        note = "sent at the file's start_times"
        concurrency = None
    elif math.isinf(rate):
        due = [0.0] * n
        note = (f"closed loop: all due at 0, {concurrency} in flight" if concurrency is not None
                else "all sent at 0")
    else:
        recorded = _file_seed(data, source)
        used = seed if recorded is None else recorded
        workload = data.get("workload")
        scale = 1.0
        if isinstance(workload, Mapping) and "time_scale" in workload:
            scale = _number(source, "workload.time_scale", workload["time_scale"], positive=True)
        # vllm bench serve's draw ends at n / rate.
        _check_span(source, f"the arrival draw ({n} requests at {rate:g} req/s)", n / rate * scale)
        due = arrival_times_of_rate(n, rate, float(burstiness), used)
        if scale != 1.0:
            due = [t * scale for t in due]
        origin = "the file's" if recorded is not None else "--seed, not in the file:"
        note = (f"vllm bench serve's arrival draw at {rate:g} req/s, burstiness {burstiness:g}, "
                f"{origin} seed {used}"
                + (f", {concurrency} in flight at most" if concurrency is not None else ""))

    keep = [i for i in range(n) if ok[i]]
    input_lens = tuple(_count(source, f"input_lens[{i}]", inputs[i], 1) for i in keep)
    output_lens = tuple(_count(source, f"output_lens[{i}]", outputs[i], 1) for i in keep)
    arrivals = tuple(max(0.0, due[i]) for i in keep)
    common: dict[str, Any] = dict(source=source, model_id=model_id, input_lens=input_lens,
                                  output_lens=output_lens, arrivals=arrivals,
                                  max_concurrency=concurrency, arrivals_note=note,
                                  failed=n - len(keep),
                                  hardware=_hardware(source, data.get("hardware")))
    if "ttfts" not in data:
        present = [k for k in _TIME_LISTS if k in data]
        if present:
            raise ValueError(f"{source}: has {', '.join(present)} but no ttfts: the per-request lists "
                             "are incomplete; save the run again with --save-detailed")
        means = {}
        for key in ("mean_ttft_ms", "mean_tpot_ms"):
            if key not in data or data[key] is None:
                raise ValueError(f"{source}: no ttfts and no {key}: give the per-request lists "
                                 "(vllm bench serve --save-detailed) or at least the run's means")
            means[key] = _number(source, key, data[key], positive=True,
                                 maximum=DURATION_LIMIT * 1e3) / 1e3
        return ObservedRun(**common, mean_ttft_s=means["mean_ttft_ms"], mean_tpot_s=means["mean_tpot_ms"])
    ttft_list = _list(source, data, "ttfts", n)
    ttfts = tuple(_seconds(source, f"ttfts[{i}]", ttft_list[i], positive=True) for i in keep)
    tpots: list[float | None] = []
    if "itls" in data or "latencies" in data:
        key = "itls" if "itls" in data else "latencies"
        values = _list(source, data, key, n)
        for j, i in enumerate(keep):
            out = output_lens[j]
            if out < 2:
                tpots.append(None)
                continue
            if key == "itls":
                gaps = values[i]
                if not isinstance(gaps, list) or not gaps:
                    raise ValueError(f"{_where(source, f'itls[{i}]')}={gaps!r}: a completed request "
                                     f"of {out} output tokens needs its list of inter-token gaps")
                span = sum(_seconds(source, f"itls[{i}]", g) for g in gaps)
                if span > DURATION_LIMIT:
                    _check_span(source, f"itls[{i}]", span)
            else:
                latency = _seconds(source, f"latencies[{i}]", values[i], positive=True)
                if latency < ttfts[j]:
                    raise ValueError(f"{_where(source, f'latencies[{i}]')}={latency!r}: below the "
                                     f"request's ttft {ttfts[j]!r}; a latency is the whole request's "
                                     "time (seconds)")
                span = latency - ttfts[j]
            tpots.append(span / (out - 1))
        return ObservedRun(**common, ttfts=ttfts, tpots=tuple(tpots))
    # TTFTs per request, TPOT as the run's mean only.
    if data.get("mean_tpot_ms") is None:
        raise ValueError(f"{source}: ttfts but neither itls, latencies nor mean_tpot_ms: nothing "
                         "gives the time per output token; save the run with --save-detailed")
    return ObservedRun(**common, ttfts=ttfts,
                       mean_tpot_s=_number(source, "mean_tpot_ms", data["mean_tpot_ms"], positive=True,
                                           maximum=DURATION_LIMIT * 1e3) / 1e3)


def _hardware(source: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise ValueError(f"{_where(source, 'hardware')}={_show(value)}: must be the hardware's name (kvsched "
                     "writes it, e.g. \"h100-sxm\"); fix it or remove the key")


def parse_requests(lines: Sequence[tuple[int, object]], source: str) -> ObservedRun:
    """Per-request JSON lines (``(line number, object)``) as a run: each
    request sent at its ``arrival_time``."""
    rows: list[tuple[float, float, float, int, int]] = []
    models: set[str] = set()
    failed = 0
    for line, obj in lines:
        where = f"{source} line {line}"
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object with {', '.join(REQUEST_FIELDS)}")
        model = obj.get("model")
        if model is not None:
            if not isinstance(model, str) or not model:
                raise ValueError(f"{where}: model={model!r}: must be the model's name")
            models.add(model)
        error = obj.get("error")
        if error is not None and not isinstance(error, str | bool):
            raise ValueError(f"{where}: error={_show(error)}: must be the request's error text (\"\" or "
                             "null when it succeeded)")
        if error:
            failed += 1
            continue
        missing = [k for k in REQUEST_FIELDS if k not in obj]
        if missing:
            extra = [k for k in obj if k not in REQUEST_FIELDS]
            close = [f"{k!r} for {m!r}" for m in missing
                     for k in difflib.get_close_matches(m, extra, n=1, cutoff=0.6)]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{where}: missing {', '.join(missing)}{hint} (each line needs "
                             f"{', '.join(REQUEST_FIELDS)}; see docs/calibrate.md)")
        sent = _clock(where, "arrival_time", obj["arrival_time"])
        first = _clock(where, "first_token_time", obj["first_token_time"])
        last = _clock(where, "last_token_time", obj["last_token_time"])
        prompt = _count(where, "prompt_tokens", obj["prompt_tokens"], 1)
        output = _count(where, "output_tokens", obj["output_tokens"], 1)
        if not first > sent:
            raise ValueError(f"{where}: first_token_time={first!r} must be after arrival_time={sent!r} "
                             "(same clock, seconds)")
        if last < first:
            raise ValueError(f"{where}: last_token_time={last!r} is before first_token_time={first!r}")
        _check_span(where, "the request's", last - sent)
        rows.append((sent, first, last, prompt, output))
    if len(models) > 1:
        raise ValueError(f"{source}: requests of several models ({', '.join(sorted(models))}); "
                         "a run is of one model")
    if not rows:
        raise ValueError(f"{source}: no completed request (every line failed or the file is empty)")
    # Send order (stable for equal times).
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    _check_span(source, "the arrival_time", rows[-1][0] - t0)
    return ObservedRun(
        source=source, model_id=models.pop() if models else None,
        input_lens=tuple(r[3] for r in rows), output_lens=tuple(r[4] for r in rows),
        arrivals=tuple(r[0] - t0 for r in rows), max_concurrency=None,
        arrivals_note="sent at the file's arrival_time", failed=failed,
        ttfts=tuple(r[1] - r[0] for r in rows),
        tpots=tuple((r[2] - r[1]) / (r[4] - 1) if r[4] > 1 else None for r in rows))


def _read(path: str, flag: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{flag} {path}: is a folder; give the run's file") from None
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: not a text file (not UTF-8); give a JSON file") from None


def _loads(text: str) -> object:
    return strict_loads(text)


def _json_lines(text: str, source: str) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((number, _loads(line)))
        except DuplicateKeyError as e:
            raise ValueError(f"{source} line {number}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{source} line {number}: {json_problem(e)}; each line must be one "
                             "request's JSON object") from None
    return out


def load_run(path: str, kind: str = "auto", *, seed: int = VLLM_DEFAULT_SEED) -> ObservedRun:
    """A run from ``path``: ``kind`` "bench" (vllm bench serve's JSON),
    "requests" (JSON lines) or "auto" (a JSON object with the bench keys is a
    bench file, anything else is read as JSON lines)."""
    flag = {"bench": "--bench", "requests": "--requests"}.get(kind, "--held-out")
    text = _read(path, flag)
    source = f"{flag} {path}"
    if kind == "requests":
        try:
            lines = _json_lines(text, source)
        except ValueError:
            try:
                whole = _loads(text)
            except ValueError:
                whole = None
            if isinstance(whole, dict) and ("input_lens" in whole or "model_id" in whole):
                raise ValueError(f"{source}: is a vllm bench serve result (one JSON object), not JSON "
                                 f"lines; pass it with --bench {path}") from None
            raise
        return parse_requests(lines, source)
    try:
        data = _loads(text)
    except ValueError as e:
        if isinstance(e, DuplicateKeyError):
            raise ValueError(f"{source}: {e}") from None
        if kind == "bench":
            raise ValueError(f"{source}: {json_problem(e)}; give vllm bench serve --save-result's "
                             "file") from None
        return parse_requests(_json_lines(text, source), source)
    if kind == "auto" and isinstance(data, dict) and "first_token_time" in data:
        return parse_requests([(1, data)], source)  # a one-line JSONL file
    return parse_bench(data, source, seed=seed)


# --------------------------------------------------------------------------
# Replaying a run


def workload_of(run: ObservedRun) -> Workload:
    """The run's requests as the simulator sends them: ``cal-i`` is the i-th
    completed request, its prompt private (random prompts share nothing)."""
    requests = tuple(
        WorkloadRequest(f"cal-{i}", t, ((UNIQUE_TOKEN_BASE + i, inp),), out)
        for i, (t, inp, out) in enumerate(zip(run.arrivals, run.input_lens, run.output_lens)))
    return Workload("calibrate", requests, run.max_concurrency)


@dataclass(slots=True)
class SimulatedLatencies:
    """The simulator's TTFT and TPOT of every request of a run (seconds, in
    the run's order; TPOT NaN for a one-token output)."""

    ttfts: FloatArray
    tpots: FloatArray


def latencies_of(result: SimResult, n: int) -> SimulatedLatencies:
    records = result.records
    ttfts = np.full(n, np.nan)
    tpots = np.full(n, np.nan)
    for rid, sent, first, finish, outs in zip(records.request_id, records.send_time,
                                              records.first_token_time, records.finish_time,
                                              records.num_output_tokens):
        i = int(rid[4:])
        ttfts[i] = first - sent
        if outs > 1:
            tpots[i] = (finish - first) / (outs - 1)
    if result.failed or np.isnan(ttfts).any():
        rid, why = result.failed[0] if result.failed else ("?", "not finished")
        raise RuntimeError(f"the replay did not complete every request ({rid}: {why})")
    return SimulatedLatencies(ttfts, tpots)


def require_measured(deployment: Deployment) -> None:
    if not isinstance(deployment.step_model, MeasuredStepTimeModel):
        raise ValueError("calibrate fits the measured backend's host terms, but this deployment's "
                         f"steps are priced by {deployment.step_model.describe_backend()}; calibrate "
                         "a deployment the measured tables cover (GPUs h100-sxm, h200, b200)")


class Replayer:
    """Replays runs on one deployment with any host terms."""

    def __init__(self, deployment: Deployment, args: argparse.Namespace | None = None) -> None:
        require_measured(deployment)
        self.deployment = deployment
        if args is None:
            args = default_engine_args()
        # simulate's runner reads the DP and admission flags; no step trace here.
        self.args = copy.copy(args)
        self.args.trace_steps = None
        self.simulations = 0
        self._workloads: dict[int, tuple[ObservedRun, Workload]] = {}

    def deployment_with(self, terms: HostTerms) -> Deployment:
        d = self.deployment
        model = MeasuredStepTimeModel(d.model, d.hardware, d.parallel, d.runtime, terms)
        return dataclasses.replace(d, step_model=model)

    def simulate(self, run: ObservedRun, terms: HostTerms) -> SimulatedLatencies:
        from kvsched.sim.command import run_deployment

        # Built once per run; the run is kept with it so that its id is not
        # reused by another run while the entry lives.
        cached = self._workloads.get(id(run))
        if cached is None or cached[0] is not run:
            cached = self._workloads[id(run)] = (run, workload_of(run))
        workload = cached[1]
        d = self.deployment_with(terms)
        config = SimConfig(d.scheduler_config, d.cache_config, d.step_model, fast_forward=True,
                           prefill_schedule_interval=d.options.prefill_schedule_interval,
                           keep_step_log=False)
        self.simulations += 1
        return latencies_of(run_deployment(d, config, workload, self.args), len(run.input_lens))


def default_engine_args() -> argparse.Namespace:
    """simulate's engine flags at their defaults (DP routing, admission policy)."""
    from kvsched.sim.command import add_engine_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_engine_arguments(p)
    return p.parse_args([])


# --------------------------------------------------------------------------
# Errors and loss


@dataclass(frozen=True, slots=True)
class RunErrors:
    """Relative errors (simulated / measured - 1) of one run: per request, or
    the run's mean alone when the file has no per-request times."""

    source: str
    ttft: FloatArray
    tpot: FloatArray

    @staticmethod
    def summary(errors: FloatArray) -> tuple[float, float, float]:
        """(median |err|, mean |err|, mean err); NaN when there is none."""
        if not errors.size:
            return math.nan, math.nan, math.nan
        a = np.abs(errors)
        return float(np.median(a)), float(np.mean(a)), float(np.mean(errors))


def run_errors(run: ObservedRun, sim: SimulatedLatencies) -> RunErrors:
    if run.ttfts is not None:
        ttft = sim.ttfts / np.asarray(run.ttfts) - 1.0
    else:
        assert run.mean_ttft_s is not None
        ttft = np.array([float(np.mean(sim.ttfts)) / run.mean_ttft_s - 1.0])
    if run.tpots is not None:
        observed = np.array([math.nan if t is None else t for t in run.tpots])
        keep = ~np.isnan(observed) & (observed > 0)
        tpot = sim.tpots[keep] / observed[keep] - 1.0
    else:
        assert run.mean_tpot_s is not None
        # vLLM's mean TPOT is over requests with more than one output token.
        values = sim.tpots[~np.isnan(sim.tpots)]
        tpot = np.array([float(np.mean(values)) / run.mean_tpot_s - 1.0]) if values.size else np.array([])
    return RunErrors(run.source, ttft, tpot)


def length_groups(lengths: Sequence[int], mask: npt.NDArray[np.bool_], groups: int) -> list[IntArray]:
    """The requests ``mask`` selects, sorted by ``lengths`` (stable) and cut
    into ``groups`` runs of nearly equal size, at least MIN_GROUP each."""
    idx = np.flatnonzero(mask)
    k = max(1, min(groups, idx.size // MIN_GROUP))
    order = idx[np.argsort(np.asarray(lengths, dtype=np.int64)[idx], kind="stable")]
    return [g for g in np.array_split(order, k) if g.size]


@dataclass(frozen=True, slots=True)
class LossGroups:
    """How one run's requests are grouped in the loss: TTFT by prompt length,
    TPOT by output length (empty lists: the file has the run's means only)."""

    ttft: list[IntArray]
    tpot: list[IntArray]
    observed_tpots: FloatArray  # NaN where a request has no TPOT

    @staticmethod
    def of(run: ObservedRun, groups: int) -> LossGroups:
        n = len(run.input_lens)
        tpots = np.full(n, np.nan) if run.tpots is None else \
            np.array([math.nan if t is None else t for t in run.tpots])
        ttft = length_groups(run.input_lens, np.ones(n, dtype=bool), groups) if run.ttfts is not None else []
        valid = ~np.isnan(tpots)
        valid[valid] = tpots[valid] > 0
        tpot = length_groups(run.output_lens, valid, groups) if run.tpots is not None else []
        return LossGroups(ttft, tpot, tpots)


def loss_residuals(run: ObservedRun, sim: SimulatedLatencies, groups: LossGroups) -> FloatArray:
    """One run's part of the loss: the relative error of the mean TTFT of each
    group of requests of similar prompt length, and of the mean TPOT of each
    group of similar output length (or of the run's means), each metric's
    errors over the square root of their count so that every run and metric
    weighs the same."""
    parts: list[FloatArray] = []
    if run.ttfts is not None:
        observed = np.asarray(run.ttfts)
        ttft = np.array([sim.ttfts[g].mean() / observed[g].mean() - 1.0 for g in groups.ttft])
    else:
        assert run.mean_ttft_s is not None
        ttft = np.array([float(np.mean(sim.ttfts)) / run.mean_ttft_s - 1.0])
    parts.append(ttft / math.sqrt(ttft.size))
    if run.tpots is not None:
        o = groups.observed_tpots
        tpot = np.array([sim.tpots[g].mean() / o[g].mean() - 1.0 for g in groups.tpot])
    else:
        assert run.mean_tpot_s is not None
        # vLLM's mean TPOT is over requests with more than one output token.
        values = sim.tpots[~np.isnan(sim.tpots)]
        tpot = np.array([float(np.mean(values)) / run.mean_tpot_s - 1.0]) if values.size else np.zeros(0)
    if tpot.size:
        parts.append(tpot / math.sqrt(tpot.size))
    return np.concatenate(parts)


# --------------------------------------------------------------------------
# The optimiser


@dataclass(slots=True)
class FitResult:
    x: FloatArray
    loss: float
    iterations: int
    evaluations: int
    converged: bool
    jacobian: FloatArray | None = None
    history: list[tuple[int, float, FloatArray]] = field(default_factory=list)


def levenberg_marquardt(fun: Callable[[FloatArray], FloatArray], x0: FloatArray, *,
                        max_iterations: int = DEFAULT_MAX_ITERATIONS, rel_step: float = 0.1,
                        min_step: float = 0.5, refinements: int = 3, tries: int = 6,
                        tolerance: float = 1e-4, loss_floor: float = 1e-14, central: bool = True,
                        progress: Callable[[int, float, FloatArray], None] | None = None) -> FitResult:
    """Minimise ``sum(fun(x)**2)`` over ``x >= 0`` (``x`` in units of order 1).

    Levenberg-Marquardt with Marquardt's diagonal scaling; each damped step
    is the exact minimiser of the linearised loss within the bound ``x >=
    0`` (:func:`bounded_step`). The Jacobian is taken by central (or, with
    ``central=False``, forward) differences of ``max(rel_step * |x|,
    min_step)``, coarse on purpose: a simulated latency moves in small jumps
    (a request reaches the engine just before a step begins, or just after)
    and a coarse difference reads the slope through them; central ones
    cancel more of them (measured on synthetic runs from a far start:
    forward differences reached the truth on 1 of 5 run sets, central ones
    on 3). When the linearisation stops predicting the loss (an accepted
    step gains less than a quarter of what it promised, or no step in
    ``tries`` lowers it), the differences are made 4 times finer, at most
    ``refinements`` times: near the minimum fewer jumps lie in between, and
    a finer slope goes further. Done when no step lowers the loss at the
    finest differences, a step gains less than ``tolerance`` (relative), or
    the loss falls under ``loss_floor``. Deterministic: same ``fun``, same
    path. The minimum is local: see docs/calibrate.md for runs that make it
    the only one.
    """
    x = np.maximum(np.asarray(x0, dtype=float), 0.0)
    r = fun(x)
    loss = float(r @ r)
    evaluations = 1
    lam = 1e-3
    result = FitResult(x, loss, 0, evaluations, False)
    if progress is not None:
        progress(0, loss, x)
    result.history.append((0, loss, x.copy()))
    refined = 0
    for iteration in range(1, max_iterations + 1):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            h = max(rel_step * abs(x[j]), min_step)
            xh = x.copy()
            xh[j] += h
            if central:
                xl = x.copy()
                xl[j] = max(0.0, x[j] - h)
                jac[:, j] = (fun(xh) - fun(xl)) / (xh[j] - xl[j])
                evaluations += 2
            else:
                jac[:, j] = (fun(xh) - r) / h
                evaluations += 1
        result.jacobian = jac
        grad = jac.T @ r
        normal = jac.T @ jac
        diag = np.diag(normal).copy()
        # A term that moves nothing (e.g. no step it applies to) stays put.
        movable = diag > 1e-12 * max(float(diag.max()), 1e-300)
        gain = promised = 0.0
        improved = False
        for _ in range(tries):
            step = bounded_step(normal, grad, diag * lam, x, movable)
            candidate = np.maximum(x + step, 0.0)
            if not np.any(candidate != x):
                break
            r_new = fun(candidate)
            evaluations += 1
            loss_new = float(r_new @ r_new)
            if loss_new < loss:
                predicted = r + jac @ (candidate - x)
                promised = loss - float(predicted @ predicted)
                gain = loss - loss_new
                x, r, loss = candidate, r_new, loss_new
                lam = max(lam / 3.0, 1e-9)
                improved = True
                break
            lam *= 10.0
        result.x, result.loss, result.iterations, result.evaluations = x, loss, iteration, evaluations
        if progress is not None:
            progress(iteration, loss, x)
        result.history.append((iteration, loss, x.copy()))
        if loss <= loss_floor:
            result.converged = True  # the runs are reproduced to ~1e-7
            break
        if improved and gain >= 0.25 * promised:
            if gain < tolerance * (loss + gain):
                result.converged = True
                break
            continue
        if refined >= refinements:
            # No step lowers the loss, or the slope no longer predicts it,
            # at the finest differences: a (local) minimum.
            result.converged = not improved or gain < tolerance * (loss + gain)
            if result.converged:
                break
            continue
        refined += 1
        rel_step /= 4.0
        min_step /= 4.0
    return result


def bounded_step(normal: FloatArray, grad: FloatArray, damping: FloatArray, x: FloatArray,
                 movable: npt.NDArray[np.bool_]) -> FloatArray:
    """The step ``d`` minimising ``d.(normal + diag(damping)).d / 2 +
    grad.d`` subject to ``x + d >= 0`` (``d = 0`` where not ``movable``).
    The problem is strictly convex, so its minimiser is the best of the
    unconstrained minimisers over every choice of bound-held variables that
    respects the bound: at most 2**6 small solves for kvsched's six terms."""
    idx = np.flatnonzero(movable)
    best = np.zeros_like(x)
    best_value = math.inf
    m = normal[np.ix_(idx, idx)] + np.diag(np.maximum(damping[idx], 1e-12))
    g = grad[idx]
    lower = -x[idx]
    k = idx.size
    for mask in range(1 << k):
        held = np.array([bool(mask >> i & 1) for i in range(k)], dtype=bool)
        d = np.where(held, lower, 0.0)
        free = ~held
        if free.any():
            rhs = -(g[free] + m[np.ix_(free, held)] @ d[held])
            d[free] = np.linalg.solve(m[np.ix_(free, free)], rhs)
            if np.any(d[free] < lower[free] - 1e-12):
                continue
        value = 0.5 * float(d @ m @ d) + float(g @ d)
        if value < best_value:
            best_value = value
            best[:] = 0.0
            best[idx] = d
    return best


# --------------------------------------------------------------------------
# Calibration


def parse_fit_names(text: str | None, data_parallel_size: int) -> tuple[str, ...]:
    """The terms to fit: ``--fit a,b`` or every term (``dp_sync_s`` only
    with data parallelism, where a step pays it)."""
    if text is None:
        return tuple(t for t in TERMS if t != "dp_sync_s" or data_parallel_size > 1)
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError(f"--fit={text!r}: name at least one term ({', '.join(TERMS)})")
    unknown = [n for n in names if n not in TERMS]
    if unknown:
        raise ValueError(f"--fit: unknown term {', '.join(map(repr, unknown))}; the terms are "
                         f"{', '.join(TERMS)}")
    if "dp_sync_s" in names and data_parallel_size == 1:
        raise ValueError("--fit dp_sync_s: the deployment has one DP rank (--data-parallel-size 1), "
                         "where no step pays it; fit it on runs with --data-parallel-size > 1")
    return tuple(dict.fromkeys(names))


def format_term(name: str, value: float) -> str:
    unit, factor = TERM_UNITS[name]
    return f"{value * factor:.4g} {unit}"


@dataclass(slots=True)
class Calibration:
    """A fit's outcome: the terms, and the errors before and after on the
    fitted runs and the held-out ones."""

    start: HostTerms
    terms: HostTerms
    fitted: tuple[str, ...]
    fit: FitResult
    fit_before: list[RunErrors]
    fit_after: list[RunErrors]
    held_before: list[RunErrors]
    held_after: list[RunErrors]
    simulations: int
    wall_seconds: float
    notes: list[str] = field(default_factory=list)


def with_terms(base: HostTerms, values: Mapping[str, float]) -> HostTerms:
    """``base`` with the named terms replaced (metadata kept)."""
    fields: dict[str, Any] = {**base.to_json(), **{k: float(v) for k, v in values.items()}}
    return HostTerms(**fields)


def check_run(run: ObservedRun, deployment: Deployment, served_model_name: str | None = None) -> None:
    """A clear error when ``run`` is not of this deployment: another model
    (or checkpoint format), another GPU, or requests longer than its
    max_model_len."""
    model = deployment.model
    if run.model_id is not None and run.model_id != served_model_name:
        match = catalog_match(run.model_id)
        same = False
        if match is not None:
            same = match[0] == model.name
            fmt = match[1]
            if same and fmt is not None and fmt.weights != deployment.runtime.dtype:
                raise ValueError(
                    f"{run.source}: model_id {run.model_id!r} is a checkpoint in {fmt.weights} but "
                    f"the deployment prices {model.name} in {deployment.runtime.dtype}; pass --model "
                    f"{run.model_id} (or the matching --quantization)")
        else:
            # A local path or a served name: the last path part, as written.
            tail = run.model_id.rstrip("/").rsplit("/", 1)[-1].lower()
            same = tail in (model.name.rsplit("/", 1)[-1].lower(),
                            deployment.options.model.rstrip("/").rsplit("/", 1)[-1].lower())
        if not same:
            raise ValueError(
                f"{run.source}: the run is of model {run.model_id!r}, the deployment of {model.name} "
                f"(--model {deployment.options.model}); calibrate with that run's --model, or pass "
                f"--served-model-name {run.model_id} if the server called {model.name} so")
    if run.hardware is not None and run.hardware != deployment.hardware.id:
        raise ValueError(f"{run.source}: the run is on hardware {run.hardware!r}, the deployment on "
                         f"{deployment.hardware.id} (--hardware); calibrate with --hardware {run.hardware}")
    limit = deployment.scheduler_config.max_model_len
    for i, (inp, out) in enumerate(zip(run.input_lens, run.output_lens)):
        if inp + out > limit:
            raise ValueError(
                f"{run.source}: completed request {i} has {inp} prompt + {out} output tokens, more "
                f"than the deployment's max_model_len={limit}, so the server that ran it had a larger "
                "one; pass its --max-model-len")


class Calibrator:
    """Fits ``fitted`` terms of ``start`` to ``runs`` on one deployment."""

    def __init__(self, deployment: Deployment, runs: Sequence[ObservedRun], start: HostTerms,
                 fitted: Sequence[str], *, held_out: Sequence[ObservedRun] = (),
                 args: argparse.Namespace | None = None, groups: int = DEFAULT_GROUPS,
                 out: Callable[[str], None] | None = None) -> None:
        if not runs:
            raise ValueError("no runs to fit on: give --bench FILE.json or --requests FILE.jsonl")
        if not fitted:
            raise ValueError("no terms to fit (--fit)")
        self.replayer = Replayer(deployment, args)
        self.runs = list(runs)
        self.held_out = list(held_out)
        self.start = start
        self.fitted = tuple(fitted)
        self.scales = np.array([TERM_SCALES[n] for n in self.fitted])
        self.out = out or (lambda line: None)
        self.groups = [LossGroups.of(run, groups) for run in self.runs]

    def terms_at(self, x: FloatArray) -> HostTerms:
        return with_terms(self.start, dict(zip(self.fitted, x * self.scales)))

    def errors(self, runs: Sequence[ObservedRun], terms: HostTerms) -> list[RunErrors]:
        return [run_errors(run, self.replayer.simulate(run, terms)) for run in runs]

    def run(self, max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Calibration:
        t0 = time.perf_counter()
        x0 = np.array([getattr(self.start, n) for n in self.fitted]) / self.scales

        def fun(x: FloatArray) -> FloatArray:
            terms = self.terms_at(x)
            return np.concatenate([loss_residuals(run, self.replayer.simulate(run, terms), groups)
                                   for run, groups in zip(self.runs, self.groups)])

        def progress(iteration: int, loss: float, x: FloatArray) -> None:
            values = ", ".join(f"{n} {format_term(n, v)}" for n, v in zip(self.fitted, x * self.scales))
            self.out(f"  iteration {iteration:>2}: loss {loss:.6g}  ({values}; "
                     f"{self.replayer.simulations} simulations, {time.perf_counter() - t0:.1f} s)")

        fit_before = self.errors(self.runs, self.start)
        held_before = self.errors(self.held_out, self.start)
        fit = levenberg_marquardt(fun, x0, max_iterations=max_iterations, progress=progress)
        terms = self.terms_at(fit.x)
        calibration = Calibration(
            self.start, terms, self.fitted, fit, fit_before, self.errors(self.runs, terms), held_before,
            self.errors(self.held_out, terms), self.replayer.simulations, time.perf_counter() - t0)
        calibration.notes.extend(identifiability_notes(self.fitted, fit))
        if not fit.converged:
            calibration.notes.append(f"stopped after {fit.iterations} iterations (--max-iterations) "
                                     "before the loss settled; raise --max-iterations")
        return calibration


def identifiability_notes(names: Sequence[str], fit: FitResult) -> list[str]:
    """Terms the runs cannot tell apart: a term whose effect (its Jacobian
    column) the other terms reproduce almost exactly, or that has none."""
    jac = fit.jacobian
    notes: list[str] = []
    if jac is None or not jac.size:
        return notes
    for j, name in enumerate(names):
        col = jac[:, j]
        norm = float(col @ col)
        if norm <= 1e-24:
            notes.append(f"{name}: no effect on these runs, left at its start value")
            continue
        others = np.delete(jac, j, axis=1)
        if others.shape[1]:
            coef, *_ = np.linalg.lstsq(others, col, rcond=None)
            rest = col - others @ coef
            unexplained = float(rest @ rest) / norm
            if unexplained < 1e-3:
                notes.append(f"{name}: nearly indistinguishable from the other terms on these runs "
                             "(its value is uncertain); add runs at another concurrency, rate or "
                             "prompt length")
    return notes


# --------------------------------------------------------------------------
# Report


def error_line(label: str, e: RunErrors) -> str:
    tm, ta, tb = RunErrors.summary(e.ttft)
    pm, pa, pb = RunErrors.summary(e.tpot)

    def pct(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * 100:.2f}%"

    return (f"{label:<10}{pct(tm):>9}{pct(ta):>9}{pct(tb):>9}   {pct(pm):>9}{pct(pa):>9}{pct(pb):>9}"
            f"   {e.source}")


def error_block(before: Sequence[RunErrors], after: Sequence[RunErrors]) -> list[str]:
    """The error table of some runs, start against fitted, pooled when there
    are several."""
    lines = [ERROR_HEADER]
    for b, a in zip(before, after, strict=True):
        lines += [error_line("start", b), error_line("fitted", a)]
    if len(after) > 1:
        lines += [error_line("start", pooled(before)), error_line("fitted", pooled(after))]
    return lines


ERROR_HEADER = (f"{'':<10}{'TTFT':>9}{'':>9}{'':>9}   {'TPOT':>9}\n"
                f"{'':<10}{'med|err|':>9}{'mean|err|':>9}{'bias':>9}   {'med|err|':>9}{'mean|err|':>9}"
                f"{'bias':>9}   run")


def pooled(errors: Sequence[RunErrors]) -> RunErrors:
    return RunErrors(f"all {len(errors)} runs",
                     np.concatenate([e.ttft for e in errors]) if errors else np.zeros(0),
                     np.concatenate([e.tpot for e in errors]) if errors else np.zeros(0))


def format_report(c: Calibration) -> str:
    lines = ["", f"{'term':<26}{'start':>12}{'fitted':>12}   meaning"]
    for name in TERMS:
        mark = "" if name in c.fitted else "  (not fitted)"
        lines.append(f"{name:<26}{format_term(name, getattr(c.start, name)):>12}"
                     f"{format_term(name, getattr(c.terms, name)):>12}   {TERM_MEANING[name]}{mark}")
    lines.append("")
    lines.append(f"Fit error (relative; {c.fit.iterations} iterations, loss {c.fit.loss:.4g}, "
                 f"{c.simulations} simulations in {c.wall_seconds:.1f} s):")
    lines += error_block(c.fit_before, c.fit_after)
    if c.held_after:
        lines.append("Held-out error (runs the fit never saw):")
        lines += error_block(c.held_before, c.held_after)
    else:
        lines.append("Held-out error: none (give --held-out FILE: a run of the same deployment at "
                     "another rate or concurrency)")
    lines.extend(f"note: {n}" for n in c.notes)
    return "\n".join(lines)


def _errors_text(errors: Sequence[RunErrors]) -> str:
    e = pooled(errors)
    tm, _, tb = RunErrors.summary(e.ttft)
    pm, _, pb = RunErrors.summary(e.tpot)
    return (f"{len(errors)} run(s): TTFT median |err| {tm * 100:.2f}% (bias {tb * 100:+.2f}%), "
            f"TPOT median |err| {pm * 100:.2f}% (bias {pb * 100:+.2f}%)")


def provenance(c: Calibration, fit_files: Sequence[str], held_files: Sequence[str], flags: str,
               start: str) -> str:
    held = (f" Held out {', '.join(held_files)}: {_errors_text(c.held_after)} (start: "
            f"{_errors_text(c.held_before)})." if held_files else " No held-out run.")
    unfitted = [n for n in TERMS if n not in c.fitted]
    return (f"fitted {date.today().isoformat()} by kvsched calibrate ({', '.join(c.fitted)}; loss: "
            "squared relative errors of mean TTFT and TPOT over groups of requests of similar length, "
            f"per run) on {', '.join(fit_files)} with deployment flags [{flags}], starting from "
            f"{start}{' (which gives ' + ', '.join(unfitted) + ')' if unfitted else ''}. Fit: "
            f"{_errors_text(c.fit_after)} (start: {_errors_text(c.fit_before)}).{held}")


def engine_flags(args: argparse.Namespace) -> str:
    """The engine flags given (those not at their defaults), as a command line."""
    from kvsched.sim.command import add_engine_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_engine_arguments(p)
    parts: list[str] = []
    for action in p._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{flag[2:]}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts) if parts else "defaults"


# --------------------------------------------------------------------------
# The command


def add_calibrate_parser(sub: Any) -> None:
    from kvsched.sim.command import add_engine_arguments

    p = sub.add_parser(
        "calibrate", help="fit the measured backend's host terms to real serving runs",
        description="Fit the measured step-time backend's host terms (kvsched.perf.host) to serving "
                    "runs of one deployment, given as simulate's engine flags; write a file for "
                    "simulate/compare --calibration. Here --calibration FILE gives the start values "
                    "(and the terms not fitted). See docs/calibrate.md.")
    add_engine_arguments(p)
    g = p.add_argument_group("calibration")
    g.add_argument("--bench", action="append", default=[], metavar="FILE.json",
                   help="a vllm bench serve --save-result --save-detailed JSON (or kvsched simulate's) "
                        "to fit on (repeatable)")
    g.add_argument("--requests", action="append", default=[], metavar="FILE.jsonl",
                   help="per-request JSON lines: arrival_time, first_token_time, last_token_time, "
                        "prompt_tokens, output_tokens (repeatable)")
    g.add_argument("--held-out", action="append", default=[], metavar="FILE",
                   help="a run of the same deployment (either format) only to judge the fit on "
                        "(repeatable)")
    g.add_argument("--fit", metavar="TERMS",
                   help=f"comma-separated terms to fit (default: all of {', '.join(TERMS)}; dp_sync_s "
                        "only with --data-parallel-size > 1); the others keep their start values")
    g.add_argument("--output", "-o", default=DEFAULT_OUTPUT, metavar="FILE.json",
                   help="where to write the fitted terms (default: %(default)s)")
    g.add_argument("--groups", type=int, default=DEFAULT_GROUPS,
                   help="the loss compares mean TTFT and TPOT over at most this many groups of "
                        f"requests of similar length per run, of {MIN_GROUP} requests at least "
                        "(1: each run's means; default: %(default)s)")
    g.add_argument("--max-iterations", type=int, default=DEFAULT_MAX_ITERATIONS,
                   help="Levenberg-Marquardt iterations at most (default: %(default)s)")
    g.add_argument("--seed", type=int, default=VLLM_DEFAULT_SEED,
                   help="the runs' vllm bench serve --seed, to redraw the arrival times of a finite "
                        "--request-rate run whose file has neither start_times nor a seed "
                        "(default: %(default)s, vLLM's)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the name the runs' files give the model (vllm serve --served-model-name), "
                        "taken as the deployment's model")
    g.add_argument("--vllm-version", help="the vLLM version of the runs, recorded in the file "
                                          "(default: the start file's)")
    p.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from kvsched.sim.command import check_output_path, make_deployment

    if not args.bench and not args.requests:
        raise ValueError("calibrate needs a run to fit on: --bench FILE.json (vllm bench serve "
                         "--save-result --save-detailed) or --requests FILE.jsonl")
    if args.max_iterations < 1:
        raise ValueError(f"--max-iterations={args.max_iterations}: must be at least 1")
    if args.groups < 1:
        raise ValueError(f"--groups={args.groups}: must be at least 1 (1: each run's means)")
    if args.seed < 0:
        raise ValueError(f"--seed={args.seed}: must be >= 0 (vllm bench serve's --seed)")
    if args.step_time_backend == "roofline":
        raise ValueError("--step-time-backend roofline: calibrate fits the measured backend's host "
                         "terms; use --step-time-backend measured (or auto)")
    check_output_path("--output", args.output)
    # auto falls back to the roofline where the tables do not reach; the
    # Replayer then says why measured kernels cannot price this deployment.
    deployment = make_deployment(args)
    require_measured(deployment)
    fitted = parse_fit_names(args.fit, deployment.parallel.data_parallel_size)
    runs = [load_run(p, "bench", seed=args.seed) for p in args.bench]
    runs += [load_run(p, "requests", seed=args.seed) for p in args.requests]
    held = [load_run(p, "auto", seed=args.seed) for p in args.held_out]
    for run in [*runs, *held]:
        check_run(run, deployment, args.served_model_name)
    start = load_host_terms(args.calibration) if args.calibration else load_host_terms(DEFAULT_FILE)
    print(f"Calibrating {', '.join(fitted)} for {deployment.describe()}.", flush=True)
    print(f"Start: {args.calibration or 'the fitted default'} ({', '.join(f'{n} {format_term(n, v)}' for n, v in start.terms().items())}).")  # noqa: E501
    for run in runs:
        print(f"fit on   {run.describe()}")
    for run in held:
        print(f"held out {run.describe()}")
    calibrator = Calibrator(deployment, runs, start, fitted, held_out=held, args=args,
                            groups=args.groups, out=lambda line: print(line, flush=True))
    c = calibrator.run(args.max_iterations)
    fit_files = [*args.bench, *args.requests]
    c.terms = dataclasses.replace(
        c.terms, hardware_class=deployment.hardware.id,
        vllm_version=args.vllm_version or start.vllm_version,
        provenance=provenance(c, fit_files, args.held_out, engine_flags(args),
                              args.calibration or f"the default {DEFAULT_FILE.name}"))
    print(format_report(c))
    save_host_terms(c.terms, args.output)
    print(f"wrote {args.output}: use it with kvsched simulate/compare --calibration {args.output}")
    sys.stdout.flush()
    return 0
