"""``kvsched tune --step-time-profile``: a search priced from a step profile
(the small synthetic one beside tests/perf) searches only the TP size and
machine the profile measured, and its cached results follow the profile's
bytes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvsched.cli import main

DATA = Path(__file__).parents[1] / "perf" / "data"
PROFILE = DATA / "tiny_llama_profile.json"
MODEL = str(DATA / "tiny_llama")
QUESTION = ["tune", "--model", MODEL, "--hardware", "h100-sxm", "--max-gpus", "2",
            "--no-async-scheduling", "--max-model-len", "4096",
            "--max-num-seqs", "64", "--max-num-batched-tokens", "512",
            "--num-prompts", "12", "--random-input-len", "200", "--random-output-len", "10",
            "--request-rate", "2", "--slo", "ttft:100000", "--workers", "1", "--no-progress"]


def test_a_profile_pins_the_search_to_its_tp_and_prices_every_candidate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert main([*QUESTION, "--step-time-profile", str(PROFILE), "--no-cache",
                 "--save-result", str(out)]) == 0
    result = json.loads(out.read_text())
    ranked = result["ranked"]
    # The profile was served with the default -tp 1: TP 2 (within --max-gpus
    # 2, searched without a profile) is not a candidate, and DP still is.
    assert {r["candidate"]["tensor_parallel_size"] for r in ranked} == {1}
    assert {r["candidate"]["data_parallel_size"] for r in ranked} == {1, 2}
    assert result["pruned"] == [] and result["failed"] == []
    assert {r["pricing"] for r in ranked} == {"profiled"}
    assert all(str(PROFILE) in r["pricing_detail"] for r in ranked)
    assert result["mixed_pricing"] is False
    # The reproducing line carries the profile; vllm serve's does not.
    best = result["best"]
    assert "--step-time-profile" in best["simulate_args"]
    assert "step-time-profile" not in best["vllm_serve"]
    assert "profiled" in capsys.readouterr().out


def test_a_tp_the_profile_cannot_price_and_two_machines_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*QUESTION, "--step-time-profile", str(PROFILE), "--tp", "1", "2", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "profiled with -tp 1, so it cannot price --tp 2; give --tp 1" in err
    argv = [*QUESTION, "--step-time-profile", str(PROFILE), "--no-cache"]
    argv[argv.index("h100-sxm")] = "h100-sxm h200"
    argv = [w for a in argv for w in (a.split() if a == "h100-sxm h200" else [a])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give one --hardware" in err and "h100-sxm h200" in err


def test_cached_results_follow_the_profiles_bytes(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    cache = tmp_path / "cache"
    argv = [*QUESTION, "--step-time-profile", str(profile), "--cache-dir", str(cache), "--dp", "1",
            "--save-result", str(tmp_path / "a.json")]
    assert main(argv) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert first["num_simulations"] > 0 and first["num_cached"] == 0
    assert main(argv) == 0
    again = json.loads((tmp_path / "a.json").read_text())
    assert again["num_simulations"] == 0 and again["num_cached"] == first["num_simulations"]
    # The same path, other step times (every measured step 10x slower): simulated again.
    data = json.loads(profile.read_text())
    for step in data["steps"]:
        step["elapsed_ms"] *= 10
    profile.write_text(json.dumps(data))
    assert main(argv) == 0
    changed = json.loads((tmp_path / "a.json").read_text())
    assert changed["num_cached"] == 0 and changed["num_simulations"] == first["num_simulations"]
    ttft = changed["best"]["metrics"]["mean_ttft_ms"]
    assert ttft > 5 * first["best"]["metrics"]["mean_ttft_ms"]
