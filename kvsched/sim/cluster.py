"""The event loop: a client, a router and engine instances on one clock.

One heap holds the time each busy instance starts its next step; the client
says when it next sends. The loop takes the earliest event, sends first at
equal times (a request that arrives as a step starts is in that step's
queue, as vLLM's engine core drains its input queue before scheduling), then
instances by index. An instance advances one step, or a stretch of decode
steps that must stop before the next time anything from outside could reach
it: the client's next send, and, while the client holds requests back for
``--max-concurrency``, any other instance's next step (its finishes free the
slots). Every instance's state at a send is therefore that of all its steps
that started before it, with or without fast-forward.

With a client timeout (``--request-timeout``) each request's deadline is an
event of the client too, bounding stretches as a send does: at it the
client frees the slot and the loop aborts the request wherever it is
(``_expire``), before any step that starts then.

A request may take time to reach the engine after the client sends it
(``arrival``: the host terms' arrival delay, the API server's HTTP
handling and tokenisation, kvsched.perf.host). It then waits in transit, a second kind of event: the
router places it and its rank receives it when it arrives, while its TTFT
still counts from the send.

========================  ==========================================  ============================
component                 owns                                        clock
========================  ==========================================  ============================
:class:`Client`           arrivals, the concurrency limit             none (asked for its next send)
:class:`Router`           which rank gets a request                   none (reads the ranks' queues)
:class:`EngineInstance`   one :class:`Rank` and a step-time model     its own ``now``
:class:`LockstepGroup`    DP ranks that step together                 one ``now`` for all its ranks
:class:`Cluster`          the heap of instance clocks                 none (reads the others')
========================  ==========================================  ============================
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence

from kvsched.errors import UserInputError
from kvsched.perf.host import HostTerms
from kvsched.sim.client import Client
from kvsched.sim.instance import EngineInstance, LockstepGroup
from kvsched.sim.proxy import Proxy
from kvsched.sim.rank import Rank, SimResult
from kvsched.sim.router import Router
from kvsched.sim.workload import WorkloadRequest

Instance = EngineInstance | LockstepGroup
# (requests done, requests in the workload, simulated seconds)
Progress = Callable[[int, int, float], None]


class Cluster:
    def __init__(self, instances: Sequence[Instance], client: Client, router: Router | None = None,
                 *, progress: Progress | None = None, arrival: HostTerms | None = None,
                 proxy: Proxy | None = None) -> None:
        if not instances:
            raise UserInputError("a cluster needs at least one engine instance")
        self.instances = list(instances)
        self.client = client
        self.ranks: list[Rank] = [r for inst in self.instances for r in inst.ranks]
        self._instance_of = [i for i, inst in enumerate(self.instances) for _ in inst.ranks]
        if router is None:
            router = Router("round-robin", len(self.ranks))
        if router.size != len(self.ranks):
            raise UserInputError(f"router for {router.size} ranks, cluster has {len(self.ranks)}")
        self.router = router
        # Prefill/decode disaggregation: the proxy routes each request to a
        # prefill rank, then its decode leg to a decode rank (None: the
        # router places every request once).
        self.proxy = proxy
        self._hands_off = [any(r.hands_off for r in inst.ranks) for inst in self.instances]
        # The index of each instance's first rank in ``ranks`` (an instance's ranks are consecutive).
        self._first_rank = [self._instance_of.index(i) for i in range(len(self.instances))]
        self.routed = [0] * len(self.ranks)
        # Instances a send woke earlier than they were queued for (_send).
        self._rewoken: list[int] = []
        self.progress = progress
        # Called after every step or stretch of any instance (e.g. to publish
        # the ranks' load to DP admission policies).
        self.after_step: list[Callable[[Cluster], None]] = []
        self.wall_seconds = 0.0
        # Host terms that delay arrivals, or None (each request reaches its
        # rank as it is sent).
        self.arrival = arrival if arrival is not None and arrival.delays_arrivals else None
        # Sent requests on their way to the engine: (reach time, send order,
        # send time, request), a heap.
        self._transit: list[tuple[float, int, float, WorkloadRequest]] = []
        self._sent = 0

    @property
    def now(self) -> float:
        """The latest instance clock (the end of the simulation, once run)."""
        return max(inst.now for inst in self.instances)

    def _next_from_outside(self, t: float, t_dead: float) -> float:
        """The earliest of ``t`` (the client's next send, or the soonest a
        send could reach an engine), the client's next deadline ``t_dead``,
        a request reaching an engine (``_transit``) and the P/D proxy's next
        decode leg: the next event that does not come from an engine step."""
        transit = self._transit
        if t_dead < t:
            t = t_dead
        if transit and transit[0][0] < t:
            t = transit[0][0]
        proxy = self.proxy
        if proxy is not None:
            t = min(t, proxy.next_decode_leg())
        return t

    def run(self) -> list[SimResult]:
        """Serve the whole workload; every rank's result."""
        wall0 = time.perf_counter()
        client = self.client
        instances = self.instances
        heap: list[tuple[float, int]] = []   # (next step start, instance) of busy instances
        # When each instance is queued in the heap (nan: not queued); an entry
        # at another time is stale (the instance was woken and queued again).
        queued_at = [math.nan] * len(instances)
        hooks = self.after_step
        last_report = wall0
        iterations = 0
        transit = self._transit
        proxy = self.proxy
        hands_off = self._hands_off
        # A client timeout: its deadlines are events too (the client gives
        # up, the engine aborts), and an abort may leave a queued instance idle.
        timeouts = client.request_timeout is not None
        t_dead = math.inf
        # Open loop with a delay: a send is not an event for the engines.
        # No request reaches an engine sooner than arrival_s after its send:
        # an open-loop client's send changes nothing before then.
        floor = self.arrival.arrival_s if self.arrival is not None and client.max_concurrency is None else 0.0
        while True:
            t_client = client.next_send_time()
            if timeouts:
                t_dead = client.next_deadline()
            t_send = self._next_from_outside(t_client, t_dead)
            t_step = heap[0][0] if heap else math.inf
            if t_send <= t_step and t_send < math.inf:
                for i in self._send(t_send):
                    inst = instances[i]
                    if queued_at[i] != inst.now and inst.busy():
                        queued_at[i] = inst.now
                        heapq.heappush(heap, (inst.now, i))
                for i in self._rewoken:
                    # Its clock moved back: its queued time is stale (skipped when popped).
                    if queued_at[i] != instances[i].now:
                        queued_at[i] = instances[i].now
                        heapq.heappush(heap, (instances[i].now, i))
                self._rewoken.clear()
                continue
            if not heap:
                if client.done and not transit:
                    break
                raise RuntimeError("the client waits for responses but no engine has work; "
                                   "nothing would ever progress")
            t_queued, i = heapq.heappop(heap)
            inst = instances[i]
            if t_queued != queued_at[i]:
                continue  # stale: the instance was woken earlier and queued again
            queued_at[i] = math.nan
            if timeouts and not inst.busy():
                continue  # aborts took its last requests
            bound = self._next_from_outside(t_client + floor, t_dead) if floor else t_send
            if heap and (proxy is not None or client.waits_on_responses()):
                # Another instance's finish could free a slot and send a request
                # here (or hand a decode leg here): no jump past its next step.
                bound = min(bound, heap[0][0])
            finished = inst.advance(bound)
            if proxy is not None and hands_off[i]:
                # Finished prefill legs become decode legs; the client sees no finish.
                for k, r in enumerate(inst.ranks):
                    proxy.collect(self._first_rank[i] + k, r)
                finished = 0
            if timeouts:
                # The client needs to know which: one past its deadline frees its slot then.
                for r in inst.ranks:
                    if r.finished_ids:
                        client.finished(r.finished_ids, inst.now)
                        r.finished_ids.clear()
            elif finished:
                client.release(finished, inst.now)
            for hook in hooks:
                hook(self)
            if inst.busy():
                queued_at[i] = inst.now
                heapq.heappush(heap, (inst.now, i))
            iterations += 1
            if self.progress is not None and not iterations & 255:
                wall = time.perf_counter()
                if wall - last_report > 0.5:
                    last_report = wall
                    self.progress(self._num_done(), client.num_requests, inst.now)
        if self.progress is not None:
            self.progress(self._num_done(), client.num_requests, self.now)
        self.wall_seconds = time.perf_counter() - wall0
        return [r.result(self.wall_seconds) for r in self.ranks]

    def _num_done(self) -> int:
        return sum(len(r.records) + len(r.failed) for r in self.ranks)

    def _send(self, t: float) -> list[int]:
        """Send what the client has due at ``t`` and deliver what reaches the
        engine by ``t``; the instances that got work."""
        client = self.client
        arrival = self.arrival
        transit = self._transit
        # Requests the client gave up on first: their slots go to the queue.
        touched = self._expire(t) if client.request_timeout is not None else []
        while True:
            due = client.due(t)
            if arrival is not None:
                for spec in due:
                    heapq.heappush(transit, (t + arrival.arrival_delay(spec.num_prompt_tokens), self._sent,
                                             t, spec))
                    self._sent += 1
                arrived: list[tuple[float, WorkloadRequest]] = []
                while transit and transit[0][0] <= t:
                    _, _, sent, spec = heapq.heappop(transit)
                    arrived.append((sent, spec))
            else:
                arrived = [(t, spec) for spec in due]
            refused: list[str] = []
            proxy = self.proxy
            for sent, spec in arrived:
                if proxy is None:
                    index = self.router.choose(self.ranks, t, spec)
                else:
                    index = proxy.route_arrival(self.ranks, t, spec)
                owner = self._instance_of[index]
                self._wake(owner, t)
                if proxy is None:
                    ok = self.ranks[index].receive(spec, sent, t)
                else:
                    ok = self.ranks[index].receive_leg(spec, sent, t, 1, proxy.prefill_params(spec, sent))
                if ok:
                    self.routed[index] += 1
                    touched.append(owner)
                else:
                    refused.append(spec.request_id)
            if proxy is not None:
                for _, _, sent, spec, params in proxy.due_decode_legs(t):
                    index = proxy.route_decode(self.ranks, t, spec)
                    owner = self._instance_of[index]
                    self._wake(owner, t)
                    if self.ranks[index].receive_leg(spec, sent, t, spec.output_len, params):
                        self.routed[index] += 1
                        touched.append(owner)
                    else:
                        refused.append(spec.request_id)
            if not refused:
                return touched
            client.refused(refused)  # their slots go to the next in the queue

    def _expire(self, t: float) -> list[int]:
        """Abort what the client gives up on at ``t`` wherever the request is
        (vLLM's server aborts a request whose client disconnected): on its
        way to an engine (it never arrives), in an engine (waiting, running,
        preempted, loading KV: the scheduler's abort path frees its blocks,
        as vLLM's ``finish_requests(..., FINISHED_ABORTED)``), or between a
        prefill and a decode instance (the decode leg is never sent; the
        prefill instance keeps its blocks until NIXL's lease runs out, as
        vLLM's does). The instances that aborted something, woken as by an
        arrival: the engine takes the abort between steps. A request the
        engine finished after its deadline is not here: its rank recorded
        the timeout as it finished it (``Rank._finish``)."""
        expired = self.client.expired(t)
        if not expired:
            return []
        touched: list[int] = []
        transit = self._transit
        proxy = self.proxy
        for rid in expired:
            at = next((k for k, entry in enumerate(transit) if entry[3].request_id == rid), -1)
            if at >= 0:
                # Sent, not arrived: it never reaches an engine.
                transit[at] = transit[-1]
                transit.pop()
                heapq.heapify(transit)
                self.ranks[0].record_timeout(rid, t)
                continue
            index = next((k for k, r in enumerate(self.ranks) if rid in r.live), -1)
            if index >= 0:
                self.ranks[index].abort(rid, t)
                owner = self._instance_of[index]
                self._wake(owner, t)
                touched.append(owner)
                continue
            if proxy is not None and proxy.drop_decode_leg(rid):
                self.ranks[0].record_timeout(rid, t)
                continue
            # Nowhere: the engine finished it (in time or late, its rank
            # decided) in a step the client has not heard of yet.
        return touched

    def _wake(self, owner: int, t: float) -> None:
        """Instance ``owner`` gets work (or an abort) at ``t``; with a client
        timeout, what it finished as it woke (a KV report) reaches the client."""
        inst = self.instances[owner]
        if inst.wake(t):
            self._rewoken.append(owner)
        if self.client.request_timeout is not None:
            for r in inst.ranks:
                if r.finished_ids:
                    self.client.finished(r.finished_ids, t)
                    r.finished_ids.clear()
