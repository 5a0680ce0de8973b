"""Fitting host terms to runs: the optimiser over the loss
(:mod:`kvsched.calibrate.loss`) and :class:`Calibrator`, which replays the
runs at each candidate and reports the errors before and after.

Each evaluation is one deterministic simulation per run, so the minimiser is
a deterministic bounded Levenberg-Marquardt (:func:`levenberg_marquardt`,
central differences): the terms enter the latencies nearly linearly, and a
term never goes below 0.
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
from kvsched.calibrate.terms import TERM_SCALES, format_term, with_terms
from kvsched.perf.host import HostTerms
from kvsched.sim.deployment import Deployment
from kvsched.sim.spec import InstanceGroup

FloatArray = npt.NDArray[np.float64]

DEFAULT_MAX_ITERATIONS = 20



@dataclass(slots=True)
class FitResult:
    x: FloatArray
    loss: float
    iterations: int
    evaluations: int
    converged: bool
    jacobian: FloatArray | None = None
    history: list[tuple[int, float, FloatArray]] = field(default_factory=list)


def levenberg_marquardt(fun: Callable[[FloatArray], FloatArray], x0: FloatArray, *,
                        max_iterations: int = DEFAULT_MAX_ITERATIONS, rel_step: float = 0.1,
                        min_step: float = 0.5, refinements: int = 3, tries: int = 6,
                        tolerance: float = 1e-4, loss_floor: float = 1e-14, central: bool = True,
                        progress: Callable[[int, float, FloatArray], None] | None = None) -> FitResult:
    """Minimise ``sum(fun(x)**2)`` over ``x >= 0`` (``x`` in units of order 1).

    Levenberg-Marquardt with Marquardt's diagonal scaling; each damped step
    is the exact minimiser of the linearised loss within the bound ``x >=
    0`` (:func:`bounded_step`). The Jacobian is taken by central (or, with
    ``central=False``, forward) differences of ``max(rel_step * |x|,
    min_step)``, coarse on purpose: a simulated latency moves in small jumps
    (a request reaches the engine just before a step begins, or just after)
    and a coarse difference reads the slope through them; central ones
    cancel more of them (measured on synthetic runs from a far start:
    forward differences reached the truth on 1 of 5 run sets, central ones
    on 3). When the linearisation stops predicting the loss (an accepted
    step gains less than a quarter of what it promised, or no step in
    ``tries`` lowers it), the differences are made 4 times finer, at most
    ``refinements`` times: near the minimum fewer jumps lie in between, and
    a finer slope goes further. Done when no step lowers the loss at the
    finest differences, a step gains less than ``tolerance`` (relative), or
    the loss falls under ``loss_floor``. Deterministic: same ``fun``, same
    path. The minimum is local: see docs/calibrate.md for runs that make it
    the only one.
    """
    x = np.maximum(np.asarray(x0, dtype=float), 0.0)
    r = fun(x)
    loss = float(r @ r)
    evaluations = 1
    lam = 1e-3
    result = FitResult(x, loss, 0, evaluations, False)
    if progress is not None:
        progress(0, loss, x)
    result.history.append((0, loss, x.copy()))
    refined = 0
    for iteration in range(1, max_iterations + 1):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            h = max(rel_step * abs(x[j]), min_step)
            xh = x.copy()
            xh[j] += h
            if central:
                xl = x.copy()
                xl[j] = max(0.0, x[j] - h)
                jac[:, j] = (fun(xh) - fun(xl)) / (xh[j] - xl[j])
                evaluations += 2
            else:
                jac[:, j] = (fun(xh) - r) / h
                evaluations += 1
        result.jacobian = jac
        grad = jac.T @ r
        normal = jac.T @ jac
        diag = np.diag(normal).copy()
        # A term that moves nothing (e.g. no step it applies to) stays put.
        movable = diag > 1e-12 * max(float(diag.max()), 1e-300)
        gain = promised = 0.0
        improved = False
        for _ in range(tries):
            step = bounded_step(normal, grad, diag * lam, x, movable)
            candidate = np.maximum(x + step, 0.0)
            if not np.any(candidate != x):
                break
            r_new = fun(candidate)
            evaluations += 1
            loss_new = float(r_new @ r_new)
            if loss_new < loss:
                predicted = r + jac @ (candidate - x)
                promised = loss - float(predicted @ predicted)
                gain = loss - loss_new
                x, r, loss = candidate, r_new, loss_new
                lam = max(lam / 3.0, 1e-9)
                improved = True
                break
            lam *= 10.0
        result.x, result.loss, result.iterations, result.evaluations = x, loss, iteration, evaluations
        if progress is not None:
            progress(iteration, loss, x)
        result.history.append((iteration, loss, x.copy()))
        if loss <= loss_floor:
            result.converged = True  # the runs are reproduced to ~1e-7
            break
        if improved and gain >= 0.25 * promised:
            if gain < tolerance * (loss + gain):
                result.converged = True
                break
            continue
        if refined >= refinements:
            # No step lowers the loss, or the slope no longer predicts it,
            # at the finest differences: a (local) minimum.
            result.converged = not improved or gain < tolerance * (loss + gain)
            if result.converged:
                break
            continue
        refined += 1
        rel_step /= 4.0
        min_step /= 4.0
    return result


def bounded_step(normal: FloatArray, grad: FloatArray, damping: FloatArray, x: FloatArray,
                 movable: npt.NDArray[np.bool_]) -> FloatArray:
    """The step ``d`` minimising ``d.(normal + diag(damping)).d / 2 +
    grad.d`` subject to ``x + d >= 0`` (``d = 0`` where not ``movable``).
    The problem is strictly convex, so its minimiser is the best of the
    unconstrained minimisers over every choice of bound-held variables that
    respects the bound: at most 2**6 small solves for kvsched's six terms."""
    idx = np.flatnonzero(movable)
    best = np.zeros_like(x)
    best_value = math.inf
    m = normal[np.ix_(idx, idx)] + np.diag(np.maximum(damping[idx], 1e-12))
    g = grad[idx]
    lower = -x[idx]
    k = idx.size
    for mask in range(1 << k):
        held = np.array([bool(mask >> i & 1) for i in range(k)], dtype=bool)
        d = np.where(held, lower, 0.0)
        free = ~held
        if free.any():
            rhs = -(g[free] + m[np.ix_(free, held)] @ d[held])
            d[free] = np.linalg.solve(m[np.ix_(free, free)], rhs)
            if np.any(d[free] < lower[free] - 1e-12):
                continue
        value = 0.5 * float(d @ m @ d) + float(g @ d)
        if value < best_value:
            best_value = value
            best[:] = 0.0
            best[idx] = d
    return best


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
            raise ValueError("no runs to fit on: give --bench FILE.json or --requests FILE.jsonl")
        if not fitted:
            raise ValueError("no terms to fit (--fit)")
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
        fit = levenberg_marquardt(fun, x0, max_iterations=max_iterations, progress=progress)
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
