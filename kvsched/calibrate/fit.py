"""Fitting host terms to runs: the optimiser over the loss
(:mod:`kvsched.calibrate.loss`) and :class:`Calibrator`, which replays the
runs at each candidate and reports the errors before and after.

Each evaluation is one deterministic simulation per run, so the minimiser is
deterministic: SciPy's bounded least squares (trust-region reflective) with
coarse central differences (:func:`bounded_least_squares`). The terms enter
the latencies nearly linearly, and a term never goes below 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvsched.calibrate.loss import DEFAULT_GROUPS, LossGroups, RunErrors, loss_residuals, run_errors
from kvsched.calibrate.replay import Replayer
from kvsched.calibrate.run_files import ObservedRun
from kvsched.calibrate.terms import TERM_SCALES, format_term, with_terms
from kvsched.errors import UserInputError
from kvsched.perf.host import HostTerms
from kvsched.sim.deployment import Deployment
from kvsched.sim.spec import InstanceGroup

FloatArray = npt.NDArray[np.float64]

DEFAULT_MAX_ITERATIONS = 20
# The optimiser's settings (see bounded_least_squares): the Jacobian's
# relative difference step, the relative loss change that ends the fit, and
# the loss under which the runs count as reproduced.
DIFF_STEP = 0.1
TOLERANCE = 1e-4
LOSS_FLOOR = 1e-14


@dataclass(slots=True)
class FitResult:
    """Where the optimiser stopped: ``x``, its loss (sum of squared
    residuals), the iterations taken, and the Jacobian there (for
    :func:`identifiability_notes`)."""

    x: FloatArray
    loss: float
    iterations: int
    evaluations: int  # loss evaluations, the Jacobian's included
    converged: bool
    jacobian: FloatArray | None = None
    history: list[tuple[int, float, FloatArray]] = field(default_factory=list)


def bounded_least_squares(fun: Callable[[FloatArray], FloatArray], x0: FloatArray, *,
                          max_iterations: int = DEFAULT_MAX_ITERATIONS, diff_step: float = DIFF_STEP,
                          tolerance: float = TOLERANCE, loss_floor: float = LOSS_FLOOR,
                          progress: Callable[[int, float, FloatArray], None] | None = None) -> FitResult:
    """Minimise ``sum(fun(x)**2)`` over ``x >= 0`` (``x`` in units of order
    1) with SciPy's trust-region reflective least squares.

    The Jacobian is taken by central differences of ``diff_step * max(1,
    |x|)``, coarse on purpose: a simulated latency moves in small jumps (a
    request reaches the engine just before a step begins, or just after) and
    a coarse central difference reads the slope through them. Done when a
    step lowers the loss by less than ``tolerance`` of it, the loss falls
    under ``loss_floor`` (the runs are reproduced), or after
    ``max_iterations`` steps tried. Deterministic: same ``fun``, same path.
    The minimum is local: see docs/calibrate.md for runs that make it the
    only one.
    """
    # SciPy ships no type stubs (scipy-stubs is a separate package).
    from scipy.optimize import OptimizeResult, least_squares  # type: ignore[import-untyped, unused-ignore]

    start = np.maximum(np.asarray(x0, dtype=float), 0.0)
    r0 = fun(start)
    evaluations = 1

    def counted(x: FloatArray) -> FloatArray:
        nonlocal evaluations
        if np.array_equal(x, start):
            return r0  # SciPy's first call: already evaluated for the progress line
        evaluations += 1
        return fun(x)

    history: list[tuple[int, float, FloatArray]] = [(0, float(r0 @ r0), start.copy())]
    if progress is not None:
        progress(*history[0])

    def on_iteration(intermediate_result: OptimizeResult) -> None:
        loss = 2.0 * float(intermediate_result.cost)  # SciPy's cost is half the sum of squares
        history.append((len(history), loss, np.array(intermediate_result.x)))
        if progress is not None:
            progress(*history[-1])
        if loss <= loss_floor:
            raise StopIteration  # the runs are reproduced to ~1e-7: nothing left to gain

    # max_nfev counts the loss evaluations of the steps tried (not the
    # Jacobian's), the first evaluation at x0 among them.
    result = least_squares(counted, start, jac="3-point", bounds=(0.0, np.inf), method="trf",
                           diff_step=diff_step, x_scale=1.0, ftol=tolerance, xtol=1e-10, gtol=1e-12,
                           max_nfev=max_iterations + 1, callback=on_iteration)
    x = np.maximum(np.asarray(result.x, dtype=float), 0.0)
    residuals = np.asarray(result.fun, dtype=float)
    # status 0: max_nfev reached; -2: the loss floor (StopIteration above); > 0: a tolerance met.
    converged = bool(result.status != 0)
    return FitResult(x, float(residuals @ residuals), len(history) - 1, evaluations, converged,
                     np.asarray(result.jac, dtype=float), history)


@dataclass(slots=True)
class Calibration:
    """A fit's outcome: the terms, and the errors before and after on the
    fitted runs and the held-out ones."""

    start: HostTerms
    terms: HostTerms
    fitted: tuple[str, ...]
    fit: FitResult
    fit_before: list[RunErrors]
    fit_after: list[RunErrors]
    held_before: list[RunErrors]
    held_after: list[RunErrors]
    simulations: int
    wall_seconds: float
    notes: list[str] = field(default_factory=list)


class Calibrator:
    """Fits ``fitted`` terms of ``start`` to ``runs`` on one deployment."""

    def __init__(self, deployment: Deployment, runs: Sequence[ObservedRun], start: HostTerms,
                 fitted: Sequence[str], *, held_out: Sequence[ObservedRun] = (),
                 group: InstanceGroup | None = None, groups: int = DEFAULT_GROUPS,
                 out: Callable[[str], None] | None = None) -> None:
        if not runs:
            raise UserInputError("no runs to fit on: give --bench FILE.json or --requests FILE.jsonl")
        if not fitted:
            raise UserInputError("no terms to fit (--fit)")
        self.replayer = Replayer(deployment, group)
        self.runs = list(runs)
        self.held_out = list(held_out)
        self.start = start
        self.fitted = tuple(fitted)
        self.scales = np.array([TERM_SCALES[n] for n in self.fitted])
        self.out = out or (lambda line: None)
        self.groups = [LossGroups.of(run, groups) for run in self.runs]

    def terms_at(self, x: FloatArray) -> HostTerms:
        return with_terms(self.start, dict(zip(self.fitted, x * self.scales)))

    def errors(self, runs: Sequence[ObservedRun], terms: HostTerms) -> list[RunErrors]:
        return [run_errors(run, self.replayer.simulate(run, terms)) for run in runs]

    def run(self, max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Calibration:
        t0 = time.perf_counter()
        x0 = np.array([getattr(self.start, n) for n in self.fitted]) / self.scales

        def fun(x: FloatArray) -> FloatArray:
            terms = self.terms_at(x)
            return np.concatenate([loss_residuals(run, self.replayer.simulate(run, terms), groups)
                                   for run, groups in zip(self.runs, self.groups)])

        def progress(iteration: int, loss: float, x: FloatArray) -> None:
            values = ", ".join(f"{n} {format_term(n, v)}" for n, v in zip(self.fitted, x * self.scales))
            self.out(f"  iteration {iteration:>2}: loss {loss:.6g}  ({values}; "
                     f"{self.replayer.simulations} simulations, {time.perf_counter() - t0:.1f} s)")

        fit_before = self.errors(self.runs, self.start)
        held_before = self.errors(self.held_out, self.start)
        fit = bounded_least_squares(fun, x0, max_iterations=max_iterations, progress=progress)
        terms = self.terms_at(fit.x)
        calibration = Calibration(
            self.start, terms, self.fitted, fit, fit_before, self.errors(self.runs, terms), held_before,
            self.errors(self.held_out, terms), self.replayer.simulations, time.perf_counter() - t0)
        calibration.notes.extend(identifiability_notes(self.fitted, fit))
        if not fit.converged:
            calibration.notes.append(f"stopped after {fit.iterations} iterations (--max-iterations) "
                                     "before the loss settled; raise --max-iterations")
        return calibration


def identifiability_notes(names: Sequence[str], fit: FitResult) -> list[str]:
    """Terms the runs cannot tell apart: a term whose effect (its Jacobian
    column) the other terms reproduce almost exactly, or that has none."""
    jac = fit.jacobian
    notes: list[str] = []
    if jac is None or not jac.size:
        return notes
    for j, name in enumerate(names):
        col = jac[:, j]
        norm = float(col @ col)
        if norm <= 1e-24:
            notes.append(f"{name}: no effect on these runs, left at its start value")
            continue
        others = np.delete(jac, j, axis=1)
        if others.shape[1]:
            coef, *_ = np.linalg.lstsq(others, col, rcond=None)
            rest = col - others @ coef
            unexplained = float(rest @ rest) / norm
            if unexplained < 1e-3:
                notes.append(f"{name}: nearly indistinguishable from the other terms on these runs "
                             "(its value is uncertain); add runs at another concurrency, rate or "
                             "prompt length")
    return notes
