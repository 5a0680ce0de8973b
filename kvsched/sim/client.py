"""The benchmark client: who sends what, and when.

One client sends a workload's requests as ``vllm bench serve`` does: each at
its arrival time (an open-loop rate with Poisson or gamma inter-arrival
times, or a trace's own times, are both just the workload's arrival times),
and with ``--max-concurrency`` never more than that many in flight: a
request that arrives while all slots are taken waits in the client and is
sent the moment a response frees a slot (closed loop).

The client owns no clock. The event loop asks :meth:`Client.next_send_time`,
and at that time takes :meth:`Client.due`; finished requests come back
through :meth:`Client.release` with the time their slot freed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from kvsched.sim.workload import Workload, WorkloadRequest


class Client:
    def __init__(self, workload: Workload) -> None:
        self.requests = workload.requests
        # Read on every loop turn: kept apart so a lazy workload builds a
        # request only when it is sent.
        self.arrivals = workload.arrival_times()
        self.max_concurrency = workload.max_concurrency
        self._next = 0                    # index of the next request to arrive
        self._queue: deque[WorkloadRequest] = deque()  # arrived, waiting for a slot
        # Slots taken, counting those whose response is due at a time in
        # ``_frees`` (a heap) that the client has not reached yet.
        self._taken = 0
        self._frees: list[float] = []

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def done(self) -> bool:
        """Every request has been sent."""
        return self._next >= len(self.requests) and not self._queue

    def waits_on_responses(self) -> bool:
        """True when a response completing could make the client send (or send
        earlier): requests queue for a slot, or every slot is taken and more
        requests are to come."""
        limit = self.max_concurrency
        if limit is None:
            return False
        return bool(self._queue) or (self._next < len(self.requests) and self._taken >= limit)

    def next_send_time(self) -> float:
        """When the client next sends something (inf: nothing until a response
        frees a slot, or nothing left)."""
        frees = self._frees
        if self._queue:
            # Later arrivals queue behind; only a freed slot sends anything.
            return frees[0] if frees else math.inf
        if self._next >= len(self.requests):
            return math.inf
        arrival = self.arrivals[self._next]
        if self.max_concurrency is None or self._taken < self.max_concurrency:
            return arrival
        return max(arrival, frees[0]) if frees else math.inf

    def due(self, t: float) -> list[WorkloadRequest]:
        """The requests to send at ``t``: slots freed by ``t`` come back,
        arrivals up to ``t`` join the queue, and the queue drains while slots
        are free. Refusals are reported with :meth:`refused`."""
        frees = self._frees
        while frees and frees[0] <= t:
            heapq.heappop(frees)
            self._taken -= 1
        requests = self.requests
        arrivals = self.arrivals
        n = len(arrivals)
        queue = self._queue
        while self._next < n and arrivals[self._next] <= t:
            queue.append(requests[self._next])
            self._next += 1
        limit = self.max_concurrency
        out: list[WorkloadRequest] = []
        while queue and (limit is None or self._taken < limit):
            out.append(queue.popleft())
            self._taken += 1
        return out

    def refused(self, count: int = 1) -> None:
        """Sent requests the engine refused: their slots are free at once."""
        self._taken -= count

    def release(self, count: int, t: float) -> None:
        """``count`` responses complete at ``t``, freeing their slots then."""
        if self.max_concurrency is None:
            self._taken -= count
            return
        for _ in range(count):
            heapq.heappush(self._frees, t)
