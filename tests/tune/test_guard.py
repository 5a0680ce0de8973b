"""The early stop is a shortcut: it must never stop a run that meets its SLO.
Differential check against the full simulation on random runs and SLOs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.sim.flags import parse_spec
from kvsched.sim.metrics import RecordTable
from kvsched.tune.evaluate import Job, run_job
from kvsched.tune.guard import SloGuard, SloMissed
from kvsched.tune.search import Slo


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(num_prompts=st.integers(5, 60), input_len=st.sampled_from([64, 256, 1024]),
       output_len=st.integers(1, 40), rate=st.sampled_from([2.0, 8.0, 32.0, 1e9]),
       max_num_seqs=st.sampled_from([2, 8, 64]), dp=st.sampled_from([1, 2]),
       percentile=st.sampled_from(["mean", "50", "90", "99"]),
       ttft=st.sampled_from([None, 20.0, 60.0, 200.0, 1000.0]),
       tpot=st.sampled_from([None, 5.0, 8.0, 12.0, 40.0]),
       e2el=st.sampled_from([None, 100.0, 500.0, 3000.0]))
def test_a_stopped_run_misses_its_slo_and_a_finished_one_is_unchanged(
        num_prompts: int, input_len: int, output_len: int, rate: float, max_num_seqs: int, dp: int,
        percentile: str, ttft: float | None, tpot: float | None, e2el: float | None) -> None:
    targets = tuple((n, t) for n, t in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)) if t is not None)
    if not targets:
        targets = (("ttft", 50.0),)
    argv = ("--model", "meta-llama/Llama-3.1-8B", "--num-prompts", str(num_prompts),
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0.5", "--request-rate", repr(rate), "--max-num-seqs",
            str(max_num_seqs), "--data-parallel-size", str(dp))
    slo = Slo(targets, percentile)
    spec = parse_spec(argv).with_options(percentiles=slo.percentiles(), goodput=targets)
    full = run_job(Job(spec))
    guarded = run_job(Job(spec, guard=percentile))
    met = slo.met(full["metrics"])
    if "missed" in guarded:
        assert not met, f"the guard stopped a run that meets {targets} at {percentile}: {guarded}"
    else:
        assert guarded["metrics"] == full["metrics"]
    if met:
        assert "missed" not in guarded


def _cluster(rows: list[tuple[float, float, float, int]]) -> SimpleNamespace:
    """One rank whose finished requests are ``(send, first token, finish,
    output tokens)``."""
    records = RecordTable()
    for i, (send, first, finish, out) in enumerate(rows):
        records.append(str(i), send, first, finish, 16, out, send)
    return SimpleNamespace(ranks=[SimpleNamespace(records=records)])


def test_the_guard_measures_tpot_from_the_first_token() -> None:
    # A 2 s wait for the first token, then 10 tokens 10 ms apart: TPOT is
    # 10 ms (from the first token), not ~0.23 s (from the send).
    slow_start = [(0.0, 2.0, 2.09, 10)] * 4
    SloGuard([("tpot", 20.0)], "mean", 4)(_cluster(slow_start))
    SloGuard([("tpot", 20.0)], "99", 4)(_cluster(slow_start))
    # 30 ms between tokens misses a 20 ms target whatever the send time.
    slow_tokens = [(0.0, 0.01, 0.28, 10)] * 4
    with pytest.raises(SloMissed, match="tpot"):
        SloGuard([("tpot", 20.0)], "mean", 4)(_cluster(slow_tokens))
    with pytest.raises(SloMissed, match="tpot"):
        SloGuard([("tpot", 20.0)], "99", 4)(_cluster(slow_tokens))


def test_the_guard_measures_ttft_and_e2el_from_the_send() -> None:
    late = [(5.0, 5.3, 5.4, 2)] * 3  # sent at 5 s: TTFT 300 ms, E2EL 400 ms
    SloGuard([("ttft", 350.0), ("e2el", 450.0)], "mean", 3)(_cluster(late))
    with pytest.raises(SloMissed, match="ttft"):
        SloGuard([("ttft", 250.0)], "mean", 3)(_cluster(late))
    with pytest.raises(SloMissed, match="e2el"):
        SloGuard([("e2el", 350.0)], "mean", 3)(_cluster(late))
