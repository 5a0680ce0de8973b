"""The multiset of float samples that ITLs and token times are pooled in.

:class:`SampleAccumulator` is fed on every simulated step (a decode step
where B requests each get a token adds one ``(gap, B)`` pair), so it is part
of the compiled hot path (``setup.py``); the statistics read once at the end
use numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvsched.errors import UserInputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Pairs kept in lists before they move into numpy arrays: 16 bytes a pair.
FLUSH_AT = 1 << 16


class SampleAccumulator:
    """A multiset of float samples added as ``(value, count)`` pairs.

    Built for ITLs (``add(gap, count)``: ``count`` tokens that each came
    ``gap`` seconds after their request's previous one) and for token emission
    times (``add(time, tokens)``). Adding is two list appends; pairs are moved
    into numpy arrays every ``flush_at`` pairs, so memory is 16 bytes a pair
    however many samples they stand for. :meth:`percentile` and :meth:`median`
    equal ``np.percentile`` / ``np.median`` of :meth:`to_array` exactly;
    :meth:`mean` and :meth:`std` equal numpy's up to summation rounding.
    """

    __slots__ = ("_values", "_counts", "_chunks", "_n", "_sorted", "_distinct", "_flush_at")

    def __init__(self, flush_at: int = FLUSH_AT) -> None:
        if flush_at < 1:
            raise UserInputError(f"SampleAccumulator flush_at={flush_at!r} must be >= 1")
        self._flush_at = flush_at
        self._values: list[float] = []
        self._counts: list[int] = []
        self._chunks: list[tuple[FloatArray, IntArray]] = []
        self._n = 0
        # (ascending values, cumulative counts), cached until the next add.
        self._sorted: tuple[FloatArray, IntArray] | None = None
        # (distinct values, their total counts as floats), derived from _sorted.
        self._distinct: tuple[FloatArray, FloatArray] | None = None

    def add(self, value: float, count: int = 1) -> None:
        """Add ``count`` samples equal to ``value`` (a count of 0 adds nothing)."""
        if not 0.0 <= value < math.inf:
            raise UserInputError(f"sample value={value!r} must be a finite number >= 0")
        if count <= 0:
            if count == 0:
                return
            raise UserInputError(f"sample count={count!r} must be >= 0")
        self._values.append(value)
        self._counts.append(count)
        self._n += count
        self._sorted = None
        self._distinct = None
        if len(self._values) >= self._flush_at:
            self._flush()

    def add_repeated(self, values: Sequence[float], count: int) -> None:
        """Add each of ``values`` ``count`` times: one step-time gap per step of
        a decode stretch, each for ``count`` requests. Plain list work, no
        numpy, so it stays cheap for the short stretches a simulation makes."""
        if not values:
            return
        if count < 1:
            raise UserInputError(f"sample count={count!r} must be >= 1")
        low, high = min(values), max(values)
        if low < 0.0 or high >= math.inf:
            raise UserInputError(f"sample value={low if low < 0 else high!r} must be a finite number >= 0")
        self._values.extend(values)
        self._counts.extend([count] * len(values))
        self._n += count * len(values)
        self._sorted = None
        self._distinct = None
        if len(self._values) >= self._flush_at:
            self._flush()

    def merge(self, other: SampleAccumulator) -> None:
        """Add every sample of ``other`` (e.g. another data-parallel rank's)."""
        values, counts = other._pairs()
        if len(values):
            self.add_array(values, counts)

    def without(self, other: SampleAccumulator) -> SampleAccumulator:
        """The samples of this multiset less those of ``other``, each removed
        once per time it is in ``other`` (e.g. the ITLs of requests that
        timed out, which vllm bench serve leaves out); this one itself when
        ``other`` is empty. Every sample of ``other`` must be here."""
        if not other._n:
            return self
        values, counts = self._pairs()
        gone, gone_counts = other._pairs()
        distinct, at = np.unique(np.concatenate([values, gone]), return_inverse=True)
        totals = np.zeros(len(distinct), dtype=np.int64)
        np.add.at(totals, at, np.concatenate([counts, -gone_counts]))
        if np.any(totals < 0):
            raise ValueError(f"without: removes {int(-totals[totals < 0].sum())} samples that are not here")
        out = SampleAccumulator(self._flush_at)
        kept = totals > 0
        out.add_array(distinct[kept], totals[kept])
        return out

    def add_array(self, values: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> None:
        """Add many samples at once: ``values[i]`` ``counts[i]`` times (once each
        without ``counts``), e.g. one request's ITL array."""
        v = np.array(values, dtype=np.float64).reshape(-1)
        c = np.ones(len(v), dtype=np.int64) if counts is None else np.array(counts).reshape(-1)
        if len(c) != len(v):
            raise UserInputError(f"add_array: {len(v)} values but {len(c)} counts")
        if c.dtype.kind not in "iu":
            raise UserInputError(f"add_array: counts must be integers, got dtype {c.dtype}")
        if not np.all((v >= 0.0) & np.isfinite(v)):
            bad = v[~((v >= 0.0) & np.isfinite(v))][0]
            raise UserInputError(f"add_array: sample value={bad!r} must be a finite number >= 0")
        if np.any(c < 0):
            raise UserInputError(f"add_array: sample count={c[c < 0][0]!r} must be >= 0")
        if len(v):
            self._flush()
            self._chunks.append((v, c.astype(np.int64)))
            self._n += int(c.sum())
            self._sorted = None
            self._distinct = None

    def __len__(self) -> int:
        return self._n

    def _flush(self) -> None:
        if self._values:
            self._chunks.append((np.array(self._values, dtype=np.float64),
                                 np.array(self._counts, dtype=np.int64)))
            self._values.clear()
            self._counts.clear()

    def _pairs(self) -> tuple[FloatArray, IntArray]:
        self._flush()
        if not self._chunks:
            return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
        if len(self._chunks) > 1:
            # Merge so later calls do not concatenate again.
            self._chunks = [(np.concatenate([v for v, _ in self._chunks]),
                             np.concatenate([c for _, c in self._chunks]))]
        return self._chunks[0]

    def to_array(self) -> FloatArray:
        """Every sample, each value repeated ``count`` times, in the order added."""
        values, counts = self._pairs()
        return np.repeat(values, counts)

    def _order_stats(self) -> tuple[FloatArray, IntArray]:
        if self._sorted is None:
            values, counts = self._pairs()
            order = np.argsort(values, kind="stable")
            self._sorted = (values[order], np.cumsum(counts[order]))
        return self._sorted

    def _kth(self, k: int) -> float:
        """The k-th smallest sample (0-based), as ``np.sort(to_array())[k]``."""
        values, cumulative = self._order_stats()
        return float(values[int(np.searchsorted(cumulative, k, side="right"))])

    def _require_samples(self, what: str) -> None:
        if self._n == 0:
            raise UserInputError(f"{what} of no samples; add samples first")

    def percentile(self, q: float) -> float:
        """``np.percentile(self.to_array(), q)`` (linear), bit for bit."""
        self._require_samples("percentile")
        if not 0 <= q <= 100:
            raise UserInputError(f"percentile q={q!r} must be in [0, 100]")
        n = self._n
        # numpy: virtual index (n-1)*(q/100), neighbours floor and floor+1,
        # and _lerp, which interpolates from the nearer neighbour.
        index = (n - 1) * (q / 100)
        if index >= n - 1:
            return self._kth(n - 1)
        below = math.floor(index)
        gamma = index - below
        a, b = self._kth(below), self._kth(below + 1)
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma

    def median(self) -> float:
        """``np.median(self.to_array())``, bit for bit (the mean of the two
        middle samples when there is an even number)."""
        self._require_samples("median")
        half = self._n // 2
        if self._n % 2:
            return self._kth(half)
        return (self._kth(half - 1) + self._kth(half)) / 2

    def mean(self) -> float:
        """Exactly rounded (math.fsum), so it depends only on the samples, not
        on the order or grouping of the adds."""
        self._require_samples("mean")
        values, counts = self._order_stats_pairs()
        return math.fsum((values * counts).tolist()) / self._n

    def std(self) -> float:
        """Population standard deviation (numpy's default ``ddof=0``), summed
        exactly like :meth:`mean`."""
        self._require_samples("std")
        values, counts = self._order_stats_pairs()
        deviation = values - self.mean()
        return math.sqrt(math.fsum((deviation * deviation * counts).tolist()) / self._n)

    def _order_stats_pairs(self) -> tuple[FloatArray, FloatArray]:
        """Distinct sample values, ascending, with their total counts (as
        floats), read off the sorted samples (one sort for every statistic)."""
        if self._distinct is None:
            values, cumulative = self._order_stats()
            last = np.flatnonzero(np.append(values[1:] != values[:-1], True))
            totals = np.diff(cumulative[last], prepend=0).astype(np.float64)
            self._distinct = (values[last], totals)
        return self._distinct
