"""Workloads for the serving simulator: who sends what, and when.

A :class:`Workload` is a tuple of :class:`WorkloadRequest` sorted by arrival
time. Sources:

* :func:`random_workload` - the synthetic dataset of
  ``vllm bench serve --dataset-name random`` with its arrival process;
* :func:`load_azure` - the Azure LLM inference traces 2023 (CSV);
* :func:`load_mooncake` - the Mooncake traces (JSONL with ``hash_ids``);
* :func:`load_jsonl` - plain ``{"arrival_time", "input_tokens", "output_tokens"}`` lines;
* :func:`load_workload` - dispatch on a dataset name, as ``--dataset-name``.

Token ids
---------
Prompts are stored as runs of ``(token_id, count)``: a one-hour trace holds
tens of millions of prompt tokens, and the scheduler only needs the token
*content* to be right where it matters, which is prefix-cache hashing. The
scheme makes two prompts share exactly the tokens the source says they share:

* Content private to one request is one run of ``UNIQUE_TOKEN_BASE + index``,
  ``index`` being the request's position in its source (file row order, or
  generation order for the random dataset). No other request has that id.
* The random dataset's shared prefix (``prefix_len``) is one run of
  ``RANDOM_PREFIX_TOKEN``.
* A Mooncake hash id ``h`` names a block of ``MOONCAKE_BLOCK_TOKENS`` (512)
  tokens; the block is one run of ``HASH_BLOCK_TOKEN_BASE + h``, and the last
  block of a prompt is cut to the tokens that remain of ``input_length``.
  Blocks of 512 tokens stay aligned with any KV block size that divides 512.

Ids ``0`` and ``2 .. HASH_BLOCK_TOKEN_BASE - 1`` are never used in prompts, so
a simulator can pick its output token ids there.
"""

from __future__ import annotations

import csv
import datetime
import io
import itertools
import math
import re
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from kvsched.jsonfile import json_problem, strict_loads
from kvsched.request import Request, SamplingParams, TokenRuns

RANDOM_PREFIX_TOKEN = 1
HASH_BLOCK_TOKEN_BASE = 1_000_000
UNIQUE_TOKEN_BASE = 1_000_000_000
# The largest Mooncake hash id whose token id stays below the request-unique range.
MAX_HASH_ID = UNIQUE_TOKEN_BASE - HASH_BLOCK_TOKEN_BASE - 1
MOONCAKE_BLOCK_TOKENS = 512
# Random prompt i starts with token UNIQUE_TOKEN_BASE + i: keep it an int64.
MAX_RANDOM_PROMPTS = 2**62 - UNIQUE_TOKEN_BASE

# Bounds on every number a workload file or flag gives, checked before
# anything is allocated from it; kvsched.sim.command and
# kvsched.sim.deployment bound the flags.
#
# Token counts of one request (prompt, output, random lengths): 2**40 (about
# 1.1e12). Far above any context window (the longest are ~1e7 tokens), so a
# long row is still a *request* the server refuses against max_model_len, as
# vLLM's does; and small enough that a count, prompt + output and numpy's
# int64 columns hold it exactly. A prompt is kept as runs, never as a token
# list, so a long row costs no memory before it is refused.
MAX_REQUEST_TOKENS = 2**40
# Arrival times, in seconds from the start of the workload: 1e8 s (3.2
# years). Longer than any serving trace (Azure 2023: 1 hour, Azure 2024: 1
# week, Mooncake: 1 hour), and float64 times up there still resolve 15 ns,
# well below a step time; further out step times lose digits (at 1e12 s the
# resolution is 0.1 ms, at 1e300 s a step adds nothing: a TPOT of 0).
MAX_ARRIVAL_TIME = 1e8
# Raw Mooncake timestamps (milliseconds): 2**53, the largest integer a float
# holds exactly (Unix-epoch milliseconds are ~1.7e12).
MAX_TIMESTAMP_MS = 2**53
# Requests of one workload: ten million. The random dataset draws its
# columns up front (numpy, then 20 bytes a request), so the count is what
# memory grows with; ten million is 100x the largest runs vllm bench serve
# is used for, and peaks at ~0.7 GB during the draw (measured).
MAX_NUM_PROMPTS = 10_000_000
# vllm bench serve seeds numpy's global RandomState (np.random.seed), whose
# seeds are 32-bit.
MAX_SEED = 2**32 - 1
# Gamma shape of the arrival gaps. vLLM takes any value > 0, but below 0.01
# numpy's gamma draws underflow to exactly 0 for a growing share of gaps (half
# of them at 0.001), so the arrivals are no longer the process asked for;
# above 1e6 the gaps are constant to 0.1 % (give inf for exactly constant).
MIN_BURSTINESS = 0.01
MAX_BURSTINESS = 1e6

# vllm bench serve's defaults for --dataset-name random.
DEFAULT_NUM_PROMPTS = 1000
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128

DATASET_NAMES = ("random", "azure", "mooncake", "jsonl")

PromptRuns = tuple[tuple[int, int], ...]


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True is no token count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _show(value: object, limit: int = 40) -> str:
    """``repr(value)`` for a message, a 400-digit number cut to its length."""
    if isinstance(value, list | dict) and len(value) > 8:
        return f"<a {type(value).__name__} of {len(value)} items>"
    text = repr(value)
    if len(text) <= limit:
        return text
    if _is_int(value):
        return f"{text[:12]}...({len(text)} digits)"
    return text[:limit] + "..."


@dataclass(slots=True, frozen=True)
class WorkloadRequest:
    """One request of a workload: when it arrives (seconds from the start of
    the workload), its prompt as ``(token_id, count)`` runs, and how many
    tokens it generates."""

    request_id: str
    arrival_time: float
    prompt_runs: PromptRuns
    output_len: int
    num_prompt_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.request_id
        if not isinstance(name, str) or not name:
            raise ValueError(f"WorkloadRequest request_id={name!r}: must be a non-empty string")
        where = f"WorkloadRequest {name}"
        t = self.arrival_time
        # Compared, not converted: an int of 400 digits is refused, not an OverflowError.
        if not _is_real(t) or not 0 <= t <= MAX_ARRIVAL_TIME:
            raise ValueError(f"{where}: arrival_time={_show(t)} must be a number of seconds in "
                             f"[0, {MAX_ARRIVAL_TIME:.0e}] (the simulator's time span)")
        if not _is_int(self.output_len) or not 1 <= self.output_len <= MAX_REQUEST_TOKENS:
            raise ValueError(f"{where}: output_len={_show(self.output_len)} must be an integer in "
                             f"[1, 2**40]")
        runs = _checked_runs(where, self.prompt_runs)
        num_prompt_tokens = sum(count for _, count in runs)
        if num_prompt_tokens > MAX_REQUEST_TOKENS:
            raise ValueError(f"{where}: {_show(num_prompt_tokens)} prompt tokens; at most 2**40 "
                             "(a longer prompt is no request any server takes)")
        # Frozen: normalise lists to tuples and cache the length once.
        object.__setattr__(self, "prompt_runs", runs)
        object.__setattr__(self, "num_prompt_tokens", num_prompt_tokens)

    def prompt_token_ids(self) -> list[int]:
        """The prompt as a token list (``[token] * count`` per run, C speed)."""
        tokens: list[int] = []
        for token, count in self.prompt_runs:
            tokens += [token] * count
        return tokens

    def to_request(self, params: SamplingParams, arrival_time: float) -> Request:
        """The scheduler's Request for this prompt: its runs as they are (no
        token list, so a waiting request stays small), marked private when
        :func:`prompt_shares_nothing` says so."""
        return Request(self.request_id, TokenRuns(self.prompt_runs, None, self.num_prompt_tokens),
                       params, arrival_time=arrival_time,
                       private=prompt_shares_nothing(self.prompt_runs))


def prompt_shares_nothing(runs: PromptRuns) -> bool:
    """The one rule for "this prompt can share no KV block with another
    request": it starts with a request-unique token (``UNIQUE_TOKEN_BASE``
    and up; :class:`Workload` checks no two of its requests start with the
    same one). Every full block of such a request, prompt and outputs, then
    chains from a first block no other request has, so the prefix cache can
    never match it to another request's (see
    ``KVCacheManager._private_keys`` for what the cache does with that)."""
    return runs[0][0] >= UNIQUE_TOKEN_BASE


def _checked_runs(where: str, runs: object) -> PromptRuns:
    # Fast path (a trace has ~300k runs): a tuple of (int, int) tuples, all valid.
    if type(runs) is tuple and runs and all(
            type(r) is tuple and len(r) == 2 and type(r[0]) is int and type(r[1]) is int
            and r[0] >= 0 and r[1] >= 1 for r in runs):
        return runs
    return _slow_checked_runs(where, runs)


def _slow_checked_runs(where: str, runs: object) -> PromptRuns:
    """Normalise lists to tuples, or name the first bad run."""
    if not isinstance(runs, tuple | list) or not runs:
        raise ValueError(f"{where}: prompt_runs={runs!r} must be a non-empty sequence of "
                         "(token_id, count) pairs")
    out: list[tuple[int, int]] = []
    for i, run in enumerate(runs):
        if not isinstance(run, tuple | list) or len(run) != 2:
            raise ValueError(f"{where}: prompt_runs[{i}]={run!r} must be a (token_id, count) pair")
        token, count = run
        if not _is_int(token) or token < 0:
            raise ValueError(f"{where}: prompt_runs[{i}] token_id={token!r} must be an integer >= 0")
        if not _is_int(count) or count < 1:
            raise ValueError(f"{where}: prompt_runs[{i}] count={count!r} must be an integer >= 1")
        out.append((token, count))
    return tuple(out)


class RandomRequests(Sequence[WorkloadRequest]):
    """The random dataset's requests, kept as three columns and built on
    demand: a million requests cost 20 bytes each until they are sent
    (a built :class:`WorkloadRequest` is ~500 bytes). Request ``i`` is
    ``random-i``: ``prefix_len`` shared tokens, then its own input (one run
    of ``UNIQUE_TOKEN_BASE + i``), and ``output_lens[i]`` output tokens.
    Sorted by arrival, ids unique, by construction."""

    __slots__ = ("arrivals", "input_lens", "output_lens", "prefix_len", "start", "stop")

    def __init__(self, arrivals: array[float], input_lens: array[int], output_lens: array[int],
                 prefix_len: int, start: int = 0, stop: int | None = None) -> None:
        self.arrivals = arrivals
        self.input_lens = input_lens
        self.output_lens = output_lens
        self.prefix_len = prefix_len
        self.start = start
        self.stop = len(arrivals) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, index: int) -> WorkloadRequest: ...

    @overload
    def __getitem__(self, index: slice) -> RandomRequests: ...

    def __getitem__(self, index: int | slice) -> WorkloadRequest | RandomRequests:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                raise ValueError("RandomRequests: only contiguous slices (step 1) are supported")
            return RandomRequests(self.arrivals, self.input_lens, self.output_lens, self.prefix_len,
                                  self.start + start, self.start + max(start, stop))
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("RandomRequests index out of range")
        i += self.start
        runs = []
        if self.prefix_len:
            runs.append((RANDOM_PREFIX_TOKEN, self.prefix_len))
        if self.input_lens[i]:
            runs.append((UNIQUE_TOKEN_BASE + i, self.input_lens[i]))
        return WorkloadRequest(f"random-{i}", self.arrivals[i], tuple(runs), self.output_lens[i])

    def arrival_times(self) -> Sequence[float]:
        return self.arrivals[self.start:self.stop]

    def _columns(self) -> tuple[int, array[float], array[int], array[int]]:
        lo, hi = self.start, self.stop
        return (self.prefix_len, self.arrivals[lo:hi], self.input_lens[lo:hi], self.output_lens[lo:hi])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RandomRequests):
            return self.start == other.start and self._columns() == other._columns()
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        prefix, arrivals, inputs, outputs = self._columns()
        return hash((prefix, self.start, arrivals.tobytes(), inputs.tobytes(), outputs.tobytes()))

    def total_lengths(self) -> tuple[int, int]:
        """(prompt tokens, output tokens) of all requests."""
        lo, hi = self.start, self.stop
        return (sum(self.input_lens[lo:hi]) + self.prefix_len * len(self),
                sum(self.output_lens[lo:hi]))

    def longest_total(self) -> int:
        """The largest prompt + output length of any request."""
        lo, hi = self.start, self.stop
        return self.prefix_len + max(a + b for a, b in zip(self.input_lens[lo:hi],
                                                          self.output_lens[lo:hi]))

    def scaled(self, time_scale: float) -> RandomRequests:
        # Element by element, the same float product as WorkloadRequest's.
        arrivals = array("d", (t * time_scale for t in self.arrivals[self.start:self.stop]))
        return RandomRequests(arrivals, self.input_lens[self.start:self.stop],
                              self.output_lens[self.start:self.stop], self.prefix_len)

    def first_at_or_after(self, t: float) -> int:
        """How many requests arrive before ``t`` (they are sorted)."""
        return bisect_left(self.arrivals, t, self.start, self.stop) - self.start


@dataclass(slots=True, frozen=True)
class Workload:
    """Requests sorted by arrival time (stable: equal times keep their order),
    plus the client-side concurrency limit of ``vllm bench serve
    --max-concurrency`` (``None``: unlimited). ``requests`` is a tuple, or
    for the random dataset a :class:`RandomRequests` built on demand."""

    name: str
    requests: Sequence[WorkloadRequest]
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Workload name={self.name!r}: must be a non-empty string")
        mc = self.max_concurrency
        if mc is not None and (not _is_int(mc) or mc < 1):
            raise ValueError(f"Workload {self.name}: max_concurrency={mc!r} must be None or an integer >= 1")
        if isinstance(self.requests, RandomRequests):
            if not len(self.requests):
                raise ValueError(f"Workload {self.name}: requests is empty; a workload needs a request")
            return  # sorted, unique and private by construction
        requests = tuple(self.requests)
        if not requests:
            raise ValueError(f"Workload {self.name}: requests is empty; a workload needs a request")
        for i, r in enumerate(requests):
            if not isinstance(r, WorkloadRequest):
                raise ValueError(f"Workload {self.name}: requests[{i}] is a {type(r).__name__}, "
                                 "not a WorkloadRequest")
        if any(a.arrival_time > b.arrival_time for a, b in itertools.pairwise(requests)):
            requests = tuple(sorted(requests, key=lambda r: r.arrival_time))  # sorted() is stable
        seen: set[str] = set()
        for r in requests:
            if r.request_id in seen:
                raise ValueError(f"Workload {self.name}: duplicate request_id {r.request_id!r}")
            seen.add(r.request_id)
        # prompt_shares_nothing relies on it: a request-unique token starts one prompt only.
        owner: dict[int, str] = {}
        for r in requests:
            first = r.prompt_runs[0][0]
            if first >= UNIQUE_TOKEN_BASE:
                other = owner.setdefault(first, r.request_id)
                if other != r.request_id:
                    raise ValueError(
                        f"Workload {self.name}: requests {other} and {r.request_id} both start with "
                        f"token {first}; ids from UNIQUE_TOKEN_BASE ({UNIQUE_TOKEN_BASE}) up are "
                        "private to one request (give each request its own)")
        object.__setattr__(self, "requests", requests)

    def __len__(self) -> int:
        return len(self.requests)

    def arrival_times(self) -> Sequence[float]:
        """Every request's arrival time, in order (without building requests)."""
        if isinstance(self.requests, RandomRequests):
            return self.requests.arrival_times()
        return [r.arrival_time for r in self.requests]

    @property
    def total_prompt_tokens(self) -> int:
        if isinstance(self.requests, RandomRequests):
            return self.requests.total_lengths()[0]
        return sum(r.num_prompt_tokens for r in self.requests)

    @property
    def total_output_tokens(self) -> int:
        if isinstance(self.requests, RandomRequests):
            return self.requests.total_lengths()[1]
        return sum(r.output_len for r in self.requests)

    @property
    def last_arrival_time(self) -> float:
        return self.requests[-1].arrival_time

    def scaled(self, time_scale: float) -> Workload:
        """Arrival times multiplied by ``time_scale`` (0.5 = twice the rate)."""
        if not _is_real(time_scale) or not math.isfinite(time_scale) or time_scale <= 0:
            raise ValueError(f"Workload {self.name}: time_scale={time_scale!r} must be a finite number > 0")
        last = self.last_arrival_time * time_scale
        if last > MAX_ARRIVAL_TIME:
            raise ValueError(f"Workload {self.name}: time_scale={time_scale!r} puts the last arrival at "
                             f"{last:.4g} s, beyond the simulator's time span of {MAX_ARRIVAL_TIME:.0e} s; "
                             f"use a time scale <= {MAX_ARRIVAL_TIME / self.last_arrival_time:.4g}")
        if isinstance(self.requests, RandomRequests):
            return Workload(self.name, self.requests.scaled(time_scale), self.max_concurrency)
        requests = tuple(
            WorkloadRequest(r.request_id, r.arrival_time * time_scale, r.prompt_runs, r.output_len)
            for r in self.requests)
        return Workload(self.name, requests, self.max_concurrency)

    def truncated(self, num_requests: int | None = None, duration: float | None = None) -> Workload:
        """The first ``num_requests`` requests and/or those arriving before
        ``duration`` seconds (``arrival_time < duration``); both apply if both given."""
        requests = self.requests
        if num_requests is not None:
            if not _is_int(num_requests) or num_requests < 1:
                raise ValueError(f"Workload {self.name}: num_requests={num_requests!r} "
                                 "must be an integer >= 1")
            requests = requests[:num_requests]
        if duration is not None:
            if not _is_real(duration) or math.isnan(duration) or duration <= 0:
                raise ValueError(f"Workload {self.name}: duration={duration!r} must be a number > 0")
            if isinstance(requests, RandomRequests):
                requests = requests[:requests.first_at_or_after(duration)]
            else:
                requests = tuple(r for r in requests if r.arrival_time < duration)
            if not requests:
                raise ValueError(f"Workload {self.name}: no request arrives before duration={duration!r} s "
                                 f"(the first arrives at {self.requests[0].arrival_time} s)")
        return Workload(self.name, requests, self.max_concurrency)


# --------------------------------------------------------------------------
# The random dataset of vllm bench serve


def _split_range_ratio(range_ratio: float | Mapping[str, float]) -> tuple[float, float]:
    # vLLM takes one float for both lengths, or {"input": r, "output": r}.
    if isinstance(range_ratio, Mapping):
        extra = set(range_ratio) - {"input", "output"}
        if extra or len(range_ratio) != 2:
            raise ValueError(f"range_ratio={dict(range_ratio)!r}: a mapping needs exactly the keys "
                             "'input' and 'output'")
        ratios = (range_ratio["input"], range_ratio["output"])
    else:
        ratios = (range_ratio, range_ratio)
    for which, r in zip(("input", "output"), ratios):
        if not _is_real(r) or not 0.0 <= r < 1.0:
            raise ValueError(f"range_ratio ({which})={r!r} must be a number in [0, 1)")
    return float(ratios[0]), float(ratios[1])


_TOKENS_WHY = ("2**40 tokens is far beyond any context window; longer requests are refused "
               "against max_model_len")


def _check_count(name: str, value: object, minimum: int, maximum: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"random workload: {name}={_show(value)} must be an integer >= {minimum}")
    if value > maximum:
        raise ValueError(f"random workload: {name}={_show(value)} must be at most {maximum:,} ({why})")


def random_workload(
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    range_ratio: float | Mapping[str, float] = 0.0,
    prefix_len: int = 0,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
) -> Workload:
    """``vllm bench serve --dataset-name random``, same semantics and defaults.

    Each prompt is ``prefix_len`` shared tokens followed by a length drawn
    uniformly from the integers ``[floor(input_len*(1-r)), ceil(input_len*(1+r))]``;
    the output length from ``[max(1, floor(output_len*(1-r))), max(1, ceil(output_len*(1+r)))]``.
    The lengths come from ``numpy.random.default_rng(seed)`` drawn in vLLM's
    order (all input lengths, then all output lengths), so they equal vLLM's
    for the same seed when the tokenizer adds no special tokens (vLLM subtracts
    those from ``input_len``; we have no tokenizer).

    Arrivals follow vLLM's ``get_request``: with ``request_rate`` infinite all
    arrive at 0; otherwise the gaps are gamma(shape=burstiness,
    scale=1/(rate*burstiness)) (exponential, i.e. Poisson arrivals, at
    burstiness 1; constant 1/rate at burstiness inf), summed, then rescaled so
    the last arrival is at ``num_prompts / request_rate``. The gaps come from
    ``numpy.random.RandomState(seed)``, the stream vLLM draws after
    ``np.random.seed(seed)``, so arrival times match vLLM's too.
    """
    _check_count("num_prompts", num_prompts, 1, MAX_NUM_PROMPTS,
                 "ten million requests: the random dataset draws every request's lengths up front")
    _check_count("input_len", input_len, 0, MAX_REQUEST_TOKENS, _TOKENS_WHY)
    _check_count("output_len", output_len, 0, MAX_REQUEST_TOKENS, _TOKENS_WHY)
    _check_count("prefix_len", prefix_len, 0, MAX_REQUEST_TOKENS, _TOKENS_WHY)
    _check_count("seed", seed, 0, MAX_SEED, "numpy's RandomState, which vLLM seeds, takes 32-bit seeds")
    if not _is_real(request_rate) or not request_rate > 0:
        raise ValueError(f"random workload: request_rate={request_rate!r} must be a number > 0 "
                         "(inf: all at once)")
    # vLLM rescales the arrivals to end at num_prompts / request_rate: bound that span.
    if num_prompts / request_rate > MAX_ARRIVAL_TIME:
        raise ValueError(f"random workload: request_rate={request_rate!r} spreads {num_prompts} requests "
                         f"over {num_prompts / request_rate:.4g} s, beyond the simulator's time span of "
                         f"{MAX_ARRIVAL_TIME:.0e} s (float64 times lose step-time precision further "
                         f"out); use a rate >= {num_prompts / MAX_ARRIVAL_TIME:.4g} req/s")
    if not _is_real(burstiness) or not (MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS
                                        or burstiness == math.inf):
        raise ValueError(f"random workload: burstiness={burstiness!r} must be a number in "
                         f"[{MIN_BURSTINESS}, {MAX_BURSTINESS:.0e}] or inf (constant gaps): below, "
                         "numpy's gamma gaps underflow to 0; above, they are constant to 0.1 %")
    input_ratio, output_ratio = _split_range_ratio(range_ratio)
    input_low = math.floor(input_len * (1 - input_ratio))
    input_high = math.ceil(input_len * (1 + input_ratio))
    output_low = max(1, math.floor(output_len * (1 - output_ratio)))
    output_high = max(1, math.ceil(output_len * (1 + output_ratio)))
    if prefix_len + input_low < 1:
        raise ValueError(f"random workload: prefix_len ({prefix_len}) + the shortest sampled input "
                         f"({input_low}) must be >= 1; raise input_len or prefix_len, or lower range_ratio")
    if prefix_len + input_high > MAX_REQUEST_TOKENS or output_high > MAX_REQUEST_TOKENS:
        raise ValueError(f"random workload: prompts up to {prefix_len + input_high} tokens (prefix_len + "
                         f"input_len x (1 + range_ratio)) and outputs up to {output_high}: each must be "
                         f"<= 2**40 ({_TOKENS_WHY})")

    import numpy as np  # only the random dataset needs numpy here; trace loading does not

    rng = np.random.default_rng(seed)
    input_lens = array("q", rng.integers(input_low, input_high + 1, size=num_prompts).tolist())
    output_lens = array("q", rng.integers(output_low, output_high + 1, size=num_prompts).tolist())
    arrivals = array("d", arrival_times_of_rate(num_prompts, float(request_rate), float(burstiness), seed))
    return Workload("random", RandomRequests(arrivals, input_lens, output_lens, prefix_len),
                    max_concurrency)


def arrival_times_of_rate(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The send times of ``n`` requests at ``rate`` req/s with vllm bench
    serve's gamma gaps (``burstiness`` 1 = Poisson), seeded: the one draw
    the random workloads and ``kvsched calibrate``'s replays share."""
    import numpy as np

    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        theta = 1.0 / (rate * burstiness)
        gaps = np.random.RandomState(seed).gamma(shape=burstiness, scale=theta, size=n)
    # np.cumsum adds left to right, as vLLM's running sum does: same floats.
    times = np.cumsum(gaps)
    if times[-1] != 0:
        # vLLM rescales so the schedule ends exactly at n / rate.
        times = times * ((n / rate) / times[-1])
    result: list[float] = times.tolist()
    return result


# --------------------------------------------------------------------------
# Trace files


class _Source:
    """Where a value came from, for error messages: file and line."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, line: int, message: str) -> ValueError:
        return ValueError(f"{self.path}, line {line}: {message}")


def _read_text(path: str | Path) -> tuple[Path, str]:
    p = Path(path)
    try:
        # utf-8-sig: a byte-order mark (common in CSVs saved by spreadsheets) is not data.
        return p, p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ValueError(f"{p}: cannot read the workload file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text (byte {e.start}): {e.reason}") from None


_INT_TEXT = re.compile(r"\s*[-+]?[0-9]+\s*")


def _text_int(src: _Source, line: int, column: str, text: str, minimum: int, why: str) -> int:
    # int() alone would also take '1_000'; a trace column holds plain digits.
    if not _INT_TEXT.fullmatch(text):
        raise src.error(line, f"{column}={_show(text)} is not an integer")
    if len(text.strip().lstrip("+-").lstrip("0")) > 20:  # before int(): it refuses 4,300 digits
        raise src.error(line, f"{column}={_show(text.strip())} must be at most 2**40 ({_TOKENS_WHY})")
    value = int(text)
    return _bounded_int(src, line, column, value, minimum, why)


def _bounded_int(src: _Source, line: int, key: str, value: int, minimum: int, why: str) -> int:
    if value < minimum:
        raise src.error(line, f"{key}={_show(value)} must be >= {minimum} ({why})")
    if value > MAX_REQUEST_TOKENS:
        raise src.error(line, f"{key}={_show(value)} must be at most 2**40 ({_TOKENS_WHY})")
    return value


def _json_int(src: _Source, line: int, key: str, value: object, minimum: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise src.error(line, f"{key}={_show(value)} must be an integer")
    return _bounded_int(src, line, key, value, minimum, why)


def _json_time(src: _Source, line: int, key: str, value: object, maximum: float, unit: str) -> float | int:
    # json.loads accepts NaN and Infinity; neither is a time. Compared, not
    # converted: a 400-digit integer is out of range, not an OverflowError.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= maximum:
        raise src.error(line, f"{key}={_show(value)} must be a number in [0, {maximum:.4g}] {unit}")
    return value


def _check_span(src: _Source, line: int, key: str, seconds: float) -> None:
    if seconds > MAX_ARRIVAL_TIME:
        raise src.error(line, f"{key} is {seconds:.4g} s after the first request's, beyond the "
                        f"simulator's time span of {MAX_ARRIVAL_TIME:.0e} s (float64 times lose "
                        "step-time precision further out); split the trace")


_PROMPT_WHY = "a request needs at least one prompt token"
_OUTPUT_WHY = "a request generates at least one token; vLLM has no zero-token generation"


def _unique_prompt(index: int, num_tokens: int) -> PromptRuns:
    return ((UNIQUE_TOKEN_BASE + index, num_tokens),)


def _build(src: _Source, line: int, request_id: str, arrival: float, runs: PromptRuns,
           output_len: int) -> WorkloadRequest:
    try:
        return WorkloadRequest(request_id, arrival, runs, output_len)
    except ValueError as e:  # the loaders check fields first; this is a backstop with the line
        raise src.error(line, str(e)) from None


# Azure: "2023-11-16 18:15:46.6805900" (7 fractional digits: more than %f takes).
_AZURE_TIME = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _azure_time_ns(src: _Source, line: int, text: str) -> int:
    """Nanoseconds since 0001-01-01 as an exact integer (no float rounding)."""
    m = _AZURE_TIME.fullmatch(text)
    if m is None:
        raise src.error(line, f"TIMESTAMP={_show(text)} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        days = datetime.date(year, month, day).toordinal()
    except ValueError as e:
        raise src.error(line, f"TIMESTAMP={text!r}: {e}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise src.error(line, f"TIMESTAMP={text!r}: time of day out of range")
    fraction = (m.group(7) or "").ljust(9, "0")
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second
    return seconds * 1_000_000_000 + int(fraction)


def _csv_rows(src: _Source, text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # a NUL byte, a field over csv's size limit, a stray quote
            raise src.error(reader.line_num, f"not valid CSV: {e}") from None
        if row:  # csv yields [] for an empty line: no row there to drop
            yield reader.line_num, row


def _azure_header(src: _Source, header: list[str]) -> tuple[int, int, int]:
    names = [h.strip() for h in header]
    for column in _AZURE_COLUMNS:
        if names.count(column) > 1:
            raise src.error(1, f"column {column!r} appears twice in the header")
    missing = [c for c in _AZURE_COLUMNS if c not in names]
    if missing:
        raise src.error(1, f"missing column(s) {', '.join(missing)}; the header has "
                        f"{_show(', '.join(names), 200)} (expected {', '.join(_AZURE_COLUMNS)})")
    unknown = [n for n in names if n not in _AZURE_COLUMNS]
    if unknown:  # their values would be dropped unread
        raise src.error(1, f"unknown column(s) {_show(', '.join(unknown), 200)}; the columns are "
                        f"{', '.join(_AZURE_COLUMNS)} (remove the others)")
    ts, ctx, gen = (names.index(c) for c in _AZURE_COLUMNS)
    return ts, ctx, gen


def load_azure(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """The Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    ``arrival_time`` = TIMESTAMP minus the first row's TIMESTAMP, computed
    exactly from the text (all fractional digits, up to nanoseconds) and then
    rounded once to a float. Timestamps must not go backwards (the published
    traces are sorted; an unsorted file is not the trace its first row
    dates). Request ``i`` (0-based data row) is ``azure-{i}``.
    """
    p, text = _read_text(path)
    src = _Source(p)
    rows = _csv_rows(src, text)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{p}: empty file; expected the header {','.join(_AZURE_COLUMNS)}")
    header = first[1]
    ts_col, ctx_col, gen_col = _azure_header(src, header)
    requests: list[WorkloadRequest] = []
    t0 = prev = 0
    prev_line = 0
    for line, row in rows:
        if len(row) != len(header):
            raise src.error(line, f"{len(row)} fields, the header has {len(header)}")
        t = _azure_time_ns(src, line, row[ts_col])
        if not requests:
            t0 = prev = t
        elif t < prev:
            raise src.error(line, f"TIMESTAMP={row[ts_col].strip()!r} is earlier than the previous row's "
                            f"(line {prev_line}); the trace must be in time order")
        _check_span(src, line, f"TIMESTAMP={row[ts_col].strip()!r}", (t - t0) / 1e9)
        prev, prev_line = t, line
        ctx = _text_int(src, line, "ContextTokens", row[ctx_col], 1, _PROMPT_WHY)
        gen = _text_int(src, line, "GeneratedTokens", row[gen_col], 1, _OUTPUT_WHY)
        i = len(requests)
        requests.append(_build(src, line, f"azure-{i}", (t - t0) / 1e9, _unique_prompt(i, ctx), gen))
    if not requests:
        raise ValueError(f"{p}: no data rows after the header")
    return Workload(p.stem, tuple(requests), max_concurrency)


def _json_lines(src: _Source, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue  # blank line (e.g. the trailing newline): holds no request
        try:
            obj = strict_loads(raw)
        except ValueError as e:
            raise src.error(line, json_problem(e)) from None
        if not isinstance(obj, dict):
            raise src.error(line, f"expected a JSON object, got {type(obj).__name__}")
        yield line, obj


def _check_keys(src: _Source, line: int, obj: dict[str, Any], keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise src.error(line, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise src.error(line, f"unknown field(s) {_show(', '.join(unknown), 200)}; the fields are "
                        f"{', '.join(keys)}")


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _mooncake_runs(src: _Source, line: int, hash_ids: object, input_length: int) -> PromptRuns:
    if not isinstance(hash_ids, list):
        raise src.error(line, f"hash_ids={_show(hash_ids)} must be a list of integers")
    expected = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise src.error(line, f"hash_ids has {len(hash_ids)} ids; input_length={input_length} is "
                        f"{expected} blocks of {MOONCAKE_BLOCK_TOKENS} tokens")
    if not all(type(h) is int and 0 <= h <= MAX_HASH_ID for h in hash_ids):
        j, h = next((j, h) for j, h in enumerate(hash_ids)
                    if not (type(h) is int and 0 <= h <= MAX_HASH_ID))
        raise src.error(line, f"hash_ids[{j}]={_show(h)} must be an integer in [0, {MAX_HASH_ID}]")
    runs = [(HASH_BLOCK_TOKEN_BASE + h, MOONCAKE_BLOCK_TOKENS) for h in hash_ids]
    # The last block holds what remains of the prompt (1..512 tokens).
    last = input_length - (len(runs) - 1) * MOONCAKE_BLOCK_TOKENS
    runs[-1] = (runs[-1][0], last)
    return tuple(runs)


def load_mooncake(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """A Mooncake trace: JSON lines ``{"timestamp" (ms), "input_length",
    "output_length", "hash_ids"}``.

    ``arrival_time`` = (timestamp - first timestamp) / 1000. ``hash_ids`` must
    name exactly ceil(input_length / 512) blocks (true of every row of the
    published conversation trace); the prompt is those blocks, the last one
    cut short (see the module docstring). Timestamps must not go backwards.
    Request ``i`` (0-based data line) is ``mooncake-{i}``.
    """
    p, text = _read_text(path)
    src = _Source(p)
    requests: list[WorkloadRequest] = []
    t0: float = 0
    prev: float = 0
    prev_line = 0
    for line, obj in _json_lines(src, text):
        _check_keys(src, line, obj, _MOONCAKE_KEYS)
        t = _json_time(src, line, "timestamp", obj["timestamp"], MAX_TIMESTAMP_MS,
                       "milliseconds (2**53: exact in a float)")
        if not requests:
            t0 = prev = t
        elif t < prev:
            raise src.error(line, f"timestamp={t} is earlier than the previous line's ({prev}, line "
                            f"{prev_line}); the trace must be in time order")
        _check_span(src, line, f"timestamp={t}", (t - t0) / 1000)
        prev, prev_line = t, line
        input_length = _json_int(src, line, "input_length", obj["input_length"], 1, _PROMPT_WHY)
        output_length = _json_int(src, line, "output_length", obj["output_length"], 1, _OUTPUT_WHY)
        runs = _mooncake_runs(src, line, obj["hash_ids"], input_length)
        i = len(requests)
        # Integer milliseconds: subtract exactly, then round once.
        requests.append(_build(src, line, f"mooncake-{i}", (t - t0) / 1000, runs, output_length))
    if not requests:
        raise ValueError(f"{p}: no requests (the file has no JSON lines)")
    return Workload(p.stem, tuple(requests), max_concurrency)


_JSONL_KEYS = ("arrival_time", "input_tokens", "output_tokens")


def load_jsonl(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """Plain JSON lines ``{"arrival_time" (s), "input_tokens", "output_tokens"}``.

    Lines may come in any time order: the workload sorts them (stably).
    Request ``i`` (0-based data line, file order) is ``jsonl-{i}``; every
    prompt is private to its request.
    """
    p, text = _read_text(path)
    src = _Source(p)
    requests: list[WorkloadRequest] = []
    for line, obj in _json_lines(src, text):
        _check_keys(src, line, obj, _JSONL_KEYS)
        arrival = float(_json_time(src, line, "arrival_time", obj["arrival_time"], MAX_ARRIVAL_TIME,
                                   "seconds (the simulator's time span)"))
        input_tokens = _json_int(src, line, "input_tokens", obj["input_tokens"], 1, _PROMPT_WHY)
        output_tokens = _json_int(src, line, "output_tokens", obj["output_tokens"], 1, _OUTPUT_WHY)
        i = len(requests)
        runs = _unique_prompt(i, input_tokens)
        requests.append(_build(src, line, f"jsonl-{i}", arrival, runs, output_tokens))
    if not requests:
        raise ValueError(f"{p}: no requests (the file has no JSON lines)")
    return Workload(p.stem, tuple(requests), max_concurrency)


_RANDOM_KWARGS = ("num_prompts", "input_len", "output_len", "range_ratio", "prefix_len", "request_rate",
                  "burstiness", "max_concurrency", "seed")
_TRACE_LOADERS: dict[str, Callable[..., Workload]] = {
    "azure": load_azure, "mooncake": load_mooncake, "jsonl": load_jsonl}


def load_workload(dataset_name: str, dataset_path: str | Path | None = None, **kwargs: Any) -> Workload:
    """Build a workload by dataset name, as ``vllm bench serve --dataset-name``:
    ``random`` (keyword arguments of :func:`random_workload`, no path) or
    ``azure`` / ``mooncake`` / ``jsonl`` (a path; ``max_concurrency`` optional)."""
    if dataset_name == "random":
        if dataset_path is not None:
            raise ValueError("dataset 'random' is synthetic and reads no file; "
                             f"got dataset_path={dataset_path!r}")
        _check_kwargs(dataset_name, kwargs, _RANDOM_KWARGS)
        return random_workload(**kwargs)
    loader = _TRACE_LOADERS.get(dataset_name)
    if loader is None:
        raise ValueError(f"unknown dataset name {dataset_name!r}; choose one of {', '.join(DATASET_NAMES)}")
    if dataset_path is None or str(dataset_path) == "":
        raise ValueError(f"dataset {dataset_name!r} needs dataset_path, the trace file to read")
    _check_kwargs(dataset_name, kwargs, ("max_concurrency",))
    return loader(dataset_path, **kwargs)


def _check_kwargs(dataset_name: str, kwargs: Mapping[str, object], allowed: Sequence[str]) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"dataset {dataset_name!r}: unknown option(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(allowed)}")
