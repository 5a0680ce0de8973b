"""A self-contained HTML report of one or more simulation runs.

:func:`write_report` / :func:`render_report` make one page for labelled
:class:`~kvsched.sim.simulator.SimResult` objects (several are drawn over each
other, one colour per result): the configuration lines given by the caller, a
table of ``vllm bench serve``'s metrics and the engine statistics (one column
per result), latency CDFs (TTFT, TPOT, ITL, E2E latency) and time series of
output throughput, batch composition, KV cache usage and queue lengths.

The page opens offline: no script, font, stylesheet or image is fetched; the
charts are inline SVG drawn here (:func:`svg_chart`). Data is reduced before it
is drawn, with numpy, so a one-hour run of ~10^6 steps renders in about a
second: a CDF has at most :data:`MAX_CDF_POINTS` points (ITLs are read from the
accumulator's sorted ``(value, cumulative count)`` pairs, never expanded), a
time series at most :data:`MAX_TIME_BUCKETS` buckets.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvsched.sim.metrics import SampleAccumulator
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


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


# -- numbers --------------------------------------------------------------------

# Metrics shown as percentages (they are fractions in ``SimResult.metrics()``).
FRACTION_KEYS = frozenset({"prefill_token_share", "decode_token_share", "mean_kv_cache_usage",
                           "max_kv_cache_usage", "prefix_cache_hit_rate"})


def format_value(key: str, value: object) -> str:
    """How the summary table prints ``metrics()[key]``: integers with thousands
    separators, fractions (shares, usages, hit rates) as percentages with two
    decimals, other numbers with two decimals (as ``vllm bench serve`` prints)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if key in FRACTION_KEYS:
            return f"{100.0 * v:,.2f}%"
        return f"{v:,.2f}"
    return str(value)


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


def _text_width(text: str, size: float = 12.0) -> float:
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
        w = 28 + _text_width(e.label) + 22
        if x > left and x + w > left + width:
            x, y = left, y + row_h
        if e.area:
            parts.append(f'<rect x="{x:.1f}" y="{y + 3:.1f}" width="22" height="10" rx="2" '
                         f'fill="{_esc(e.color)}" fill-opacity="0.75"/>')
        else:
            dash = f' stroke-dasharray="{_esc(e.dash)}"' if e.dash else ""
            parts.append(f'<line x1="{x:.1f}" y1="{y + 8:.1f}" x2="{x + 22:.1f}" y2="{y + 8:.1f}" '
                         f'stroke="{_esc(e.color)}" stroke-width="2.5"{dash}/>')
        parts.append(f'<text class="legend-label" x="{x + 28:.1f}" y="{y + 12:.1f}">{_esc(e.label)}</text>')
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

    title = f"<title>{_esc(description)}</title>" if description else ""
    out = [f'<svg class="chart" data-chart="{_esc(chart_id)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{_esc(description)}">{title}',
           f'<defs><clipPath id="clip-{_esc(chart_id)}"><rect x="{left - 2:.1f}" y="{top - 2:.1f}" '
           f'width="{pw + 4:.1f}" height="{ph + 4:.1f}"/></clipPath></defs>',
           legend_svg]
    # Grid and ticks.
    out.append('<g class="grid">')
    for t in y_ticks:
        if y_lo <= t <= y_hi * (1 + 1e-9):
            py = float(sy(np.array([t]))[0])
            out.append(f'<line x1="{left:.1f}" y1="{py:.1f}" x2="{left + pw:.1f}" y2="{py:.1f}"/>')
    for t in x_ticks:
        if x_lo * (1 - 1e-9) <= t <= x_hi * (1 + 1e-9):
            px = float(sx(np.array([t]))[0])
            out.append(f'<line x1="{px:.1f}" y1="{top:.1f}" x2="{px:.1f}" y2="{top + ph:.1f}"/>')
    out.append("</g>")
    out.append('<g class="ticks">')
    for t in y_ticks:
        if y_lo <= t <= y_hi * (1 + 1e-9):
            py = float(sy(np.array([t]))[0])
            out.append(f'<text x="{left - 8:.1f}" y="{py + 4:.1f}" text-anchor="end">{_esc(fy(t))}</text>')
    for t in x_ticks:
        if x_lo * (1 - 1e-9) <= t <= x_hi * (1 + 1e-9):
            px = float(sx(np.array([t]))[0])
            out.append(f'<text x="{px:.1f}" y="{top + ph + 18:.1f}" text-anchor="middle">'
                       f"{_esc(fx(t))}</text>")
    out.append("</g>")
    out.append(f'<rect class="frame" x="{left:.1f}" y="{top:.1f}" width="{pw:.1f}" height="{ph:.1f}"/>')
    # Data.
    out.append(f'<g class="data" clip-path="url(#clip-{_esc(chart_id)})">')
    for s in series:
        x, y, base = s.x, s.y, s.base
        ok = np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        dx, dy = sx(x), sy(y)
        label = f"<title>{_esc(s.label)}</title>" if s.label else ""
        if base is not None:
            db = sy(base[ok])
            ring = _points(np.concatenate([dx, dx[::-1]]), np.concatenate([dy, db[::-1]]))
            out.append(f'<polygon class="area" points="{ring}" fill="{_esc(s.color)}" fill-opacity="0.75" '
                       f'stroke="{_esc(s.color)}" stroke-width="1">{label}</polygon>')
        else:
            dash = f' stroke-dasharray="{_esc(s.dash)}"' if s.dash else ""
            out.append(f'<polyline class="line" points="{_points(dx, dy)}" fill="none" '
                       f'stroke="{_esc(s.color)}" stroke-width="2" stroke-linejoin="round"{dash}>'
                       f'{label}</polyline>')
    out.append("</g>")
    if not series:
        out.append(f'<text class="empty" x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" '
                   f'text-anchor="middle">no data</text>')
    # Axis labels.
    out.append(f'<text class="axis-label" x="{left + pw / 2:.1f}" y="{height - 8:.1f}" '
               f'text-anchor="middle">{_esc(x_axis.label)}</text>')
    out.append(f'<text class="axis-label" transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{_esc(y_axis.label)}</text>')
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
        ttft, e2el = first - send, finish - send
        multi = out > 1
        return cls(ttft, (e2el[multi] - ttft[multi]) / (out[multi] - 1), e2el)


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
    # The log's columns are array.array: numpy reads their buffers directly.
    cols = {name: np.asarray(getattr(s, name), dtype=np.float64)
            for name in ("start", "duration", "num_tokens", "prefill_tokens", "free_blocks",
                         "num_running", "num_waiting")}
    cols["end"] = cols["start"] + cols["duration"]
    return cols


def _run_end(result: SimResult) -> float:
    s = result.steps
    return float(s.start[-1] + s.duration[-1]) if len(s) else 0.0


def bucket_width(results: Sequence[SimResult], max_buckets: int = MAX_TIME_BUCKETS) -> float:
    """A round bucket width (1, 2 or 5 times a power of ten, seconds) giving at
    most ``max_buckets`` buckets over the longest run, and at least
    ``MIN_STEPS_PER_BUCKET`` mean step durations."""
    end = max((_run_end(r) for r in results), default=0.0)
    if end <= 0:
        return 1.0
    mean_steps = [float(np.asarray(r.steps.duration).mean()) for r in results if len(r.steps)]
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
    if not len(result.steps):
        return None
    c = _step_arrays(result)
    run_end = _run_end(result)
    n = max(1, round(run_end / width))
    edges = np.arange(n, dtype=np.float64) * width
    lengths = np.full(n, width)
    lengths[-1] = run_end - edges[-1]
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


# -- the page -------------------------------------------------------------------

# Summary table: (section, [(metric key, unit, description)]).
METRIC_ROWS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("Requests", (
        ("completed", "", "requests completed"),
        ("failed", "", "requests refused (never scheduled)"),
        ("duration", "s", "benchmark duration: start to the last completion"),
        ("total_input_tokens", "tok", "prompt tokens of completed requests"),
        ("total_output_tokens", "tok", "output tokens of completed requests"),
    )),
    ("Throughput", (
        ("request_throughput", "req/s", "completed requests per second"),
        ("request_goodput", "req/s", "requests meeting every SLO per second"),
        ("output_throughput", "tok/s", "output tokens per second"),
        ("total_token_throughput", "tok/s", "prompt + output tokens per second"),
        ("max_output_tokens_per_s", "tok/s", "most output tokens in one second"),
        ("max_concurrent_requests", "", "most requests in flight in one second"),
    )),
    *((name, tuple((f"{stat}_{metric}_ms", "ms", f"{stat} {name.lower()}")
                   for stat in ("mean", "median", "p90", "p99")))
      for metric, name in (("ttft", "Time to first token"), ("tpot", "Time per output token"),
                           ("itl", "Inter-token latency"), ("e2el", "End-to-end latency"))),
    ("Engine", (
        ("num_steps", "", "engine steps"),
        ("mean_batch_size", "req", "requests per step"),
        ("mean_tokens_per_step", "tok", "tokens per step"),
        ("prefill_token_share", "%", "share of scheduled tokens that were prefill"),
        ("decode_token_share", "%", "share of scheduled tokens that were decode"),
        ("mean_kv_cache_usage", "%", "KV cache usage, time-weighted over busy time"),
        ("max_kv_cache_usage", "%", "highest KV cache usage after a step"),
        ("num_preemptions", "", "requests preempted (recomputed)"),
        ("prefix_cache_hit_rate", "%", "prompt tokens found in the prefix cache"),
    )),
)

_CSS = """
:root { --fg: #1f2430; --muted: #5f6b7a; --line: #e2e6ec; --bg: #f5f6f8; --card: #ffffff; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1140px; margin: 0 auto; padding: 28px 20px 40px; }
header h1 { font-size: 24px; margin: 0 0 2px; font-weight: 650; }
header .sub { color: var(--muted); margin: 0 0 14px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 16px 20px 18px; margin: 0 0 16px; }
h2 { font-size: 16px; margin: 0 0 10px; font-weight: 650; }
h3 { font-size: 14px; margin: 0 0 2px; font-weight: 600; }
.note { color: var(--muted); font-size: 12.5px; margin: 0 0 6px; }
ul.config { list-style: none; margin: 0; padding: 0; columns: 2; column-gap: 32px; }
ul.config li { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; padding: 2px 0; break-inside: avoid; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12.5px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; }
td.unit { color: var(--muted); font-size: 12.5px; }
tr.section td { background: #f0f2f5; font-weight: 600; font-size: 12.5px; color: #3a4352;
  border-bottom: 1px solid var(--line); }
span.d { display: inline-block; min-width: 54px; color: var(--muted); font-size: 11px; }
.tables { display: grid; grid-template-columns: 1fr; gap: 0 28px; }
.tables:not(.two) table.metrics { width: auto; min-width: 66%; }
.tables:not(.two) table.metrics td.num, .tables:not(.two) table.metrics th.num { padding-left: 28px; }
.tables.two { grid-template-columns: 1fr 1fr; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 6px;
  vertical-align: -1px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 14px 24px; }
figure { margin: 0 0 6px; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font-size: 12px; fill: var(--muted); }
svg.chart .legend-label { fill: var(--fg); }
svg.chart .axis-label { fill: #3a4352; font-size: 12.5px; }
svg.chart .grid line { stroke: #e9ecf1; stroke-width: 1; }
svg.chart .frame { fill: none; stroke: #c9ced6; stroke-width: 1; }
svg.chart .empty { font-size: 14px; }
details { margin-top: 8px; }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
@media (max-width: 800px) { .grid2, .tables.two { grid-template-columns: 1fr; } ul.config { columns: 1; } }
"""


def _color(i: int) -> str:
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
        series.append(Series(label, ms, y, _color(i)))
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
    return [LegendEntry(label, _color(i)) for i, label in enumerate(labels)]


def _time_charts(labels: Sequence[str], lines: Sequence[_Timeline | None], end: float, width: float
                 ) -> list[tuple[str, str, str]]:
    """(title, note, svg) for throughput, batch composition, KV cache usage, queues."""
    multi = len(labels) > 1
    present = [(i, label, t) for i, (label, t) in enumerate(zip(labels, lines)) if t is not None]
    bucket = f"{width:g} s buckets"
    charts = []

    series = [Series(label, t.mid, t.output_rate, _color(i)) for i, label, t in present]
    charts.append(("Output throughput", f"output tokens per second ({bucket})", svg_chart(
        "throughput", series, _time_axis(end), Axis("output tokens/s"),
        legend=_result_legend(labels) if multi else [], height=280,
        description="Output tokens per second over time")))

    if multi:
        series = []
        for i, label, t in present:
            series.append(Series(f"{label}: decode", t.mid, t.decode, _color(i)))
            series.append(Series(f"{label}: prefill", t.mid, t.prefill, _color(i), dash=DASHED))
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

    series = [Series(label, t.mid, t.kv_usage, _color(i)) for i, label, t in present]
    charts.append(("KV cache usage", f"share of usable KV blocks in use, time-weighted ({bucket})",
                   svg_chart("kv-cache", series, _time_axis(end),
                             Axis("KV cache usage", lo=0.0, hi=100.0, format=lambda v, _s: f"{v:.0f}%"),
                             legend=_result_legend(labels) if multi else [], height=260,
                             description="KV cache usage over time")))

    series = []
    for i, label, t in present:
        if multi:
            series.append(Series(f"{label}: running", t.mid, t.running, _color(i)))
            series.append(Series(f"{label}: waiting", t.mid, t.waiting, _color(i), dash=DASHED))
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


def _delta(value: object, reference: object) -> str:
    if (isinstance(value, bool) or isinstance(reference, bool)
            or not isinstance(value, int | float) or not isinstance(reference, int | float)):
        return ""
    if reference == 0 or not math.isfinite(reference) or not math.isfinite(value):
        return ""
    change = (value - reference) / abs(reference) * 100.0
    return f"{change:+.1f}%" if abs(change) >= 0.05 else ""


LATENCY_SECTIONS = frozenset(name for name, _ in METRIC_ROWS[2:6])


def _metrics_tables(labels: Sequence[str], metrics: Sequence[Mapping[str, Any]]) -> str:
    """The summary: one row per metric key present in any result, one column
    per result (later columns also show their change against the first)."""
    ncols = 2 + len(labels)
    blocks: list[tuple[str, str]] = []  # (section, rows html)
    for section, rows in METRIC_ROWS:
        body = []
        for key, unit, description in rows:
            if not any(key in m for m in metrics):
                continue
            cells = []
            for i, m in enumerate(metrics):
                value = m.get(key)
                d = f'<span class="d">{_esc(_delta(value, metrics[0].get(key)))}</span>' if i else ""
                cells.append(f'<td class="num" data-key="{_esc(key)}" data-result="{i}">'
                             f'<span class="v">{_esc(format_value(key, value))}</span>{d}</td>')
            body.append(f'<tr><td class="key" title="{_esc(description)}">{_esc(key)}</td>'
                        f'<td class="unit">{_esc(unit)}</td>{"".join(cells)}</tr>')
        if body:
            blocks.append((section, f'<tr class="section"><td colspan="{ncols}">{_esc(section)}</td></tr>'
                           + "".join(body)))
    head = "".join(f'<th class="num"><span class="swatch" style="background:{_color(i)}"></span>'
                   f"{_esc(label)}</th>" for i, label in enumerate(labels))
    thead = f"<thead><tr><th>metric</th><th>unit</th>{head}</tr></thead>"

    def table(rows: Sequence[str]) -> str:
        return f'<table class="metrics">{thead}<tbody>{"".join(rows)}</tbody></table>'

    value_width = sum(max(80.0, _text_width(label, 12.5) + 30) + (60 if i else 0)
                      for i, label in enumerate(labels))
    if 190 + 50 + value_width <= 520:
        # Narrow enough: two tables side by side, latencies on the right.
        left = [rows for name, rows in blocks if name not in LATENCY_SECTIONS]
        right = [rows for name, rows in blocks if name in LATENCY_SECTIONS]
        if left and right:
            return f'<div class="tables two">{table(left)}{table(right)}</div>'
    return f'<div class="tables">{table([rows for _, rows in blocks])}</div>'


def _runs_table(labels: Sequence[str], results: Sequence[SimResult]) -> str:
    rows = []
    for i, (label, r) in enumerate(zip(labels, results)):
        rows.append(
            f'<tr><td><span class="swatch" style="background:{_color(i)}"></span>{_esc(label)}</td>'
            f"<td>{_esc(r.workload)}</td>"
            f'<td class="num">{len(r.records):,}</td><td class="num">{len(r.failed):,}</td>'
            f'<td class="num">{_run_end(r):,.2f}</td><td class="num">{len(r.steps):,}</td>'
            f'<td class="num">{r.num_fast_forwarded_steps:,}</td>'
            f'<td class="num">{r.wall_seconds:,.2f}</td></tr>')
    failures = []
    for label, r in zip(labels, results):
        if r.failed:
            shown = r.failed[:20]
            items = "".join(f"<li><code>{_esc(rid)}</code>: {_esc(why)}</li>" for rid, why in shown)
            rest = len(r.failed) - len(shown)
            more = f"<li>... and {rest:,} more</li>" if rest else ""
            failures.append(f"<details><summary>{_esc(label)}: {len(r.failed):,} requests refused"
                            f"</summary><ul>{items}{more}</ul></details>")
    return ('<table class="runs"><thead><tr><th>run</th><th>workload</th><th class="num">completed</th>'
            '<th class="num">failed</th><th class="num">simulated time (s)</th><th class="num">steps</th>'
            '<th class="num">fast-forwarded steps</th><th class="num">simulation wall time (s)</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>{"".join(failures)}')


def render_report(results: Sequence[tuple[str, SimResult]], title: str, config_lines: Sequence[str] = (),
                  *, metrics: Sequence[Mapping[str, Any]] | None = None,
                  goodput_slos: dict[str, float] | None = None) -> str:
    """The report page as one HTML string (see :func:`write_report`)."""
    if not results:
        raise ValueError("render_report: no results; give at least one (label, SimResult)")
    labels = [label for label, _ in results]
    dupes = sorted({label for label in labels if labels.count(label) > 1})
    if dupes:
        raise ValueError(f"render_report: labels must differ, {', '.join(map(repr, dupes))} given twice")
    runs = [r for _, r in results]
    if metrics is None:
        metrics = [r.metrics(goodput_slos=goodput_slos) for r in runs]
    elif len(metrics) != len(runs):
        raise ValueError(f"render_report: {len(metrics)} metrics dicts for {len(runs)} results")

    latencies = [_Latencies.of(r) for r in runs]
    cdf_specs = (
        ("cdf-ttft", "TTFT", "Time to first token", "requests",
         [_array_cdf(lat.ttft) for lat in latencies]),
        ("cdf-tpot", "TPOT", "Time per output token", "requests",
         [_array_cdf(lat.tpot) for lat in latencies]),
        ("cdf-itl", "ITL", "Inter-token latency", "tokens", [_accumulator_cdf(r.itls) for r in runs]),
        ("cdf-e2el", "E2E latency", "End-to-end latency", "requests",
         [_array_cdf(lat.e2el) for lat in latencies]),
    )
    cdf_html = []
    for chart_id, short, long, unit_of, cdfs in cdf_specs:
        svg = _cdf_chart(chart_id, short, unit_of, labels, cdfs)
        cdf_html.append(f'<figure><h3>{_esc(long)} <span class="note">({_esc(short)})</span></h3>'
                        f"{svg}</figure>")

    width = bucket_width(runs)
    end = max(_run_end(r) for r in runs)
    timelines = [_timeline(r, width) for r in runs]
    time_html = [f'<figure><h3>{_esc(name)}</h3><p class="note">{_esc(note)}</p>{svg}</figure>'
                 for name, note, svg in _time_charts(labels, timelines, end, width)]

    config = ""
    if config_lines:
        items = "".join(f"<li>{_esc(line)}</li>" for line in config_lines)
        config = f'<section class="card"><h2>Configuration</h2><ul class="config">{items}</ul></section>'
    what = "one run" if len(runs) == 1 else f"{len(runs)} runs compared; deltas are against the first"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body><main>",
        f'<header><h1>{_esc(title)}</h1><p class="sub">kvsched serving simulation report: {_esc(what)}</p>'
        "</header>",
        config,
        f'<section class="card"><h2>Runs</h2>{_runs_table(labels, runs)}</section>',
        f'<section class="card"><h2>Summary</h2><p class="note">vllm bench serve\'s metric names; '
        f"latencies in milliseconds, percentiles as numpy computes them.</p>"
        f"{_metrics_tables(labels, metrics)}</section>",
        f'<section class="card"><h2>Latency distributions</h2><p class="note">Cumulative share of '
        f"requests (of output tokens for ITL) at or below each latency.</p>"
        f'<div class="grid2">{"".join(cdf_html)}</div></section>',
        f'<section class="card"><h2>Over time</h2>{"".join(time_html)}</section>',
        "<footer>Generated by kvsched. Self-contained: charts are inline SVG; nothing is loaded from "
        "elsewhere.</footer>",
        "</main></body></html>",
        "",
    ])


def write_report(path: str | Path, results: Sequence[tuple[str, SimResult]], title: str,
                 config_lines: Sequence[str] = (), *, metrics: Sequence[Mapping[str, Any]] | None = None,
                 goodput_slos: dict[str, float] | None = None) -> None:
    """Write the HTML report of ``results`` (``(label, result)`` pairs, drawn
    over each other in that order) to ``path``.

    ``config_lines`` are shown as given under the title (model, hardware,
    parallelism, scheduler settings, workload ...). ``metrics``: each
    result's ``result.metrics()`` if the caller has them already (they cost
    about a second for a one-hour run); otherwise they are computed here, with
    ``goodput_slos`` if given."""
    page = render_report(results, title, config_lines, metrics=metrics, goodput_slos=goodput_slos)
    Path(path).write_text(page, encoding="utf-8")
