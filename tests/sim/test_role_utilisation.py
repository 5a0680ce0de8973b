"""Per-role utilisation: each role's engine cores over the whole run, from
hand-made step totals (expected values worked out by hand)."""

from __future__ import annotations

import pytest

from kvsched.sim.metrics import RecordTable
from kvsched.sim.rank import SimResult, StepTotals
from kvsched.sim.results import role_utilisation
from kvsched.sim.samples import SampleAccumulator


def core(totals: StepTotals, ranks: list[SimResult] | None = None) -> SimResult:
    return SimResult(workload="w", records=RecordTable(), failed=[], itls=SampleAccumulator(),
                     token_times=SampleAccumulator(), totals=totals, steps=None, num_gpu_blocks=100,
                     num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
                     num_fast_forwarded_steps=0, wall_seconds=0.0, ranks=ranks or [])


def test_busy_fraction_batch_and_kv_usage_per_role() -> None:
    # Prefill: one core, two steps of 1 s (4 and 2 requests, 1000 and 500 tokens), free 50 then 80 of 100.
    p = StepTotals(usable_blocks=100)
    p.add(end=1.0, dt=1.0, num_reqs=4, num_tokens=1000, prefill_tokens=1000, free_blocks=50)
    p.add(end=3.0, dt=1.0, num_reqs=2, num_tokens=500, prefill_tokens=500, free_blocks=80)
    # Decode: one instance of two DP ranks; rank 0 steps 2 s until t=4 (the run's end), rank 1 never.
    d0 = StepTotals(usable_blocks=100)
    d0.add(end=4.0, dt=2.0, num_reqs=6, num_tokens=6, prefill_tokens=0, free_blocks=90)
    d1 = StepTotals(usable_blocks=100)
    decode = core(d0, [core(d0), core(d1)])
    use = role_utilisation({"prefill": [core(p)], "decode": [decode]})
    assert use["prefill"] == pytest.approx({
        "engine_cores": 1, "num_steps": 2, "busy_fraction": 2 / 4, "mean_batch_size": 3.0,
        "mean_tokens_per_step": 750.0, "mean_kv_cache_usage": (0.5 + 0.2) / 2, "max_kv_cache_usage": 0.5})
    assert use["decode"] == pytest.approx({
        "engine_cores": 2, "num_steps": 1, "busy_fraction": 2 / (4 * 2), "mean_batch_size": 6.0,
        "mean_tokens_per_step": 6.0, "mean_kv_cache_usage": 0.1, "max_kv_cache_usage": 0.1})


def test_a_role_that_never_stepped_is_idle() -> None:
    use = role_utilisation({"prefill": [core(StepTotals(usable_blocks=10))]})
    assert use["prefill"]["busy_fraction"] == 0.0 and use["prefill"]["num_steps"] == 0


def test_simulate_prints_each_roles_utilisation() -> None:
    from kvsched.commands.simulate import format_table

    def role(cores: int, busy: float) -> dict[str, float]:
        return {"engine_cores": cores, "num_steps": 10, "busy_fraction": busy, "mean_batch_size": 3.5,
                "mean_tokens_per_step": 700.0, "mean_kv_cache_usage": 0.25, "max_kv_cache_usage": 0.5}
    lines = format_table({"role_utilisation": {"prefill": role(1, 0.2), "decode": role(2, 0.75)}},
                         (99.0,)).splitlines()
    prefill = next(i for i, line in enumerate(lines) if "Utilisation (prefill, 1 engine cores)" in line)
    decode = next(i for i, line in enumerate(lines) if "Utilisation (decode, 2 engine cores)" in line)
    assert prefill < decode
    assert any("Busy fraction:" in line and "20.0%" in line for line in lines[prefill:decode])
    assert any("Busy fraction:" in line and "75.0%" in line for line in lines[decode:])
    assert any("Mean / max KV cache usage:" in line and "25.0% / 50.0%" in line for line in lines[decode:])
