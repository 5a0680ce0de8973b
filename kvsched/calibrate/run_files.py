"""Reading a serving run's files: ``vllm bench serve --save-result
--save-detailed`` JSON (``--bench``; ``kvsched simulate``'s has the same keys)
and per-request JSON lines (``--requests``), each checked field by field into
an :class:`ObservedRun`.

A bench file gives the per-request ``input_lens``, ``output_lens``, ``ttfts``,
``itls`` (or ``latencies``) and ``errors``, with ``request_rate``,
``burstiness`` and ``max_concurrency``; one without the per-request times but
with the lengths is fitted on its ``mean_ttft_ms`` and ``mean_tpot_ms`` only.
A JSON-lines file has one request per line: ``arrival_time`` (when the client
sent it, seconds on any clock), ``first_token_time`` and ``last_token_time``
(same clock), ``prompt_tokens``, ``output_tokens``; optional ``model`` (checked
against the deployment) and ``error`` (non-empty: the request failed, left out).

The arrival times are reconstructed as the run sent them: ``request_rate:
inf`` all due at 0 with the file's ``max_concurrency`` in flight (closed
loop); a JSONL's or a bench file's ``start_times`` (vLLM writes the send times
with ``--save-detailed``) as exact send times; otherwise vllm bench serve's
own arrival draw (gamma gaps from ``np.random.seed(seed)``, rescaled to end at
``n / rate``), deterministic given the run's ``--seed``: the file's ``seed``
key (or kvsched's ``workload.seed``) or ``--seed`` (default 0, vLLM's default).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.files import read_text
from kvsched.jsonfile import DuplicateKeyError, json_problem, show, strict_loads
from kvsched.sim.workload import arrival_times_of_rate

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

    def mean_ttft(self) -> float:
        """The run's mean TTFT (seconds), per request or as the file gives it."""
        if self.ttfts is not None:
            return float(sum(self.ttfts) / len(self.ttfts)) if self.ttfts else 0.0
        assert self.mean_ttft_s is not None
        return self.mean_ttft_s

    def mean_tpot(self) -> float | None:
        """The run's mean TPOT (seconds) over requests with more than one
        output token, as vLLM's; None when no request has one."""
        if self.tpots is not None:
            values = [t for t in self.tpots if t is not None and t > 0]
            return sum(values) / len(values) if values else None
        return self.mean_tpot_s

    def decode_concurrency(self) -> float:
        """How many requests decode at once on average (Little's law: the
        requests' decode time over the run's span; at least 1); 1 without
        per-request times."""
        if self.ttfts is None or self.tpots is None or not self.ttfts:
            return 1.0
        decoding = 0.0
        end = 0.0
        for t, ttft, tpot, out in zip(self.arrivals, self.ttfts, self.tpots, self.output_lens):
            d = (tpot or 0.0) * max(out - 1, 0)
            decoding += d
            end = max(end, t + ttft + d)
        span = end - min(self.arrivals)
        return max(1.0, decoding / span) if span > 0 else 1.0

    def describe(self) -> str:
        kind = "per-request" if self.per_request else "means only"
        failed = f", {self.failed} failed left out" if self.failed else ""
        return f"{self.source}: {len(self.input_lens)} requests ({kind}{failed}), {self.arrivals_note}"


def _where(source: str, key: str) -> str:
    return f"{source}: {key}"


def _number(source: str, key: str, value: object, *, minimum: float | None = None,
            positive: bool = False, maximum: float | None = None) -> float:
    if (not is_number(value)
            or not math.isfinite(value if isinstance(value, float) else 0.0)
            or (isinstance(value, int) and abs(value) > 10**300)):
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be a finite number")
    if positive and not value > 0:
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be > 0")
    if minimum is not None and value < minimum:
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be >= {minimum:g}")
    if maximum is not None and value > maximum:
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be <= {maximum:g} (an absurd "
                         "value for a serving run; check the file)")
    return float(value)


def _count(source: str, key: str, value: object, minimum: int, maximum: int = LENGTH_LIMIT) -> int:
    if not is_int(value) or not minimum <= value <= maximum:
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be an integer in "
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
        raise UserInputError(f"{_where(source, key)}={show(value)}: must be within +-{CLOCK_LIMIT:g} s "
                         "(seconds on any clock; Unix time is 1.8e9)")
    return t


def _check_span(source: str, what: str, span: float) -> None:
    if span > DURATION_LIMIT:
        raise UserInputError(f"{source}: {what} span {span:g} s, more than {DURATION_LIMIT:g} s (11.6 "
                         "days); a serving run is minutes or hours: check the file's times")


def _list(source: str, data: Mapping[str, Any], key: str, n: int | None) -> list[Any]:
    value = data[key]
    if not isinstance(value, list):
        raise UserInputError(f"{_where(source, key)}: must be a list (one entry per request), "
                         f"got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise UserInputError(f"{_where(source, key)}: {len(value)} entries but input_lens has {n}; "
                         "the per-request lists must have one entry per request")
    return value


def _request_rate(source: str, value: object) -> float:
    # vLLM writes an unlimited rate as the string "inf".
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if value is None:
        raise UserInputError(f"{source}: request_rate is null (a trace replay): its send times are not in "
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
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise UserInputError(f"{_where(source, key)}={show(seed)}: must be the run's --seed, an integer in "
                         f"[0, 2**32); fix it or remove the key and pass --seed")
    return seed


def parse_bench(data: object, source: str, *, seed: int = VLLM_DEFAULT_SEED) -> ObservedRun:
    """A ``vllm bench serve`` result (or ``kvsched simulate``'s) as a run;
    ``seed`` is the run's ``--seed`` when the file does not record it."""
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: expected a JSON object (vllm bench serve --save-result's file), "
                         f"got {type(data).__name__}")
    model_id = data.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise UserInputError(f"{source}: model_id={model_id!r}: the file must name its model (vllm bench "
                         "serve writes model_id); add it")
    missing = [k for k in ("input_lens", "output_lens") if k not in data]
    if missing:
        raise UserInputError(f"{source}: no {' or '.join(missing)}: the request lengths are written by "
                         "vllm bench serve --save-result --save-detailed; rerun with --save-detailed")
    if data.get("ramp_up_strategy"):
        raise UserInputError(f"{source}: ramp_up_strategy={data['ramp_up_strategy']!r}: ramp-up runs are "
                         "not replayed; calibrate on fixed-rate or fixed-concurrency runs")
    inputs = _list(source, data, "input_lens", None)
    n = len(inputs)
    if not n:
        raise UserInputError(f"{source}: input_lens is empty; the run has no requests")
    outputs = _list(source, data, "output_lens", n)
    errors = _list(source, data, "errors", n) if "errors" in data else [""] * n
    ok = [not e for e in errors]
    if not any(ok):
        raise UserInputError(f"{source}: every request failed (errors); nothing to calibrate on")
    if "request_rate" not in data:
        raise UserInputError(f"{source}: no request_rate (vllm bench serve writes it; \"inf\" for all at "
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
            raise UserInputError(f"{_where(source, f'errors[{i}]')}={show(e)}: must be the request's error "
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
            raise UserInputError(f"{source}: has {', '.join(present)} but no ttfts: the per-request lists "
                             "are incomplete; save the run again with --save-detailed")
        means = {}
        for key in ("mean_ttft_ms", "mean_tpot_ms"):
            if key not in data or data[key] is None:
                raise UserInputError(f"{source}: no ttfts and no {key}: give the per-request lists "
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
                    raise UserInputError(f"{_where(source, f'itls[{i}]')}={gaps!r}: a completed request "
                                     f"of {out} output tokens needs its list of inter-token gaps")
                span = sum(_seconds(source, f"itls[{i}]", g) for g in gaps)
                if span > DURATION_LIMIT:
                    _check_span(source, f"itls[{i}]", span)
            else:
                latency = _seconds(source, f"latencies[{i}]", values[i], positive=True)
                if latency < ttfts[j]:
                    raise UserInputError(f"{_where(source, f'latencies[{i}]')}={latency!r}: below the "
                                     f"request's ttft {ttfts[j]!r}; a latency is the whole request's "
                                     "time (seconds)")
                span = latency - ttfts[j]
            tpots.append(span / (out - 1))
        return ObservedRun(**common, ttfts=ttfts, tpots=tuple(tpots))
    # TTFTs per request, TPOT as the run's mean only.
    if data.get("mean_tpot_ms") is None:
        raise UserInputError(f"{source}: ttfts but neither itls, latencies nor mean_tpot_ms: nothing "
                         "gives the time per output token; save the run with --save-detailed")
    return ObservedRun(**common, ttfts=ttfts,
                       mean_tpot_s=_number(source, "mean_tpot_ms", data["mean_tpot_ms"], positive=True,
                                           maximum=DURATION_LIMIT * 1e3) / 1e3)


def _hardware(source: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise UserInputError(f"{_where(source, 'hardware')}={show(value)}: must be the hardware's name (kvsched "
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
            raise UserInputError(f"{where}: expected a JSON object with {', '.join(REQUEST_FIELDS)}")
        model = obj.get("model")
        if model is not None:
            if not isinstance(model, str) or not model:
                raise UserInputError(f"{where}: model={model!r}: must be the model's name")
            models.add(model)
        error = obj.get("error")
        if error is not None and not isinstance(error, str | bool):
            raise UserInputError(f"{where}: error={show(error)}: must be the request's error text (\"\" or "
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
            raise UserInputError(f"{where}: missing {', '.join(missing)}{hint} (each line needs "
                             f"{', '.join(REQUEST_FIELDS)}; see docs/calibrate.md)")
        sent = _clock(where, "arrival_time", obj["arrival_time"])
        first = _clock(where, "first_token_time", obj["first_token_time"])
        last = _clock(where, "last_token_time", obj["last_token_time"])
        prompt = _count(where, "prompt_tokens", obj["prompt_tokens"], 1)
        output = _count(where, "output_tokens", obj["output_tokens"], 1)
        if not first > sent:
            raise UserInputError(f"{where}: first_token_time={first!r} must be after arrival_time={sent!r} "
                             "(same clock, seconds)")
        if last < first:
            raise UserInputError(f"{where}: last_token_time={last!r} is before first_token_time={first!r}")
        _check_span(where, "the request's", last - sent)
        rows.append((sent, first, last, prompt, output))
    if len(models) > 1:
        raise UserInputError(f"{source}: requests of several models ({', '.join(sorted(models))}); "
                         "a run is of one model")
    if not rows:
        raise UserInputError(f"{source}: no completed request (every line failed or the file is empty)")
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


# A run's file: vllm bench serve's JSON with --save-detailed lists, or
# per-request JSON lines; 1 GiB is millions of requests.
MAX_RUN_FILE_BYTES = 2**30


def _read(path: str, flag: str) -> str:
    try:
        return read_text(path, MAX_RUN_FILE_BYTES, f"the run's file for {flag}",
                         fix="split the run into shorter files")
    except UserInputError as e:
        raise UserInputError(f"{flag} {e}") from None


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
            raise UserInputError(f"{source} line {number}: {e}") from None
        except ValueError as e:
            raise UserInputError(f"{source} line {number}: {json_problem(e)}; each line must be one "
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
                raise UserInputError(f"{source}: is a vllm bench serve result (one JSON object), not JSON "
                                 f"lines; pass it with --bench {path}") from None
            raise
        return parse_requests(lines, source)
    try:
        data = _loads(text)
    except ValueError as e:
        if isinstance(e, DuplicateKeyError):
            raise UserInputError(f"{source}: {e}") from None
        if kind == "bench":
            raise UserInputError(f"{source}: {json_problem(e)}; give vllm bench serve --save-result's "
                             "file") from None
        return parse_requests(_json_lines(text, source), source)
    if kind == "auto" and isinstance(data, dict) and "first_token_time" in data:
        return parse_requests([(1, data)], source)  # a one-line JSONL file
    return parse_bench(data, source, seed=seed)
