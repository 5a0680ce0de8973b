"""The step profile file: read back as written; a bad one is one line naming
the field, its value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.serving_fit import RequestSample, ServingFit, StepWindow
from kvsched.perf.step_profile import StepProfile, StepRecord, load_profile, save_profile, serve_flag

FIXTURE = Path(__file__).parent / "data" / "tiny_llama_profile.json"
# A version 2 profile written by kvsched before StepRecord shared its logged
# fields with the log parser's IterationLine and RequestSample grouped its
# steps into StepWindows: the file's bytes are the format.
SMALL_V2 = Path(__file__).parent / "data" / "step_profile_v2_small.json"


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    return p


def test_fixture_reads_and_round_trips(tmp_path: Path) -> None:
    prof = load_profile(FIXTURE)
    assert prof.model["hidden_size"] == 512 and prof.kv_cache_tokens == 131072
    assert len(prof.steps) == 46 and not any(s.warmup for s in prof.steps)
    out = tmp_path / "again.json"
    save_profile(prof, out)
    again = load_profile(out)
    assert again.steps == prof.steps and again.model == prof.model and again.fit == prof.fit


def test_a_version_1_step_reads_as_written() -> None:
    first = load_profile(FIXTURE).steps[0]
    assert first == StepRecord(iteration=0, context_requests=1, context_tokens=8, generation_requests=0,
                               generation_tokens=0, elapsed_ms=5.057088871647174, point="prefill-8-0",
                               num_tokens=8, num_reqs=1, num_sampled=1, prefill_tokens=8,
                               prefill_attn_pairs=36, decode_kv_tokens=0, warmup=False)


def _small_v2() -> StepProfile:
    """SMALL_V2's contents, written out by hand."""
    model = {"name": "tiny", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "num_experts": 0,
             "experts_per_token": 0}
    steps = [StepRecord(iteration=1, context_requests=1, context_tokens=8, generation_requests=0,
                        generation_tokens=0, elapsed_ms=12.5, point="prefill-8", num_tokens=8, num_reqs=1,
                        num_sampled=1, prefill_tokens=8, prefill_attn_pairs=36, decode_kv_tokens=0,
                        warmup=True),
             StepRecord(iteration=7, context_requests=0, context_tokens=0, generation_requests=2,
                        generation_tokens=2, elapsed_ms=3.25, point="decode-2", num_tokens=2, num_reqs=2,
                        num_sampled=2, prefill_tokens=0, prefill_attn_pairs=0, decode_kv_tokens=34)]
    requests = [RequestSample(point="prefill-8", prompt_tokens=8, output_tokens=1, idle=True, ttft_s=0.02,
                              prefill=StepWindow(steps=1, elapsed_s=0.0125, sampled=1, reqs=1)),
                RequestSample(point="decode-2", prompt_tokens=16, output_tokens=5, idle=False, ttft_s=0.031,
                              prefill=StepWindow(steps=2, elapsed_s=0.0175, sampled=2, reqs=3), span_s=0.0125,
                              span=StepWindow(steps=3, elapsed_s=0.00975, sampled=6, reqs=6))]
    serving = ServingFit(step_s=0.001, per_sampled_request_s=0.0001, arrival_s=0.005,
                         per_prompt_token_s=2e-06, cpu_step_s=0.0002, cpu_per_request_s=1e-05, gap_rows=4,
                         gap_trimmed=1,
                         gap_median_abs_error=0.01, gap_p90_abs_error=0.05, gap_median_period_s=0.004,
                         gap_median_elapsed_s=0.003, arrival_rows=4, arrival_trimmed=0,
                         arrival_median_abs_error=0.02, arrival_p90_abs_error=0.08)
    return StepProfile(model, {"device": "cpu", "name": "test CPU"}, {"version": "0.32.0", "python": "none"},
                       ["--max-num-seqs", "2"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, 4096,
                       ["prefill-8", "decode-2"], steps, None, ["a note"], "", requests, serving)


def test_a_profile_is_written_byte_for_byte_as_before(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    save_profile(_small_v2(), out)
    assert out.read_bytes() == SMALL_V2.read_bytes()


def test_a_version_2_file_reads_to_its_records() -> None:
    prof = load_profile(SMALL_V2)
    want = _small_v2()
    assert prof.steps == want.steps and prof.requests == want.requests and prof.serving == want.serving
    assert (prof.model, prof.kv_cache_tokens, prof.points_done, prof.notes) == (
        want.model, want.kv_cache_tokens, want.points_done, want.notes)


def test_a_sample_time_written_as_an_integer_reads_as_seconds(tmp_path: Path) -> None:
    data = json.loads(SMALL_V2.read_text())
    data["requests"][0].update(ttft_s=1, prefill_elapsed_s=0)
    got = load_profile(_write(tmp_path, data)).requests[0]
    assert got.ttft_s == 1.0 and isinstance(got.ttft_s, float)
    assert got.prefill == StepWindow(steps=1, elapsed_s=0.0, sampled=1, reqs=1)
    assert isinstance(got.prefill.elapsed_s, float)


def test_bad_sample_names_its_index_and_flat_key(tmp_path: Path) -> None:
    for key, value, rule in (("span_reqs", -1, "integer >= 0"), ("prefill_elapsed_s", "0.1", "seconds >= 0"),
                             ("prefill_steps", 1.5, "integer >= 0")):
        data = json.loads(SMALL_V2.read_text())
        data["requests"][1][key] = value
        with pytest.raises(UserInputError, match=rf"requests\[1\]\.{key}=.*{rule}"):
            load_profile(_write(tmp_path, data))
    data = json.loads(SMALL_V2.read_text())
    data["requests"][0].pop("span_sampled")
    data["requests"][0]["span"] = {}
    with pytest.raises(UserInputError, match=r"requests\[0\]: missing span_sampled; unknown span"):
        load_profile(_write(tmp_path, data))


def _broken(tmp_path: Path, change: object) -> str:
    data = json.loads(FIXTURE.read_text())
    assert callable(change)
    change(data)
    with pytest.raises(UserInputError) as e:
        load_profile(_write(tmp_path, data))
    message = str(e.value)
    assert "\n" not in message
    assert "kvsched profile" in message  # the fix
    return message


def test_missing_field(tmp_path: Path) -> None:
    msg = _broken(tmp_path, lambda d: d.pop("steps"))
    assert "missing field 'steps'" in msg


def test_missing_model_field(tmp_path: Path) -> None:
    msg = _broken(tmp_path, lambda d: d["model"].pop("num_kv_heads"))
    assert "missing field 'num_kv_heads'" in msg


def test_wrong_type_names_field_and_value(tmp_path: Path) -> None:
    msg = _broken(tmp_path, lambda d: d["model"].__setitem__("hidden_size", "512"))
    assert "hidden_size='512'" in msg and "integer" in msg


def test_bad_step_names_its_index_field_and_value(tmp_path: Path) -> None:
    msg = _broken(tmp_path, lambda d: d["steps"][3].__setitem__("elapsed_ms", -1.5))
    assert "steps[3].elapsed_ms=-1.5" in msg and "positive" in msg
    msg = _broken(tmp_path, lambda d: d["steps"][0].__setitem__("num_reqs", True))
    assert "steps[0].num_reqs=True" in msg
    msg = _broken(tmp_path, lambda d: d["steps"][1].pop("decode_kv_tokens"))
    assert "steps[1]: missing decode_kv_tokens" in msg


def test_other_format_or_version(tmp_path: Path) -> None:
    assert "format='calibration'" in _broken(tmp_path, lambda d: d.__setitem__("format", "calibration"))
    assert "version=3" in _broken(tmp_path, lambda d: d.__setitem__("version", 3))


def test_not_json(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text("{nope")
    with pytest.raises(UserInputError, match="is not JSON"):
        load_profile(p)


def test_serve_flag_reads_both_spellings_last_wins() -> None:
    flags = ["--dtype", "bfloat16", "-tp", "2", "--max-model-len=4096", "--dtype", "half"]
    assert serve_flag(flags, ("--dtype",)) == "half"
    assert serve_flag(flags, ("--tensor-parallel-size", "-tp")) == "2"
    assert serve_flag(flags, ("--max-model-len",)) == "4096"
    assert serve_flag(flags, ("--kv-cache-dtype",), "auto") == "auto"
