"""The step profile file: read back as written; a bad one is one line naming
the field, its value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.step_profile import load_profile, save_profile, serve_flag

FIXTURE = Path(__file__).parent / "data" / "tiny_llama_profile.json"


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
