"""Measured vLLM kernel latencies, read from aiconfigurator-core's tables.

aiconfigurator-core (NVIDIA, Apache-2.0, ``pip install -e ".[measured]"``)
ships per-GPU latencies of the kernels vLLM runs, collected by running vLLM's
own layers: ``systems/data/<system>/<op>/vllm/<version>/*.parquet``. kvsched
reads the files rather than calling aiconfigurator's query engine: that
engine prices uniform static batches (one mean context length), while a
kvsched step has its own mix of prefill chunks and decodes, must cost a
microsecond or less when memoised, and must give the very same float every
time (fast-forward is exact only then). So the tables are loaded once per
system and interpolated here, by a scheme this module owns and tests
(leave-one-out, :func:`leave_one_out_errors`):

- GEMM ``(dtype, m, n, k)``: piecewise linear in ``m`` (tokens) along each
  measured ``(n, k)`` curve - the grid has points on both sides of every
  kernel-tile switch (m and m + 1), so the steps are kept. A shape off the
  ``(n, k)`` grid is bilinear between the four surrounding curves, exact for
  a cost of the form a·n·k + b·n + c·k + d.
- Attention ``(batch, length)`` per head configuration: piecewise linear in
  the length (generation: KV tokens; context: prompt tokens) along each
  measured batch size, linear in the batch size between measured ones.
- MLA attention (DeepSeek's latent attention) per heads-per-GPU and KV
  dtype: aiconfigurator times the whole attention block as one module, on
  the same (batch, length) grids as attention, interpolated the same way.
- All-reduce (vLLM's custom all-reduce, CUDA-graph kernel): piecewise linear
  in the message size (elements).
- MoE all-to-all (DeepEP's dispatch and combine, on one node): piecewise
  linear in the tokens per EP rank.

Outside a table nothing is silent: past its largest point a curve goes on
proportionally (latency ∝ m, ∝ length, ∝ batch) and the query is recorded in
the caller's notes (the step-time model reports them).
Table cells the collection skipped (context: batch × length > 131,072;
generation: batch × KV > 1,048,576) are filled the same way from the
largest batch measured at that length, and flagged the same way.
"""

from __future__ import annotations

import bisect
import importlib.resources
import importlib.util
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError

# aiconfigurator-core's name of each kvsched hardware id that has vLLM tables.
AIC_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200",
               "l40s": "l40s", "rtx-pro-6000": "rtx_pro_6000_server"}
# The vLLM table version read (aiconfigurator-core 0.12's ``query_versions``
# current one for these systems).
VLLM_TABLE_VERSION = "0.24.0"
# kvsched's weight / KV dtype names -> the tables' names.
# GEMMs: NVFP4 is measured on Blackwell only (b200_sxm, gb200); MXFP4 and
# int4 checkpoints leave their GEMMs 16-bit, so those have no GEMM table.
# Block-scaled FP8 GEMMs read the per-tensor FP8 table: the block table was
# timed eagerly, one Python-level call per GEMM (activation quantisation and
# the DeepGEMM/CUTLASS kernel launched from the host), and sits on a flat
# floor of 0.06 ms (H100/H200) and 0.17 ms (B200) per call from m=1 to 1024
# for every n x k, host time that vLLM's CUDA graphs (full for decodes,
# piecewise around the linear layers for prefills) do not pay. Above the
# floor the two tables agree (8192 x 16384 x 16384: 2.11 vs 2.05 ms on B200,
# 3.38 vs 3.06 ms on H200).
GEMM_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "bfloat16", "float16": "bfloat16",
               "half": "bfloat16", "auto": "bfloat16", "fp8": "fp8", "fp8_e4m3": "fp8",
               "fp8_block": "fp8", "nvfp4": "nvfp4"}
# Fused MoE: the kernel vLLM runs for each weight format. MXFP4 is timed as
# w4a16_mxfp4 (4-bit weights, 16-bit activations: Marlin on Hopper,
# FlashInfer on Blackwell), int4 as int4_wo (weight-only); nvfp4 is measured
# on Blackwell only.
MOE_DTYPES = {**{k: v for k, v in GEMM_DTYPES.items() if v == "bfloat16"}, "fp8": "fp8",
              "fp8_e4m3": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
              "mxfp4": "w4a16_mxfp4", "int4": "int4_wo"}
KV_DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8",
             "fp8_e4m3": "fp8"}

MS = 1e-3
# A table as its columns (pyarrow's to_pydict: untyped values).
Columns = dict[str, list[Any]]


class Curve:
    """A piecewise-linear function through measured points (x ascending),
    continued proportionally (y ∝ x) past the last point."""

    __slots__ = ("xs", "ys", "slopes")

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        if len(xs) != len(ys) or not xs:
            raise UserInputError("Curve: need as many ys as xs, at least one")
        if any(b <= a for a, b in pairwise(xs)):
            raise UserInputError("Curve: xs must be strictly increasing")
        self.xs = list(xs)
        self.ys = list(ys)
        self.slopes = [(y1 - y0) / (x1 - x0) for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])]

    @property
    def x_max(self) -> float:
        return self.xs[-1]

    def __call__(self, x: float) -> float:
        xs = self.xs
        if x >= xs[-1]:
            return self.ys[-1] * x / xs[-1] if x > xs[-1] else self.ys[-1]
        i = bisect.bisect_right(xs, x) - 1
        if i < 0:  # below the first point: its value (a kernel takes no less)
            return self.ys[0]
        return self.ys[i] + self.slopes[i] * (x - xs[i])

    def ascending(self, points: Sequence[float]) -> list[float]:
        """``[self(x) for x in points]`` for ascending ``points``, the same
        floats, with the segment carried from one point to the next instead
        of searched for each (a decode stretch's mean context only grows)."""
        xs, ys, slopes = self.xs, self.ys, self.slopes
        last_x, last_y, first_y = xs[-1], ys[-1], ys[0]
        top = len(xs) - 1
        i = bisect.bisect_right(xs, points[0]) - 1 if points else 0
        out: list[float] = []
        append = out.append
        for x in points:
            if x >= last_x:
                append(last_y * x / last_x if x > last_x else last_y)
                continue
            while i < top and xs[i + 1] <= x:
                i += 1
            append(first_y if i < 0 else ys[i] + slopes[i] * (x - xs[i]))
        return out


@dataclass(frozen=True, slots=True)
class Grid2D:
    """Latencies over (batch, length), some cells missing: one length curve
    per measured batch size, cells past a row's end filled from the largest
    batch that has them (∝ batch)."""

    batches: list[int]
    rows: dict[int, Curve]         # batch -> latency over length (gaps filled)
    measured_max: dict[int, int]   # batch -> its longest measured length

    @classmethod
    def from_cells(cls, cells: dict[int, dict[int, float]]) -> Grid2D:
        batches = sorted(cells)
        lengths = sorted(set().union(*(r.keys() for r in cells.values())))
        rows = {}
        for b in batches:
            ys = []
            for length in lengths:
                v = cells[b].get(length)
                if v is None:
                    donor = max(x for x in batches if length in cells[x])
                    v = cells[donor][length] * b / donor
                ys.append(v)
            rows[b] = Curve(lengths, ys)
        return cls(batches, rows, {b: max(cells[b]) for b in batches})

    def measured_up_to(self, b: float) -> int:
        """The longest length whose cells are measured in the rows batch
        ``b`` reads; 0 past the largest batch (all extrapolated)."""
        batches = self.batches
        if b > batches[-1]:
            return 0
        i = bisect.bisect_left(batches, b)
        if batches[i] == b:
            return self.measured_max[batches[i]]
        lo = batches[max(0, i - 1)]
        return min(self.measured_max[lo], self.measured_max[batches[i]])

    def batch_curve(self, b: float) -> Curve:
        """The length curve at batch ``b``: linear between measured batches,
        ∝ batch past the largest (a new Curve when blended: callers memoise)."""
        batches = self.batches
        if b <= batches[0]:
            return self.rows[batches[0]]
        if b >= batches[-1]:
            top = self.rows[batches[-1]]
            return top if b == batches[-1] else Curve(top.xs, [y * b / batches[-1] for y in top.ys])
        i = bisect.bisect_left(batches, b)
        if batches[i] == b:
            return self.rows[batches[i]]
        b0, b1 = batches[i - 1], batches[i]
        w = (b - b0) / (b1 - b0)
        r0, r1 = self.rows[b0], self.rows[b1]
        return Curve(r0.xs, [y0 + (y1 - y0) * w for y0, y1 in zip(r0.ys, r1.ys)])


@dataclass(frozen=True, slots=True)
class AttentionKey:
    num_heads: int       # query heads per GPU
    num_kv_heads: int    # KV heads per GPU
    head_dim: int
    kv_dtype: str        # the tables' name: bfloat16 or fp8
    window: int = 0

    def describe(self) -> str:
        """The key in words, for messages."""
        window = f", a {self.window}-token sliding window" if self.window else ""
        return (f"attention with {self.num_heads} query and {self.num_kv_heads} KV heads per GPU, head size "
                f"{self.head_dim}, {self.kv_dtype} KV cache{window}")


@dataclass(frozen=True, slots=True)
class MoeKey:
    """One fused-MoE configuration as the tables key it (one layer's routed
    experts on one GPU)."""

    dtype: str           # the tables' name: bfloat16, fp8, fp8_block, nvfp4, w4a16_mxfp4, ...
    hidden: int
    inter: int           # one expert's intermediate size
    topk: int
    num_experts: int
    moe_tp: int
    moe_ep: int
    # Routing skew the kernel was timed under: aiconfigurator's default for
    # real models (a power law of exponent 1.01 over experts).
    distribution: str = "power_law_1.01"

    def describe(self) -> str:
        """The key in words, for messages."""
        split = (f"expert parallelism over {self.moe_ep} GPUs" if self.moe_ep > 1
                 else f"each expert split over {self.moe_tp} GPUs" if self.moe_tp > 1
                 else "every expert whole on one GPU")
        return (f"{self.dtype} fused MoE: {self.num_experts} experts of {self.hidden} x {self.inter}, "
                f"top-{self.topk}, {split}")


@dataclass(frozen=True, slots=True)
class MlaShape:
    """An MLA attention block's dimensions (DeepSeek's names)."""

    hidden: int
    q_lora_rank: int          # 0: q projected straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def projections(self, heads: int) -> tuple[list[tuple[int, int]], tuple[int, int]]:
        """The block's GEMMs on one GPU with ``heads`` query heads, as (n, k):
        those every token runs (q down and the latent's down projection fused
        into one replicated GEMM, q up, o), and the latent's up-projection to
        per-head K-nope and V, which only prefill runs (decodes absorb it into
        the attention's batched matmuls)."""
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.q_lora_rank:
            per_token = [(self.q_lora_rank + latent, self.hidden), (qk, self.q_lora_rank)]
        else:
            per_token = [(qk, self.hidden), (latent, self.hidden)]
        per_token.append((self.hidden, heads * self.v_head_dim))
        return per_token, (heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank)


# The block aiconfigurator-core timed its vLLM MLA modules on (the tables'
# ``model`` column, deepseek-ai/DeepSeek-V3), heads per GPU varied from 1
# to 128: tensor-parallel shards of DeepSeek-V3 (128 heads) and Kimi-K2.5
# (64 heads) alike.
MLA_TABLE_SHAPE = MlaShape(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                           qk_rope_head_dim=64, v_head_dim=128)


@dataclass(frozen=True, slots=True)
class MlaKey:
    """One MLA module configuration as the tables key it."""

    num_heads: int            # query heads per GPU
    kv_dtype: str             # the tables' name: bfloat16 or fp8
    gemm_dtype: str = "bfloat16"   # the projections': bfloat16, fp8_block, nvfp4

    def describe(self) -> str:
        """The key in words, for messages."""
        return (f"MLA with {self.num_heads} query heads per GPU, {self.kv_dtype} KV cache, "
                f"{self.gemm_dtype} projections")


@dataclass(frozen=True, slots=True)
class A2aKey:
    """One MoE all-to-all configuration as the tables key it (per EP rank)."""

    hidden: int
    topk: int
    num_experts: int
    ep: int


@dataclass(frozen=True, slots=True)
class A2aCurves:
    """DeepEP's dispatch and combine over the tokens of one EP rank: the
    low-latency kernels (decode) and the high-throughput ones (prefill)."""

    ll_dispatch: Curve
    ll_combine: Curve
    ht_dispatch: Curve
    ht_combine: Curve


@dataclass(frozen=True, slots=True)
class GemmTable:
    """One dtype's GEMMs: latency over m per measured (n, k), and the axes."""

    curves: dict[tuple[int, int], Curve]
    ns: list[int]
    ks: list[int]


@dataclass(frozen=True, slots=True)
class KernelTables:
    """One system's measured vLLM kernels (seconds per call, one GPU). Each
    table is read when first needed, only the rows asked for (a parquet
    filter), and kept for the process: a deployment reads a few thousand of
    the tables' ~220,000 rows."""

    system: str
    vllm_version: str
    root: str        # <aiconfigurator_core>/systems/data/<system>

    # -- GEMM -------------------------------------------------------------------
    def gemm_table(self, dtype: str) -> GemmTable:
        """All measured GEMMs of ``dtype`` (empty if none)."""
        return _gemm_table(self.root, self.vllm_version, dtype)

    def gemm_curve(self, dtype: str, n: int, k: int, notes: set[str]) -> Curve:
        """Latency over m for an (n, k) weight: the measured curve, or the
        bilinear blend of the four around it (a new Curve: callers memoise)."""
        table = self.gemm_table(dtype)
        curve = table.curves.get((n, k))
        if curve is not None:
            return curve
        if not table.curves:
            raise UserInputError(f"no measured {dtype} GEMMs on {self.system}")
        (n0, n1, wn), (k0, k1, wk) = _bracket(table.ns, n), _bracket(table.ks, k)
        if n > table.ns[-1] or k > table.ks[-1]:
            notes.add(f"GEMM {dtype} n={n} k={k} past the measured shapes")
        corners = [table.curves.get((a, c)) for a in (n0, n1) for c in (k0, k1)]
        xs = sorted(set().union(*(c.xs for c in corners if c is not None)))
        return Curve(xs, [_bilinear([c(m) if c else None for c in corners], wn, wk) for m in xs])

    # -- attention --------------------------------------------------------------
    def context(self, key: AttentionKey) -> Grid2D | None:
        """Prefill attention over (prompts, prompt length); None if not measured."""
        return _attention(self.root, self.vllm_version, "context", key)

    def generation(self, key: AttentionKey) -> Grid2D | None:
        """Decode attention over (sequences, KV length); None if not measured."""
        return _attention(self.root, self.vllm_version, "generation", key)

    def has_attention(self, key: AttentionKey) -> bool:
        return self.context(key) is not None and self.generation(key) is not None

    # -- MLA ----------------------------------------------------------------------
    def mla_cells(self, kind: str, key: MlaKey) -> dict[int, dict[int, float]]:
        """The measured MLA module latencies, batch -> length -> seconds
        (context: prompt length; generation: KV length), a fresh dict; empty
        if not measured. One module is the whole attention block of
        :data:`MLA_TABLE_SHAPE` from the fused q/latent down projection to o
        (see :func:`_mla`)."""
        cells: dict[int, dict[int, float]] = defaultdict(dict)
        for b, length, lat in _mla(self.root, self.vllm_version, kind, key):
            cells[b][length] = lat
        return dict(cells)

    def mla(self, kind: str, key: MlaKey) -> Grid2D | None:
        """The MLA module over (batch, length); None if not measured."""
        cells = self.mla_cells(kind, key)
        return Grid2D.from_cells(cells) if cells else None

    def has_mla(self, key: MlaKey) -> bool:
        return bool(_mla(self.root, self.vllm_version, "context", key)
                    and _mla(self.root, self.vllm_version, "generation", key))

    # -- MoE ----------------------------------------------------------------------
    def moe(self, key: MoeKey) -> Curve | None:
        """Latency over the tokens entering the layer; None if not measured."""
        return _moe(self.root, self.vllm_version, key)

    # -- collectives ------------------------------------------------------------
    def allreduce_curves(self) -> dict[int, Curve]:
        """GPUs -> latency over the message size (elements), vLLM's custom
        all-reduce as captured in CUDA graphs."""
        return _allreduce(self.root, self.vllm_version)

    def allreduce_curve(self, num_gpus: int) -> Curve:
        curves = self.allreduce_curves()
        curve = curves.get(num_gpus)
        if curve is None:
            raise UserInputError(f"no measured all-reduce over {num_gpus} GPUs on {self.system}; "
                             f"measured: {sorted(curves)}")
        return curve

    def all_to_all(self, key: A2aKey) -> A2aCurves | None:
        """DeepEP's MoE dispatch and combine for this shape on one node;
        None if the table (or the shape, or the EP size) is not measured."""
        return _all_to_all(self.root, self.vllm_version, key)


def _bilinear(v: list[float | None], wn: float, wk: float) -> float:
    """Blend (n0 k0, n0 k1, n1 k0, n1 k1) values; the collection skipped one
    corner of the grid (the largest n with the largest k): a missing corner
    is the plane through the other three."""
    v00, v01, v10, v11 = v
    if v11 is None and v00 is not None and v01 is not None and v10 is not None:
        v11 = v10 + v01 - v00
    if v00 is None or v01 is None or v10 is None or v11 is None:
        raise UserInputError("GEMM grid: more than one corner missing around the shape")
    return (v00 * (1 - wk) + v01 * wk) * (1 - wn) + (v10 * (1 - wk) + v11 * wk) * wn


def _bracket(grid: list[int], x: int) -> tuple[int, int, float]:
    """(lower, upper, weight of upper) around ``x`` on a sorted grid; past an
    end the end pair, extrapolated linearly."""
    i = bisect.bisect_left(grid, x)
    if i < len(grid) and grid[i] == x:
        return x, x, 0.0
    i = min(max(i, 1), len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    return lo, hi, (x - lo) / (hi - lo)


def measured_available() -> bool:
    """Whether aiconfigurator-core (the tables) and pyarrow (their reader) are installed."""
    return (importlib.util.find_spec("aiconfigurator_core") is not None
            and importlib.util.find_spec("pyarrow") is not None)


def aic_data_dir() -> Path:
    if not measured_available():
        raise UserInputError("the measured step-time backend needs aiconfigurator-core's tables: "
                         "pip install -e \".[measured]\" (or use --step-time-backend roofline)")
    return Path(str(importlib.resources.files("aiconfigurator_core"))) / "systems" / "data"


def system_for(hardware_id: str) -> str | None:
    """aiconfigurator-core's system name for a kvsched hardware id (None: no tables)."""
    return AIC_SYSTEMS.get(hardware_id)


def load_tables(system: str, version: str = VLLM_TABLE_VERSION) -> KernelTables:
    """One system's vLLM tables (read lazily, see :class:`KernelTables`)."""
    root = aic_data_dir() / system
    if not root.is_dir():
        raise UserInputError(f"aiconfigurator-core has no tables for system {system!r}")
    return KernelTables(system, version, str(root))


def _read(root: str, rel: str, columns: list[str], where: dict[str, Any] | None = None) -> Columns:
    """Columns of a table, rows where each ``where`` column equals the value
    (or is in it, for a tuple). Filtered after reading: pyarrow's dataset
    filters cost 0.25 s of set-up, the whole table reads in 15 ms."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    path = Path(root) / rel
    if not path.is_file():
        raise UserInputError(f"missing measured table {path}")
    where = where or {}
    table = pq.read_table(path, columns=sorted(set(columns) | set(where)), use_threads=False)
    if where:
        mask = None
        for column, value in where.items():
            test = (pc.is_in(table[column], value_set=_pa_array(value)) if isinstance(value, tuple)
                    else pc.equal(table[column], value))
            mask = test if mask is None else pc.and_(mask, test)
        table = table.filter(mask)
    selected: Columns = table.select(columns).to_pydict()
    return selected


def _pa_array(values: tuple[Any, ...]) -> Any:
    import pyarrow as pa

    return pa.array(list(values))


# The memos below hold immutable tables read from immutable files, one per
# (table, selection): a cache, not state.
@cache
def _gemm_table(root: str, version: str, dtype: str) -> GemmTable:
    import numpy as np

    g = _read(root, f"gemm/vllm/{version}/gemm_perf.parquet", ["m", "n", "k", "latency"],
              {"gemm_dtype": dtype})
    n, k, m = (np.asarray(g[c], dtype=np.int64) for c in ("n", "k", "m"))
    lat = np.asarray(g["latency"], dtype=np.float64) * MS
    if not len(n):
        return GemmTable({}, [], [])
    order = np.lexsort((m, k, n))
    n, k, m, lat = n[order], k[order], m[order], lat[order]
    # One curve per run of equal (n, k), built from array slices (35,000
    # rows per dtype: a Python loop per row would cost 0.3 s per run).
    starts = np.flatnonzero(np.r_[True, (np.diff(n) != 0) | (np.diff(k) != 0)])
    ends = np.r_[starts[1:], len(n)]
    curves = {(int(n[a]), int(k[a])): Curve(m[a:b].tolist(), lat[a:b].tolist())
              for a, b in zip(starts.tolist(), ends.tolist())}
    # The collection is a full (n, k) cross product but a corner; _bilinear
    # fills one missing corner (the tests check the grid).
    return GemmTable(curves, sorted({x for x, _ in curves}), sorted({y for _, y in curves}))


# vLLM's default kernel per GPU generation (FA3 on Hopper; FlashInfer's
# TRT-LLM kernels or Triton on Blackwell). The tables add a few FA4 rows,
# which vLLM 0.24 does not pick by default.
_DEFAULT_ATTENTION_KERNELS = ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill",
                              "vllm_flashinfer_trtllmdecode", "vllm_triton_attn")


@cache
def _attention(root: str, version: str, kind: str, key: AttentionKey) -> Grid2D | None:
    length_col = "isl" if kind == "context" else "step"
    t = _read(root, f"attention/vllm/{version}/{kind}_attention_perf.parquet",
              ["kernel_source", "batch_size", length_col, "latency"],
              {"num_heads": key.num_heads, "num_key_value_heads": key.num_kv_heads,
               "head_dim": key.head_dim, "kv_cache_dtype": key.kv_dtype, "window_size": key.window,
               "kernel_source": _DEFAULT_ATTENTION_KERNELS})
    cells: dict[int, dict[int, float]] = defaultdict(dict)
    # Generation rows give the step; the KV read is step + 1 tokens.
    extra = 1 if kind == "generation" else 0
    for b, length, lat in zip(t["batch_size"], t[length_col], t["latency"]):
        cells[int(b)].setdefault(int(length) + extra, float(lat) * MS)
    return Grid2D.from_cells(cells) if cells else None


def attention_keys(tables: KernelTables, kind: str) -> list[AttentionKey]:
    """Every head configuration measured (for leave-one-out over all)."""
    t = _read(tables.root, f"attention/vllm/{tables.vllm_version}/{kind}_attention_perf.parquet",
              ["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "window_size"])
    return sorted({AttentionKey(int(h), int(kv), int(d), str(dt), int(w))
                   for h, kv, d, dt, w in zip(t["num_heads"], t["num_key_value_heads"], t["head_dim"],
                                              t["kv_cache_dtype"], t["window_size"])},
                  key=lambda k: (k.num_heads, k.num_kv_heads, k.head_dim, k.kv_dtype, k.window))


@cache
def _moe(root: str, version: str, key: MoeKey) -> Curve | None:
    t = _read(root, f"moe/vllm/{version}/moe_perf.parquet", ["num_tokens", "latency"],
              {"moe_dtype": key.dtype, "hidden_size": key.hidden, "inter_size": key.inter,
               "topk": key.topk, "num_experts": key.num_experts, "moe_tp_size": key.moe_tp,
               "moe_ep_size": key.moe_ep, "distribution": key.distribution})
    by_tokens: dict[int, float] = {}
    for tokens, lat in zip(t["num_tokens"], t["latency"]):
        by_tokens.setdefault(int(tokens), float(lat) * MS)
    if not by_tokens:
        return None
    xs = sorted(by_tokens)
    return Curve(xs, [by_tokens[x] for x in xs])


@cache
def _allreduce(root: str, version: str) -> dict[int, Curve]:
    t = _read(root, f"comm/vllm/{version}/custom_allreduce_perf.parquet",
              ["num_gpus", "message_size", "latency"], {"kernel_source": "vLLM_custom_graph"})
    by_gpus: dict[int, dict[int, float]] = defaultdict(dict)
    for gpus, size, lat in zip(t["num_gpus"], t["message_size"], t["latency"]):
        by_gpus[int(gpus)][int(size)] = float(lat) * MS
    return {g: Curve(sorted(v), [v[s] for s in sorted(v)]) for g, v in by_gpus.items()}


@cache
def _mla(root: str, version: str, kind: str, key: MlaKey) -> tuple[tuple[int, int, float], ...]:
    """(batch, length, seconds) of one MLA module configuration, sorted.

    A row times vLLM's whole MLA attention block (DeepSeek-V3's, at tensor
    parallelism 1 with ``num_heads`` heads standing for a TP shard): the
    fused q/latent down projection, the q and latent RMSNorms, q up, RoPE and
    the KV-cache write, the attention (context: the latent's up-projection,
    then the un-absorbed prefill kernel; generation: the absorbed batched
    matmuls around the latent decode kernel) and o. It leaves out the
    layer's input norm and the TP all-reduce. (Checked against the GEMM
    table: the module less its projections is positive and grows with the
    heads and the length; aiconfigurator's own DeepSeek model swaps exactly
    down/q/kv/attention/o GEMMs for it.) Rows of 16-bit attention math
    (``mla_dtype``), vLLM's default; each cell has one kernel, the one vLLM
    ran there (the decode kernel for prompts under the backend's
    decode-length threshold, FlashAttention above it on Hopper and B200).
    Generation rows give the step; the KV read is step + isl (= 1) tokens.
    """
    rel = f"mla/vllm/{version}/mla_{kind}_module_perf.parquet"
    if not (Path(root) / rel).is_file():
        return ()
    t = _read(root, rel, ["kernel_source", "batch_size", "isl", "step", "latency"],
              {"mla_dtype": "bfloat16", "kv_cache_dtype": key.kv_dtype, "gemm_type": key.gemm_dtype,
               "num_heads": key.num_heads, "tp_size": 1})
    cells: dict[tuple[int, int], float] = {}
    rows = sorted(zip(t["kernel_source"], t["batch_size"], t["isl"], t["step"], t["latency"]))
    for _kernel, b, isl, step, lat in rows:
        length = int(isl) if kind == "context" else int(step) + int(isl)
        cells.setdefault((int(b), length), float(lat) * MS)
    return tuple((b, length, lat) for (b, length), lat in sorted(cells.items()))


def mla_keys(tables: KernelTables) -> list[MlaKey]:
    """Every MLA module configuration measured in both phases (16-bit
    attention math), for leave-one-out over all."""
    keys: set[MlaKey] = set()
    for kind in ("context", "generation"):
        rel = f"mla/vllm/{tables.vllm_version}/mla_{kind}_module_perf.parquet"
        if not (Path(tables.root) / rel).is_file():
            return []
        t = _read(tables.root, rel, ["num_heads", "kv_cache_dtype", "gemm_type"], {"mla_dtype": "bfloat16"})
        found = {MlaKey(int(h), str(kv), str(g))
                 for h, kv, g in zip(t["num_heads"], t["kv_cache_dtype"], t["gemm_type"])}
        keys = found if kind == "context" else keys & found
    return sorted(keys, key=lambda k: (k.gemm_dtype, k.kv_dtype, k.num_heads))


# The all-to-all table's microseconds (its ``latency`` repeats
# ``transmit_us``; the other tables are in milliseconds).
US = 1e-6


@cache
def _all_to_all(root: str, version: str, key: A2aKey) -> A2aCurves | None:
    """DeepEP as vLLM's wide-EP deployments run it (``--all2all-backend
    deepep_low_latency`` / ``deepep_high_throughput``), timed on one node:
    per kernel, latency over the tokens one EP rank sends (dispatch) or gets
    back (combine), in the default wire dtype."""
    rel = f"comm/vllm/{version}/moe_a2a_perf.parquet"
    if not (Path(root) / rel).is_file():
        return None
    t = _read(root, rel, ["comm_backend", "phase", "num_tokens", "latency"],
              {"comm_backend": ("deepep_ll", "deepep_ht"), "comm_dtype": "default", "node_num": 1,
               "ep_size": key.ep, "hidden_size": key.hidden, "topk": key.topk,
               "num_experts": key.num_experts})
    points: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for backend, phase, tokens, lat in zip(t["comm_backend"], t["phase"], t["num_tokens"], t["latency"]):
        points[(str(backend), str(phase))].setdefault(int(tokens), float(lat) * US)
    curves = {}
    for part in (("deepep_ll", "dispatch"), ("deepep_ll", "combine"),
                 ("deepep_ht", "dispatch"), ("deepep_ht", "combine")):
        p = points.get(part)
        if not p:
            return None
        xs = sorted(p)
        curves[part] = Curve(xs, [p[x] for x in xs])
    return A2aCurves(curves[("deepep_ll", "dispatch")], curves[("deepep_ll", "combine")],
                     curves[("deepep_ht", "dispatch")], curves[("deepep_ht", "combine")])


def all_to_all_keys(tables: KernelTables) -> list[A2aKey]:
    """Every MoE shape and EP size the all-to-all table holds (one node)."""
    rel = f"comm/vllm/{tables.vllm_version}/moe_a2a_perf.parquet"
    if not (Path(tables.root) / rel).is_file():
        return []
    t = _read(tables.root, rel, ["hidden_size", "topk", "num_experts", "ep_size"], {"node_num": 1})
    return sorted({A2aKey(int(h), int(k), int(e), int(ep))
                   for h, k, e, ep in zip(t["hidden_size"], t["topk"], t["num_experts"], t["ep_size"])},
                  key=lambda k: (k.hidden, k.topk, k.num_experts, k.ep))


# -- interpolation quality -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class LeaveOneOut:
    table: str
    points: int
    median_abs_error: float
    p90_abs_error: float


def _summary(name: str, errors: list[float]) -> LeaveOneOut:
    errors.sort()
    if not errors:
        return LeaveOneOut(name, 0, float("nan"), float("nan"))
    return LeaveOneOut(name, len(errors), errors[len(errors) // 2], errors[int(len(errors) * 0.9)])


def leave_one_out_errors(tables: KernelTables, dtype: str = "bfloat16") -> list[LeaveOneOut]:
    """Each interior measured point predicted from the others by this
    module's scheme, as |relative error|: GEMM along m, GEMM across (n, k)
    (a whole curve left out, rebuilt from its four neighbours), attention
    and the MLA modules along the length and across batch sizes, all-reduce
    along the size, the MoE all-to-all along the tokens."""
    out = []
    along_m: list[float] = []
    gemm = tables.gemm_table(dtype)
    for curve in gemm.curves.values():
        xs, ys = curve.xs, curve.ys
        for i in range(1, len(xs) - 1):
            # Tile-switch pairs (m, m + 1) predict each other trivially: skip
            # a point whose neighbour is one token away.
            if xs[i] - xs[i - 1] == 1 or xs[i + 1] - xs[i] == 1:
                continue
            w = (xs[i] - xs[i - 1]) / (xs[i + 1] - xs[i - 1])
            guess = ys[i - 1] + (ys[i + 1] - ys[i - 1]) * w
            along_m.append(abs(guess / ys[i] - 1))
    out.append(_summary(f"gemm {dtype}, along m", along_m))
    across: list[float] = []
    ns, ks = gemm.ns, gemm.ks
    for a in range(1, len(ns) - 1):
        for c in range(1, len(ks) - 1):
            n, k = ns[a], ks[c]
            n0, n1, k0, k1 = ns[a - 1], ns[a + 1], ks[c - 1], ks[c + 1]
            wn, wk = (n - n0) / (n1 - n0), (k - k0) / (k1 - k0)
            truth = gemm.curves[(n, k)]
            corners = [gemm.curves.get((x, y)) for x in (n0, n1) for y in (k0, k1)]
            if None in corners:
                continue
            for m in truth.xs[::8]:
                guess = _bilinear([cv(m) for cv in corners if cv is not None], wn, wk)
                across.append(abs(guess / truth(m) - 1))
    out.append(_summary(f"gemm {dtype}, across (n, k)", across))
    for kind in ("context", "generation"):
        along: list[float] = []
        batch: list[float] = []
        for key in attention_keys(tables, kind):
            grid = _attention(tables.root, tables.vllm_version, kind, key)
            if grid is None:  # rows only of kernels vLLM does not pick by default
                continue
            # Measured cells only: a row up to its longest measured length.
            _grid_errors({b: {int(x): y for x, y in zip(c.xs, c.ys) if x <= grid.measured_max[b]}
                          for b, c in grid.rows.items()}, along, batch)
        out.append(_summary(f"{kind} attention, along the length", along))
        out.append(_summary(f"{kind} attention, across batch sizes", batch))
    ar: list[float] = []
    for curve in tables.allreduce_curves().values():
        xs, ys = curve.xs, curve.ys
        for i in range(1, len(xs) - 1):
            w = (xs[i] - xs[i - 1]) / (xs[i + 1] - xs[i - 1])
            ar.append(abs((ys[i - 1] + (ys[i + 1] - ys[i - 1]) * w) / ys[i] - 1))
    out.append(_summary("custom all-reduce, along the size", ar))
    # MLA modules with 16-bit projections (the rows the measured backend reads).
    mla = [k for k in mla_keys(tables) if k.gemm_dtype == "bfloat16"]
    for kind in ("context", "generation"):
        along, batch = [], []
        for mkey in mla:
            _grid_errors(tables.mla_cells(kind, mkey), along, batch)
        out.append(_summary(f"MLA {kind} module, along the length", along))
        out.append(_summary(f"MLA {kind} module, across batch sizes", batch))
    a2a: list[float] = []
    for akey in all_to_all_keys(tables):
        curves = tables.all_to_all(akey)
        if curves is None:
            continue
        for curve in (curves.ll_dispatch, curves.ll_combine, curves.ht_dispatch, curves.ht_combine):
            xs, ys = curve.xs, curve.ys
            for i in range(1, len(xs) - 1):
                w = (xs[i] - xs[i - 1]) / (xs[i + 1] - xs[i - 1])
                a2a.append(abs((ys[i - 1] + (ys[i + 1] - ys[i - 1]) * w) / ys[i] - 1))
    out.append(_summary("MoE all-to-all (DeepEP), along the tokens", a2a))
    return out


def _grid_errors(measured: dict[int, dict[int, float]], along: list[float], batch: list[float]) -> None:
    """Leave-one-out over one (batch, length) table's measured cells: each
    interior cell from its neighbours along the length (into ``along``) and
    across batch sizes (into ``batch``)."""
    for row in measured.values():
        ls = sorted(row)
        for i in range(1, len(ls) - 1):
            w = (ls[i] - ls[i - 1]) / (ls[i + 1] - ls[i - 1])
            guess = row[ls[i - 1]] + (row[ls[i + 1]] - row[ls[i - 1]]) * w
            along.append(abs(guess / row[ls[i]] - 1))
    bs = sorted(measured)
    for i in range(1, len(bs) - 1):
        r0, r, r1 = measured[bs[i - 1]], measured[bs[i]], measured[bs[i + 1]]
        w = (bs[i] - bs[i - 1]) / (bs[i + 1] - bs[i - 1])
        for length in r:
            if length in r0 and length in r1:
                guess = r0[length] + (r1[length] - r0[length]) * w
                batch.append(abs(guess / r[length] - 1))
