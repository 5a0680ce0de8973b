"""The HTML report: self-contained, every chart present, the summary table equal
to ``SimResult.metrics()``, bounded point counts for long runs, and a real
render in headless Chromium (skipped when Chromium is not installed, except
under KVSCHED_CI=1, where a missing Chromium fails)."""

from __future__ import annotations

import re
import struct
import subprocess
import time
import zlib
from array import array
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf.hardware import get_hardware
from kvsched.perf.model_catalog import get_model
from kvsched.perf.step_time import StepTimeModel
from kvsched.report.simulate_page import (
    MAX_CDF_POINTS,
    MAX_TIME_BUCKETS,
    PALETTE,
    bucket_width,
    cdf_points,
    format_value,
    render_report,
    write_report,
)
from kvsched.sim.metrics import RequestRecord
from kvsched.sim.samples import SampleAccumulator
from kvsched.sim.simulator import SimConfig, SimResult, Simulator, StepLog
from kvsched.sim.workload import random_workload

CHARTS = ("cdf-ttft", "cdf-tpot", "cdf-itl", "cdf-e2el", "throughput", "batch", "kv-cache", "queues")
CONFIG = ["model: Llama-3.1-8B", "hardware: h100-sxm", "parallelism: TP=1",
          "scheduler: max_num_batched_tokens=2048, max_num_seqs=16", "workload: random, 50 prompts"]
# Keys the summary table must show for a run with completed requests.
REQUIRED_KEYS = (
    "completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
    *(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "p90", "p99")),
    "num_steps", "mean_batch_size", "mean_tokens_per_step", "prefill_token_share", "decode_token_share",
    "mean_kv_cache_usage", "max_kv_cache_usage", "num_preemptions", "prefix_cache_hit_rate",
)


def simulate(max_num_seqs: int, num_gpu_blocks: int, input_len: int = 512) -> SimResult:
    config = SimConfig(SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=max_num_seqs),
                       CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=16),
                       StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm")))
    workload = random_workload(num_prompts=50, input_len=input_len, output_len=64, range_ratio=0.5, seed=1)
    return Simulator(config, workload).run()


@pytest.fixture(scope="module")
def small() -> SimResult:
    # KV-bound: preemptions and a waiting queue.
    return simulate(16, 400)


@pytest.fixture(scope="module")
def roomy() -> SimResult:
    return simulate(64, 1200)


# -- parsing the page -----------------------------------------------------------

class Page(HTMLParser):
    """What the tests look at: every tag with its attributes, the charts, the
    summary cells, the legend labels of each chart, and the visible text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.charts: dict[str, dict[str, int]] = {}   # chart id -> element counts
        self.legends: dict[str, list[str]] = {}       # chart id -> legend labels
        self.cells: dict[tuple[str, int], str] = {}   # (metric key, result index) -> value text
        self.text: list[str] = []
        self._chart: str | None = None
        self._legend_depth = 0
        self._cell: tuple[str, int] | None = None
        self._in_value = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "svg":
            self._chart = a.get("data-chart") or ""
            self.charts[self._chart] = {}
            self.legends[self._chart] = []
        elif self._chart is not None:
            counts = self.charts[self._chart]
            counts[tag] = counts.get(tag, 0) + 1
            if tag == "g" and (a.get("class") == "legend" or self._legend_depth):
                self._legend_depth += 1
        if tag == "td" and "data-key" in a:
            self._cell = (str(a["data-key"]), int(str(a["data-result"])))
        if tag == "span" and self._cell is not None and a.get("class") == "v":
            self._in_value = True

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if self._chart is not None:
            counts = self.charts[self._chart]
            counts[tag] = counts.get(tag, 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None
        elif tag == "g" and self._legend_depth:
            self._legend_depth -= 1
        elif tag == "td":
            self._cell = None
        elif tag == "span":
            self._in_value = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_value and self._cell is not None:
            self.cells[self._cell] = self.cells.get(self._cell, "") + data
        if self._legend_depth and self._chart is not None and data.strip():
            self.legends[self._chart].append(data)


def parse_number(text: str) -> float:
    value = float(text.rstrip("%").replace(",", ""))
    return value / 100.0 if text.endswith("%") else value


# -- the page -------------------------------------------------------------------

def test_page_is_self_contained(tmp_path: Path, small: SimResult, roomy: SimResult) -> None:
    path = tmp_path / "report.html"
    write_report(path, [("a", small), ("b", roomy)], "Self-contained", CONFIG)
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    assert not re.search(r"(?i)https?:|//[a-z0-9.-]+\.[a-z]{2,}/", text), "an absolute URL in the page"
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "img", "iframe", "object", "embed", "base"), tag
        for name, value in attrs.items():
            assert name not in ("src", "srcset"), (tag, name, value)
            if name in ("href", "xlink:href"):
                assert value is not None and value.startswith("#"), (tag, name, value)
    assert "@import" not in text and "@font-face" not in text
    for url in re.findall(r"url\(([^)]*)\)", text):
        assert url.startswith("#"), url  # only the charts' own clip paths


def test_every_chart_is_drawn(small: SimResult) -> None:
    page = Page(render_report([("only", small)], "Charts", CONFIG))
    assert set(page.charts) == set(CHARTS)
    assert len([t for t, _ in page.tags if t == "svg"]) == len(CHARTS)  # one <svg> per chart
    for chart, counts in page.charts.items():
        assert counts.get("polyline", 0) + counts.get("polygon", 0) >= 1, chart
        assert counts.get("text", 0) >= 6, f"{chart}: ticks and axis labels"
    # One result: the quantity legends only (batch composition and queues).
    assert page.legends["batch"] == ["decode tokens", "prefill tokens"]
    assert page.legends["queues"] == ["running", "waiting"]
    assert page.legends["cdf-ttft"] == [] and page.legends["throughput"] == []


def test_header_shows_title_and_config(small: SimResult) -> None:
    page = Page(render_report([("only", small)], "My <run> & more", CONFIG))
    text = "".join(page.text)
    assert "My <run> & more" in text
    for line in CONFIG:
        assert line in text


def test_table_values_equal_metrics(small: SimResult, roomy: SimResult) -> None:
    results = [("small", small), ("roomy", roomy)]
    page = Page(render_report(results, "Metrics", CONFIG))
    for i, (_, result) in enumerate(results):
        metrics = result.metrics()
        for key in REQUIRED_KEYS:
            assert (key, i) in page.cells, f"{key} missing for result {i}"
        for (key, j), text in page.cells.items():
            if j != i:
                continue
            assert text == format_value(key, metrics[key]), key
            # And independently of format_value: the printed number is the metric, rounded.
            value = float(metrics[key])
            assert parse_number(text) == pytest.approx(value, abs=0.006 if "%" not in text else 6e-5), key
    assert small.num_preemptions > 0  # the fixture exercises preemption
    assert page.cells[("num_preemptions", 0)] == f"{small.num_preemptions:,}"


def test_format_value() -> None:
    assert format_value("completed", 1234) == "1,234"
    assert format_value("mean_ttft_ms", 1234.5678) == "1,234.57"
    assert format_value("prefill_token_share", 0.12345) == "12.35%"
    assert format_value("duration", None) == "-"


def test_two_results_have_a_legend_with_both_labels(small: SimResult, roomy: SimResult) -> None:
    labels = ("max_num_seqs=16", "max_num_seqs=64 <b>")
    page = Page(render_report([(labels[0], small), (labels[1], roomy)], "Compare", CONFIG))
    for chart in CHARTS:
        legend = page.legends[chart]
        assert labels[0] in legend and labels[1] in legend, (chart, legend)
    # The run table and the summary name both, with their colours.
    text = "".join(page.text)
    assert labels[0] in text and labels[1] in text
    for key in REQUIRED_KEYS:
        assert (key, 0) in page.cells and (key, 1) in page.cells


def test_strings_are_escaped(small: SimResult) -> None:
    nasty = '<script>alert("x")</script> & "quotes"'
    text = render_report([(nasty, small)], nasty, [nasty])
    assert "<script>" not in text
    page = Page(text)
    assert not any(tag == "script" for tag, _ in page.tags)
    assert "".join(page.text).count(nasty) >= 3  # title, config line, run label


def test_refused_requests_and_empty_runs(small: SimResult) -> None:
    # Every prompt is longer than the whole KV cache: all refused, no step run.
    empty = simulate(16, 40, input_len=4096)
    assert not empty.records and empty.failed and not len(empty.steps)
    page = Page(render_report([("empty", empty)], "Nothing ran"))
    assert set(page.charts) == set(CHARTS)
    assert "no data" in page.text
    assert page.cells[("completed", 0)] == "0"
    assert page.cells[("failed", 0)] == f"{len(empty.failed):,}"
    # Next to a real run: the real one is drawn, the table marks the missing values.
    page = Page(render_report([("small", small), ("empty", empty)], "Mixed"))
    assert page.cells[("mean_ttft_ms", 1)] == "-"
    assert page.charts["throughput"].get("polyline", 0) == 1


def test_bad_arguments(small: SimResult) -> None:
    with pytest.raises(ValueError, match="no results"):
        render_report([], "x")
    with pytest.raises(ValueError, match="labels must differ"):
        render_report([("a", small), ("a", small)], "x")
    with pytest.raises(ValueError, match="metrics dicts"):
        render_report([("a", small)], "x", metrics=[])
    with pytest.raises(ValueError, match="2 run descriptions for 1 results"):
        render_report([("a", small)], "x", descriptions=[{}, {}])


def test_precomputed_metrics_are_used(small: SimResult) -> None:
    metrics = small.metrics()
    assert render_report([("a", small)], "x", metrics=[metrics]) == render_report([("a", small)], "x")


# -- the page as a reader sees it ------------------------------------------------

PROVENANCE = ("fitted 2026-11-24 by benchmarks/fit_host_terms.py on the h100_sxm/h200_sxm vLLM agg rows "
              "of aiconfigurator-core 0.12's silicon_sample.csv (measured backend; coordinate descent, "
              "21 evaluations). Train 554 rows: TTFT median |err| 21.8% (bias +2.1%), TPOT median |err| "
              "8.3% (bias +6.1%). Held out b200_sxm: 623 rows: TTFT median |err| 20.0% (bias +6.2%), "
              "TPOT median |err| 11.3% (bias +1.3%).")
# The shape of kvsched.sim.results.describe_run, written out by hand.
DESCRIPTION: dict[str, Any] = {
    "deployment": {
        "model": {"name": "meta-llama/Llama-3.1-8B", "dtype": "bf16"},
        "step_times": {"backend": "measured",
                       "host_terms": {"vllm_version": "0.24", "provenance": PROVENANCE, "step_s": 0.00014,
                                      "arrival_s": 0.02},
                       "extrapolated": ["GEMM bfloat16 n=128256 k=4096 past the measured shapes"]},
        "scheduler": {"max_num_seqs": 16},
        "per_rank": {"scheduler": "every scheduler setting applies to each DP rank"},
    },
    "workload": {"dataset_name": "random", "num_prompts": 50},
}


def _cell(text: str, setting: str, result: int) -> str:
    match = re.search(rf'<td class="[^"]*" data-setting="{re.escape(setting)}" data-result="{result}">'
                      r'(.*?)</td></tr>(?=<tr class="section"|<tr><td class="key"|</tbody>)', text, re.S)
    assert match, setting
    return match.group(1)


def test_charts_come_before_the_settings(small: SimResult) -> None:
    text = render_report([("only", small)], "Order", CONFIG, descriptions=[DESCRIPTION])
    first_chart = text.index("<svg")
    assert first_chart < text.index('<table class="metrics deployment"')
    assert first_chart < text.index("Deployment and workload")
    # What ran is still said at the top, before the charts.
    assert text.index(CONFIG[0]) < first_chart


def test_host_terms_read_as_a_small_table(small: SimResult) -> None:
    text = render_report([("only", small)], "Readable", CONFIG, descriptions=[DESCRIPTION])
    assert "{'" not in text and "&#x27;vllm_version&#x27;" not in text  # no Python dict repr
    cell = _cell(text, "step_times.host_terms", 0)
    assert cell.startswith('<table class="kv">')
    assert "<th>vllm_version</th><td>0.24</td>" in cell
    assert "<th>step_s</th><td>0.00014</td>" in cell and "<th>arrival_s</th><td>0.02</td>" in cell
    # The 400-character provenance is folded under its first sentence.
    summary = re.search(r"<th>provenance</th><td><details class=\"long\"><summary>(.*?)</summary>", cell)
    assert summary and summary.group(1) == ("fitted 2026-11-24 by benchmarks/fit_host_terms.py on the "
                                            "h100_sxm/h200_sxm vLLM agg rows of ...")
    assert "Held out b200_sxm: 623 rows" in cell  # all of it, one click away
    # A list is one line per item, not a Python list.
    assert _cell(text, "step_times.extrapolated", 0) == (
        '<ul class="items"><li>GEMM bfloat16 n=128256 k=4096 past the measured shapes</li></ul>')
    # Plain values are as before.
    assert _cell(text, "scheduler.max_num_seqs", 0) == "16"


def test_a_single_run_is_not_labelled_as_one_of_several(small: SimResult, roomy: SimResult) -> None:
    text = render_report([("kvsched", small)], "One run", CONFIG, descriptions=[DESCRIPTION])
    heads = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", text)
    assert "kvsched" not in "".join(heads) and 'class="swatch"' not in text
    # One column named "value": in the summary's two side-by-side tables and the settings'.
    assert heads.count("value") == 3
    assert "first run" not in text
    page = Page(text)
    assert page.cells[("completed", 0)] == f"{len(small.records):,}"
    # Two runs: each column named, with its colour, and the differences marked.
    other = {**DESCRIPTION, "deployment": {**DESCRIPTION["deployment"], "scheduler": {"max_num_seqs": 64}}}
    text = render_report([("small", small), ("roomy", roomy)], "Two runs", CONFIG,
                         descriptions=[DESCRIPTION, other])
    heads = "".join(re.findall(r"<th(?: [^>]*)?>(.*?)</th>", text))
    assert "small" in heads and "roomy" in heads and "value" not in heads
    assert "values that differ from the first run's are marked" in text
    assert 'class="num changed" data-setting="scheduler.max_num_seqs" data-result="1">64</td>' in text


# -- data reduction -------------------------------------------------------------

def test_cdf_points_exact_then_downsampled() -> None:
    values = np.array([1.0, 2.0, 2.0, 5.0])
    x, y, step = cdf_points(values, np.arange(1, 5))
    assert step and x.tolist() == [1.0, 2.0, 2.0, 5.0] and y.tolist() == [0.25, 0.5, 0.75, 1.0]

    rng = np.random.default_rng(0)
    acc = SampleAccumulator()
    acc.add_array(rng.exponential(0.01, 100_000), rng.integers(1, 300, 100_000))
    values, cumulative = acc._order_stats()
    x, y, step = cdf_points(values, cumulative)
    assert not step and len(x) <= MAX_CDF_POINTS
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) >= 0)
    assert y[0] == 0.0 and y[-1] == 1.0 and x[-1] == values[-1]
    # Each point is on the true CDF: the share of samples <= x is y.
    for q in (0.5, 0.9, 0.99):
        i = int(np.searchsorted(y, q))
        assert acc.percentile(100 * y[i - 1]) <= x[i] <= acc.percentile(min(100.0, 100 * y[i] + 0.5))


def synthetic(num_steps: int, num_requests: int, seed: int = 0, blocks: int = 20_000) -> SimResult:
    """A SimResult shaped like a one-hour run (random numbers, no simulation)."""
    rng = np.random.default_rng(seed)
    duration = rng.uniform(0.004, 0.010, num_steps)
    start = np.concatenate([[0.0], np.cumsum(duration)[:-1]])
    reqs = rng.integers(1, 256, num_steps)
    prefill = np.where(rng.random(num_steps) < 0.1, rng.integers(100, 2048, num_steps), 0)
    log = StepLog()
    columns: dict[str, npt.NDArray[Any]] = {
        "start": start, "duration": duration, "num_reqs": reqs, "num_tokens": reqs + prefill,
        "prefill_tokens": prefill, "free_blocks": rng.integers(0, blocks, num_steps),
        "num_running": reqs, "num_waiting": rng.integers(0, 50, num_steps)}
    for name, values in columns.items():
        column: array[Any] = getattr(log, name)
        column.frombytes(values.astype(np.float64 if column.typecode == "d" else np.int64).tobytes())
    end = float(start[-1] + duration[-1])
    send = np.sort(rng.uniform(0, end * 0.95, num_requests))
    ttft = rng.exponential(0.3, num_requests)
    e2el = ttft + rng.uniform(1, 20, num_requests)
    records = [RequestRecord(f"r{i}", s, s + t, min(s + e, end), 1000, 200)
               for i, (s, t, e) in enumerate(zip(send.tolist(), ttft.tolist(), e2el.tolist()))]
    itls = SampleAccumulator()
    itls.add_array(duration, reqs)
    token_times = SampleAccumulator()
    token_times.add_array(start + duration, reqs)
    return SimResult("random", records, [], itls, token_times, log.totals(blocks - 1), log, blocks,
                     0, 100, 10, 0, 1.0)


def test_long_run_is_reduced() -> None:
    # ~an hour of steps: every curve stays within its point budget, and the
    # reduction is numpy (no per-step Python), so it takes well under a second here.
    results = [("a", synthetic(500_000, 5000)), ("b", synthetic(400_000, 5000, seed=1))]
    assert bucket_width([r for _, r in results]) == 10.0  # ~3500 s / 600 buckets, rounded up
    metrics = [{"completed": len(r.records)} for _, r in results]
    t0 = time.perf_counter()
    text = render_report(results, "Long", metrics=metrics)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"rendering took {elapsed:.2f}s; the reduction should be numpy, not per step"
    page = Page(text)
    assert set(page.charts) == set(CHARTS)
    for tag, attrs in page.tags:
        if tag in ("polyline", "polygon"):
            n = len(str(attrs["points"]).split())
            budget = 2 * MAX_TIME_BUCKETS if tag == "polygon" else max(MAX_TIME_BUCKETS, MAX_CDF_POINTS)
            assert n <= budget, (tag, n)
    assert len(text) < 1_000_000


# -- in a real browser ----------------------------------------------------------

def read_png(path: Path) -> npt.NDArray[np.uint8]:
    """Pixels (height, width, channels) of an 8-bit RGB or RGBA PNG, with zlib
    and numpy. Unfiltering runs as a wavefront: pixel (r, c) needs only its
    left, upper and upper-left neighbours, so pixels are decoded in steps of
    equal ``row_offset + c``. Rows filtered None or Sub do not read the row
    above, so each starts a segment (row offset 0) and segments go side by side."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, 1 + width * channels)
    ftype = rows[:, 0].astype(np.intp)
    residual = np.zeros((height * width, 4), np.uint8)  # pixels padded to 4 bytes: one uint32 each
    residual[:, :channels] = rows[:, 1:].reshape(height * width, channels)
    res32 = residual.view(np.uint32).reshape(-1)
    anchor = ftype <= 1
    anchor[0] = True
    offset = np.arange(height) - np.maximum.accumulate(np.where(anchor, np.arange(height), 0))
    order = np.argsort(offset, kind="stable")
    offsets = offset[order]
    stride = width + 1  # decoded image has a zero row above and a zero column left
    out_base = (order + 1) * stride + 1 - offsets
    res_base = order * width - offsets
    filters = ftype[order][:, None]
    steps = np.arange(int(offsets[-1]) + width)
    lo = np.searchsorted(offsets, steps - width + 1)
    hi = np.searchsorted(offsets, steps + 1)
    out = np.zeros((height + 1) * stride, np.uint32)

    def pixels(v: npt.NDArray[np.uint32]) -> npt.NDArray[np.int16]:
        return v.view(np.uint8).reshape(-1, 4).astype(np.int16)

    for s, i, j in zip(steps.tolist(), lo.tolist(), hi.tolist()):
        at = out_base[i:j] + s
        a, b, c = pixels(out[at - 1]), pixels(out[at - stride]), pixels(out[at - stride - 1])
        pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        f = filters[i:j]
        pred = np.where(f == 4, paeth,
                        np.where(f == 2, b, np.where(f == 1, a, np.where(f == 3, (a + b) >> 1, 0))))
        out[at] = (pixels(res32[res_base[i:j] + s]) + pred).astype(np.uint8).view(np.uint32).reshape(-1)
    return out.view(np.uint8).reshape(height + 1, stride, 4)[1:, 1:, :channels]


def test_read_png_round_trip(tmp_path: Path) -> None:
    # Every filter type, on random pixels, against an encoder written from the spec.
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)
    raw = bytearray()
    prior = np.zeros(7 * 3, np.int16)
    for r in range(9):
        row = image[r].reshape(-1).astype(np.int16)
        ftype = r % 5
        left = np.concatenate([np.zeros(3, np.int16), row[:-3]])
        upleft = np.concatenate([np.zeros(3, np.int16), prior[:-3]])
        if ftype == 4:
            p = left + prior - upleft
            pa, pb, pc = np.abs(p - left), np.abs(p - prior), np.abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prior, upleft))
        else:
            pred = [np.zeros_like(row), left, prior, (left + prior) >> 1][ftype]
        raw += bytes([ftype]) + ((row - pred) & 255).astype(np.uint8).tobytes()
        prior = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = tmp_path / "t.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 7, 9, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))
    assert np.array_equal(read_png(png), image)


def test_renders_in_headless_chromium(tmp_path: Path, small: SimResult, roomy: SimResult,
                                      chromium: str) -> None:
    report = tmp_path / "report.html"
    write_report(report, [("small", small), ("roomy", roomy)], "Rendered", CONFIG)
    shot = tmp_path / "shot.png"
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
               "--window-size=1200,3000", report.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert shot.is_file() and shot.stat().st_size > 0, f"no screenshot; chromium said:\n{done.stderr[-3000:]}"
    image = read_png(shot)
    assert image.shape[:2] == (3000, 1200)
    rgb = image[:, :, :3].reshape(-1, 3).astype(np.int64)
    colours, counts = np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2], return_counts=True)
    assert len(colours) > 100, f"only {len(colours)} colours: blank page?"
    assert counts.max() < 0.9 * len(rgb), "one colour covers 90% of the page"
    # Both results' colours are painted (swatches, legends and chart lines).
    for colour in PALETTE[:2]:
        painted = int(counts[colours == int(colour[1:], 16)].sum())
        assert painted > 500, f"{colour}: {painted} pixels"


def test_the_settings_name_the_vllm_release(small: SimResult) -> None:
    from kvsched.sim.deployment import EngineOptions, build_deployment
    from kvsched.sim.results import describe_run
    from kvsched.sim.spec import RunSpec, WorkloadSpec

    # A release other than the default (0.34), so the cells follow the spec.
    spec = RunSpec(workload=WorkloadSpec(num_prompts=50)).with_engine(vllm_version="0.33", max_model_len=4096)
    workload = random_workload(num_prompts=50, input_len=512, output_len=64, range_ratio=0.5, seed=1)
    description = describe_run(build_deployment(spec.engine), spec.with_workload(
        random_input_len=512, random_output_len=64, random_range_ratio=0.5, random_prefix_len=0,
        request_rate=float("inf"), burstiness=1.0, seed=1), workload)
    text = render_report([("only", small)], "Release", CONFIG, descriptions=[description])
    assert _cell(text, "vllm.version", 0) == "0.33"
    assert _cell(text, "cache.block_size", 0) == "16"
    assert EngineOptions().vllm_version == "0.34"  # the default (newest modelled) release names itself too
