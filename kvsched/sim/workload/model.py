"""The workload data model: :class:`WorkloadRequest` (one request: when,
which prompt, how many output tokens), :class:`Workload` (requests sorted by
arrival, with scaling and truncation) and :class:`RandomRequests` (the random
dataset's requests kept as columns and built on demand)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.request import MultiModalFeature, Request, SamplingParams, TokenRuns
from kvsched.sim.workload.arrivals import arrival_times_of_rate
from kvsched.sim.workload.limits import (
    MAX_ARRIVAL_TIME,
    MAX_REQUEST_TOKENS,
    check_request_timeout,
    is_int,
    is_real,
)
from kvsched.sim.workload.tokens import RANDOM_PREFIX_TOKEN, UNIQUE_TOKEN_BASE, PromptRuns

# The modalities a workload's items may have (vLLM's names).
MM_MODALITIES = ("image",)


@dataclass(slots=True, frozen=True)
class MMItem:
    """One multimodal item of a prompt, as vLLM's scheduler sees it (a
    ``MultiModalFeatureSpec``): ``identifier`` (vLLM's mm hash: equal for
    identical items, which then share one encoder-cache entry), its
    ``modality``, and its placeholder range in the prompt (``offset``,
    ``length`` tokens), of which ``num_embeds`` are encoder outputs (the
    encoder cache's charge); plus what pricing needs: the ViT patches the
    encoder runs over (``num_patches``) and the image's size."""

    identifier: str
    modality: str
    offset: int
    length: int
    num_embeds: int
    num_patches: int
    height: int
    width: int

    def __post_init__(self) -> None:
        where = f"MMItem {self.identifier!r}"
        if not isinstance(self.identifier, str) or not self.identifier:
            raise UserInputError(f"MMItem identifier={self.identifier!r}: must be a non-empty string")
        if self.modality not in MM_MODALITIES:
            raise UserInputError(f"{where}: modality={self.modality!r}: must be one of "
                                 f"{', '.join(MM_MODALITIES)}")
        for name in ("offset", "length", "num_embeds", "num_patches", "height", "width"):
            value = getattr(self, name)
            least = 0 if name == "offset" else 1
            if not is_int(value) or not least <= value <= MAX_REQUEST_TOKENS:
                raise UserInputError(f"{where}: {name}={show(value)} must be an integer in [{least}, 2**40]")
        if self.num_embeds > self.length:
            raise UserInputError(f"{where}: num_embeds={self.num_embeds} exceeds its length={self.length} "
                                 "(the embeddings are placeholder tokens)")

    def feature(self) -> MultiModalFeature:
        """The item as the scheduler's multimodal feature. Where the
        placeholder holds tokens that get no embedding (Gemma 3's and
        Llama 4's markers), the embeddings are taken as one run in its
        middle: only a chunk cut inside the item reads where they lie."""
        mask = None
        if self.num_embeds < self.length:
            before = (self.length - self.num_embeds) // 2
            mask = [before <= i < before + self.num_embeds for i in range(self.length)]
        return MultiModalFeature(self.identifier, self.offset, self.length, self.modality, mask)


@dataclass(slots=True, frozen=True)
class WorkloadRequest:
    """One request of a workload: when it arrives (seconds from the start of
    the workload), its prompt as ``(token_id, count)`` runs, how many
    tokens it generates, the LoRA adapter it names (vLLM's
    ``lora_int_id``; 0: the base model; :mod:`kvsched.sim.workload.lora`),
    and its multimodal items (:class:`MMItem`, by offset, inside the
    prompt, not overlapping)."""

    request_id: str
    arrival_time: float
    prompt_runs: PromptRuns
    output_len: int
    lora_id: int = 0
    mm_items: tuple[MMItem, ...] = ()
    num_prompt_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.request_id
        if not isinstance(name, str) or not name:
            raise UserInputError(f"WorkloadRequest request_id={name!r}: must be a non-empty string")
        where = f"WorkloadRequest {name}"
        t = self.arrival_time
        # Compared, not converted: an int of 400 digits is refused, not an OverflowError.
        if not is_real(t) or not 0 <= t <= MAX_ARRIVAL_TIME:
            raise UserInputError(f"{where}: arrival_time={show(t)} must be a number of seconds in "
                             f"[0, {MAX_ARRIVAL_TIME:.0e}] (the simulator's time span)")
        if not is_int(self.output_len) or not 1 <= self.output_len <= MAX_REQUEST_TOKENS:
            raise UserInputError(f"{where}: output_len={show(self.output_len)} must be an integer in "
                             f"[1, 2**40]")
        if not is_int(self.lora_id) or not 0 <= self.lora_id < 2**31:
            raise UserInputError(f"{where}: lora_id={show(self.lora_id)} must be an integer in [0, 2**31) "
                                 "(0: the base model)")
        runs = _checked_runs(where, self.prompt_runs)
        num_prompt_tokens = sum(count for _, count in runs)
        if num_prompt_tokens > MAX_REQUEST_TOKENS:
            raise UserInputError(f"{where}: {show(num_prompt_tokens)} prompt tokens; at most 2**40 "
                             "(a longer prompt is no request any server takes)")
        if self.mm_items:
            _check_items(where, self.mm_items, num_prompt_tokens)
        # Frozen: normalise lists to tuples and cache the length once.
        object.__setattr__(self, "prompt_runs", runs)
        object.__setattr__(self, "num_prompt_tokens", num_prompt_tokens)

    @classmethod
    def checked_elsewhere(cls, request_id: str, arrival_time: float, prompt_runs: PromptRuns,
                          output_len: int, num_prompt_tokens: int) -> WorkloadRequest:
        """A request built from values its maker has already checked as
        ``__post_init__`` would (:class:`RandomRequests` checks its columns
        once, when built): a million requests are built one by one as they
        are sent, and the checks cost more than the rest of sending one."""
        self = object.__new__(cls)
        put = object.__setattr__
        put(self, "request_id", request_id)
        put(self, "arrival_time", arrival_time)
        put(self, "prompt_runs", prompt_runs)
        put(self, "output_len", output_len)
        put(self, "lora_id", 0)
        put(self, "mm_items", ())
        put(self, "num_prompt_tokens", num_prompt_tokens)
        return self

    def prompt_token_ids(self) -> list[int]:
        """The prompt as a token list (``[token] * count`` per run, C speed)."""
        tokens: list[int] = []
        for token, count in self.prompt_runs:
            tokens += [token] * count
        return tokens

    def to_request(self, params: SamplingParams, arrival_time: float, with_mm: bool = False) -> Request:
        """The scheduler's Request for this prompt: its runs as they are (no
        token list, so a waiting request stays small), marked private when
        :func:`prompt_shares_nothing` says so; with ``with_mm`` its items
        as the scheduler's multimodal features (a scheduler with an encoder)."""
        features = tuple(item.feature() for item in self.mm_items) if with_mm else ()
        return Request(self.request_id, TokenRuns(self.prompt_runs, None, self.num_prompt_tokens),
                       params, arrival_time=arrival_time,
                       private=not features and prompt_shares_nothing(self.prompt_runs),
                       lora_id=self.lora_id, mm_features=features)


def _check_items(where: str, items: object, num_prompt_tokens: int) -> None:
    if not isinstance(items, tuple) or not all(isinstance(i, MMItem) for i in items):
        raise UserInputError(f"{where}: mm_items must be a tuple of MMItem")
    end = 0
    for item in items:
        if item.offset < end:
            raise UserInputError(f"{where}: item {item.identifier!r} at offset {item.offset} overlaps the "
                                 f"one before it (ending at {end}); give items by offset, apart")
        end = item.offset + item.length
    if end > num_prompt_tokens:
        raise UserInputError(f"{where}: item {items[-1].identifier!r} ends at token {end}, beyond the "
                             f"prompt's {num_prompt_tokens}")


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
        raise UserInputError(f"{where}: prompt_runs={runs!r} must be a non-empty sequence of "
                         "(token_id, count) pairs")
    out: list[tuple[int, int]] = []
    for i, run in enumerate(runs):
        if not isinstance(run, tuple | list) or len(run) != 2:
            raise UserInputError(f"{where}: prompt_runs[{i}]={run!r} must be a (token_id, count) pair")
        token, count = run
        if not is_int(token) or token < 0:
            raise UserInputError(f"{where}: prompt_runs[{i}] token_id={token!r} must be an integer >= 0")
        if not is_int(count) or count < 1:
            raise UserInputError(f"{where}: prompt_runs[{i}] count={count!r} must be an integer >= 1")
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
        self._check_columns()

    def _check_columns(self) -> None:
        """What ``WorkloadRequest.__post_init__`` checks of one request, for
        every request at once (``__getitem__`` then builds them unchecked),
        each failure naming the first request it finds."""
        lo, hi = self.start, self.stop
        if not (0 <= lo <= hi <= len(self.arrivals) == len(self.input_lens) == len(self.output_lens)):
            raise UserInputError(f"RandomRequests: columns of {len(self.arrivals)}, {len(self.input_lens)} "
                                 f"and {len(self.output_lens)} requests, rows [{lo}, {hi}): give equal "
                                 "columns and rows inside them")
        if not is_int(self.prefix_len) or not 0 <= self.prefix_len <= MAX_REQUEST_TOKENS:
            raise UserInputError(f"RandomRequests: prefix_len={show(self.prefix_len)} must be an integer "
                                 "in [0, 2**40]")
        if lo == hi:
            return
        # NaN fails every comparison, so it is refused too.
        if not all(0.0 <= t <= MAX_ARRIVAL_TIME for t in self.arrivals[lo:hi]):
            i = next(i for i in range(lo, hi) if not 0.0 <= self.arrivals[i] <= MAX_ARRIVAL_TIME)
            self._request(i)  # raises, naming the request and the bound
            raise AssertionError(f"RandomRequests: row {i} passed WorkloadRequest's checks")
        inputs, outputs = self.input_lens[lo:hi], self.output_lens[lo:hi]
        if min(inputs) < 0 or self.prefix_len + max(inputs) > MAX_REQUEST_TOKENS or (
                self.prefix_len + min(inputs) < 1) or min(outputs) < 1 or max(outputs) > MAX_REQUEST_TOKENS:
            i = next(i for i in range(lo, hi) if not (
                self.input_lens[i] >= 0 and 1 <= self.prefix_len + self.input_lens[i] <= MAX_REQUEST_TOKENS
                and 1 <= self.output_lens[i] <= MAX_REQUEST_TOKENS))
            self._request(i)
            raise AssertionError(f"RandomRequests: row {i} passed WorkloadRequest's checks")

    def _request(self, i: int) -> WorkloadRequest:
        """Request ``i`` of the columns (not of this slice), checked one by one."""
        runs = []
        if self.prefix_len:
            runs.append((RANDOM_PREFIX_TOKEN, self.prefix_len))
        if self.input_lens[i]:
            runs.append((UNIQUE_TOKEN_BASE + i, self.input_lens[i]))
        return WorkloadRequest(f"random-{i}", self.arrivals[i], tuple(runs), self.output_lens[i])

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
                raise UserInputError("RandomRequests: only contiguous slices (step 1) are supported")
            return RandomRequests(self.arrivals, self.input_lens, self.output_lens, self.prefix_len,
                                  self.start + start, self.start + max(start, stop))
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("RandomRequests index out of range")
        i += self.start
        prefix, own = self.prefix_len, self.input_lens[i]
        # The columns were checked when built (_check_columns).
        if prefix:
            runs: PromptRuns = ((RANDOM_PREFIX_TOKEN, prefix), (UNIQUE_TOKEN_BASE + i, own)) if own \
                else ((RANDOM_PREFIX_TOKEN, prefix),)
        else:
            runs = ((UNIQUE_TOKEN_BASE + i, own),)
        return WorkloadRequest.checked_elsewhere(f"random-{i}", self.arrivals[i], runs, self.output_lens[i],
                                                 prefix + own)

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
    plus the client's settings: the concurrency limit of ``vllm bench serve
    --max-concurrency`` (``None``: unlimited) and the seconds it waits for a
    complete response before it gives up on a request (``request_timeout``,
    kvsched's ``--request-timeout``; ``None``: for ever). ``requests`` is a
    tuple, or for the random dataset a :class:`RandomRequests` built on
    demand."""

    name: str
    requests: Sequence[WorkloadRequest]
    max_concurrency: int | None = None
    request_timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UserInputError(f"Workload name={self.name!r}: must be a non-empty string")
        mc = self.max_concurrency
        if mc is not None and (not is_int(mc) or mc < 1):
            raise UserInputError(f"Workload {self.name}: max_concurrency={mc!r} must be None or an "
                                 f"integer >= 1")
        check_request_timeout(self.request_timeout)
        if isinstance(self.requests, RandomRequests):
            if not len(self.requests):
                raise UserInputError(f"Workload {self.name}: requests is empty; a workload needs a request")
            return  # sorted, unique and private by construction
        requests = tuple(self.requests)
        if not requests:
            raise UserInputError(f"Workload {self.name}: requests is empty; a workload needs a request")
        for i, r in enumerate(requests):
            if not isinstance(r, WorkloadRequest):
                raise UserInputError(f"Workload {self.name}: requests[{i}] is a {type(r).__name__}, "
                                 "not a WorkloadRequest")
        if any(a.arrival_time > b.arrival_time for a, b in itertools.pairwise(requests)):
            requests = tuple(sorted(requests, key=lambda r: r.arrival_time))  # sorted() is stable
        seen: set[str] = set()
        for r in requests:
            if r.request_id in seen:
                raise UserInputError(f"Workload {self.name}: duplicate request_id {r.request_id!r}")
            seen.add(r.request_id)
        # prompt_shares_nothing relies on it: a request-unique token starts one prompt only.
        owner: dict[int, str] = {}
        for r in requests:
            first = r.prompt_runs[0][0]
            if first >= UNIQUE_TOKEN_BASE:
                other = owner.setdefault(first, r.request_id)
                if other != r.request_id:
                    raise UserInputError(
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
        if not is_real(time_scale) or not math.isfinite(time_scale) or time_scale <= 0:
            raise UserInputError(f"Workload {self.name}: time_scale={time_scale!r} must be a finite "
                                 f"number > 0")
        last = self.last_arrival_time * time_scale
        if last > MAX_ARRIVAL_TIME:
            raise UserInputError(f"Workload {self.name}: time_scale={time_scale!r} puts the last arrival at "
                             f"{last:.4g} s, beyond the simulator's time span of {MAX_ARRIVAL_TIME:.0e} s; "
                             f"use a time scale <= {MAX_ARRIVAL_TIME / self.last_arrival_time:.4g}")
        if isinstance(self.requests, RandomRequests):
            return self.with_requests(self.requests.scaled(time_scale))
        requests = tuple(dataclasses.replace(r, arrival_time=r.arrival_time * time_scale)
                         for r in self.requests)
        return self.with_requests(requests)

    def truncated(self, num_requests: int | None = None, duration: float | None = None) -> Workload:
        """The first ``num_requests`` requests and/or those arriving before
        ``duration`` seconds (``arrival_time < duration``); both apply if both given."""
        requests = self.requests
        if num_requests is not None:
            if not is_int(num_requests) or num_requests < 1:
                raise UserInputError(f"Workload {self.name}: num_requests={num_requests!r} "
                                 "must be an integer >= 1")
            requests = requests[:num_requests]
        if duration is not None:
            if not is_real(duration) or math.isnan(duration) or duration <= 0:
                raise UserInputError(f"Workload {self.name}: duration={duration!r} must be a number > 0")
            if isinstance(requests, RandomRequests):
                requests = requests[:requests.first_at_or_after(duration)]
            else:
                requests = tuple(r for r in requests if r.arrival_time < duration)
            if not requests:
                raise UserInputError(f"Workload {self.name}: no request arrives before "
                                     f"duration={duration!r} s "
                                 f"(the first arrives at {self.requests[0].arrival_time} s)")
        return self.with_requests(requests)

    def with_requests(self, requests: Sequence[WorkloadRequest]) -> Workload:
        """Other requests, sent by the same client (its concurrency limit and timeout)."""
        return Workload(self.name, requests, self.max_concurrency, self.request_timeout)


def repaced(workload: Workload, request_rate: float, burstiness: float, seed: int) -> Workload:
    """``workload``'s requests, lengths, prompts and order kept, sent at
    ``vllm bench serve --request-rate`` arrivals instead of their own times:
    gamma gaps (``burstiness`` 1 = Poisson, inf = constant) from numpy's
    ``RandomState(seed)``, rescaled to end at n / rate; inf: all at once."""
    if not is_real(request_rate) or not request_rate > 0:
        raise UserInputError(f"--request-rate={show(request_rate)}: must be a number > 0 (inf: all at once)")
    n = len(workload.requests)
    if n / request_rate > MAX_ARRIVAL_TIME:
        raise UserInputError(f"--request-rate={show(request_rate)}: {n} requests at that rate arrive over "
                             f"{n / request_rate:.4g} s, beyond the simulator's time span of "
                             f"{MAX_ARRIVAL_TIME:.0e} s; use a rate >= {n / MAX_ARRIVAL_TIME:.4g} req/s")
    times = arrival_times_of_rate(n, float(request_rate), float(burstiness), seed)
    if isinstance(workload.requests, RandomRequests):
        r = workload.requests
        lo, hi = r.start, r.stop
        columns = RandomRequests(array("d", times), r.input_lens[lo:hi], r.output_lens[lo:hi], r.prefix_len)
        return workload.with_requests(columns)
    # The lengths, prompt and items kept; the adapter too (assigned afterwards anyway).
    requests = tuple(dataclasses.replace(r, arrival_time=t) for r, t in zip(workload.requests, times))
    return workload.with_requests(requests)
