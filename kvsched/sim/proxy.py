"""The disaggregated-serving proxy: prefill first, then decode.

vLLM's prefill/decode disaggregation puts a proxy in front of two kinds of
instances (vLLM's ``toy_proxy_server.py`` for NixlConnector, llm-d's
routing sidecar alike): a request goes first to a prefill instance with
``max_tokens`` 1 and ``kv_transfer_params`` ``{"do_remote_decode": true}``;
that instance computes the prompt, samples one token (dropped) and, as the
request finishes, holds its KV blocks and answers with the params a decode
instance needs to read them. The proxy then sends the original request, with
those params, to a decode instance, whose NixlConnector reads the prompt's
KV before the request decodes; the client's tokens all come from the decode
instance, so its TTFT spans both legs and the transfer.

:class:`Proxy` is that routing, for the event loop (:class:`kvsched.sim.cluster.Cluster`):
which prefill rank gets an arrival, what becomes of a finished prefill leg
(a decode leg, after the hop to the decode instance's API server), which
decode rank gets it. It keeps, per request, when each leg started and ended,
for the TTFT split.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.perf.host import HostTerms
from kvsched.sim.rank import Rank
from kvsched.sim.router import Router
from kvsched.sim.workload import WorkloadRequest

# What vLLM's proxy sends to the prefill instance with every request.
PREFILL_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False,
                                  "remote_engine_id": None, "remote_block_ids": None,
                                  "remote_host": None, "remote_port": None}
# A decode leg: (reaches the decode instance, hand-off order, client send
# time, request, kv_transfer_params).
DecodeLeg = tuple[float, int, float, WorkloadRequest, dict[str, Any]]


def prefill_engine_id(index: int) -> str:
    """The engine id of prefill rank ``index`` (the decode side's
    ``remote_engine_id``)."""
    return f"prefill-{index}"


@dataclass(slots=True)
class LegTimes:
    """One request's way through a disaggregated deployment (seconds)."""

    sent: float
    prefill_done: float = -1.0      # the prefill leg finished (its blocks held)
    decode_arrival: float = -1.0    # the decode leg reached its instance


@dataclass(slots=True)
class Proxy:
    """Routes arrivals to prefill ranks and finished prefill legs to decode
    ranks. ``prefill`` and ``decode``: the ranks' indices in the cluster's
    rank list; ``arrival``: the host terms whose arrival delay the hop to the
    decode instance's API server pays (None: none); ``block_size``: both
    roles' cache block size."""

    prefill: list[int]
    decode: list[int]
    prefill_router: Router
    decode_router: Router
    block_size: int
    arrival: HostTerms | None = None
    legs: dict[str, LegTimes] = field(default_factory=dict)
    _pending: list[DecodeLeg] = field(default_factory=list)
    _order: int = 0

    def __post_init__(self) -> None:
        if self.arrival is not None and not self.arrival.delays_arrivals:
            self.arrival = None

    def route_arrival(self, ranks: Sequence[Rank], now: float, spec: WorkloadRequest) -> int:
        """The cluster index of the prefill rank a new request goes to."""
        return self.prefill[self.prefill_router.choose([ranks[i] for i in self.prefill], now, spec)]

    def route_decode(self, ranks: Sequence[Rank], now: float, spec: WorkloadRequest) -> int:
        """The cluster index of the decode rank a decode leg goes to."""
        return self.decode[self.decode_router.choose([ranks[i] for i in self.decode], now, spec)]

    def prefill_params(self, spec: WorkloadRequest, sent: float) -> dict[str, Any]:
        self.legs[spec.request_id] = LegTimes(sent)
        return dict(PREFILL_PARAMS)

    def collect(self, rank_index: int, rank: Rank) -> None:
        """The prefill legs ``rank`` finished since the last call become
        decode legs, due at the decode instance after the hop."""
        if not rank.handoffs:
            return
        engine = prefill_engine_id(self.prefill.index(rank_index))
        for spec, sent, done in rank.handoffs:
            num_blocks = -(-spec.num_prompt_tokens // self.block_size)
            params = {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_block_ids": [list(range(num_blocks))], "remote_engine_id": engine,
                      "remote_request_id": spec.request_id, "remote_host": "localhost",
                      "remote_port": 5600, "remote_num_tokens": spec.num_prompt_tokens}
            reach = done
            if self.arrival is not None:
                reach += self.arrival.arrival_delay(spec.num_prompt_tokens)
            legs = self.legs.get(spec.request_id)
            if legs is not None:
                legs.prefill_done = done
                legs.decode_arrival = reach
            heapq.heappush(self._pending, (reach, self._order, sent, spec, params))
            self._order += 1
        rank.handoffs.clear()

    def next_decode_leg(self) -> float:
        """When the next decode leg reaches its instance (inf: none pending)."""
        return self._pending[0][0] if self._pending else float("inf")

    def drop_decode_leg(self, request_id: str) -> bool:
        """The client gave up on ``request_id`` while its decode leg was on
        its way (the hop): it is never sent to a decode instance. False: no
        such leg pending."""
        pending = self._pending
        at = next((k for k, leg in enumerate(pending) if leg[3].request_id == request_id), -1)
        if at < 0:
            return False
        pending[at] = pending[-1]
        pending.pop()
        heapq.heapify(pending)
        return True

    def due_decode_legs(self, t: float) -> list[DecodeLeg]:
        """The decode legs that reach their instances by ``t``, in order."""
        out: list[DecodeLeg] = []
        pending = self._pending
        while pending and pending[0][0] <= t:
            out.append(heapq.heappop(pending))
        return out
