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
