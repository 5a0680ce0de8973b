"""Measured kernel tables: the interpolation rules on hand-made data, and the
values read from aiconfigurator-core's h100_sxm vLLM tables (expected values
copied by hand from the parquet files)."""

from __future__ import annotations

import pytest

from kvsched.perf.kernels import AttentionKey, Curve, Grid2D, leave_one_out_errors, load_tables

MS = 1e-3


def test_curve_is_linear_between_points_flat_below_and_proportional_above() -> None:
    c = Curve([2, 4, 8], [10.0, 20.0, 24.0])
    assert c(3) == pytest.approx(15.0)
    assert c(6) == pytest.approx(22.0)
    assert c(4) == 20.0
    assert c(1) == 10.0          # a kernel takes no less than its smallest measurement
    assert c(16) == pytest.approx(48.0)  # past the end: ∝ x


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


def test_leave_one_out_error_stays_small(h100: object) -> None:
    # Each measured point predicted from the others (its neighbours twice as
    # far apart as in use): the medians of docs/validation.md.
    from kvsched.perf.kernels import KernelTables

    assert isinstance(h100, KernelTables)
    results = leave_one_out_errors(h100, "bfloat16") + leave_one_out_errors(h100, "fp8")[:2]
    assert len(results) == 9
    for r in results:
        assert r.points > 50, r
        assert r.median_abs_error < 0.06, r
        assert r.p90_abs_error < 0.2, r
