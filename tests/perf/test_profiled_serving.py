"""A profile's serving-path terms: stored in the file (version 2), an old
profile still loads, the profiled backend prices its host time with them by
default (``--calibration`` replaces them) and says which, and a simulated
TPOT moves by exactly the measured gap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.host import HostTerms, save_host_terms
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.serving_fit import RequestSample, ServingFit, StepWindow
from kvsched.perf.step_profile import StepProfile, load_profile, save_profile
from kvsched.perf.step_time import CPU_PER_REQUEST_S, CPU_STEP_S, BatchShape, ParallelConfig, RuntimeConfig

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "tiny_llama_profile.json"  # version 1: written before the serving path was measured
MODEL = str(DATA / "tiny_llama")

SERVING = ServingFit(
    step_s=2e-3, per_sampled_request_s=0.25e-3, arrival_s=5e-3, per_prompt_token_s=4e-6,
    cpu_step_s=CPU_STEP_S, cpu_per_request_s=CPU_PER_REQUEST_S, gap_rows=40, gap_trimmed=1,
    gap_median_abs_error=0.03, gap_p90_abs_error=0.08, gap_median_period_s=0.02, gap_median_elapsed_s=0.015,
    arrival_rows=20, arrival_trimmed=0, arrival_median_abs_error=0.02, arrival_p90_abs_error=0.05)
SAMPLE = RequestSample(point="decode-2x16", prompt_tokens=16, output_tokens=32, idle=False, ttft_s=0.05,
                       prefill=StepWindow(steps=1, elapsed_s=0.03, sampled=2, reqs=2), span_s=0.6,
                       span=StepWindow(steps=31, elapsed_s=0.45, sampled=62, reqs=62))


def with_serving(tmp_path: Path) -> Path:
    prof = load_profile(FIXTURE)
    out = tmp_path / "serving.json"
    save_profile(dataclasses.replace(prof, requests=[SAMPLE], serving=SERVING), out)
    return out


def backend(profile: StepProfile, host: HostTerms | None = None,
            runtime: RuntimeConfig | None = None) -> ProfiledStepTimeModel:
    return ProfiledStepTimeModel(load_model_spec(DATA / "tiny_llama"), get_hardware("h100-sxm"),
                                 ParallelConfig(), runtime or RuntimeConfig(async_scheduling=False), profile,
                                 host=host)


def test_an_old_profile_loads_without_serving_terms() -> None:
    prof = load_profile(FIXTURE)
    assert json.loads(FIXTURE.read_text())["version"] == 1
    assert prof.serving is None and prof.requests == []
    sm = backend(prof)
    assert sm.host is None and sm.host_source == "none"
    assert "no host terms (the profile predates serving-path measurement" in sm.describe_backend()


def test_serving_terms_round_trip(tmp_path: Path) -> None:
    path = with_serving(tmp_path)
    data = json.loads(path.read_text())
    assert data["version"] == 2 and data["serving"]["step_s"] == 2e-3
    prof = load_profile(path)
    assert prof.serving == SERVING and prof.requests == [SAMPLE]
    assert prof.steps == load_profile(FIXTURE).steps


def test_bad_serving_fields_are_one_line_naming_them(tmp_path: Path) -> None:
    data = json.loads(with_serving(tmp_path).read_text())
    drop = object()
    # (where in the file, the value put there or dropped, what the error names)
    cases: list[tuple[tuple[str | int, ...], object, str]] = [
        (("serving", "step_s"), -1.0, "serving.step_s=-1.0"),
        (("serving", "arrival_s"), 5.0, "serving.arrival_s=5.0"),
        (("serving", "gap_rows"), drop, "missing gap_rows"),
        (("requests", 0, "span_s"), "x", "requests[0].span_s='x'"),
        (("requests", 0, "idle"), 1, "requests[0].idle=1"),
        (("requests",), drop, "missing field 'requests'")]
    for where, value, expect in cases:
        bad = json.loads(json.dumps(data))
        node = bad
        for key in where[:-1]:
            node = node[key]
        if value is drop:
            node.pop(where[-1])
        else:
            node[where[-1]] = value
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(UserInputError) as e:
            load_profile(p)
        assert expect in str(e.value) and "\n" not in str(e.value) and "kvsched profile" in str(e.value)


def test_the_profiles_serving_path_prices_the_host_time_by_default(tmp_path: Path) -> None:
    prof = load_profile(with_serving(tmp_path))
    sm = backend(prof)
    assert sm.host_source == "profile" and sm.host is not None
    assert (sm.host.step_s, sm.host.per_sampled_request_s, sm.host.arrival_s, sm.host.per_prompt_token_s) \
        == (2e-3, 0.25e-3, 5e-3, 4e-6)
    old = backend(load_profile(FIXTURE))
    decode = BatchShape.decode(8, 8 * 300)
    assert sm.step_time(decode) - old.step_time(decode) == pytest.approx(2e-3 + 8 * 0.25e-3, rel=1e-9)
    assert sm.decode_step_times(8, 8 * 300, 8, 3) == [sm.step_time(BatchShape.decode(8, 8 * 300 + 8 * j))
                                                      for j in range(3)]
    # The iteration clock's part is the fit alone.
    assert sm.forward_time(decode) == old.forward_time(decode)
    text = sm.describe_backend()
    assert ("host terms: the serving path the profile measured (step_s 2 ms, per_sampled_request_s 250 us, "
            "arrival_s 5 ms, per_prompt_token_s 4 us;") in text
    # Another CPU time per step in the simulation: the measured gap stays whole.
    other = backend(prof, runtime=RuntimeConfig(async_scheduling=False, cpu_step_s=1e-3))
    assert other.host is not None and other.host.step_s == pytest.approx(1.5e-3)
    assert other.step_time(decode) == pytest.approx(sm.step_time(decode), rel=1e-9)


def test_a_calibration_replaces_them_and_says_so(tmp_path: Path) -> None:
    prof = load_profile(with_serving(tmp_path))
    given = HostTerms(prefill_step_per_layer_s=0.0, vllm_version="0.32.0", hardware_class="cpu",
                      provenance="kvsched calibrate on run.json", step_s=1e-3, per_prefill_token_s=3e-6)
    sm = backend(prof, host=given)
    assert sm.host == given and sm.host_source == "given"
    # Every term the file prices is named, the prefill ones too.
    assert ("host terms given (kvsched calibrate on run.json: step_s 1 ms, per_prefill_token_s 3 us)"
            in sm.describe_backend())
    # The same terms again (calibrate's candidates): still the profile's.
    mine = backend(prof)
    assert mine.host is not None
    assert mine.with_host(mine.host).describe_backend() == mine.describe_backend()


def _tpot(tmp_path: Path, profile: Path, extra: list[str]) -> tuple[float, float, dict[str, object]]:
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    # One request alone: its TPOT is the mean decode step, its TTFT one prefill.
    assert main(["simulate", "--model", MODEL, "--step-time-profile", str(profile), "--no-async-scheduling",
                 "--max-model-len", "4096", "--max-num-batched-tokens", "512", "--max-num-seqs", "64",
                 "--num-prompts", "1", "--random-input-len", "200", "--random-output-len", "33",
                 "--no-progress", "--save-result", str(out), *extra]) == 0
    result = json.loads(out.read_text())
    return result["mean_tpot_ms"], result["mean_ttft_ms"], result["deployment"]["step_times"]


def test_a_simulated_tpot_moves_by_the_measured_gap(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    served = with_serving(tmp_path)
    tpot_old, ttft_old, _ = _tpot(tmp_path, FIXTURE, [])
    tpot_new, ttft_new, st = _tpot(tmp_path, served, [])
    # A decode step of one request: + step_s + per_sampled_request_s.
    assert tpot_new - tpot_old == pytest.approx(1e3 * (2e-3 + 0.25e-3), rel=1e-6)
    # Its TTFT: + the arrival delay of 200 prompt tokens + one step's gap.
    assert ttft_new - ttft_old == pytest.approx(1e3 * (5e-3 + 200 * 4e-6 + 2e-3 + 0.25e-3), rel=1e-6)
    assert "the serving path the profile measured" in str(st["description"])
    assert "host terms: the serving path the profile measured" in capsys.readouterr().out
    # --calibration replaces them: zero terms give the old TPOT back.
    zero = tmp_path / "zero.json"
    save_host_terms(HostTerms(prefill_step_per_layer_s=0.0, vllm_version="0.32.0", hardware_class="cpu",
                              provenance="none"), zero)
    tpot_cal, ttft_cal, st = _tpot(tmp_path, served, ["--calibration", str(zero)])
    assert tpot_cal == pytest.approx(tpot_old, rel=1e-9) and ttft_cal == pytest.approx(ttft_old, rel=1e-9)
    assert "host terms given (none" in str(st["description"])
