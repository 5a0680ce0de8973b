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
from kvsched.calibrate.resimulate import Replayer
from kvsched.calibrate.run_files import ObservedRun
from kvsched.calibrate.terms import TERM_SCALES, latency_units, with_terms
from kvsched.errors import UserInputError
from kvsched.perf.host import MAX_TERM_S, HostTerms, format_term
from kvsched.sim.deployment import Deployment
from kvsched.sim.spec import InstanceGroup

FloatArray = npt.NDArray[np.float64]

DEFAULT_MAX_ITERATIONS = 40
# The optimiser's settings (see bounded_least_squares), in the terms' latency
# units (terms.latency_units): the first and last difference steps, how a
# step shrinks, the largest move of one iteration, the relative loss drop an
# iteration must make, and the loss under which the runs count as
# reproduced; DIFF_STEP: trust_region_fit's relative difference step.
FIRST_STEP = 0.25
LAST_STEP = 1e-6
SHRINK = 0.25
MAX_MOVE = 1.0
TOLERANCE = 1e-4
LOSS_FLOOR = 1e-14
DIFF_STEP = 0.1


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
    through many stairs). Each iteration takes the bounded Gauss-Newton step
    of that Jacobian (at most MAX_MOVE a term), halved up to twice until the
    loss drops by ``tolerance`` of itself; ``h`` shrinks by SHRINK when the
    step lands nearer than ``h`` (a closer stencil reads the slope there
    better) or fails (the secant model does not predict at this scale; the
    stencil's best point is taken if it is lower). When ``h`` falls under
    ``last_step`` the search restarts at ``first_step``, and is done
    (converged) when a whole pass gained nothing; also done when the loss is
    under ``loss_floor`` (the runs are reproduced) or after
    ``max_iterations`` iterations. Deterministic: same ``fun``, same path.
    The minimum is local: see docs/calibrate.md for runs that make it the
    only one.
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
            # (lsq_linear wants lower < upper: a term at 0 whose bound is 0.)
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
        if not moved:
            # The secant model does not predict at this scale: look closer,
            # from the stencil's best point if it is lower.
            h *= SHRINK
            if best_loss < loss - tolerance * loss:
                x, r, loss = best_x, best_r, best_loss
        history.append((iterations, loss, x.copy()))
        if progress is not None:
            progress(*history[-1])
    return FitResult(x, loss, iterations, evaluations, converged, jacobian, history)


def trust_region_fit(fun: Callable[[FloatArray], FloatArray], x0: FloatArray, *,
                     max_iterations: int = DEFAULT_MAX_ITERATIONS, diff_step: float = DIFF_STEP,
                     tolerance: float = TOLERANCE, loss_floor: float = LOSS_FLOOR,
                     progress: Callable[[int, float, FloatArray], None] | None = None) -> FitResult:
    """Minimise ``sum(fun(x)**2)`` over ``x >= 0`` (``x`` in units of order
    1) with SciPy's trust-region reflective least squares.

    The Jacobian is taken by central differences of ``diff_step * max(1,
    |x|)``: coarse next to a GPU's stairs in typical-size units, too fine
    for a CPU's 50 ms steps (see bounded_least_squares), so calibrate runs
    it beside implicit filtering and keeps the lower loss; it settles closer
    where the latencies are smooth near the optimum. Done when a
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
        units = latency_units(self.runs, deployment.model.num_layers)
        self.scales = np.array([units[n] for n in self.fitted])
        self.out = out or (lambda line: None)
        self.groups = [LossGroups.of(run, groups) for run in self.runs]
        # The loss each of the two fits reached (Calibrator.fit).
        self.fit_losses: dict[str, float] = {}

    def terms_at(self, x: FloatArray) -> HostTerms:
        # min: x at its bound times the unit may round a hair past MAX_TERM_S.
        return with_terms(self.start, {n: min(v, MAX_TERM_S) for n, v in zip(self.fitted, x * self.scales)})

    def errors(self, runs: Sequence[ObservedRun], terms: HostTerms) -> list[RunErrors]:
        return [run_errors(run, self.replayer.simulate(run, terms)) for run in runs]

    def fit(self, fun: Callable[[FloatArray], FloatArray], x0: FloatArray, max_iterations: int,
            progress: Callable[[int, float, FloatArray], None]) -> FitResult:
        """Two fits from ``x0`` (in latency units), the lower loss kept:
        implicit filtering (bounded_least_squares), whose coarse secants read
        the slope through a replay's stairs from however far off, and SciPy's
        trust-region fit with fine differences in each term's typical size
        (trust_region_fit), which settles closer on runs whose latencies are
        smooth near the optimum (skipped when the first reproduces the runs).
        Measured: neither alone reaches the other's loss on every run set
        (docs/calibrate.md)."""
        # No term lasts a second (HostTerms' own bound).
        upper = MAX_TERM_S / self.scales
        self.out("  implicit filtering, in units of the runs' latencies:")
        filtering = bounded_least_squares(fun, x0, upper=upper, max_iterations=max_iterations,
                                          progress=progress)
        self.fit_losses = {"implicit filtering": filtering.loss}
        if filtering.loss <= LOSS_FLOOR:
            return filtering  # the runs are reproduced: nothing for the other fit to gain
        # The trust-region fit's unit of each term: its typical size.
        typical = np.array([TERM_SCALES[n] for n in self.fitted]) / self.scales

        def fun_typical(z: FloatArray) -> FloatArray:
            return fun(np.minimum(z * typical, upper))

        def progress_typical(iteration: int, loss: float, z: FloatArray) -> None:
            progress(iteration, loss, np.minimum(z * typical, upper))

        self.out("  trust region, in typical sizes:")
        region = trust_region_fit(fun_typical, x0 / typical, max_iterations=max_iterations,
                                  progress=progress_typical)
        region.x = np.minimum(region.x * typical, upper)
        if region.jacobian is not None:
            region.jacobian = region.jacobian / typical
        self.fit_losses["trust region"] = region.loss
        return filtering if filtering.loss <= region.loss else region

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
        fit = self.fit(fun, x0, max_iterations, progress)
        terms = self.terms_at(fit.x)
        calibration = Calibration(
            self.start, terms, self.fitted, fit, fit_before, self.errors(self.runs, terms), held_before,
            self.errors(self.held_out, terms), self.replayer.simulations, time.perf_counter() - t0)
        losses = ", ".join(f"{k} {v:.4g}" for k, v in self.fit_losses.items())
        calibration.notes.append(f"loss reached: {losses}; the lower kept")
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
