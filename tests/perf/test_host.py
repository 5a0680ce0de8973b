"""Host terms: the file format and its errors, and what the terms add to a step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.perf import get_hardware, get_model
from kvsched.perf.host import DEFAULT_FILE, HostTerms, load_host_terms, save_host_terms
from kvsched.perf.measured import MeasuredStepTimeModel
from kvsched.perf.step_time import BatchShape
from kvsched.sim.deployment import EngineOptions, build_deployment

H100 = get_hardware("h100-sxm")
LLAMA_8B = get_model("Llama-3.1-8B")   # 32 layers


def _terms(per_layer_s: float) -> HostTerms:
    return HostTerms(per_layer_s, "0.24", "nvidia", "test")


def test_the_fitted_default_loads_and_says_where_it_comes_from() -> None:
    terms = load_host_terms()
    assert terms.prefill_step_per_layer_s >= 0
    assert terms.vllm_version == "0.24" and terms.provenance
    assert DEFAULT_FILE.name == "host_terms_vllm-0.24_nvidia.json"


def test_a_prefill_step_pays_the_per_layer_term_and_a_decode_step_does_not() -> None:
    without = MeasuredStepTimeModel(LLAMA_8B, H100, host=_terms(0.0))
    with_term = MeasuredStepTimeModel(LLAMA_8B, H100, host=_terms(0.25e-3))
    prefill = BatchShape(512, 1, 1, 0, 0, 512, 512, 512 * 513 // 2)
    assert with_term.gpu_time(prefill) - without.gpu_time(prefill) == pytest.approx(32 * 0.25e-3)
    decode = BatchShape.decode(16, 16 * 700)
    assert with_term.step_time(decode) == without.step_time(decode)
    assert with_term.decode_step_times(16, 16 * 700, 16, 5) == without.decode_step_times(16, 16 * 700, 16, 5)


def test_bad_files_are_refused_naming_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.json: no such file \(expected a calibration file"):
        load_host_terms(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not JSON"):
        load_host_terms(bad)
    bad.write_text(json.dumps({"prefill_step_per_layer_s": 1e-4, "vllm_version": "0.24"}), encoding="utf-8")
    with pytest.raises(ValueError, match="missing arrival_s, dp_sync_s, hardware_class, per_prompt_token_s"):
        load_host_terms(bad)
    good = _terms(1e-4).to_json()
    bad.write_text(json.dumps({**good, "per_token_s": 1.0}), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown per_token_s"):
        load_host_terms(bad)
    bad.write_text(json.dumps({**good, "prefill_step_per_layer_s": -1}), encoding="utf-8")
    with pytest.raises(ValueError,
                       match=r"bad.json.*prefill_step_per_layer_s=-1: must be a number of seconds"):
        load_host_terms(bad)


def test_a_calibration_file_reaches_the_step_model(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.json"
    save_host_terms(HostTerms(0.5e-3, "0.24", "h100-lab", "my run"), path)
    d = build_deployment(EngineOptions(calibration=str(path)))
    assert d.step_model.host == load_host_terms(path)
    assert "host terms 0.24/h100-lab" in d.describe()
    # Any backend carries the file's terms (the roofline has none without it).
    roof = build_deployment(EngineOptions(calibration=str(path), step_time_backend="roofline"))
    assert roof.step_model.backend == "roofline" and roof.step_model.host == load_host_terms(path)
    assert "host terms 0.24/h100-lab" in roof.step_model.describe_backend()
    # Without one, the roofline prices with the fitted default, and says so.
    plain = build_deployment(EngineOptions(step_time_backend="roofline")).step_model
    assert plain.host == load_host_terms() and "host terms 0.24/nvidia" in plain.describe_backend()
    assert main(["simulate", "--num-prompts", "2", "--no-progress", "--calibration",
                 str(tmp_path / "missing.json")]) != 0
    err = capsys.readouterr().err
    assert "missing.json: no such file (expected a calibration file" in err and "Traceback" not in err


def test_every_step_pays_the_step_terms_and_fast_forward_gives_the_same_float() -> None:
    base = MeasuredStepTimeModel(LLAMA_8B, H100, host=_terms(0.0))
    terms = HostTerms(0.0, "0.24", "nvidia", "test", step_s=0.4e-3, per_sampled_request_s=25e-6)
    sm = MeasuredStepTimeModel(LLAMA_8B, H100, host=terms)
    decode = BatchShape.decode(16, 16 * 700)
    # 0.4 ms per step + 16 sampled requests x 25 us
    assert sm.step_time(decode) - base.step_time(decode) == pytest.approx(0.4e-3 + 16 * 25e-6, rel=1e-9)
    prefill = BatchShape(512, 1, 1, 0, 0, 512, 512, 512 * 513 // 2)
    assert sm.gpu_time(prefill) - base.gpu_time(prefill) == pytest.approx(0.4e-3 + 25e-6, rel=1e-9)
    # a chunk that does not sample pays the step term only
    chunk = BatchShape(512, 1, 0, 0, 0, 512, 512, 512 * 513 // 2)
    assert sm.gpu_time(chunk) - base.gpu_time(chunk) == pytest.approx(0.4e-3, rel=1e-9)
    stretch = sm.decode_step_times(16, 16 * 700, 16, 4)
    assert stretch == [sm.step_time(BatchShape.decode(16, 16 * 700 + 16 * j)) for j in range(4)]


def test_dp_sync_is_paid_only_with_several_data_parallel_ranks() -> None:
    from kvsched.perf.step_time import ParallelConfig

    terms = HostTerms(0.0, "0.24", "nvidia", "test", dp_sync_s=1e-3)
    one = MeasuredStepTimeModel(LLAMA_8B, H100, ParallelConfig(1, 1), host=terms)
    two = MeasuredStepTimeModel(LLAMA_8B, H100, ParallelConfig(1, 2), host=terms)
    plain = MeasuredStepTimeModel(LLAMA_8B, H100, ParallelConfig(1, 2), host=_terms(0.0))
    decode = BatchShape.decode(8, 8 * 300)
    assert two.step_time(decode) - plain.step_time(decode) == pytest.approx(1e-3, rel=1e-9)
    assert one.step_time(decode) == MeasuredStepTimeModel(LLAMA_8B, H100, host=_terms(0.0)).step_time(decode)


def _ttfts(terms: HostTerms, rate_gap_s: float) -> list[float]:
    from array import array

    from kvsched.sim.simulator import SimConfig, Simulator
    from kvsched.sim.workload import RandomRequests, Workload

    d = build_deployment(EngineOptions())
    sm = MeasuredStepTimeModel(LLAMA_8B, H100, host=terms)
    n = 6
    arrivals = array("d", [i * rate_gap_s for i in range(n)])
    work = Workload("t", RandomRequests(arrivals, array("q", [100 * (i + 1) for i in range(n)]),
                                        array("q", [4] * n), 0))
    result = Simulator(SimConfig(d.scheduler_config, d.cache_config, sm, keep_step_log=False), work).run()
    by_id = {r.request_id: r for r in result.records}
    return [by_id[spec.request_id].ttft for spec in work.requests]


def test_a_request_reaches_the_engine_after_its_arrival_delay_and_ttft_counts_from_the_send() -> None:
    # Requests far apart (1 s): each is alone, so its TTFT grows by exactly its delay,
    # 3 ms + 10 us per prompt token.
    plain = _ttfts(_terms(0.0), 1.0)
    late = _ttfts(HostTerms(0.0, "0.24", "nvidia", "test", arrival_s=3e-3, per_prompt_token_s=10e-6), 1.0)
    for i, (a, b) in enumerate(zip(plain, late, strict=True)):
        assert b - a == pytest.approx(3e-3 + 10e-6 * 100 * (i + 1), rel=1e-6)


@pytest.mark.parametrize("value", [1e300, 2.0, 1e9])
def test_a_term_beyond_a_second_is_refused_with_the_file(tmp_path: Path, value: float) -> None:
    # step_s 1e300 ran and printed a 300-digit benchmark duration.
    data = load_host_terms().to_json()
    data["step_s"] = value
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"cal.json.*step_s=.*\[0, 1\]"):
        load_host_terms(path)


PROFILE_DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("backend", ["roofline", "profiled"])
def test_every_backend_adds_the_host_terms_in_one_place(backend: str) -> None:
    """The roofline and the profiled backend add a calibration's terms as the
    measured one does: per step, per sampled request, per layer of a step
    with prefill; stepping and fast-forward give the same float."""
    from kvsched.perf.step_time import StepTimeModel

    if backend == "roofline":
        base: StepTimeModel = StepTimeModel(LLAMA_8B, H100)
        layers = 32
    else:
        opts = EngineOptions(str(PROFILE_DATA / "tiny_llama"), step_time_profile=str(
            PROFILE_DATA / "tiny_llama_profile.json"), async_scheduling=False, max_model_len=4096)
        base = build_deployment(opts).step_model
        layers = base.model.num_layers
    assert base.host is None
    terms = HostTerms(0.1e-3, "0.24", "nvidia", "test", step_s=0.4e-3, per_sampled_request_s=25e-6)
    sm = base.with_host(terms)
    assert sm.backend == base.backend and sm.host == terms
    decode = BatchShape.decode(16, 16 * 700)
    assert sm.step_time(decode) - base.step_time(decode) == pytest.approx(0.4e-3 + 16 * 25e-6, rel=1e-6)
    prefill = BatchShape(512, 1, 1, 0, 0, 512, 512, 512 * 513 // 2)
    assert sm.gpu_time(prefill) - base.gpu_time(prefill) == pytest.approx(
        0.4e-3 + 25e-6 + layers * 0.1e-3, rel=1e-6)
    stretch = sm.decode_step_times(16, 16 * 700, 16, 4)
    assert stretch == [sm.step_time(BatchShape.decode(16, 16 * 700 + 16 * j)) for j in range(4)]
    # Zero terms change no float.
    zero = base.with_host(_terms(0.0))
    assert zero.step_time(decode) == base.step_time(decode)
    assert zero.gpu_time(prefill) == base.gpu_time(prefill)


def _prefill_terms(**values: float) -> HostTerms:
    return HostTerms(0.0, "0.24", "nvidia", "test", **values)


def test_the_launch_floor_holds_up_a_short_prefill_and_leaves_a_long_one_alone() -> None:
    # 32 layers x 300 us = a 9.6 ms floor under the forward pass of a step
    # with prefill tokens; the step's host gaps stay on top of it.
    base = MeasuredStepTimeModel(LLAMA_8B, H100, host=_prefill_terms(step_s=0.5e-3))
    floored = MeasuredStepTimeModel(LLAMA_8B, H100,
                                    host=_prefill_terms(step_s=0.5e-3, prefill_launch_per_layer_s=300e-6))
    tail = BatchShape(15, 1, 1, 0, 0, 15, 2015, 15 * 2000 + 15 * 16 // 2)  # a 15-token tail after a hit
    assert base.gpu_time(tail) - 0.5e-3 < 9.6e-3           # the kernels alone are faster than the launches
    assert floored.gpu_time(tail) == pytest.approx(9.6e-3 + 0.5e-3, rel=1e-12)
    long = BatchShape(8192, 1, 1, 0, 0, 8192, 8192, 8192 * 8193 // 2)
    assert base.gpu_time(long) - 0.5e-3 > 9.6e-3
    assert floored.gpu_time(long) == base.gpu_time(long)
    decode = BatchShape.decode(4, 4 * 100)
    assert floored.step_time(decode) == base.step_time(decode)


def test_prefill_requests_and_tokens_pay_per_request_and_per_computed_token() -> None:
    base = MeasuredStepTimeModel(LLAMA_8B, H100, host=_prefill_terms())
    sm = MeasuredStepTimeModel(LLAMA_8B, H100,
                               host=_prefill_terms(per_prefill_request_s=0.2e-3, per_prefill_token_s=1e-6))
    # Two prefill chunks (300 + 15 new tokens, the second after a
    # 2,000-token prefix hit) and five decodes.
    mixed = BatchShape(320, 7, 6, 5, 5 * 900, 315, 300 + 2015,
                       300 * 301 // 2 + 15 * 2000 + 15 * 16 // 2)
    assert sm.gpu_time(mixed) - base.gpu_time(mixed) == pytest.approx(2 * 0.2e-3 + 315 * 1e-6, rel=1e-9)
    # The tail pays for its 15 computed tokens, not its 2,015-token prompt.
    tail = BatchShape(15, 1, 1, 0, 0, 15, 2015, 15 * 2000 + 15 * 16 // 2)
    assert sm.gpu_time(tail) - base.gpu_time(tail) == pytest.approx(0.2e-3 + 15e-6, rel=1e-9)


def test_a_file_written_before_the_prefill_terms_still_loads(tmp_path: Path) -> None:
    data = _terms(1e-4).to_json()
    for name in ("per_prefill_request_s", "per_prefill_token_s", "prefill_launch_per_layer_s"):
        del data[name]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    terms = load_host_terms(path)
    assert terms.prefill_step_per_layer_s == 1e-4
    new = (terms.per_prefill_request_s, terms.per_prefill_token_s, terms.prefill_launch_per_layer_s)
    assert new == (0, 0, 0)


@pytest.mark.parametrize("hardware", ["h100-sxm", "l40s", "a100-80gb", "mi300x", "ascend-910b"])
def test_no_pricing_goes_without_host_time(hardware: str) -> None:
    """Every backend a simulate can pick carries host terms; a device of a
    class the default was not fitted on says it borrowed them."""
    for backend in ("auto", "roofline"):
        sm = build_deployment(EngineOptions(hardware=hardware, step_time_backend=backend)).step_model
        assert sm.host is not None and sm.host == load_host_terms()
        text = sm.describe_backend()
        assert "host terms 0.24/nvidia" in text
        assert ("borrowed" in text) == hardware.startswith(("mi", "ascend"))


def test_a_step_model_without_host_terms_says_so() -> None:
    from kvsched.perf.host import NO_HOST_TIME
    from kvsched.perf.step_time import StepTimeModel

    assert "no host terms" in StepTimeModel(LLAMA_8B, H100, host=NO_HOST_TIME).describe_backend()
    assert "no host terms" in StepTimeModel(LLAMA_8B, H100).describe_backend()
