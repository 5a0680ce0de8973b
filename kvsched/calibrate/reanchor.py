"""A step profile carried to the machine as it runs now, from one logged run.

A profile (``kvsched profile``) holds step times as the machine gave them
while it was measured. On a shared host they move: on issue 21's testbed the
same batch took 15-80 % longer an hour later (other tenants of the VM's
host; docs/validation.md). Profiling again takes minutes of an idle server;
re-anchoring takes a run the server already served with
``--enable-logging-iteration-details`` (a warm-up, a short bench run):

1. the run's log is tied to its requests by kvsched's own scheduler
   (:func:`~kvsched.calibrate.step_matching.replay_iteration_log`), so
   every logged step's batch is known exactly;
2. :func:`measure_drift` sets each logged step time against the profile's
   price of the same batch; the median ratio is the drift, taken apart for
   steps with prompt tokens and pure decode steps: the host does not slow
   them alike (on the testbed a slow hour stretched decode steps 1.5-1.7x
   and prefill steps 1.2-1.4x: a decode step is mostly the engine's own
   Python, a prefill step mostly matrix products);
3. :func:`reanchored` is the profile with each step time times its kind's
   factor (the overall one where the run had no step of that kind), saying
   so in its notes; the profiled backend fits it as any.

The run used to re-anchor is then spent: judge the profile on other runs.
``kvsched calibrate --reanchor`` is the command line (docs/calibrate.md).
"""

from __future__ import annotations

import dataclasses
import gzip
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvsched.calibrate.step_matching import IterationReplay
from kvsched.errors import UserInputError
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import StepProfile
from kvsched.profile.iteration_log import IterationLine, parse_iteration_line

# Fewer logged steps than this say too little about the machine's speed.
MIN_DRIFT_STEPS = 20


@dataclass(frozen=True, slots=True)
class Drift:
    """Logged step time over the profile's price of the same batch."""

    factor: float         # the median ratio
    steps: int            # the steps it is taken over
    p10: float            # the ratio's spread
    p90: float
    prefill_factor: float | None   # the median over steps with prompt tokens
    decode_factor: float | None    # over pure-decode steps


def measure_drift(model: ProfiledStepTimeModel, replay: IterationReplay,
                  log: Sequence[IterationLine]) -> Drift:
    """The drift of ``model``'s profile on the logged run ``log``, whose
    steps ``replay`` tied to their batches. The log's iteration time is the
    forward pass alone, as the profile's: each step is set against the
    profile's forward pass (``forward_time``), whatever host terms
    ``model`` carries (its profile's serving path, a calibration's)."""
    if not replay.complete:
        raise UserInputError(f"the logged run cannot re-anchor a profile: {replay.reason}")
    ratios: list[float] = []
    prefill: list[float] = []
    decode: list[float] = []
    for step, line in zip(replay.steps, log):
        price = model.forward_time(step.shape)
        if price <= 0.0 or line.elapsed_ms <= 0.0:
            continue
        r = line.elapsed_ms / 1e3 / price
        ratios.append(r)
        (prefill if step.shape.prefill_tokens else decode).append(r)
    if len(ratios) < MIN_DRIFT_STEPS:
        raise UserInputError(f"the logged run has {len(ratios)} timed steps; re-anchoring needs at least "
                             f"{MIN_DRIFT_STEPS} (send more requests)")
    q = statistics.quantiles(ratios, n=10)
    return Drift(statistics.median(ratios), len(ratios), q[0], q[-1],
                 statistics.median(prefill) if prefill else None,
                 statistics.median(decode) if decode else None)


def reanchored(profile: StepProfile, drift: Drift, source: str) -> StepProfile:
    """``profile`` with each step time scaled by its kind's factor (steps
    with prompt tokens, pure decode steps; the overall factor for a kind the
    logged run did not have), its fit dropped (the backend refits from the
    steps), the change in its notes."""
    prefill = drift.prefill_factor if drift.prefill_factor is not None else drift.factor
    decode = drift.decode_factor if drift.decode_factor is not None else drift.factor
    for name, value in (("factor", drift.factor), ("prefill factor", prefill), ("decode factor", decode)):
        if not 0.0 < value < 100.0:
            raise UserInputError(f"drift {name} {value!r}: not a speed change a host makes "
                                 "(the logged run is another model or machine?)")
    steps = [dataclasses.replace(s, elapsed_ms=s.elapsed_ms * (prefill if s.prefill_tokens else decode))
             for s in profile.steps]
    note = (f"re-anchored on {source}: step times x{prefill:.3f} with prompt tokens, x{decode:.3f} pure "
            f"decode (median logged/profiled over {drift.steps} steps; overall x{drift.factor:.3f}, "
            f"p10-p90 {drift.p10:.3f}-{drift.p90:.3f})")
    return dataclasses.replace(profile, steps=steps, fit=None, notes=[*profile.notes, note])


def read_iteration_log(path: str) -> list[IterationLine]:
    """The engine steps a vLLM server log holds (``--enable-logging-iteration-details``;
    plain or gzip), in order; a clear error if it has none."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            lines = [it for it in map(parse_iteration_line, f) if it is not None]
    except OSError as e:
        raise UserInputError(f"--server-log {path!r}: cannot read it ({e.strerror or e})") from None
    if not lines:
        raise UserInputError(f"--server-log {path!r}: no engine iteration lines (start vllm serve with "
                             "--enable-logging-iteration-details and keep its log)")
    return lines
