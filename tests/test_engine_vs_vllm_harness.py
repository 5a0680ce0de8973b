"""benchmarks/engine_vs_vllm.py's pure parts (no vLLM needed): the A B B A
run order, the report's medians, ranges and ratios, the parity prompts and
the first difference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    path = REPO / "benchmarks" / "engine_vs_vllm.py"
    spec = importlib.util.spec_from_file_location("engine_vs_vllm", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while the file runs.
    sys.modules["engine_vs_vllm"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["engine_vs_vllm"]
    return module


def test_run_order_alternates_pairs_across_workloads(harness: ModuleType) -> None:
    order = harness.run_order(["w1", "w2"], 3, ("A", "B"))
    assert [e for _, _, e in order] == list("ABBAAB" "BAABBA")
    assert [(w, k) for w, k, _ in order[:6:2]] == [("w1", 1), ("w1", 2), ("w1", 3)]
    assert {(w, k) for w, k, _ in order} == {(w, k) for w in ("w1", "w2") for k in (1, 2, 3)}


def test_workload_table_medians_ranges_and_ratio(harness: ModuleType) -> None:
    vllm = [{"output_throughput": x, "mean_ttft_ms": t} for x, t in ((100.0, 50.0), (120.0, 40.0),
                                                                      (110.0, 60.0))]
    kvsched = [{"output_throughput": x, "mean_ttft_ms": t} for x, t in ((90.0, 80.0), (70.0, 100.0),
                                                                         (80.0, 90.0))]
    lines = harness.workload_table({"vllm": vllm, "kvsched": kvsched})
    assert lines[0] == "| metric | vLLM (runs: 3) | kvsched (runs: 3) | kvsched/vLLM |"
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines[2:]}
    # Medians 110 and 80: 80 / 110 = 0.727...
    assert rows["output tok/s"] == "| output tok/s | 110 [100-120] | 80.0 [70.0-90.0] | 0.73 |"
    # Medians 50 and 90: 1.8.
    assert rows["mean TTFT ms"] == "| mean TTFT ms | 50.0 [40.0-60.0] | 90.0 [80.0-100] | 1.80 |"
    assert rows["req/s"] == "| req/s | — | — | — |"


def test_ratio_of_zero(harness: ModuleType) -> None:
    assert harness.ratio(0.0, 0.0) is None
    assert harness.ratio(3.0, 2.0) == 1.5
    with pytest.raises(ValueError):
        harness.median_range([])


def test_parity_prompts_are_seeded_and_share_prefixes(harness: ModuleType) -> None:
    a = harness.parity_prompts(32000, 24, seed=5)
    assert a == harness.parity_prompts(32000, 24, seed=5)
    assert a != harness.parity_prompts(32000, 24, seed=6)
    assert all(len(p) >= 16 for p in a) and all(100 <= t < 31900 for p in a for t in p)
    for i in (8, 16):
        half = len(a[i - 1]) // 2
        assert a[i][:half] == a[i - 1][:half]


def test_first_difference_and_compare(harness: ModuleType) -> None:
    c = harness.Completion
    same = c([1, 2, 3], [{"1": -0.1}, {"2": -0.2}, {"3": -0.3}])
    assert harness.first_difference(same, same) is None
    assert harness.first_difference(same, c([1, 2], [])) == 2
    other = c([1, 5, 3], [{"1": -0.1}, {"5": -0.5, "2": -0.6, "9": -3.0}, {"3": -0.3}], [-0.1, -0.5, -0.3])
    mine = c([1, 2, 3], [{"1": -0.15}, {"2": -0.55, "5": -0.58}, {"3": -0.3}], [-0.15, -0.55, -0.3])
    row = harness.compare(10, {"vllm": other, "kvsched": mine})
    assert row["identical"] is False and row["position"] == 1
    # Only position 0 agrees: |-0.1 - -0.15|.
    assert row["max_abs_logprob_diff"] == pytest.approx(0.05)
    assert harness.compare(3, {"vllm": same, "kvsched": same}) == {
        "prompt_len": 3, "identical": True, "max_abs_logprob_diff": None}
    assert row["vllm"] == {"token": 5, "top2": [["5", -0.5], ["2", -0.6]], "gap": 0.1}
    assert row["kvsched"]["top2"] == [["2", -0.55], ["5", -0.58]]
    assert row["kvsched"]["gap"] == pytest.approx(0.03)
