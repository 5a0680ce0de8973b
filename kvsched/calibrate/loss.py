"""The relative errors of a replay against the run it replays, and the
fit's loss over them.

The loss (:func:`loss_residuals`) is a sum over runs of the mean squared
relative error of the mean TTFT of each group of requests of similar prompt
length, and of the mean TPOT (time per output token after the first: the
request's mean ITL, from its first and last token times, so streamed chunks
of several tokens do not matter) of each group of similar output length;
every run and metric weighs the same, and a file without per-request times
contributes the relative errors of its two means. Groups, not single
requests: a replayed request's TTFT jumps by a whole step when a term moves
its arrival across a step's start, so a per-request loss is a staircase
(measured: Gauss-Newton stalls on it, terms up to 2x off) while a group's
mean moves smoothly. The per-request errors (:func:`run_errors`) are still
what the report prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvsched.calibrate.resimulate import SimulatedLatencies
from kvsched.calibrate.run_files import ObservedRun

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Requests are grouped by length in the loss (see loss_residuals): this many
# groups per run and metric at most, of MIN_GROUP requests at least.
DEFAULT_GROUPS = 8
MIN_GROUP = 20


@dataclass(frozen=True, slots=True)
class RunErrors:
    """Relative errors (simulated / measured - 1) of one run: per request, or
    the run's mean alone when the file has no per-request times."""

    source: str
    ttft: FloatArray
    tpot: FloatArray

    @staticmethod
    def summary(errors: FloatArray) -> tuple[float, float, float]:
        """(median |err|, mean |err|, mean err); NaN when there is none."""
        if not errors.size:
            return math.nan, math.nan, math.nan
        a = np.abs(errors)
        return float(np.median(a)), float(np.mean(a)), float(np.mean(errors))


def run_errors(run: ObservedRun, sim: SimulatedLatencies) -> RunErrors:
    if run.ttfts is not None:
        ttft = sim.ttfts / np.asarray(run.ttfts) - 1.0
    else:
        assert run.mean_ttft_s is not None
        ttft = np.array([float(np.mean(sim.ttfts)) / run.mean_ttft_s - 1.0])
    if run.tpots is not None:
        observed = np.array([math.nan if t is None else t for t in run.tpots])
        keep = ~np.isnan(observed) & (observed > 0)
        tpot = sim.tpots[keep] / observed[keep] - 1.0
    else:
        assert run.mean_tpot_s is not None
        # vLLM's mean TPOT is over requests with more than one output token.
        values = sim.tpots[~np.isnan(sim.tpots)]
        tpot = np.array([float(np.mean(values)) / run.mean_tpot_s - 1.0]) if values.size else np.array([])
    return RunErrors(run.source, ttft, tpot)


def length_groups(lengths: Sequence[int], mask: npt.NDArray[np.bool_], groups: int) -> list[IntArray]:
    """The requests ``mask`` selects, sorted by ``lengths`` (stable) and cut
    into ``groups`` runs of nearly equal size, at least MIN_GROUP each."""
    idx = np.flatnonzero(mask)
    k = max(1, min(groups, idx.size // MIN_GROUP))
    order = idx[np.argsort(np.asarray(lengths, dtype=np.int64)[idx], kind="stable")]
    return [g for g in np.array_split(order, k) if g.size]


@dataclass(frozen=True, slots=True)
class LossGroups:
    """How one run's requests are grouped in the loss: TTFT by prompt length,
    TPOT by output length (empty lists: the file has the run's means only)."""

    ttft: list[IntArray]
    tpot: list[IntArray]
    observed_tpots: FloatArray  # NaN where a request has no TPOT

    @staticmethod
    def of(run: ObservedRun, groups: int) -> LossGroups:
        n = len(run.input_lens)
        tpots = np.full(n, np.nan) if run.tpots is None else \
            np.array([math.nan if t is None else t for t in run.tpots])
        ttft = length_groups(run.input_lens, np.ones(n, dtype=bool), groups) if run.ttfts is not None else []
        valid = ~np.isnan(tpots)
        valid[valid] = tpots[valid] > 0
        tpot = length_groups(run.output_lens, valid, groups) if run.tpots is not None else []
        return LossGroups(ttft, tpot, tpots)


def loss_residuals(run: ObservedRun, sim: SimulatedLatencies, groups: LossGroups) -> FloatArray:
    """One run's part of the loss: the relative error of the mean TTFT of each
    group of requests of similar prompt length, and of the mean TPOT of each
    group of similar output length (or of the run's means), each metric's
    errors over the square root of their count so that every run and metric
    weighs the same."""
    parts: list[FloatArray] = []
    if run.ttfts is not None:
        observed = np.asarray(run.ttfts)
        ttft = np.array([sim.ttfts[g].mean() / observed[g].mean() - 1.0 for g in groups.ttft])
    else:
        assert run.mean_ttft_s is not None
        ttft = np.array([float(np.mean(sim.ttfts)) / run.mean_ttft_s - 1.0])
    parts.append(ttft / math.sqrt(ttft.size))
    if run.tpots is not None:
        o = groups.observed_tpots
        tpot = np.array([sim.tpots[g].mean() / o[g].mean() - 1.0 for g in groups.tpot])
    else:
        assert run.mean_tpot_s is not None
        # vLLM's mean TPOT is over requests with more than one output token.
        values = sim.tpots[~np.isnan(sim.tpots)]
        tpot = np.array([float(np.mean(values)) / run.mean_tpot_s - 1.0]) if values.size else np.zeros(0)
    if tpot.size:
        parts.append(tpot / math.sqrt(tpot.size))
    return np.concatenate(parts)
