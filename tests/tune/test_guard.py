"""The early stop is a shortcut: it must never stop a run that meets its SLO.
Differential check against the full simulation on random runs and SLOs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.sim.flags import parse_spec
from kvsched.tune.evaluate import Job, run_job
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
