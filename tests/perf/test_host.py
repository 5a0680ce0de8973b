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
    with pytest.raises(ValueError, match=r"calibration file '.*nope.json' does not exist"):
        load_host_terms(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not JSON"):
        load_host_terms(bad)
    bad.write_text(json.dumps({"prefill_step_per_layer_s": 1e-4, "vllm_version": "0.24"}), encoding="utf-8")
    with pytest.raises(ValueError, match="missing hardware_class, provenance"):
        load_host_terms(bad)
    good = _terms(1e-4).to_json()
    bad.write_text(json.dumps({**good, "per_token_s": 1.0}), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown per_token_s"):
        load_host_terms(bad)
    bad.write_text(json.dumps({**good, "prefill_step_per_layer_s": -1}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"prefill_step_per_layer_s=-1: must be a finite number"):
        load_host_terms(bad)


def test_a_calibration_file_reaches_the_step_model(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.json"
    save_host_terms(HostTerms(0.5e-3, "0.24", "h100-lab", "my run"), path)
    d = build_deployment(EngineOptions(calibration=str(path)))
    assert d.step_model.host == load_host_terms(path)
    assert "host terms 0.24/h100-lab" in d.describe()
    with pytest.raises(ValueError, match=r"calibration \(--calibration\).*roofline"):
        build_deployment(EngineOptions(calibration=str(path), step_time_backend="roofline"))
    assert main(["simulate", "--num-prompts", "2", "--no-progress", "--calibration",
                 str(tmp_path / "missing.json")]) != 0
    err = capsys.readouterr().err
    assert "missing.json' does not exist" in err and "Traceback" not in err
