"""Time to first token, split into the parts a request meets on its way.

Every rank notes, per request it serves (:class:`PhaseTable`, one row per
finished request, in the order of its records): when the request reached
the instance, when the step that computed its first prompt tokens started,
and the KV load the instance made for it before then (a CPU load under
offloading, a NIXL read on a decode instance), from the timed workers' own
start and done times. The parts are differences of those times, so they add
up to each request's TTFT (first token - client send) up to float rounding:

Colocated (one engine, DP replicas or lockstep ranks):

- ``arrival``: the client's send to the request reaching the engine (the
  API server's handling and tokenisation; 0 without host terms);
- ``queue``: reaching the engine to the start of the step that computes its
  first prompt chunk: waiting for a slot, for KV blocks and (async
  scheduling) for the batch ahead; a CPU load's time is taken out;
- ``offload_load`` (with KV offloading): the CPU -> GPU load of the
  prompt's CPU hit, waiting for the host link included;
- ``prefill``: the first chunk's start to the first token (the prompt's
  chunks, preemptions and recomputes included).

Disaggregated (``xPyD``): ``arrival``, ``queue``, ``offload_load`` and
``prefill`` on the prefill instance (``prefill`` ends when the prefill leg
finishes), then

- ``hop``: the prefill leg's end to the decode leg reaching a decode
  instance (the proxy and the decode API server);
- ``decode_admission``: the decode leg reaching its instance to its KV read
  starting: the decode engine scheduling it and allocating its blocks;
- ``transfer``: the decode instance's KV read, waiting for a busy link
  included (with offloading first and a CPU hit there: that CPU load);
- ``decode_queue``: the KV arrived (or, nothing read, the decode leg
  reaching its instance) to the start of its first step: the engine sees a
  read done at its next batch's end, then schedules the step;
- ``first_token_step``: the decode instance's first step (the prompt's last
  token, sampling the first output token).

:func:`summary` gives each part's mean, median, p90 and p99 (milliseconds,
numpy's percentiles as ``vllm bench serve``'s), the results' ``ttft_parts_ms``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from kvsched.sim.kv_transfer import KVWorker, MultiTimedWorker, NixlTimedWorker
from kvsched.sim.metrics import MILLISECONDS_PER_SECOND, RecordTable, distribution, extend_columns
from kvsched.sim.offload_transfer import OffloadTimedWorker

FloatArray = npt.NDArray[np.float64]

COLOCATED_PARTS = ("arrival", "queue", "offload_load", "prefill")
DISAGGREGATED_PARTS = ("arrival", "queue", "offload_load", "prefill", "hop", "decode_admission", "transfer",
                       "decode_queue", "first_token_step")
# Each part's name for people and what it is (the report and the text table).
PART_NAMES: dict[str, tuple[str, str]] = {
    "arrival": ("arrival", "client send to the engine: API server handling and tokenisation"),
    "queue": ("queue", "waiting for the first prompt chunk's step (a slot, KV blocks)"),
    "offload_load": ("CPU load", "loading the prompt's CPU hit over the host link"),
    "prefill": ("prefill", "first prompt chunk to the prompt done (preemptions included)"),
    "hop": ("hop to decode", "prefill leg's end to the decode instance (proxy, API server)"),
    "decode_admission": ("decode admission", "reaching the decode instance to its KV read starting "
                                             "(scheduled, blocks allocated)"),
    "transfer": ("KV transfer", "the decode instance's KV read, waiting for the link included"),
    "decode_queue": ("decode queue", "the KV arrived to the first decode step's start"),
    "first_token_step": ("first decode step", "the decode instance's first step"),
}
# The statistics of each part: (key, percentile).
STATISTICS = (("mean", None), ("median", 50.0), ("p90", 90.0), ("p99", 99.0))
NO_TIME = -1.0  # a time not reached (no load)


@dataclass(slots=True)
class PhaseTable:
    """Per finished request of a rank (aligned with its records): when it
    reached the instance, when the step computing its first tokens started,
    and its KV load before then (start, done; ``NO_TIME`` without one)."""

    request_id: list[str] = field(default_factory=list)
    reached: array[float] = field(default_factory=lambda: array("d"))
    started: array[float] = field(default_factory=lambda: array("d"))
    load_start: array[float] = field(default_factory=lambda: array("d"))
    load_end: array[float] = field(default_factory=lambda: array("d"))

    def append(self, request_id: str, reached: float, started: float, load_start: float,
               load_end: float) -> None:
        self.request_id.append(request_id)
        self.reached.append(reached)
        self.started.append(started)
        self.load_start.append(load_start)
        self.load_end.append(load_end)

    @classmethod
    def concat(cls, tables: Sequence[PhaseTable]) -> PhaseTable:
        out = cls()
        extend_columns(out, tables, (f.name for f in fields(cls)))
        return out

    def __len__(self) -> int:
        return len(self.request_id)

    def load_seconds(self) -> FloatArray:
        """Each request's load time (0 without one)."""
        start = np.array(self.load_start, dtype=np.float64)
        end = np.array(self.load_end, dtype=np.float64)
        return np.where(start >= 0.0, end - start, 0.0)


def kv_load_times(worker: KVWorker | None) -> list[dict[str, tuple[float, float]]]:
    """Where a rank's timed KV worker keeps each request's load (start,
    done): the NIXL worker's reads, the offloading worker's asynchronous
    loads (a MultiConnector's children, in its order); [] without one."""
    if worker is None:
        return []
    if isinstance(worker, MultiTimedWorker):
        return [d for w in worker.workers for d in kv_load_times(w)]
    if isinstance(worker, NixlTimedWorker):
        return [worker.reads]
    if isinstance(worker, OffloadTimedWorker):
        return [worker.loads]
    return []


def _check_aligned(records: RecordTable, phases: PhaseTable, what: str) -> None:
    if len(records) != len(phases) or list(records.request_id) != phases.request_id:
        raise AssertionError(f"{what}: {len(records)} records but {len(phases)} phase rows, not aligned")


def colocated_parts(records: RecordTable, phases: PhaseTable, offloading: bool) -> dict[str, FloatArray]:
    """Each completed request's TTFT parts in seconds (``records`` and
    ``phases``: one engine's or data-parallel ranks' together, aligned);
    ``offload_load`` only with ``offloading``."""
    _check_aligned(records, phases, "colocated TTFT parts")
    send = np.array(records.send_time, dtype=np.float64)
    first = np.array(records.first_token_time, dtype=np.float64)
    reached = np.array(phases.reached, dtype=np.float64)
    started = np.array(phases.started, dtype=np.float64)
    load = phases.load_seconds()
    parts = {"arrival": reached - send, "queue": started - reached - load, "offload_load": load,
             "prefill": first - started}
    return {k: v for k, v in parts.items() if offloading or k != "offload_load"}


def disaggregated_parts(records: RecordTable, decode: PhaseTable, prefill_records: RecordTable,
                        prefill: PhaseTable, offloading: bool) -> dict[str, FloatArray]:
    """Each completed request's TTFT parts in seconds: ``records`` and
    ``decode`` the decode instances' (aligned), ``prefill_records`` and
    ``prefill`` the prefill instances' (a prefill leg's finish is when it
    was handed off)."""
    _check_aligned(records, decode, "decode TTFT parts")
    _check_aligned(prefill_records, prefill, "prefill TTFT parts")
    row = {rid: i for i, rid in enumerate(prefill.request_id)}
    try:
        at = np.array([row[rid] for rid in records.request_id], dtype=np.int64)
    except KeyError as e:
        raise AssertionError(f"request {e} finished on a decode instance without a prefill leg") from None
    send = np.array(records.send_time, dtype=np.float64)
    first = np.array(records.first_token_time, dtype=np.float64)
    p_reached = np.array(prefill.reached, dtype=np.float64)[at]
    p_started = np.array(prefill.started, dtype=np.float64)[at]
    p_load = prefill.load_seconds()[at]
    p_done = np.array(prefill_records.finish_time, dtype=np.float64)[at]
    d_reached = np.array(decode.reached, dtype=np.float64)
    d_started = np.array(decode.started, dtype=np.float64)
    d_load_start = np.array(decode.load_start, dtype=np.float64)
    d_load_end = np.array(decode.load_end, dtype=np.float64)
    read = d_load_start >= 0.0
    parts = {"arrival": p_reached - send, "queue": p_started - p_reached - p_load, "offload_load": p_load,
             "prefill": p_done - p_started, "hop": d_reached - p_done,
             "decode_admission": np.where(read, d_load_start - d_reached, 0.0),
             "transfer": np.where(read, d_load_end - d_load_start, 0.0),
             "decode_queue": np.where(read, d_started - d_load_end, d_started - d_reached),
             "first_token_step": first - d_started}
    return {k: v for k, v in parts.items() if offloading or k != "offload_load"}


def summary(parts: dict[str, FloatArray]) -> dict[str, dict[str, float]]:
    """Each part's mean, median, p90 and p99 in milliseconds (the results'
    ``ttft_parts_ms``); {} without requests."""
    if not parts or not len(next(iter(parts.values()))):
        return {}
    out: dict[str, dict[str, float]] = {}
    percentiles = [p for _, p in STATISTICS if p is not None]
    for name, seconds in parts.items():
        mean, _, _, values = distribution(seconds, percentiles)
        stats = iter(values)
        out[name] = {key: MILLISECONDS_PER_SECOND * (mean if p is None else next(stats))
                     for key, p in STATISTICS}
    return out
