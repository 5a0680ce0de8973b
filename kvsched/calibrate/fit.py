"""Fitting host terms to runs: the optimiser over the loss
(:mod:`kvsched.calibrate.loss`) and :class:`Calibrator`, which replays the
runs at each candidate and reports the errors before and after.

Each evaluation is one deterministic simulation per run, so the minimiser is
deterministic: bounded Gauss-Newton by implicit filtering
(:func:`bounded_least_squares`), each term in units read off the runs'
own latencies (:func:`kvsched.calibrate.terms.latency_units`). The terms
enter the latencies nearly linearly, a term never goes below 0, and a
replay's latencies are a staircase in them, which the optimiser's coarse,
shrinking differences read through.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvsched.calibrate.loss import DEFAULT_GROUPS, LossGroups, RunErrors, loss_residuals, run_errors
from kvsched.calibrate.replay import Replayer
from kvsched.calibrate.run_files import ObservedRun
from kvsched.calibrate.terms import format_term, latency_units, with_terms
from kvsched.errors import UserInputError
from kvsched.perf.host import MAX_TERM_S, HostTerms
from kvsched.sim.deployment import Deployment
from kvsched.sim.spec import InstanceGroup

FloatArray = npt.NDArray[np.float64]

DEFAULT_MAX_ITERATIONS = 40
# The optimiser's settings (see bounded_least_squares), in the terms' latency
# units (terms.latency_units): the first and last difference steps, how a
# step shrinks, the largest move of one iteration, the relative loss drop an
# iteration must make, and the loss under which the runs count as reproduced.
FIRST_STEP = 0.25
LAST_STEP = 1e-6
SHRINK = 0.25
MAX_MOVE = 1.0
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
                          upper: FloatArray | None = None,
                          max_iterations: int = DEFAULT_MAX_ITERATIONS, first_step: float = FIRST_STEP,
                          last_step: float = LAST_STEP, tolerance: float = TOLERANCE,
                          loss_floor: float = LOSS_FLOOR,
                          progress: Callable[[int, float, FloatArray], None] | None = None) -> FitResult:
    """Minimise ``sum(fun(x)**2)`` over ``0 <= x <= upper`` (``x`` in units
    in which a move of 1 changes the residuals by their own size) by
    implicit filtering in its Gauss-Newton form (Kelley, "Implicit
    Filtering", SIAM 2011).

    Why not a textbook local fit with fine differences: a replayed latency
    is a staircase in the terms (a request's TTFT jumps by a whole step when
    a term moves its arrival across a step's start), so a difference step
    finer than the stairs reads their edges, not the slope; SciPy's
    trust-region fit with such a Jacobian shrank its region to nothing and
    stopped 20x short of the optimum on real CPU runs. Here the Jacobian is
    the secant over a stencil of ``h`` either side of ``x`` (one-sided at a
    bound), starting at ``first_step`` (a quarter of each latency: the slope
    through many stairs); each iteration takes the bounded Gauss-Newton step
    of that Jacobian (at most MAX_MOVE a term), halved up to twice until the
    loss drops by ``tolerance`` of itself, else the stencil's best point if
    it is lower; when neither is, the stencil has found no descent at this
    scale and ``h`` shrinks by SHRINK. Done when ``h`` falls under
    ``last_step`` (converged), the loss under ``loss_floor`` (the runs are
    reproduced), or after ``max_iterations`` iterations. Deterministic:
    same ``fun``, same path. The minimum is local to the scale the stencil
    ends at: see docs/calibrate.md for runs that make it the only one.
    """
    # SciPy ships no type stubs (scipy-stubs is a separate package).
    from scipy.optimize import lsq_linear  # type: ignore[import-untyped, unused-ignore]

    x = np.asarray(x0, dtype=float).copy()
    hi = np.full(x.size, np.inf) if upper is None else np.asarray(upper, dtype=float)
    x = np.clip(x, 0.0, hi)
    r = fun(x)
    loss = float(r @ r)
    evaluations = 1
    history: list[tuple[int, float, FloatArray]] = [(0, loss, x.copy())]
    if progress is not None:
        progress(*history[0])
    h = first_step
    jacobian: FloatArray | None = None
    converged = False
    iterations = 0
    restart_loss = math.inf
    while True:
        if loss <= loss_floor:  # reproduced
            converged = True
            break
        if h < last_step:
            # No descent at the finest scale: a local minimum of the
            # staircase. Restart from the coarsest scale, which may see past
            # it; done when a whole pass gained nothing.
            if loss >= restart_loss - tolerance * restart_loss:
                converged = True
                break
            restart_loss, h = loss, first_step
        if iterations >= max_iterations:
            break
        iterations += 1
        # The stencil: x moved by h along each term, inside the bounds.
        jac = np.zeros((r.size, x.size))
        best_x, best_r, best_loss = x, r, loss
        for j in range(x.size):
            up, down = min(x[j] + h, hi[j]), max(x[j] - h, 0.0)
            ends = []
            for v in (up, down):
                if v == x[j]:
                    ends.append(r)
                    continue
                y = x.copy()
                y[j] = v
                ry = fun(y)
                evaluations += 1
                ends.append(ry)
                ly = float(ry @ ry)
                if ly < best_loss:
                    best_x, best_r, best_loss = y, ry, ly
            if up > down:
                jac[:, j] = (ends[0] - ends[1]) / (up - down)
        jacobian = jac
        # The Gauss-Newton step of the secant model, inside the bounds and
        # at most MAX_MOVE a term; halved while it does not lower the loss.
        lower_move = np.maximum(-x, -MAX_MOVE)
        upper_move = np.minimum(hi - x, MAX_MOVE)
        moved = False
        if np.any(jac):
            step = np.asarray(lsq_linear(jac, -r, bounds=(lower_move, upper_move + 1e-300)).x, dtype=float)
            step = np.clip(step, lower_move, upper_move)
            for _ in range(3):
                y = np.clip(x + step, 0.0, hi)
                if np.array_equal(y, x):
                    break
                ry = fun(y)
                evaluations += 1
                ly = float(ry @ ry)
                if ly < loss - tolerance * loss:
                    if float(np.max(np.abs(y - x))) < h:
                        # The minimum is nearer than the stencil reaches:
                        # a closer one reads the slope there better.
                        h = max(h * SHRINK, last_step)
                    x, r, loss, moved = y, ry, ly, True
                    break
                step = step / 2
        if not moved and best_loss < loss - tolerance * loss:
            x, r, loss, moved = best_x, best_r, best_loss, True
        if not moved:
            h *= SHRINK  # no descent at this scale: look closer
        history.append((iterations, loss, x.copy()))
        if progress is not None:
            progress(*history[-1])
    return FitResult(x, loss, iterations, evaluations, converged, jacobian, history)


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
        units = latency_units(self.runs, deployment.model.num_layers)
        self.scales = np.array([units[n] for n in self.fitted])
        self.out = out or (lambda line: None)
        self.groups = [LossGroups.of(run, groups) for run in self.runs]

    def terms_at(self, x: FloatArray) -> HostTerms:
        # min: x at its bound times the unit may round a hair past MAX_TERM_S.
        return with_terms(self.start, {n: min(v, MAX_TERM_S) for n, v in zip(self.fitted, x * self.scales)})

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
        # No term lasts a second (HostTerms' own bound).
        fit = bounded_least_squares(fun, x0, upper=MAX_TERM_S / self.scales, max_iterations=max_iterations,
                                    progress=progress)
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
