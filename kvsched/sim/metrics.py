"""The metrics of ``vllm bench serve``, from simulated request timings.

Definitions follow vLLM 0.33.0's ``calculate_metrics`` (vllm/benchmarks/serve.py):

* TTFT = first token time - send time; E2EL = finish time - send time.
* TPOT = (E2EL - TTFT) / (output tokens - 1), only for requests with more
  than one output token; for goodput a one-token request counts TPOT 0.
* ITL: every inter-token gap of every request, pooled into one list.
* Goodput: requests meeting every given SLO (``slo >= value``) per second.
* mean / median / std / percentiles are numpy's (``np.percentile``'s default
  linear interpolation); an empty list reports 0, as vLLM's ``values or 0`` does.
* Times in the result are milliseconds; throughputs divide by ``duration``.

ITLs come in bulk (a one-hour run makes millions of tokens), so they are
collected in a :class:`SampleAccumulator` as ``(gap, count)`` pairs - one
decode step where B requests each get a token adds ``(step gap, B)`` - whose
median and percentiles equal numpy's on the flattened list exactly.
"""

from __future__ import annotations

import copy
import itertools
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar, overload

import numpy as np
import numpy.typing as npt

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.sim.samples import FloatArray, IntArray, SampleAccumulator

MILLISECONDS_PER_SECOND = 1000.0
SLO_METRICS = ("ttft", "tpot", "e2el")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


Seconds = TypeVar("Seconds", float, FloatArray)


def ttft(send_time: Seconds, first_token_time: Seconds) -> Seconds:
    """Time to first token: from the client's send to the first token. The
    one owner of TTFT (a request's, or a column of them)."""
    return first_token_time - send_time


def e2el(send_time: Seconds, finish_time: Seconds) -> Seconds:
    """End-to-end latency: from the client's send to the last token."""
    return finish_time - send_time


@overload
def tpot(ttft_s: float, e2el_s: float, num_output_tokens: int) -> float: ...


@overload
def tpot(ttft_s: FloatArray, e2el_s: FloatArray, num_output_tokens: IntArray) -> FloatArray: ...


def tpot(ttft_s: float | FloatArray, e2el_s: float | FloatArray,
         num_output_tokens: int | IntArray) -> float | FloatArray:
    """Time per output token after the first, vLLM's ``(e2el - ttft) /
    (output tokens - 1)``: measured from the first token, not the send. Only
    for requests with more than one output token (:func:`has_tpot`). The one
    owner of TPOT."""
    return (e2el_s - ttft_s) / (num_output_tokens - 1)


def has_tpot(num_output_tokens: int) -> bool:
    """Whether a request has a TPOT: vLLM leaves one-token outputs out of
    the TPOT list (and counts them TPOT 0 for goodput)."""
    return num_output_tokens > 1


def request_latencies(send_time: float, first_token_time: float, finish_time: float,
                      num_output_tokens: int) -> tuple[float, float, float | None]:
    """One request's (TTFT, E2EL, TPOT or None), in seconds."""
    first = ttft(send_time, first_token_time)
    end = e2el(send_time, finish_time)
    return first, end, tpot(first, end, num_output_tokens) if has_tpot(num_output_tokens) else None


@dataclass(slots=True)
class RequestRecord:
    """One completed request, as the benchmark client saw it (seconds).

    ``send_time`` is when the client sent it: its arrival, or later if
    ``max_concurrency`` held it back; ``arrival_time`` (optional, default:
    ``send_time``) is when it was due, for the client-queue metrics."""

    request_id: str
    send_time: float
    first_token_time: float
    finish_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    arrival_time: float | None = None
    # Every output token's time, first included; kept only when the
    # simulator is asked for per-request detail (``--save-detailed``).
    token_times: list[float] | None = None

    @property
    def itls(self) -> list[float] | None:
        """Gaps between consecutive tokens (None unless token_times are kept)."""
        times = self.token_times
        if times is None:
            return None
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def ttft(self) -> float:
        return ttft(self.send_time, self.first_token_time)

    @property
    def e2el(self) -> float:
        return e2el(self.send_time, self.finish_time)

    @property
    def tpot(self) -> float | None:
        """None for a one-token output (vLLM leaves it out of the TPOT list)."""
        return request_latencies(self.send_time, self.first_token_time, self.finish_time,
                                 self.num_output_tokens)[2]

    @property
    def client_queue_time(self) -> float:
        return 0.0 if self.arrival_time is None else self.send_time - self.arrival_time


class Mergeable(Protocol):
    """Counters of one engine core that add up across engine cores."""

    def merge(self, other: Self) -> None: ...


_M = TypeVar("_M", bound=Mergeable)


def sum_present(parts: Iterable[_M | None]) -> _M | None:
    """The sum of the engine cores' counters that are there (None: none
    is, the feature was off); the parts themselves are left as they are."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    total = copy.deepcopy(present[0])
    for part in present[1:]:
        total.merge(part)
    return total


def extend_columns(out: object, tables: Iterable[object], columns: Iterable[str]) -> None:
    """Append every table's ``columns`` (lists or arrays) to ``out``'s, in
    order: the concatenation of column tables, each column named once."""
    names = tuple(columns)
    for table in tables:
        for name in names:
            getattr(out, name).extend(getattr(table, name))


class RecordTable(Sequence[RequestRecord]):
    """Completed requests as columns: a simulator appends one per finish, and
    a million of them take ~130 bytes each instead of a ~250-byte object the
    garbage collector keeps walking. Reads as a sequence of
    :class:`RequestRecord` (built on access); :func:`compute_metrics` reads
    the columns directly. ``arrival_time`` is always set here."""

    __slots__ = ("request_id", "send_time", "first_token_time", "finish_time",
                 "num_prompt_tokens", "num_output_tokens", "arrival_time", "token_times")

    def __init__(self) -> None:
        self.request_id: list[str] = []
        self.send_time = array("d")
        self.first_token_time = array("d")
        self.finish_time = array("d")
        self.num_prompt_tokens = array("q")
        self.num_output_tokens = array("q")
        self.arrival_time = array("d")
        self.token_times: list[list[float] | None] = []

    def append(self, request_id: str, send_time: float, first_token_time: float,
               finish_time: float, num_prompt_tokens: int, num_output_tokens: int,
               arrival_time: float, token_times: list[float] | None = None) -> None:
        self.request_id.append(request_id)
        self.send_time.append(send_time)
        self.first_token_time.append(first_token_time)
        self.finish_time.append(finish_time)
        self.num_prompt_tokens.append(num_prompt_tokens)
        self.num_output_tokens.append(num_output_tokens)
        self.arrival_time.append(arrival_time)
        self.token_times.append(token_times)  # None unless detail is kept

    @classmethod
    def concat(cls, tables: Sequence[RecordTable]) -> RecordTable:
        out = cls()
        extend_columns(out, tables, cls.__slots__)
        return out

    def __len__(self) -> int:
        return len(self.request_id)

    @overload
    def __getitem__(self, index: int) -> RequestRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestRecord]: ...

    def __getitem__(self, index: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("RecordTable index out of range")
        return RequestRecord(self.request_id[i], self.send_time[i], self.first_token_time[i],
                             self.finish_time[i], self.num_prompt_tokens[i],
                             self.num_output_tokens[i], self.arrival_time[i], self.token_times[i])


def parse_goodput(args: Sequence[str] | str) -> dict[str, float]:
    """Parse SLOs as ``vllm bench serve --goodput ttft:500 tpot:50 e2el:2000``
    (milliseconds) into ``{"ttft": 500.0, ...}``. A single string is split on
    whitespace."""
    items = args.split() if isinstance(args, str) else list(args)
    slos: dict[str, float] = {}
    for item in items:
        parts = item.split(":") if isinstance(item, str) else []
        if len(parts) != 2:
            raise UserInputError(f"goodput {item!r}: expected KEY:VALUE with KEY one of "
                             f"{', '.join(SLO_METRICS)} and VALUE in milliseconds, e.g. ttft:500")
        name, text = parts[0].strip(), parts[1].strip()
        if name not in SLO_METRICS:
            raise UserInputError(f"goodput {item!r}: unknown metric {name!r}; "
                             f"choose from {', '.join(SLO_METRICS)}")
        if name in slos:
            raise UserInputError(f"goodput {item!r}: {name} is given twice")
        try:
            value = float(text)
        except ValueError:
            raise UserInputError(f"goodput {item!r}: value {text!r} is not a number of "
                                 f"milliseconds") from None
        if not 0 <= value < math.inf:
            raise UserInputError(f"goodput {item!r}: value {value} must be a finite number of milliseconds "
                             ">= 0 (leave the metric out for no limit)")
        slos[name] = value
    return slos


def _check_slos(goodput_slos: Mapping[str, float]) -> None:
    for name, value in goodput_slos.items():
        if name not in SLO_METRICS:
            raise UserInputError(f"goodput_slos: unknown metric {name!r}; "
                                 f"choose from {', '.join(SLO_METRICS)}")
        if not is_number(value) or not value >= 0:
            raise UserInputError(f"goodput_slos: {name}={value!r} must be a number >= 0 (milliseconds)")


def _percentile_word(p: float) -> str:
    # vLLM's key: p99 for 99.0, p99.9 for 99.9.
    return str(int(p)) if int(p) == p else str(p)


def _check_percentiles(percentiles: Sequence[float]) -> list[float]:
    out = []
    for p in percentiles:
        if not is_number(p) or not 0 <= p <= 100:
            raise UserInputError(f"percentiles: {p!r} must be a number in [0, 100]")
        out.append(float(p))
    return out


class _Timings:
    """The per-request columns of the records, checked once."""

    __slots__ = ("send", "first", "finish", "arrival", "prompt", "output")

    def __init__(self, records: Sequence[RequestRecord]) -> None:
        if isinstance(records, RecordTable):
            # Copies of the columns (the table keeps growing if the run goes on).
            self.send = np.array(records.send_time, dtype=np.float64)
            self.first = np.array(records.first_token_time, dtype=np.float64)
            self.finish = np.array(records.finish_time, dtype=np.float64)
            self.arrival = np.array(records.arrival_time, dtype=np.float64)
            self.prompt = np.array(records.num_prompt_tokens, dtype=np.int64)
            self.output = np.array(records.num_output_tokens, dtype=np.int64)
            self._check(records)
            return
        self.send = np.array([r.send_time for r in records], dtype=np.float64)
        self.first = np.array([r.first_token_time for r in records], dtype=np.float64)
        self.finish = np.array([r.finish_time for r in records], dtype=np.float64)
        self.arrival = np.array([r.send_time if r.arrival_time is None else r.arrival_time for r in records],
                                dtype=np.float64)
        self.prompt = np.array([r.num_prompt_tokens for r in records], dtype=np.int64)
        self.output = np.array([r.num_output_tokens for r in records], dtype=np.int64)
        self._check(records)

    def _check(self, records: Sequence[RequestRecord]) -> None:
        checks = (
            (np.isfinite(self.send) & np.isfinite(self.first) & np.isfinite(self.finish)
             & np.isfinite(self.arrival), "times must be finite numbers"),
            (self.arrival <= self.send, "arrival_time must not be after send_time"),
            (self.first >= self.send, "first_token_time must not be before send_time"),
            (self.finish >= self.first, "finish_time must not be before first_token_time"),
            (self.prompt >= 1, "num_prompt_tokens must be >= 1"),
            (self.output >= 1, "num_output_tokens must be >= 1"),
        )
        for ok, message in checks:
            if not np.all(ok):
                r = records[int(np.flatnonzero(~ok)[0])]
                raise UserInputError(f"RequestRecord {r.request_id}: {message} ({r})")


def _array_stats(values: FloatArray, percentiles: Sequence[float]) -> tuple[float, float, float, list[float]]:
    # vLLM passes `values or 0`: an empty list reports zeros.
    data = values if len(values) else np.zeros(1)
    return (float(np.mean(data)), float(np.median(data)), float(np.std(data)),
            [float(np.percentile(data, p)) for p in percentiles])


def distribution(values: FloatArray, percentiles: Sequence[float]) -> tuple[float, float, float, list[float]]:
    """(mean, median, std, percentiles) of ``values`` as vllm bench serve
    computes them (numpy's; zeros when empty), for figures beside its own."""
    return _array_stats(values, _check_percentiles(percentiles))


def _accumulator_stats(acc: SampleAccumulator, percentiles: Sequence[float]
                       ) -> tuple[float, float, float, list[float]]:
    if len(acc) == 0:
        return 0.0, 0.0, 0.0, [0.0 for _ in percentiles]
    return acc.mean(), acc.median(), acc.std(), [acc.percentile(p) for p in percentiles]


def benchmark_duration(records: Sequence[RequestRecord], start_time: float = 0.0) -> float:
    """vLLM's benchmark duration: from the start of the run (``start_time``, the
    origin of the arrival schedule - vLLM starts its clock before it sleeps
    until the first arrival) to the last completion."""
    if not records:
        raise UserInputError("benchmark_duration: no records")
    if isinstance(records, RecordTable):
        return max(records.finish_time) - start_time
    return max(r.finish_time for r in records) - start_time


def _peaks(t: _Timings, token_times: SampleAccumulator | None) -> dict[str, float | int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests: per whole
    second since the first send, tokens emitted and requests in flight.

    vLLM bins into an array with one slot per second of the run; here only
    the seconds that hold a sample or an event are visited (sort and sum per
    distinct second), so the cost follows the number of samples and a run
    spanning years costs no more than one spanning an hour."""
    out: dict[str, float | int] = {}
    if len(t.send) == 0:
        if token_times is not None:
            out["max_output_tokens_per_s"] = 0.0
        out["max_concurrent_requests"] = 0
        return out
    start = float(t.send.min())
    seconds = int(np.ceil(float(t.finish.max()) - start)) + 1
    if token_times is not None:
        times, counts = token_times._pairs()
        bucket = np.trunc(times - start)  # vLLM's int(): truncation toward zero
        inside = (bucket >= 0) & (bucket < seconds)
        # Seconds without a token hold 0, and no second holds less: the peak
        # is the largest per-second total among the seconds that have tokens.
        _, which = np.unique(bucket[inside], return_inverse=True)
        per_second = np.bincount(which.reshape(-1), weights=counts[inside].astype(np.float64))
        out["max_output_tokens_per_s"] = float(per_second.max()) if len(per_second) else 0.0
    # A request counts in every second from its send's to its finish's,
    # inclusive: +1 at its first second, -1 after its last. The count only
    # changes at those seconds, so its peak is the running sum after the last
    # event of some second (the first send's second, 0, always has one).
    first_second = np.trunc(t.send - start).astype(np.int64)
    last_second = np.trunc(t.finish - start).astype(np.int64)
    where = np.concatenate([first_second, last_second + 1])
    delta = np.concatenate([np.ones(len(first_second), dtype=np.int64),
                            np.full(len(last_second), -1, dtype=np.int64)])
    order = np.argsort(where, kind="stable")
    where = where[order]
    running = np.cumsum(delta[order])
    last_of_second = np.append(where[1:] != where[:-1], True)
    counted = last_of_second & (where < seconds)
    out["max_concurrent_requests"] = int(running[counted].max())
    return out


def _goodput_count(ttft: FloatArray, tpot_or_zero: FloatArray, e2el: FloatArray,
                   goodput_slos: Mapping[str, float]) -> int:
    values = {"ttft": ttft, "tpot": tpot_or_zero, "e2el": e2el}
    good = np.ones(len(ttft), dtype=bool)
    for name in SLO_METRICS:
        if name in goodput_slos:
            good &= (goodput_slos[name] / MILLISECONDS_PER_SECOND) >= values[name]
    return int(good.sum())


def compute_metrics(
    records: Sequence[RequestRecord],
    itls: SampleAccumulator | npt.ArrayLike,
    duration: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slos: Mapping[str, float] | None = None,
    *,
    failed: int = 0,
    token_times: SampleAccumulator | None = None,
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
) -> dict[str, float | int]:
    """vllm bench serve's result keys for completed ``records``.

    ``itls``: every inter-token latency in seconds, as a :class:`SampleAccumulator`
    or a flat array. ``duration``: the benchmark duration in seconds (see
    :func:`benchmark_duration`). ``goodput_slos``: milliseconds per metric, as
    :func:`parse_goodput` returns; ``request_goodput`` is present only with
    SLOs (vLLM writes null otherwise). ``failed``: requests that did not
    complete (reported only). ``token_times``: emission time of every output
    token, first tokens included (``add(time, tokens)`` per step); when given,
    ``max_output_tokens_per_s`` is reported. ``percentile_metrics``: which of
    ttft, tpot, itl, e2el, client_queue_time, e2el_including_client_queue get
    mean/median/std/p{N} keys (the last two need ``arrival_time``).
    """
    if not is_number(duration) or not 0 < duration < math.inf:
        raise UserInputError(f"duration={duration!r} must be a finite number of seconds > 0")
    if not is_int(failed) or failed < 0:
        raise UserInputError(f"failed={failed!r} must be an integer >= 0")
    ps = _check_percentiles(percentiles)
    unknown = [m for m in percentile_metrics if m not in PERCENTILE_METRICS]
    if unknown:
        raise UserInputError(f"percentile_metrics: unknown {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(PERCENTILE_METRICS)}")
    if goodput_slos:
        _check_slos(goodput_slos)
    t = _Timings(records)
    ttfts = ttft(t.send, t.first)
    e2els = e2el(t.send, t.finish)
    multi = t.output > 1  # has_tpot, per request
    tpots = tpot(ttfts[multi], e2els[multi], t.output[multi])
    tpot_or_zero = np.zeros(len(records))
    tpot_or_zero[multi] = tpots

    total_input = int(t.prompt.sum())
    total_output = int(t.output.sum())
    result: dict[str, float | int] = {
        "duration": float(duration),
        "completed": len(records),
        "failed": failed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(records) / duration,
    }
    if goodput_slos:
        result["request_goodput"] = _goodput_count(ttfts, tpot_or_zero, e2els, goodput_slos) / duration
    result["output_throughput"] = total_output / duration
    result["total_token_throughput"] = (total_input + total_output) / duration
    result.update(_peaks(t, token_times))

    queue = t.send - t.arrival
    columns: dict[str, FloatArray] = {"ttft": ttfts, "tpot": tpots, "e2el": e2els, "client_queue_time": queue,
                                      "e2el_including_client_queue": e2els + queue}
    for metric in PERCENTILE_METRICS:
        if metric not in percentile_metrics:
            continue
        if metric == "itl":
            stats = (_accumulator_stats(itls, ps) if isinstance(itls, SampleAccumulator)
                     else _array_stats(_itl_array(itls), ps))
        else:
            stats = _array_stats(columns[metric], ps)
        _put_stats(result, metric, stats, ps)
    return result


def _itl_array(itls: npt.ArrayLike) -> FloatArray:
    data = np.asarray(itls, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(data)):
        raise UserInputError("itls: every inter-token latency must be a finite number")
    return data


def _put_stats(result: dict[str, float | int], metric: str, stats: tuple[float, float, float, list[float]],
               percentiles: Sequence[float]) -> None:
    mean, median, std, values = stats
    ms = MILLISECONDS_PER_SECOND
    result[f"mean_{metric}_ms"] = mean * ms
    result[f"median_{metric}_ms"] = median * ms
    result[f"std_{metric}_ms"] = std * ms
    for p, value in zip(percentiles, values):
        result[f"p{_percentile_word(p)}_{metric}_ms"] = value * ms
