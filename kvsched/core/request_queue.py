"""Waiting queues: first-come-first-served, or by (priority, arrival_time).

A preempted request goes back to the head of an FCFS queue; a priority queue
simply re-inserts it by its key, exactly as vLLM does.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from kvsched.request import Request


class FCFSRequestQueue:
    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        """Put ``requests`` back at the head, in their order."""
        self._queue.extendleft(reversed(requests))

    def peek_request(self) -> Request:
        return self._queue[0]

    def replace_head(self, requests: list[Request]) -> None:
        """The first ``len(requests)`` entries, reordered: ``requests`` are
        those same requests in their new order (vLLM 0.34's cache-aware
        admission; only an FCFS queue has positions to reorder)."""
        queue = self._queue
        for _ in range(len(requests)):
            queue.popleft()
        queue.extendleft(reversed(requests))

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(map(id, requests))
        kept = [r for r in self._queue if id(r) not in drop]
        self._queue = deque(kept)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def check_invariants(self) -> None:
        ids = [id(r) for r in self._queue]
        assert len(set(ids)) == len(ids), "a request is queued twice"


def priority_order(request: Request) -> tuple[int, float, str]:
    """The priority policy's order of requests: lower priority value first,
    then earlier arrival, then request id (the total order vLLM's
    Request.__lt__ defines). The one owner: the priority queue's heap and
    the scheduler's merge of two waiting queues compare by it."""
    return request.priority, request.arrival_time, request.request_id


class PriorityRequestQueue:
    """Requests in :func:`priority_order` (so pops match vLLM's heap)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, Request]] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_order(request), request))

    def prepend_request(self, request: Request) -> None:
        # A heap has no front: a request goes back by its key (a method,
        # not a class-level alias, which mypyc cannot compile).
        self.add_request(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(map(id, requests))
        self._heap = [e for e in self._heap if id(e[3]) not in drop]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in the order they would be popped."""
        return (entry[3] for entry in sorted(self._heap))

    def check_invariants(self) -> None:
        heap = self._heap
        for i in range(1, len(heap)):
            assert heap[(i - 1) // 2][:3] <= heap[i][:3], "heap order broken"
        for key in heap:
            r = key[3]
            assert key[:3] == (r.priority, r.arrival_time, r.request_id), "stale heap key"
        assert len({id(k[3]) for k in heap}) == len(heap), "a request is queued twice"


RequestQueue = FCFSRequestQueue | PriorityRequestQueue


def create_request_queue(policy: str) -> RequestQueue:
    if policy == "priority":
        return PriorityRequestQueue()
    return FCFSRequestQueue()
