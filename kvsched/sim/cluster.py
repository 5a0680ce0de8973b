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

    def run(self) -> list[SimResult]:
        """Serve the whole workload; every rank's result."""
        wall0 = time.perf_counter()
        client = self.client
        instances = self.instances
        heap: list[tuple[float, int]] = []   # (next step start, instance) of busy instances
        queued = [False] * len(instances)
        hooks = self.after_step
        last_report = wall0
        iterations = 0
        transit = self._transit
        proxy = self.proxy
        hands_off = self._hands_off
        # Open loop with a delay: a send is not an event for the engines.
        # No request reaches an engine sooner than arrival_s after its send:
        # an open-loop client's send changes nothing before then.
        floor = self.arrival.arrival_s if self.arrival is not None and client.max_concurrency is None else 0.0
        while True:
            t_client = t_send = client.next_send_time()
            if transit and transit[0][0] < t_send:
                # The next thing from outside is a request reaching the engine.
                t_send = transit[0][0]
            if proxy is not None and proxy.next_decode_leg() < t_send:
                t_send = proxy.next_decode_leg()
            t_step = heap[0][0] if heap else math.inf
            if t_send <= t_step and t_send < math.inf:
                for i in self._send(t_send):
                    if not queued[i] and instances[i].busy():
                        queued[i] = True
                        heapq.heappush(heap, (instances[i].now, i))
                for i in self._rewoken:
                    # Its clock moved back: its queued time is stale (skipped when popped).
                    queued[i] = True
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
            if t_queued != inst.now:
                continue  # stale: the instance was woken earlier and queued again
            bound = t_send
            if floor:
                bound = t_client + floor
                if transit and transit[0][0] < bound:
                    bound = transit[0][0]
                if proxy is not None and proxy.next_decode_leg() < bound:
                    bound = proxy.next_decode_leg()
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
            if finished:
                client.release(finished, inst.now)
            for hook in hooks:
                hook(self)
            if inst.busy():
                heapq.heappush(heap, (inst.now, i))
            else:
                queued[i] = False
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
        touched: list[int] = []
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
            refused = 0
            proxy = self.proxy
            for sent, spec in arrived:
                if proxy is None:
                    index = self.router.choose(self.ranks, t, spec)
                else:
                    index = proxy.route_arrival(self.ranks, t, spec)
                owner = self._instance_of[index]
                if self.instances[owner].wake(t):
                    self._rewoken.append(owner)
                if proxy is None:
                    ok = self.ranks[index].receive(spec, sent, t)
                else:
                    ok = self.ranks[index].receive_leg(spec, sent, t, 1, proxy.prefill_params(spec, sent))
                if ok:
                    self.routed[index] += 1
                    touched.append(owner)
                else:
                    refused += 1
            if proxy is not None:
                for _, _, sent, spec, params in proxy.due_decode_legs(t):
                    index = proxy.route_decode(self.ranks, t, spec)
                    owner = self._instance_of[index]
                    if self.instances[owner].wake(t):
                        self._rewoken.append(owner)
                    if self.ranks[index].receive_leg(spec, sent, t, spec.output_len, params):
                        self.routed[index] += 1
                        touched.append(owner)
                    else:
                        refused += 1
            if not refused:
                return touched
            client.refused(refused)  # their slots go to the next in the queue
