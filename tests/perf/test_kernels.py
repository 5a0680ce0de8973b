"""Measured kernel tables: the interpolation rules on hand-made data, and the
values read from aiconfigurator-core's vLLM tables (h100_sxm: expected values
copied by hand from the parquet files; b200_sxm's MLA modules and all-to-all:
against the rows as pyarrow reads them here)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.perf.kernels import (
    MLA_TABLE_SHAPE,
    A2aKey,
    AttentionKey,
    Curve,
    Grid2D,
    KernelTables,
    MlaKey,
    aic_data_dir,
    leave_one_out_errors,
    load_tables,
    mla_keys,
)

MS = 1e-3


def test_curve_is_linear_between_points_flat_below_and_proportional_above() -> None:
    c = Curve([2, 4, 8], [10.0, 20.0, 24.0])
    assert c(3) == pytest.approx(15.0)
    assert c(6) == pytest.approx(22.0)
    assert c(4) == 20.0
    assert c(1) == 10.0          # a kernel takes no less than its smallest measurement
    assert c(16) == pytest.approx(48.0)  # past the end: ∝ x


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.floats(0.0, 40.0, allow_nan=False), max_size=30))
def test_curve_ascending_gives_the_same_floats_as_one_call_per_point(points: list[float]) -> None:
    # points below the first, on measured ones, between and past the last
    c = Curve([2, 4, 8, 16], [10.0, 20.0, 24.0, 31.0])
    points = sorted([*points, 2.0, 4.0, 16.0])
    assert c.ascending(points) == [c(x) for x in points]
    assert c.ascending([]) == []


def test_curve_rejects_bad_points() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Curve([1, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="as many"):
        Curve([1, 2], [1.0])


def test_grid_fills_missing_cells_from_the_largest_batch_that_has_them() -> None:
    # batch 4 was not measured at length 100 (the collection's triangle).
    grid = Grid2D.from_cells({1: {10: 1.0, 100: 5.0}, 2: {10: 1.5, 100: 9.0}, 4: {10: 2.0}})
    assert grid.rows[4](100) == pytest.approx(9.0 * 4 / 2)
    assert grid.measured_up_to(4) == 10
    assert grid.measured_up_to(3) == 10   # reads rows 2 and 4
    assert grid.measured_up_to(2) == 100
    assert grid.measured_up_to(5) == 0    # past the largest batch
    # Between batches: linear in the batch size.
    assert grid.batch_curve(3)(10) == pytest.approx(1.75)
    # Past the largest: ∝ batch.
    assert grid.batch_curve(8)(10) == pytest.approx(4.0)


@pytest.fixture(scope="module")
def h100() -> object:
    return load_tables("h100_sxm")


def test_gemm_reads_the_measured_curve_and_interpolates_along_m(h100: object) -> None:
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    curve = h100.gemm_curve("bfloat16", 8192, 8192, set())
    assert curve(512) == pytest.approx(0.087400 * MS, rel=1e-4)
    assert curve(1024) == pytest.approx(0.163956 * MS, rel=1e-4)
    # m = 640 lies between the measured 513 (0.086723 ms) and 768.
    assert curve(640) == pytest.approx((0.086723 + (0.125031 - 0.086723) * 127 / 255) * MS, rel=1e-4)


def test_gemm_off_the_grid_is_bilinear_and_flags_shapes_past_it(h100: object) -> None:
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    notes: set[str] = set()
    lo = h100.gemm_curve("bfloat16", 8192, 8192, notes)(1024)
    hi = h100.gemm_curve("bfloat16", 10240, 8192, notes)(1024)
    mid = h100.gemm_curve("bfloat16", 9216, 8192, notes)(1024)
    assert mid == pytest.approx((lo + hi) / 2)
    assert not notes
    h100.gemm_curve("bfloat16", 128256, 4096, notes)  # an LM head wider than any measured n
    assert any("n=128256" in n for n in notes)
    with pytest.raises(ValueError, match="no measured nvfp4 GEMMs on h100_sxm"):
        h100.gemm_curve("nvfp4", 4096, 4096, notes)


def test_generation_attention_is_linear_in_kv_and_in_batch(h100: object) -> None:
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    grid = h100.generation(AttentionKey(16, 2, 128, "bfloat16"))
    assert grid is not None
    # The table's step is the KV length minus one.
    assert grid.batch_curve(64)(1024) == pytest.approx(0.037355 * MS, rel=1e-4)
    row64 = (0.037355 + 0.057323) / 2
    row128 = (0.061413 + 0.103061) / 2
    assert grid.batch_curve(96)(1536) == pytest.approx((row64 + row128) / 2 * MS, rel=1e-4)


def test_custom_allreduce_uses_the_cuda_graph_kernel(h100: object) -> None:
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    ar = h100.allreduce_curve(4)
    assert ar(524288) == pytest.approx(0.012757 * MS, rel=1e-4)
    assert ar(786432) == pytest.approx((0.012757 + 0.018597) / 2 * MS, rel=1e-4)
    with pytest.raises(ValueError, match="over 3 GPUs"):
        h100.allreduce_curve(3)


def test_gemm_grid_is_a_full_cross_product_but_one_corner(h100: object) -> None:
    # _bilinear fills at most one missing corner; the collection skips only
    # the (65536, 65536) shape.
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    for dtype in ("bfloat16", "fp8", "fp8_block"):
        table = h100.gemm_table(dtype)
        assert len(table.ns) == len(table.ks) == 22
        missing = [(n, k) for n in table.ns for k in table.ks if (n, k) not in table.curves]
        assert missing == [(65536, 65536)], dtype


# ~7 s: an accuracy check, the slow tier.
@pytest.mark.slow
def test_leave_one_out_error_stays_small(h100: object) -> None:
    # Each measured point predicted from the others (its neighbours twice as
    # far apart as in use): the medians of docs/validation.md.
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    results = leave_one_out_errors(h100, "bfloat16") + leave_one_out_errors(h100, "fp8")[:2]
    assert len(results) == 14
    assert sum(r.table.startswith("MLA ") for r in results) == 4
    for r in results:
        assert r.points > 50, r
        if r.table.startswith("MoE all-to-all"):
            # DeepEP's low-latency kernels are not monotone in the tokens at
            # a few dozen (8 tokens 43 µs, 12 tokens 36 µs on h100_sxm).
            assert r.median_abs_error < 0.1 and r.p90_abs_error < 0.3, r
            continue
        assert r.median_abs_error < 0.06, r
        assert r.p90_abs_error < 0.2, r


# -- MLA modules and the MoE all-to-all (b200_sxm) --------------------------------

def _raw(system: str, rel: str, **where: object) -> list[dict[str, Any]]:
    """The rows of one parquet table where each column equals the value,
    read here with pyarrow alone (not through kvsched.perf.kernels)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    rows: list[dict[str, Any]] = pq.read_table(aic_data_dir() / system / rel).to_pylist()
    return [r for r in rows if all(r[c] == v for c, v in where.items())]


MLA_GEN = "mla/vllm/0.24.0/mla_generation_module_perf.parquet"
MLA_CTX = "mla/vllm/0.24.0/mla_context_module_perf.parquet"
A2A = "comm/vllm/0.24.0/moe_a2a_perf.parquet"


@pytest.fixture(scope="module")
def b200() -> KernelTables:
    return load_tables("b200_sxm")


def test_mla_generation_module_reads_its_rows_at_kv_step_plus_one(b200: KernelTables) -> None:
    # Kimi-K2.5 at TP 8: 8 heads per GPU, FP8 KV, 16-bit projections.
    grid = b200.mla("generation", MlaKey(8, "fp8"))
    assert grid is not None
    rows = {r["step"]: r for r in _raw("b200_sxm", MLA_GEN, num_heads=8, kv_cache_dtype="fp8",
                                       gemm_type="bfloat16", mla_dtype="bfloat16", batch_size=16)}
    assert rows[1024]["isl"] == 1
    curve = grid.batch_curve(16)
    assert curve(1025) == pytest.approx(rows[1024]["latency"] * MS, rel=1e-12)
    assert curve(2049) == pytest.approx(rows[2048]["latency"] * MS, rel=1e-12)
    # Linear in the KV between measured steps.
    assert curve(1537) == pytest.approx((rows[1024]["latency"] + rows[2048]["latency"]) / 2 * MS, rel=1e-9)


def test_mla_context_module_reads_its_rows_and_is_linear_in_the_batch(b200: KernelTables) -> None:
    grid = b200.mla("context", MlaKey(8, "fp8"))
    assert grid is not None
    rows = {(r["batch_size"], r["isl"]): r["latency"]
            for r in _raw("b200_sxm", MLA_CTX, num_heads=8, kv_cache_dtype="fp8", gemm_type="bfloat16",
                          mla_dtype="bfloat16")}
    assert grid.batch_curve(4)(2048) == pytest.approx(rows[(4, 2048)] * MS, rel=1e-12)
    assert grid.batch_curve(8)(3072) == pytest.approx(rows[(8, 3072)] * MS, rel=1e-12)
    assert grid.batch_curve(6)(2048) == pytest.approx((rows[(4, 2048)] + rows[(8, 2048)]) / 2 * MS,
                                                      rel=1e-9)


def test_mla_rows_of_16_bit_attention_have_one_kernel_per_cell() -> None:
    # The tables name, per cell, the kernel vLLM ran (the decode kernel for
    # short prompts, FlashAttention above): kvsched reads every kernel's rows,
    # which is sound only if no cell is timed twice.
    for system in ("h100_sxm", "h200_sxm", "b200_sxm"):
        for rel, length in ((MLA_CTX, "isl"), (MLA_GEN, "step")):
            rows = _raw(system, rel, mla_dtype="bfloat16")
            cells = [(r["num_heads"], r["kv_cache_dtype"], r["gemm_type"], r["batch_size"], r[length])
                     for r in rows]
            assert len(cells) == len(set(cells)), (system, rel)


def test_mla_modules_cover_every_heads_per_gpu_of_kimi_and_deepseek_up_to_tp_8() -> None:
    for system in ("h100_sxm", "h200_sxm", "b200_sxm"):
        tables = load_tables(system)
        keys = mla_keys(tables)
        for kv in ("bfloat16", "fp8"):
            heads = {k.num_heads for k in keys if k.kv_dtype == kv and k.gemm_dtype == "bfloat16"}
            assert heads == {1, 2, 4, 8, 16, 32, 64, 128}, (system, kv)
            for h in (64, 32, 16, 8, 128):   # Kimi-K2.5 (64) and DeepSeek-V3 (128) over TP 1..8
                assert tables.has_mla(MlaKey(h, kv)), (system, h, kv)
        assert not tables.has_mla(MlaKey(3, "bfloat16"))


def test_mla_table_shape_lists_deepseek_v3s_projections() -> None:
    # Per GPU at 16 heads: fused q_a + kv_a (1536 + 512 + 64 = 2112 x 7168,
    # replicated), q_b (16 x 192 x 1536), o (7168 x 16 x 128); kv_b (16 x 256 x 512).
    per_token, kv_up = MLA_TABLE_SHAPE.projections(16)
    assert per_token == [(2112, 7168), (3072, 1536), (7168, 2048)]
    assert kv_up == (4096, 512)


def test_all_to_all_reads_deepeps_microseconds_by_kernel(b200: KernelTables) -> None:
    a2a = b200.all_to_all(A2aKey(7168, 8, 256, 8))   # DeepSeek-V3 over EP 8
    assert a2a is not None
    rows = {(r["comm_backend"], r["phase"], r["num_tokens"]): r["latency"]
            for r in _raw("b200_sxm", A2A, hidden_size=7168, topk=8, num_experts=256, ep_size=8)}
    us = 1e-6
    assert a2a.ll_dispatch(8) == pytest.approx(rows[("deepep_ll", "dispatch", 8)] * us, rel=1e-12)
    assert a2a.ll_combine(8) == pytest.approx(rows[("deepep_ll", "combine", 8)] * us, rel=1e-12)
    assert a2a.ht_dispatch(4096) == pytest.approx(rows[("deepep_ht", "dispatch", 4096)] * us, rel=1e-12)
    assert a2a.ht_combine(4096) == pytest.approx(rows[("deepep_ht", "combine", 4096)] * us, rel=1e-12)
    # The table holds one node of 8 GPUs only, and no other shapes.
    assert b200.all_to_all(A2aKey(7168, 8, 256, 4)) is None
    assert b200.all_to_all(A2aKey(7168, 8, 128, 8)) is None
    # No all-to-all table at all on L40S.
    assert load_tables("l40s").all_to_all(A2aKey(7168, 8, 256, 8)) is None
