"""Charts for kvsched's HTML pages, drawn as inline SVG.

:func:`svg_chart` draws one line/area chart (frame, grid, ticks, labels,
legend); :func:`latency_charts` and :func:`time_charts` turn
:class:`~kvsched.sim.simulator.SimResult` objects into the report's latency
CDFs and time series. No script, font or image is fetched: the page that
embeds them opens offline.

Data is reduced before it is drawn, with numpy, so a one-hour run of ~10^6
steps renders in about a second: a CDF has at most :data:`MAX_CDF_POINTS`
points (ITLs are read from the accumulator's sorted ``(value, cumulative
count)`` pairs, never expanded), a time series at most
:data:`MAX_TIME_BUCKETS` buckets.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.sim.metrics import e2el, tpot, ttft
from kvsched.sim.samples import SampleAccumulator
from kvsched.sim.simulator import SimResult

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAX_CDF_POINTS = 500
MAX_TIME_BUCKETS = 600
# A time bucket spans at least this many mean step durations, so short runs do
# not alternate between buckets with a step and buckets without.
MIN_STEPS_PER_BUCKET = 4
# A latency CDF gets a log x axis when, on a linear one, 90% of the samples of
# every result would sit left of 1/LOG_X_SQUEEZE of the width (a long tail).
LOG_X_SQUEEZE = 8.0

# Colours for results, in order (Tableau 10, reordered so neighbours differ most).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2",
           "#9c755f", "#ff9da7", "#b6992d", "#79706e")
# Colours for two quantities of a single result.
PREFILL_COLOR = "#f28e2b"
DECODE_COLOR = "#4e79a7"
RUNNING_COLOR = "#4e79a7"
WAITING_COLOR = "#e15759"
# Line styles for two quantities when colour stands for the result.
DASHED = "6 4"
MUTED_COLOR = "#6b7280"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)



# -- axis numbers -------------------------------------------------------------

def _compact(v: float) -> str:
    """A short axis label: 1.5M, 20k, 0.25."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:,g}"


def _decimals(step: float) -> int:
    for d in range(7):
        if abs(round(step, d) - step) <= 1e-9 * step:
            return d
    return 6


def _tick_label(v: float, step: float) -> str:
    if abs(v) >= 1e4:
        return _compact(v)
    return f"{v:,.{_decimals(step)}f}"


def _nice(raw: float, mantissas: Sequence[float] = (1.0, 2.0, 2.5, 5.0, 10.0)) -> float:
    """The smallest m * 10^k >= raw with m among ``mantissas``."""
    if not raw > 0 or not math.isfinite(raw):
        return 1.0
    base = 10.0 ** math.floor(math.log10(raw))
    for m in mantissas:
        if raw <= m * base * (1 + 1e-9):
            return m * base
    return 10.0 * base


def _linear_ticks(lo: float, hi: float, target: int = 6) -> tuple[list[float], float]:
    step = _nice((hi - lo) / target)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * step:
        ticks.append(k * step)
        k += 1
    return ticks, step


def _linear_range(lo: float, hi: float, target: int, round_up: bool) -> tuple[float, list[float], float]:
    """(upper bound, ticks, tick step); ``round_up`` moves the bound up to a tick."""
    ticks, step = _linear_ticks(lo, hi, target)
    if round_up and ticks[-1] < hi * (1 - 1e-9):
        hi = math.ceil(hi / step - 1e-9) * step
        ticks, step = _linear_ticks(lo, hi, target)
        ticks = [t for t in ticks if t <= hi * (1 + 1e-9)]
    return hi, ticks, step


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1.0, 2.0, 5.0):
            v = m * 10.0 ** e
            if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                ticks.append(v)
    if len(ticks) > 10:
        ticks = [v for v in ticks if f"{v:e}".startswith("1")]
    return ticks


def _log_bounds(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` widened to the 1-2-5 values around it."""
    def down(v: float) -> float:
        base = 10.0 ** math.floor(math.log10(v))
        return max(m * base for m in (1.0, 2.0, 5.0) if m * base <= v * (1 + 1e-9))

    return down(lo), _nice(hi, (1.0, 2.0, 5.0, 10.0))


# -- SVG charts -----------------------------------------------------------------

@dataclass(slots=True)
class Series:
    """One curve through the points ``(x[i], y[i])``. ``base`` (same length as
    ``y``) makes it a band filled between ``base`` and ``y`` (a stacked area)."""

    label: str
    x: FloatArray
    y: FloatArray
    color: str
    dash: str = ""
    base: FloatArray | None = None


@dataclass(slots=True)
class Axis:
    label: str
    lo: float | None = None   # default: 0 (linear) or the smallest value (log)
    hi: float | None = None   # default: the largest value, rounded up to a tick
    log: bool = False
    format: Callable[[float, float], str] | None = None  # (value, tick step) -> label


@dataclass(slots=True)
class LegendEntry:
    label: str
    color: str
    dash: str = ""
    area: bool = False


def text_width(text: str, size: float = 12.0) -> float:
    """A generous estimate of rendered text width (no font metrics here)."""
    wide = sum(1 for ch in text if ch in "mwMW@%&=<>_#")
    return size * (0.62 * (len(text) - wide) + 0.85 * wide)


def _points(px: FloatArray, py: FloatArray) -> str:
    return " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px.tolist(), py.tolist()))


def _legend_svg(entries: Sequence[LegendEntry], left: float, top: float, width: float
                ) -> tuple[str, float]:
    """The legend as rows of entries; returns (svg, height used)."""
    if not entries:
        return "", 0.0
    row_h = 18.0
    x, y = left, top
    parts = ['<g class="legend">']
    for e in entries:
        w = 28 + text_width(e.label) + 22
        if x > left and x + w > left + width:
            x, y = left, y + row_h
        if e.area:
            parts.append(f'<rect x="{x:.1f}" y="{y + 3:.1f}" width="22" height="10" rx="2" '
                         f'fill="{esc(e.color)}" fill-opacity="0.75"/>')
        else:
            dash = f' stroke-dasharray="{esc(e.dash)}"' if e.dash else ""
            parts.append(f'<line x1="{x:.1f}" y1="{y + 8:.1f}" x2="{x + 22:.1f}" y2="{y + 8:.1f}" '
                         f'stroke="{esc(e.color)}" stroke-width="2.5"{dash}/>')
        parts.append(f'<text class="legend-label" x="{x + 28:.1f}" y="{y + 12:.1f}">{esc(e.label)}</text>')
        x += w
    parts.append("</g>")
    return "".join(parts), y + row_h - top


def svg_chart(chart_id: str, series: Sequence[Series], x_axis: Axis, y_axis: Axis, *,
              legend: Sequence[LegendEntry] = (), width: int = 1080, height: int = 300,
              description: str = "") -> str:
    """An inline ``<svg>`` line chart: frame, grid, ticks, axis labels, legend
    above the plot, and the series as polylines (or filled bands), clipped to
    the plot area. Empty series are skipped; with no data it says so."""
    series = [s for s in series if len(s.y)]
    legend_svg, legend_h = _legend_svg(legend, 64.0, 8.0, width - 80.0)
    left, right = 64.0, 26.0
    top = 14.0 + legend_h
    bottom = 46.0
    pw, ph = width - left - right, height - top - bottom

    # Ranges.
    xs = [s.x[np.isfinite(s.x)] for s in series]
    ys = [np.concatenate([s.y, s.base]) if s.base is not None else s.y for s in series]
    x_data = np.concatenate(xs) if xs else np.empty(0)
    y_data = np.concatenate(ys) if ys else np.empty(0)
    y_data = y_data[np.isfinite(y_data)]
    if x_axis.log:
        pos = x_data[x_data > 0]
        lo_raw = x_axis.lo if x_axis.lo is not None else (float(pos.min()) if len(pos) else 1.0)
        hi_raw = x_axis.hi if x_axis.hi is not None else (float(pos.max()) if len(pos) else 10.0)
        x_lo, x_hi = _log_bounds(lo_raw, max(hi_raw, lo_raw * 10))
        x_ticks = _log_ticks(x_lo, x_hi)
        x_step = 0.0
    else:
        x_lo = x_axis.lo if x_axis.lo is not None else 0.0
        x_hi_raw = x_axis.hi if x_axis.hi is not None else (float(x_data.max()) if len(x_data) else 1.0)
        if not x_hi_raw > x_lo:
            x_hi_raw = x_lo + 1.0
        x_hi, x_ticks, x_step = _linear_range(x_lo, x_hi_raw, 6, x_axis.hi is None)
    y_lo = y_axis.lo if y_axis.lo is not None else 0.0
    y_hi_raw = y_axis.hi if y_axis.hi is not None else (float(y_data.max()) if len(y_data) else 1.0)
    if not y_hi_raw > y_lo:
        y_hi_raw = y_lo + 1.0
    y_hi, y_ticks, y_step = _linear_range(y_lo, y_hi_raw, 5, y_axis.hi is None)

    def sx(v: FloatArray) -> FloatArray:
        if x_axis.log:
            lv = np.log10(np.maximum(v, x_lo))
            return left + (lv - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * pw
        return left + (v - x_lo) / (x_hi - x_lo) * pw

    def sy(v: FloatArray) -> FloatArray:
        return top + ph - (v - y_lo) / (y_hi - y_lo) * ph

    def fx(v: float) -> str:
        if x_axis.format is not None:
            return x_axis.format(v, x_step)
        return _compact(v) if x_axis.log else _tick_label(v, x_step)

    def fy(v: float) -> str:
        return y_axis.format(v, y_step) if y_axis.format is not None else _tick_label(v, y_step)

    title = f"<title>{esc(description)}</title>" if description else ""
    out = [f'<svg class="chart" data-chart="{esc(chart_id)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{esc(description)}">{title}',
           f'<defs><clipPath id="clip-{esc(chart_id)}"><rect x="{left - 2:.1f}" y="{top - 2:.1f}" '
           f'width="{pw + 4:.1f}" height="{ph + 4:.1f}"/></clipPath></defs>',
           legend_svg]
    # Grid and ticks: each tick inside the plotted range gets a grid line
    # and a label (the ranges' ends widened by a rounding margin).
    y_marks = [(float(sy(np.array([t]))[0]), fy(t)) for t in y_ticks if y_lo <= t <= y_hi * (1 + 1e-9)]
    x_marks = [(float(sx(np.array([t]))[0]), fx(t)) for t in x_ticks
               if x_lo * (1 - 1e-9) <= t <= x_hi * (1 + 1e-9)]
    out.append('<g class="grid">')
    out.extend(f'<line x1="{left:.1f}" y1="{py:.1f}" x2="{left + pw:.1f}" y2="{py:.1f}"/>'
               for py, _ in y_marks)
    out.extend(f'<line x1="{px:.1f}" y1="{top:.1f}" x2="{px:.1f}" y2="{top + ph:.1f}"/>' for px, _ in x_marks)
    out.append("</g>")
    out.append('<g class="ticks">')
    out.extend(f'<text x="{left - 8:.1f}" y="{py + 4:.1f}" text-anchor="end">{esc(label)}</text>'
               for py, label in y_marks)
    out.extend(f'<text x="{px:.1f}" y="{top + ph + 18:.1f}" text-anchor="middle">{esc(label)}</text>'
               for px, label in x_marks)
    out.append("</g>")
    out.append(f'<rect class="frame" x="{left:.1f}" y="{top:.1f}" width="{pw:.1f}" height="{ph:.1f}"/>')
    # Data.
    out.append(f'<g class="data" clip-path="url(#clip-{esc(chart_id)})">')
    for s in series:
        x, y, base = s.x, s.y, s.base
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        dx, dy = sx(x), sy(y)
        label = f"<title>{esc(s.label)}</title>" if s.label else ""
        if base is not None:
            db = sy(base[ok])
            ring = _points(np.concatenate([dx, dx[::-1]]), np.concatenate([dy, db[::-1]]))
            out.append(f'<polygon class="area" points="{ring}" fill="{esc(s.color)}" fill-opacity="0.75" '
                       f'stroke="{esc(s.color)}" stroke-width="1">{label}</polygon>')
        else:
            dash = f' stroke-dasharray="{esc(s.dash)}"' if s.dash else ""
            out.append(f'<polyline class="line" points="{_points(dx, dy)}" fill="none" '
                       f'stroke="{esc(s.color)}" stroke-width="2" stroke-linejoin="round"{dash}>'
                       f'{label}</polyline>')
    out.append("</g>")
    return _close_chart(out, bool(series), left, top, pw, ph, height, x_axis.label, y_axis.label)


def _close_chart(out: list[str], has_data: bool, left: float, top: float, pw: float, ph: float,
                 height: float, x_label: str, y_label: str) -> str:
    """The end every chart shares: "no data" when empty, the axis labels."""
    if not has_data:
        out.append(f'<text class="empty" x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" '
                   f'text-anchor="middle">no data</text>')
    out.append(f'<text class="axis-label" x="{left + pw / 2:.1f}" y="{height - 8:.1f}" '
               f'text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text class="axis-label" transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{esc(y_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


# -- data reduction -------------------------------------------------------------

def cdf_points(values: FloatArray, cumulative: npt.NDArray[Any], max_points: int = MAX_CDF_POINTS
               ) -> tuple[FloatArray, FloatArray, bool]:
    """A CDF from ascending ``values`` with their cumulative counts: ``(x, y,
    step)``. Up to ``max_points // 2`` values it is exact, drawn as a
    staircase; beyond, ``max_points`` points spaced evenly in probability,
    joined by lines."""
    n = len(values)
    if n == 0:
        return np.empty(0), np.empty(0), False
    total = float(cumulative[-1])
    if n <= max_points // 2:
        return (np.asarray(values, dtype=np.float64),
                np.asarray(cumulative, dtype=np.float64) / total, True)
    levels = np.linspace(0.0, total, max_points)[1:]
    idx = np.unique(np.minimum(np.searchsorted(cumulative, levels, side="left"), n - 1))
    x = np.concatenate([values[:1], values[idx]])
    y = np.concatenate([[0.0], cumulative[idx] / total])
    return x.astype(np.float64), y.astype(np.float64), False


def _accumulator_cdf(acc: SampleAccumulator) -> tuple[FloatArray, FloatArray, bool]:
    if len(acc) == 0:
        return np.empty(0), np.empty(0), False
    # Ascending values with cumulative counts, as the accumulator's order
    # statistics use them: no sample is expanded.
    values, cumulative = acc._order_stats()
    return cdf_points(values, cumulative)


def _array_cdf(samples: FloatArray) -> tuple[FloatArray, FloatArray, bool]:
    ordered = np.sort(samples)
    return cdf_points(ordered, np.arange(1, len(ordered) + 1))


@dataclass(slots=True)
class _Latencies:
    ttft: FloatArray  # seconds, one per completed request
    tpot: FloatArray  # requests with more than one output token
    e2el: FloatArray

    @classmethod
    def of(cls, result: SimResult) -> _Latencies:
        recs = result.records
        n = len(recs)
        send = np.fromiter((r.send_time for r in recs), np.float64, n)
        first = np.fromiter((r.first_token_time for r in recs), np.float64, n)
        finish = np.fromiter((r.finish_time for r in recs), np.float64, n)
        out = np.fromiter((r.num_output_tokens for r in recs), np.int64, n)
        first_s, end_s = ttft(send, first), e2el(send, finish)
        multi = out > 1  # has_tpot, for a column
        return cls(first_s, tpot(first_s[multi], end_s[multi], out[multi]), end_s)


@dataclass(slots=True)
class _Timeline:
    """One result's step log reduced to time buckets: bucket i spans
    ``[i * width, (i + 1) * width)``, except the last, which ends with the run
    (so it is 0.5 to 1.5 widths long)."""

    mid: FloatArray          # bucket centres, seconds
    output_rate: FloatArray  # output tokens per second
    decode: FloatArray       # decode tokens per step (mean over the steps starting in the bucket)
    prefill: FloatArray      # prefill tokens per step
    kv_usage: FloatArray     # percent of usable KV blocks in use, time-weighted
    running: FloatArray      # requests running, time-weighted
    waiting: FloatArray      # requests waiting, time-weighted


def _step_arrays(result: SimResult) -> dict[str, FloatArray]:
    s = result.steps
    assert s is not None  # callers check
    # The log's columns are array.array: numpy reads their buffers directly.
    cols = {name: np.asarray(getattr(s, name), dtype=np.float64)
            for name in ("start", "duration", "num_tokens", "prefill_tokens", "free_blocks",
                         "num_running", "num_waiting")}
    cols["end"] = cols["start"] + cols["duration"]
    return cols


def run_end(result: SimResult) -> float:
    return result.totals.end


def bucket_width(results: Sequence[SimResult], max_buckets: int = MAX_TIME_BUCKETS) -> float:
    """A round bucket width (1, 2 or 5 times a power of ten, seconds) giving at
    most ``max_buckets`` buckets over the longest run, and at least
    ``MIN_STEPS_PER_BUCKET`` mean step durations."""
    end = max((run_end(r) for r in results), default=0.0)
    if end <= 0:
        return 1.0
    mean_steps = [r.totals.busy / r.totals.num_steps for r in results if r.totals.num_steps]
    raw = max(end / max_buckets, MIN_STEPS_PER_BUCKET * max(mean_steps, default=0.0))
    width = _nice(raw, (1.0, 2.0, 5.0, 10.0))
    while math.ceil(end / width - 1e-9) > max_buckets:
        width = _nice(width * 1.01, (1.0, 2.0, 5.0, 10.0))
    return width


def _bucket_mean(idx: IntArray, values: FloatArray, weights: FloatArray | None, n: int) -> FloatArray:
    """Mean of ``values`` per bucket (NaN where no step starts)."""
    w = np.ones(len(idx)) if weights is None else weights
    total = np.bincount(idx, weights=values * w, minlength=n)
    norm = np.bincount(idx, weights=w, minlength=n)
    out = np.full(n, np.nan)
    np.divide(total, norm, out=out, where=norm > 0)
    return out


def _fill_gaps(means: FloatArray, edges: FloatArray, start: FloatArray, end: FloatArray,
               values: FloatArray, hold: bool) -> FloatArray:
    """Buckets where no step starts take the value of the step before them:
    while it is still running, or always (``hold``: a state that persists
    until the next step); otherwise 0 (the engine is idle)."""
    empty = np.flatnonzero(np.isnan(means))
    if len(empty):
        left = edges[empty]
        j = np.searchsorted(start, left, side="right") - 1
        jj = np.maximum(j, 0)
        keep = (j >= 0) if hold else (j >= 0) & (end[jj] > left)
        means[empty] = np.where(keep, values[jj], 0.0)
    return means


def _timeline(result: SimResult, width: float) -> _Timeline | None:
    if result.steps is None or not len(result.steps):
        return None  # no step log kept (SimConfig.keep_step_log), or no step
    c = _step_arrays(result)
    stop = run_end(result)
    n = max(1, round(stop / width))
    edges = np.arange(n, dtype=np.float64) * width
    lengths = np.full(n, width)
    lengths[-1] = stop - edges[-1]
    start, end, duration = c["start"], c["end"], c["duration"]
    idx = np.minimum((start / width).astype(np.int64), n - 1)

    def per_bucket(values: FloatArray, weighted: bool, hold: bool) -> FloatArray:
        means = _bucket_mean(idx, values, duration if weighted else None, n)
        return _fill_gaps(means, edges, start, end, values, hold)

    usable = result.num_gpu_blocks - 1
    usage = (100.0 * (1.0 - c["free_blocks"] / usable) if usable > 0
             else np.zeros(len(start)))
    decode = c["num_tokens"] - c["prefill_tokens"]
    times, counts = result.token_times._pairs()
    t_idx = np.clip((times / width).astype(np.int64), 0, n - 1)
    rate = np.bincount(t_idx, weights=counts.astype(np.float64), minlength=n)[:n] / lengths
    return _Timeline(
        mid=edges + lengths / 2, output_rate=rate,
        decode=per_bucket(decode, False, False), prefill=per_bucket(c["prefill_tokens"], False, False),
        kv_usage=per_bucket(usage, True, True),
        running=per_bucket(c["num_running"], True, True), waiting=per_bucket(c["num_waiting"], True, True))


# -- the report's charts ------------------------------------------------------

def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _cdf_chart(chart_id: str, what: str, unit_of: str, labels: Sequence[str],
               cdfs: Sequence[tuple[FloatArray, FloatArray, bool]]) -> str:
    """One latency CDF, one curve per result (values in seconds)."""
    series = []
    lows, highs, p90s = [], [], []
    for i, (label, (x, y, step)) in enumerate(zip(labels, cdfs)):
        if not len(x):
            continue
        ms = x * 1000.0
        if step:  # exact empirical CDF: from 0, each value lifts it to its cumulative share
            ms = np.repeat(ms, 2)
            y = np.concatenate([[0.0], np.repeat(y, 2)[:-1]])
        series.append(Series(label, ms, y, color(i)))
        positive = ms[ms > 0]
        if len(positive):
            lows.append(float(positive.min()))
            highs.append(float(positive.max()))
            p90s.append(float(ms[min(int(np.searchsorted(y, 0.9)), len(ms) - 1)]))
    log = bool(lows) and max(p90s) * LOG_X_SQUEEZE <= max(highs)
    x_axis = Axis(f"{what} (ms{', log scale' if log else ''})", log=log)
    if lows and not log and min(lows) > 0.4 * max(highs):
        # Values far from 0 (TPOT often is): start the axis at a tick below them.
        _, tick = _linear_ticks(min(lows), max(highs))
        x_axis.lo = math.floor(min(lows) / tick) * tick
    legend = [LegendEntry(s.label, s.color) for s in series] if len(labels) > 1 else []
    return svg_chart(chart_id, series, x_axis,
                     Axis(f"share of {unit_of}", lo=0.0, hi=1.0, format=lambda v, _s: f"{v * 100:.0f}%"),
                     legend=legend, width=540, height=300,
                     description=f"Cumulative distribution of {what}")


def _time_axis(end: float) -> Axis:
    return Axis("time (s)", lo=0.0, hi=max(end, 1e-9))


def _result_legend(labels: Sequence[str]) -> list[LegendEntry]:
    return [LegendEntry(label, color(i)) for i, label in enumerate(labels)]


def _time_charts(labels: Sequence[str], lines: Sequence[_Timeline | None], end: float, width: float
                 ) -> list[tuple[str, str, str]]:
    """(title, note, svg) for throughput, batch composition, KV cache usage, queues."""
    multi = len(labels) > 1
    present = [(i, label, t) for i, (label, t) in enumerate(zip(labels, lines)) if t is not None]
    bucket = f"{width:g} s buckets"
    charts = []

    series = [Series(label, t.mid, t.output_rate, color(i)) for i, label, t in present]
    charts.append(("Output throughput", f"output tokens per second ({bucket})", svg_chart(
        "throughput", series, _time_axis(end), Axis("output tokens/s"),
        legend=_result_legend(labels) if multi else [], height=280,
        description="Output tokens per second over time")))

    if multi:
        series = []
        for i, label, t in present:
            series.append(Series(f"{label}: decode", t.mid, t.decode, color(i)))
            series.append(Series(f"{label}: prefill", t.mid, t.prefill, color(i), dash=DASHED))
        legend = [*_result_legend(labels), LegendEntry("decode", MUTED_COLOR),
                  LegendEntry("prefill", MUTED_COLOR, DASHED)]
    else:
        series = []
        for _i, _label, t in present:
            zero = np.zeros(len(t.mid))
            series.append(Series("decode", t.mid, t.decode, DECODE_COLOR, base=zero))
            series.append(Series("prefill", t.mid, t.decode + t.prefill, PREFILL_COLOR, base=t.decode))
        legend = [LegendEntry("decode tokens", DECODE_COLOR, area=True),
                  LegendEntry("prefill tokens", PREFILL_COLOR, area=True)]
    charts.append(("Batch composition", f"scheduled tokens per step, mean over each bucket ({bucket})",
                   svg_chart("batch", series, _time_axis(end), Axis("tokens per step"),
                             legend=legend, height=280,
                             description="Prefill and decode tokens per step over time")))

    series = [Series(label, t.mid, t.kv_usage, color(i)) for i, label, t in present]
    charts.append(("KV cache usage", f"share of usable KV blocks in use, time-weighted ({bucket})",
                   svg_chart("kv-cache", series, _time_axis(end),
                             Axis("KV cache usage", lo=0.0, hi=100.0, format=lambda v, _s: f"{v:.0f}%"),
                             legend=_result_legend(labels) if multi else [], height=260,
                             description="KV cache usage over time")))

    series = []
    for i, label, t in present:
        if multi:
            series.append(Series(f"{label}: running", t.mid, t.running, color(i)))
            series.append(Series(f"{label}: waiting", t.mid, t.waiting, color(i), dash=DASHED))
        else:
            series.append(Series("running", t.mid, t.running, RUNNING_COLOR))
            series.append(Series("waiting", t.mid, t.waiting, WAITING_COLOR))
    if multi:
        legend = [*_result_legend(labels), LegendEntry("running", MUTED_COLOR),
                  LegendEntry("waiting", MUTED_COLOR, DASHED)]
    else:
        legend = [LegendEntry("running", RUNNING_COLOR), LegendEntry("waiting", WAITING_COLOR)]
    charts.append(("Queues", f"requests running and waiting in the scheduler, time-weighted ({bucket})",
                   svg_chart("queues", series, _time_axis(end), Axis("requests"),
                             legend=legend, height=280,
                             description="Running and waiting requests over time")))
    return charts



# (chart id, short name, long name, what the CDF counts): the report's CDFs.
LATENCY_CHARTS = (
    ("cdf-ttft", "TTFT", "Time to first token", "requests"),
    ("cdf-tpot", "TPOT", "Time per output token", "requests"),
    ("cdf-itl", "ITL", "Inter-token latency", "tokens"),
    ("cdf-e2el", "E2E latency", "End-to-end latency", "requests"),
)


def latency_charts(labels: Sequence[str], runs: Sequence[SimResult]) -> list[tuple[str, str, str]]:
    """(long name, short name, svg) for the TTFT, TPOT, ITL and E2E latency
    CDFs, one curve per result."""
    latencies = [_Latencies.of(r) for r in runs]
    cdfs = {
        "cdf-ttft": [_array_cdf(lat.ttft) for lat in latencies],
        "cdf-tpot": [_array_cdf(lat.tpot) for lat in latencies],
        "cdf-itl": [_accumulator_cdf(r.itls) for r in runs],
        "cdf-e2el": [_array_cdf(lat.e2el) for lat in latencies],
    }
    return [(long, short, _cdf_chart(chart_id, short, unit_of, labels, cdfs[chart_id]))
            for chart_id, short, long, unit_of in LATENCY_CHARTS]


def over_time_charts(labels: Sequence[str], runs: Sequence[SimResult]) -> list[tuple[str, str, str]]:
    """(title, note, svg) for output throughput, batch composition, KV cache
    usage and queues over time, on one shared time axis."""
    width = bucket_width(runs)
    end = max(run_end(r) for r in runs)
    return _time_charts(labels, [_timeline(r, width) for r in runs], end, width)


# -- scatter charts -------------------------------------------------------------

@dataclass(slots=True)
class Mark:
    """One point of :func:`scatter_chart`: a filled dot or a cross (``kind``),
    with its hover title; ``css`` classes it (e.g. ``met``/``missed``)."""

    x: float
    y: float
    title: str
    color: str
    kind: str = "dot"  # "dot" or "cross"
    css: str = ""


def _scale(axis: Axis, values: Sequence[float], start: float, span: float, flip: bool
           ) -> tuple[Callable[[float], float], list[float], Callable[[float], str]]:
    """(value -> pixel, ticks, tick label) for one axis of a scatter chart:
    linear from ``axis.lo`` (default 0) with headroom, or log over the 1-2-5
    values around the data."""
    data = [v for v in values if math.isfinite(v) and (v > 0 or not axis.log)]
    if axis.log:
        lo, hi = (min(data), max(data)) if data else (1.0, 10.0)
        lo, hi = _log_bounds(axis.lo or lo, max(axis.hi or hi, lo * 10))
        ticks, step = _log_ticks(lo, hi), 0.0
        a, b = math.log10(lo), math.log10(hi)

        def frac(v: float) -> float:
            return (math.log10(max(v, lo)) - a) / (b - a)
    else:
        lo = axis.lo if axis.lo is not None else 0.0
        top = axis.hi if axis.hi is not None else max(data, default=lo + 1.0) * 1.06
        hi, ticks, step = _linear_range(lo, top if top > lo else lo + 1.0, 5, axis.hi is None)

        def frac(v: float) -> float:
            return (v - lo) / (hi - lo)

    def pixel(v: float) -> float:
        return start + (1.0 - frac(v) if flip else frac(v)) * span

    def label(v: float) -> str:
        if axis.format is not None:
            return axis.format(v, step)
        return _compact(v) if axis.log else _tick_label(v, step)

    return pixel, [t for t in ticks if 0 <= frac(t) <= 1 + 1e-9], label


def _mark_svg(kind: str, x: float, y: float, color: str, css: str = "", title: str = "") -> str:
    """A dot, cross, ring or line/dashed-line swatch centred at (x, y)."""
    cls = f' class="{esc(css)}"' if css else ""
    inner = f"<title>{esc(title)}</title>" if title else ""
    if kind == "dot":
        return (f'<circle{cls} cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{esc(color)}" '
                f'stroke="#ffffff" stroke-width="1">{inner}</circle>')
    if kind == "cross":
        a, b, c, e = x - 4.5, x + 4.5, y - 4.5, y + 4.5
        d = f"M{a:.1f} {c:.1f}L{b:.1f} {e:.1f}M{a:.1f} {e:.1f}L{b:.1f} {c:.1f}"
        return f'<path{cls} d="{d}" stroke="{esc(color)}" stroke-width="2.2" fill="none">{inner}</path>'
    if kind == "ring":
        return (f'<circle{cls} cx="{x:.1f}" cy="{y:.1f}" r="9.5" fill="none" stroke="{esc(color)}" '
                f'stroke-width="2.5">{inner}</circle>')
    dash = f' stroke-dasharray="{DASHED}"' if kind == "dash" else ""
    return (f'<line{cls} x1="{x - 11:.1f}" y1="{y:.1f}" x2="{x + 11:.1f}" y2="{y:.1f}" stroke="{esc(color)}" '
            f'stroke-width="2"{dash}>{inner}</line>')


def scatter_chart(chart_id: str, marks: Sequence[Mark], x_axis: Axis, y_axis: Axis, *,
                  lines: Sequence[Series] = (), hlines: Sequence[tuple[float, str, str]] = (),
                  callout: tuple[Mark, str] | None = None, legend: Sequence[tuple[str, str, str]] = (),
                  width: int = 1080, height: int = 420, description: str = "") -> str:
    """An inline ``<svg>`` scatter chart: ``marks`` (each with a hover
    ``<title>``), ``lines`` drawn through given points, ``hlines`` as dashed
    horizontal lines ``(y, label, colour)``, a ``callout`` ring with a text
    label around one mark, and a ``legend`` of ``(label, kind, colour)``
    (kind: dot, cross, ring, line, dash). Either axis may be log."""
    left, right, top, bottom = 70.0, 26.0, 14.0 + (24.0 if legend else 0.0), 46.0
    pw, ph = width - left - right, height - top - bottom
    xs = [m.x for m in marks] + [float(v) for s in lines for v in s.x]
    ys = [m.y for m in marks] + [float(v) for s in lines for v in s.y] + [y for y, _, _ in hlines]
    sx, x_ticks, fx = _scale(x_axis, xs, left, pw, False)
    sy, y_ticks, fy = _scale(y_axis, ys, top, ph, True)
    title = f"<title>{esc(description)}</title>" if description else ""
    out = [f'<svg class="chart" data-chart="{esc(chart_id)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{esc(description)}">{title}',
           f'<defs><clipPath id="clip-{esc(chart_id)}"><rect x="{left - 10:.1f}" y="{top - 10:.1f}" '
           f'width="{pw + 20:.1f}" height="{ph + 20:.1f}"/></clipPath></defs>']
    if legend:
        out.append('<g class="legend">')
        x = left
        for label, kind, color_ in legend:
            out.append(_mark_svg(kind, x + 11, 20.0, color_))
            out.append(f'<text class="legend-label" x="{x + 26:.1f}" y="{24.0:.1f}">{esc(label)}</text>')
            x += 26 + text_width(label) + 20
        out.append("</g>")
    out.append('<g class="grid">')
    out += [f'<line x1="{left:.1f}" y1="{sy(t):.1f}" x2="{left + pw:.1f}" y2="{sy(t):.1f}"/>'
            for t in y_ticks]
    out += [f'<line x1="{sx(t):.1f}" y1="{top:.1f}" x2="{sx(t):.1f}" y2="{top + ph:.1f}"/>' for t in x_ticks]
    out.append('</g><g class="ticks">')
    out += [f'<text x="{left - 8:.1f}" y="{sy(t) + 4:.1f}" text-anchor="end">{esc(fy(t))}</text>'
            for t in y_ticks]
    out += [f'<text x="{sx(t):.1f}" y="{top + ph + 18:.1f}" text-anchor="middle">{esc(fx(t))}</text>'
            for t in x_ticks]
    out.append("</g>")
    out.append(f'<rect class="frame" x="{left:.1f}" y="{top:.1f}" width="{pw:.1f}" height="{ph:.1f}"/>')
    out.append(f'<g class="data" clip-path="url(#clip-{esc(chart_id)})">')
    for y, label, color_ in hlines:
        out.append(f'<line class="hline" x1="{left:.1f}" y1="{sy(y):.1f}" x2="{left + pw:.1f}" '
                   f'y2="{sy(y):.1f}" stroke="{esc(color_)}" stroke-width="1.5" stroke-dasharray="{DASHED}">'
                   f"<title>{esc(label)}</title></line>")
        # At the left: the interesting points (high x) tend to be on the right.
        out.append(f'<text class="hline-label" x="{left + 6:.1f}" y="{sy(y) - 6:.1f}" '
                   f'style="fill:{esc(color_)}">{esc(label)}</text>')
    for s in lines:
        pts = " ".join(f"{sx(float(a)):.1f},{sy(float(b)):.1f}" for a, b in zip(s.x, s.y))
        dash = f' stroke-dasharray="{esc(s.dash)}"' if s.dash else ""
        out.append(f'<polyline class="line" points="{pts}" fill="none" stroke="{esc(s.color)}" '
                   f'stroke-width="2" stroke-linejoin="round"{dash}><title>{esc(s.label)}</title></polyline>')
    out += [_mark_svg(m.kind, sx(m.x), sy(m.y), m.color, " ".join(["point", m.css]).strip(), m.title)
            for m in marks]
    if callout is not None:
        m, text = callout
        px, py = sx(m.x), sy(m.y)
        out.append(_mark_svg("ring", px, py, m.color, "callout", m.title))
        flip = px > left + 0.6 * pw
        ty = py - 14 if py > top + 24 else py + 24
        out.append(f'<text class="callout-label" x="{px - 14 if flip else px + 14:.1f}" y="{ty:.1f}" '
                   f'text-anchor="{"end" if flip else "start"}">{esc(text)}</text>')
    out.append("</g>")
    return _close_chart(out, bool(marks), left, top, pw, ph, height, x_axis.label, y_axis.label)


@dataclass(frozen=True, slots=True)
class Bar:
    """One horizontal bar of a :func:`bar_chart`: its label and its parts
    ``(name, value)``, stacked left to right in the order given."""

    label: str
    parts: tuple[tuple[str, float], ...]


def bar_chart(chart_id: str, bars: Sequence[Bar], colors: Mapping[str, str], unit: str, *,
              width: int = 1080, description: str = "") -> str:
    """An inline ``<svg>`` of horizontal stacked bars on one linear axis from
    zero (``unit`` its label), a legend of the part names above, and each
    part's value in its hover ``<title>`` and as ``data-value``."""
    legend = [LegendEntry(name, c, area=True) for name, c in colors.items()]
    legend_svg, legend_h = _legend_svg(legend, 150.0, 8.0, width - 170.0)
    left, right, top, bottom, row = 150.0, 26.0, 14.0 + legend_h, 46.0, 30.0
    pw = width - left - right
    height = int(top + row * max(1, len(bars)) + bottom)
    totals = [sum(max(0.0, v) for _, v in b.parts) for b in bars]
    hi = max(totals, default=0.0)
    top_value, ticks, step = _linear_range(0.0, hi if hi > 0 else 1.0, 6, True)

    def sx(v: float) -> float:
        return left + v / top_value * pw

    title = f"<title>{esc(description)}</title>" if description else ""
    out = [f'<svg class="chart" data-chart="{esc(chart_id)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{esc(description)}">{title}',
           legend_svg, '<g class="grid">']
    out += [f'<line x1="{sx(t):.1f}" y1="{top:.1f}" x2="{sx(t):.1f}" y2="{height - bottom:.1f}"/>'
            for t in ticks]
    out.append('</g><g class="ticks">')
    out += [f'<text x="{sx(t):.1f}" y="{height - bottom + 18:.1f}" text-anchor="middle">'
            f"{esc(_tick_label(t, step))}</text>" for t in ticks]
    out.append("</g><g class=\"data\">")
    for i, b in enumerate(bars):
        y = top + row * i
        out.append(f'<text x="{left - 8:.1f}" y="{y + row / 2 + 4:.1f}" text-anchor="end">'
                   f"{esc(b.label)}</text>")
        x = 0.0
        for name, value in b.parts:
            v = max(0.0, value)
            out.append(f'<rect class="bar" data-part="{esc(name)}" data-value="{value:.6g}" '
                       f'x="{sx(x):.1f}" y="{y + 5:.1f}" width="{sx(x + v) - sx(x):.1f}" '
                       f'height="{row - 10:.1f}" '
                       f'fill="{esc(colors.get(name, MUTED_COLOR))}"><title>{esc(b.label)}: {esc(name)} '
                       f"{value:,.2f} {esc(unit)}</title></rect>")
            x += v
    out.append("</g>")
    out.append(f'<text class="axis-label" x="{left + pw / 2:.1f}" y="{height - 8:.1f}" '
               f'text-anchor="middle">{esc(unit)}</text></svg>')
    return "".join(out)
