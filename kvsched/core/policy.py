"""Admission policies: a hook the scheduler consults before admitting each
waiting request.

A policy returns None to let the request in, or a short reason that stops
admission for the rest of the step (the reason shows up in ``--explain``).
Running requests are never affected. A new policy is a few lines::

    class MaxRunning:
        def __init__(self, limit: int) -> None:
            self.limit = limit

        def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
            if len(scheduler.running) >= self.limit:
                return f"{len(scheduler.running)} running, limit {self.limit}"
            return None

A policy may also implement any of these optional methods; the scheduler
looks them up once, at construction, and calls only those present:

- ``begin_step(scheduler) -> None`` at the start of every ``schedule()``;
- ``defer_prefill_chunks(scheduler) -> bool``: True makes this step's
  running phase skip running requests whose last scheduling left them
  mid-prefill (vLLM's ``defer_prefills``); decodes still run;
- ``end_step(scheduler, output) -> None`` once the ``SchedulerOutput`` is
  built (before the model runs), to update the policy's own state.

Ready-made policies are in ``kvsched.core.policies``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvsched.core.scheduler import Scheduler
    from kvsched.request import Request


class AdmissionPolicy(Protocol):
    def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
        """None admits ``request``; a reason stops admission for this step."""
        ...
