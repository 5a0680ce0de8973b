"""The benchmark client: who sends what, and when.

One client sends a workload's requests as ``vllm bench serve`` does: each at
its arrival time (an open-loop rate with Poisson or gamma inter-arrival
times, or a trace's own times, are both just the workload's arrival times),
and with ``--max-concurrency`` never more than that many in flight: a
request that arrives while all slots are taken waits in the client and is
sent the moment a response frees a slot (closed loop).

With a request timeout (``Workload.request_timeout``, kvsched's
``--request-timeout``) the client gives up on a request that has not
finished that many seconds after it was sent, as a real benchmark client's
total timeout does: its slot frees at that moment (a closed-loop client
sends the next request then) and the event loop aborts the request in the
engine (vLLM's server aborts a request whose client disconnected). The
send is after any concurrency wait: it is when the HTTP request starts.

The client owns no clock. The event loop asks :meth:`Client.next_send_time`
(and, with a timeout, :meth:`Client.next_deadline`), and at that time takes
:meth:`Client.expired` then :meth:`Client.due`; finished requests come back
through :meth:`Client.release` with the time their slot freed (with a
timeout, by id through :meth:`Client.finished`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

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
        # With a timeout: every request sent and not answered, by id, with
        # its deadline (send + timeout); and (deadline, id) in send order,
        # which is deadline order (sends happen in time order, the timeout
        # is one number). Entries of requests answered since are skipped.
        self.request_timeout = workload.request_timeout
        self._open: dict[str, float] = {}
        self._deadlines: deque[tuple[float, str]] = deque()

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
        timeout = self.request_timeout
        if timeout is not None and out:
            deadline = t + timeout
            for spec in out:
                self._open[spec.request_id] = deadline
                self._deadlines.append((deadline, spec.request_id))
        return out

    def refused(self, request_ids: Sequence[str]) -> None:
        """Sent requests the engine refused: their slots are free at once."""
        self._taken -= len(request_ids)
        if self.request_timeout is not None:
            for rid in request_ids:
                self._open.pop(rid, None)

    def next_deadline(self) -> float:
        """When the client next gives up on a request (inf: no request in
        flight, or no timeout)."""
        deadlines = self._deadlines
        open_ = self._open
        while deadlines and deadlines[0][1] not in open_:
            deadlines.popleft()  # answered (or refused) since it was sent
        return deadlines[0][0] if deadlines else math.inf

    def expired(self, t: float) -> list[str]:
        """The requests the client gives up on by ``t`` (their deadlines have
        passed with no complete response), in send order: their slots are
        free from now; the caller aborts them."""
        deadlines = self._deadlines
        open_ = self._open
        out: list[str] = []
        while deadlines and deadlines[0][0] <= t:
            _, rid = deadlines.popleft()
            if open_.pop(rid, None) is not None:
                out.append(rid)
        self._taken -= len(out)
        return out

    def finished(self, request_ids: Sequence[str], t: float) -> None:
        """With a timeout: the responses of ``request_ids`` completed at
        ``t``. A slot frees then, or at the request's deadline if that came
        first: the client had given up on it (the engine finished it in a
        step that ran past the deadline; the request counts as failed)."""
        open_ = self._open
        limited = self.max_concurrency is not None
        for rid in request_ids:
            deadline = open_.pop(rid, None)
            if deadline is None:
                continue  # given up on already (expired): its slot is free
            if limited:
                heapq.heappush(self._frees, t if t <= deadline else deadline)
            else:
                self._taken -= 1

    def release(self, count: int, t: float) -> None:
        """``count`` responses complete at ``t``, freeing their slots then."""
        if self.max_concurrency is None:
            self._taken -= count
            return
        for _ in range(count):
            heapq.heappush(self._frees, t)
