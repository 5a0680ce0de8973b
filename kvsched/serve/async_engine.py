"""The engine in its own thread, fed by the server's event loop.

The HTTP handlers run on an asyncio loop; the engine (``kvsched.LLM``'s
``add_request`` / ``step`` / ``abort``) runs on one thread of its own, so a
step never blocks the loop. Between steps the thread takes the requests
submitted and the aborts asked for since the last one; after each step it
hands every output to its request's :class:`RequestStream` (an asyncio
queue, filled through ``call_soon_threadsafe``). When there is nothing to do
it waits on a condition, never polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from kvsched.engine.llm import LLM, PromptType
from kvsched.engine.outputs import RequestOutput
from kvsched.errors import UserInputError
from kvsched.request import SamplingParams
from kvsched.serve.errors import ApiError
from kvsched.serve.metrics import ServerMetrics


class RequestStream:
    """One request's outputs (or the error that ended it), in order, on the
    loop that asked for them."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.finished = False
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        """From the engine thread."""
        # RuntimeError: the loop has closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def next(self) -> RequestOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item


@dataclass(slots=True)
class _Submitted:
    request_id: str
    prompt: PromptType
    params: SamplingParams
    priority: int
    stream: RequestStream
    arrival_time: float  # time.time() when the handler submitted it


@dataclass(slots=True)
class _Inbox:
    """What the loop hands the engine thread, guarded by AsyncEngine's lock."""

    submitted: list[_Submitted] = field(default_factory=list)
    aborts: set[str] = field(default_factory=set)
    # POST /reset_prefix_cache: answered between two steps.
    resets: list[concurrent.futures.Future[bool]] = field(default_factory=list)
    stopping: bool = False


class AsyncEngine:
    """``submit`` a request, read its stream, ``abort`` it if the client goes.

    At most ``max_pending_requests`` requests are in the server at once
    (submitted and not finished); one more is refused with 503 at once, so
    overload is answered, never queued without bound."""

    def __init__(self, llm: LLM, metrics: ServerMetrics, max_pending_requests: int,
                 engine_cpus: list[int] | None = None) -> None:
        """``engine_cpus``: bind the engine thread to these CPUs and run
        that many torch threads (see ``cpu_binding``); None leaves both alone."""
        self.llm = llm
        self.engine_cpus = engine_cpus
        self.metrics = metrics
        self.max_pending_requests = max_pending_requests
        self._cond = threading.Condition()
        self._inbox = _Inbox()
        self._num_pending = 0  # guarded by _cond
        self._idle = True  # guarded by _cond: the thread waits with nothing to do
        self._error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}  # the engine thread's own
        self._thread = threading.Thread(target=self._run, name="kvsched-engine", daemon=True)

    # -- the loop's side ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        with self._cond:
            self._inbox.stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def error(self) -> BaseException | None:
        """What stopped the engine thread, if it died."""
        return self._error

    @property
    def num_pending(self) -> int:
        with self._cond:
            return self._num_pending

    def submit(self, request_id: str, prompt: PromptType, params: SamplingParams,
               priority: int = 0) -> RequestStream:
        """Queue a request for the next step; its stream yields its outputs.
        ``priority`` orders it under --scheduling-policy priority (lower first)."""
        if self._error is not None:
            raise ApiError(f"the engine has stopped: {self._error}", status=500)
        stream = RequestStream(request_id, asyncio.get_running_loop())
        with self._cond:
            if self._inbox.stopping:
                raise ApiError("the server is shutting down", status=503)
            if self._num_pending >= self.max_pending_requests:
                raise ApiError(f"server overloaded: {self._num_pending} requests in progress, the "
                               f"most this server takes (--max-pending-requests "
                               f"{self.max_pending_requests}); retry later", status=503)
            self._num_pending += 1
            self._idle = False
            self._inbox.submitted.append(_Submitted(request_id, prompt, params, priority, stream,
                                                    time.time()))
            self._cond.notify_all()
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (its client went away); its blocks are freed
        before the next step."""
        with self._cond:
            self._inbox.aborts.add(request_id)
            self._idle = False
            self._cond.notify_all()

    async def reset_prefix_cache(self) -> bool:
        """vLLM's dev endpoint: forget the prefix cache between two steps;
        False while a request holds blocks."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        with self._cond:
            if self._inbox.stopping or self._error is not None:
                raise ApiError("the engine has stopped", status=503)
            self._inbox.resets.append(done)
            self._cond.notify_all()
        return await asyncio.wrap_future(done)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted request has finished or been aborted
        and the engine holds nothing (for shutdown and tests); False if
        ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._idle or self._error is not None, timeout)

    # -- the engine thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.engine_cpus is not None:
                # This thread only (Linux applies the mask per thread); torch's
                # pool, started from here on first use, inherits it.
                os.sched_setaffinity(0, self.engine_cpus)
                torch.set_num_threads(len(self.engine_cpus))
            while self._run_once():
                pass
        except Exception as err:
            # The engine is broken: fail every request, say so in the log and
            # on /health (500), refuse new requests (500).
            logging.getLogger(__name__).exception("kvsched serve: the engine failed")
            with self._cond:
                self._error = err
                self._cond.notify_all()
            for stream in self._streams.values():
                stream.put(ApiError(f"the engine failed: {type(err).__name__}: {err}", status=500))
            self._streams.clear()
        finally:
            for stream in self._streams.values():
                stream.put(ApiError("the server is shutting down", status=503))
            with self._cond:
                for reset in self._inbox.resets:
                    reset.set_exception(ApiError("the server is shutting down", status=503))

    def _run_once(self) -> bool:
        llm = self.llm
        with self._cond:
            while not (self._inbox.stopping or self._inbox.submitted or self._inbox.aborts
                       or self._inbox.resets or llm.has_unfinished_requests()):
                self._idle = True
                self._cond.notify_all()
                self._cond.wait()
            if self._inbox.stopping:
                return False
            submitted, self._inbox.submitted = self._inbox.submitted, []
            aborts, self._inbox.aborts = self._inbox.aborts, set()
            resets, self._inbox.resets = self._inbox.resets, []
        done = 0
        for sub in submitted:
            if sub.request_id in aborts:  # gone before it reached the engine
                aborts.discard(sub.request_id)
                done += 1
                continue
            try:
                llm.add_request(sub.prompt, sub.params, request_id=sub.request_id,
                                priority=sub.priority, arrival_time=sub.arrival_time)
            except UserInputError as err:  # the prompt's length or token ids
                sub.stream.put(ApiError(str(err)))
                done += 1
                continue
            self._streams[sub.request_id] = sub.stream
        known = [rid for rid in aborts if rid in self._streams]
        outputs = llm.abort(known) if known else []
        for reset in resets:  # after the aborts: their blocks are free
            reset.set_result(llm.reset_prefix_cache())
        if llm.has_unfinished_requests():
            outputs += llm.step()
        now = time.time()
        for out in outputs:
            self.metrics.observe_output(out, now)
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]
                done += 1
        self.metrics.observe_step(llm.engine.scheduler.make_stats())
        if done:
            with self._cond:
                self._num_pending -= done
        return True
