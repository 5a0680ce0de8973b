"""A step-time pricing that replays a logged sequence of step times.

:class:`LoggedStepTimeModel` prices each simulated step with the time of a
step a real vLLM logged (``--enable-logging-iteration-details``: each
engine step's batch and its time), the logged step of the same batch at
the same place in the log where there is one (below). Replaying a real run
with it takes the forward pass out of the comparison: what still differs
from the real run is kvsched's mechanics (the scheduler, the engine loop,
the client, queueing) and the host time around vLLM's clock, whose
iteration time runs from just after the step is scheduled to the model's
output. That host time is RuntimeConfig's CPU terms, added as for every
backend (:func:`~kvsched.perf.step_time.combine_step_time`), plus host
terms where given.

The pricing is stateful (a cursor walks the log), so it prices one step
at a time: a fast-forwarded decode stretch (several steps priced at once,
some perhaps discarded) is refused; replay with fast-forward off.

Which logged step prices a simulated one: the one at the cursor when its
batch (tokens and requests) is the simulated step's. Where a step boundary
fell the other way in the simulation (a request arriving a few
milliseconds before or after a step starts joins one step earlier or
later), the nearest logged step of the same batch within ``window`` steps
prices it: ahead of the cursor (the simulation skipped the logged steps
between; the cursor moves past the match), or behind it (the simulation
ran a step the log has not; the cursor stays). Failing that (and for a
window above 0), the logged step of the same batch nearest the cursor
anywhere in the log prices it (the cursor stays): the simulation grouped
requests as vLLM did not here, and a step of that batch cost that much
elsewhere. With a window of 0 the steps are taken in order. A step whose
batch the log never ran is priced by a line fitted to the log's own steps
(seconds against tokens and requests: a 350-token prefill is not priced as
the decode step at the cursor), moves the cursor on, and is listed
(``mismatches``). The counts say how far the replay is from vLLM's own
sequence. A step past the end of the log is refused.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.perf.hardware import Hardware
from kvsched.perf.host import HostTerms
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel, combine_step_time

# Mismatched steps kept for the report (the count goes on past it).
MAX_MISMATCHES_KEPT = 20


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """One logged engine step: its batch as totals, and its time."""

    num_tokens: int
    num_reqs: int
    elapsed_s: float

    def __post_init__(self) -> None:
        if self.num_tokens < 1 or self.num_reqs < 1 or self.num_reqs > self.num_tokens:
            raise UserInputError(f"logged step: {self.num_tokens} tokens over {self.num_reqs} requests; "
                                 "a step runs at least one token of each request it schedules")
        if not self.elapsed_s >= 0.0:
            raise UserInputError(f"logged step: elapsed_s={self.elapsed_s!r}: must be a time >= 0 s")


def _fit_line(steps: Sequence[LoggedStep]) -> tuple[float, float, float]:
    """Least squares of the logged seconds on (1, tokens, requests); with
    too few distinct batches for three terms, the mean step."""
    x = np.array([(1.0, s.num_tokens, s.num_reqs) for s in steps])
    y = np.array([s.elapsed_s for s in steps])
    if len({(s.num_tokens, s.num_reqs) for s in steps}) < 3 or np.linalg.matrix_rank(x) < 3:
        return float(y.mean()), 0.0, 0.0
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(coef[0]), float(coef[1]), float(coef[2])


@dataclass(frozen=True, slots=True)
class StepMismatch:
    """A simulated step whose batch is not the logged one's."""

    index: int                 # 0-based step
    logged: tuple[int, int]    # (tokens, requests) the log has
    simulated: tuple[int, int]


class LoggedStepTimeModel(StepTimeModel):
    """Steps priced with a logged step-time sequence (see the module)."""

    backend = "logged"

    def __init__(self, model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                 runtime: RuntimeConfig, steps: Sequence[LoggedStep], source: str = "a step log",
                 host: HostTerms | None = None, window: int = 0) -> None:
        super().__init__(model, hardware, parallel, runtime, host)
        if not steps:
            raise UserInputError(f"{source}: no logged steps to replay")
        if not is_int(window) or window < 0:
            raise UserInputError(f"{source}: window={window!r}: must be an integer >= 0 (how many logged "
                                 "steps either side a simulated step's batch is looked for; 0: in order)")
        self.steps = tuple(steps)
        self.source = source
        self.window = window
        self.next_index = 0
        self.num_in_order = 0     # priced by the step at the cursor, same batch
        self.num_ahead = 0        # by a matching step ahead of the cursor
        self.num_behind = 0       # by a matching step behind it
        self.num_skipped = 0      # logged steps passed over by matches ahead
        self.num_elsewhere = 0    # by the nearest step of the batch outside the window
        self.num_mismatches = 0   # by the step at the cursor, another batch
        self.mismatches: list[StepMismatch] = []
        # Where each batch ran in the log, in order.
        self._where: dict[tuple[int, int], list[int]] = {}
        for i, step in enumerate(self.steps):
            self._where.setdefault((step.num_tokens, step.num_reqs), []).append(i)
        self._line = _fit_line(self.steps)

    def _rebuilt(self, host: HostTerms) -> LoggedStepTimeModel:
        return LoggedStepTimeModel(self.model, self.hardware, self.parallel, self.runtime, self.steps,
                                   self.source, host, self.window)

    def describe_backend(self) -> str:
        text = f"logged: {len(self.steps)} steps replayed from {self.source}"
        if self.host is not None:
            text += "; " + self.host_note()
        return text

    def _take(self, num_tokens: int, num_reqs: int) -> float:
        """The seconds of the logged step that prices a simulated step of
        this batch (see the module)."""
        k = self.next_index
        steps = self.steps
        if k >= len(steps):
            raise UserInputError(f"{self.source}: the simulation ran past the log's {len(steps)} steps; "
                                 "the replay's steps are no longer vLLM's (see the mismatched steps)")
        batch = (num_tokens, num_reqs)
        if (steps[k].num_tokens, steps[k].num_reqs) == batch:
            self.num_in_order += 1
            self.next_index = k + 1
            return steps[k].elapsed_s
        for d in range(1, self.window + 1):
            j = k + d
            if j < len(steps) and (steps[j].num_tokens, steps[j].num_reqs) == batch:
                self.num_ahead += 1
                self.num_skipped += d
                self.next_index = j + 1
                return steps[j].elapsed_s
            j = k - d
            if j >= 0 and (steps[j].num_tokens, steps[j].num_reqs) == batch:
                self.num_behind += 1
                return steps[j].elapsed_s
        where = self._where.get(batch) if self.window else None
        if where is not None:
            i = bisect.bisect_left(where, k)
            near = min(where[max(0, i - 1):i + 1], key=lambda j: abs(j - k))
            self.num_elsewhere += 1
            return steps[near].elapsed_s
        self.num_mismatches += 1
        if len(self.mismatches) < MAX_MISMATCHES_KEPT:
            self.mismatches.append(StepMismatch(k, (steps[k].num_tokens, steps[k].num_reqs), batch))
        self.next_index = k + 1
        a, b, c = self._line
        return max(0.0, a + b * num_tokens + c * num_reqs)

    def gpu_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        """The logged time of the next step, plus the host terms (none
        unless given)."""
        if shape.num_tokens == 0:
            return 0.0
        t = self._take(shape.num_tokens, shape.num_reqs)
        return self.add_prefill_host(self.add_host_gaps(t, shape.num_sampled), shape)

    def decode_step_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          global_tokens: int | None = None) -> list[float]:
        """One pure-decode step (``count`` 1): its logged time plus the host
        time, as ``step_time`` combines them."""
        if count != 1:
            raise UserInputError(f"{self.source}: a logged step-time replay prices one step at a time; "
                                 f"a fast-forward stretch of {count} steps was asked: run with "
                                 "fast-forward off")
        t = self.add_host_gaps(self._take(num_reqs, num_reqs), num_reqs)
        cpu = self.runtime.cpu_step_s + self.runtime.cpu_per_request_s * num_reqs
        return [combine_step_time(t, cpu, self.async_scheduling)]
