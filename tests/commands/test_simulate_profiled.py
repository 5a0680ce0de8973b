"""``kvsched simulate --step-time-profile``: steps priced from a step profile
(a small synthetic one, committed beside tests/perf), end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions, build_deployment, resolved_backend_choice

DATA = Path(__file__).parents[1] / "perf" / "data"
PROFILE = str(DATA / "tiny_llama_profile.json")
MODEL = str(DATA / "tiny_llama")
ENGINE = ["--model", MODEL, "--step-time-profile", PROFILE, "--no-async-scheduling", "--max-model-len",
          "4096", "--max-num-batched-tokens", "512", "--max-num-seqs", "64"]
WORKLOAD = ["--num-prompts", "20", "--random-input-len", "200", "--random-output-len", "20",
            "--request-rate", "4", "--no-progress"]


def test_simulate_with_a_profile_says_profiled_and_from_which_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["simulate", *ENGINE, *WORKLOAD, "--save-result", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step times: profiled from " + PROFILE in printed
    assert "synthetic CPU (2 cores) (as profiled)" in printed
    result = json.loads(out.read_text())
    st = result["deployment"]["step_times"]
    assert st["backend"] == "profiled"
    assert PROFILE in st["description"] and "leave-one-out median |error|" in st["description"]
    assert st["extrapolated"] == []
    assert result["completed"] == 20
    # The KV cache the profiled vLLM reported: 131,072 tokens, in the default
    # release's (vLLM 0.34) blocks of 64.
    cache = result["deployment"]["cache"]
    assert (cache["block_size"], cache["num_gpu_blocks"]) == (64, 131072 // 64)
    # A 200-token prefill alone costs at least the fitted fixed + token terms.
    terms = json.loads(Path(PROFILE).read_text())["fit"]["terms"]
    assert result["mean_ttft_ms"] > 1e3 * (terms["step_s"] + 200 * terms["per_token_s"])


def test_steps_past_the_profile_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    # A token budget of 2,048 over a profile of steps up to 512 tokens.
    assert main(["simulate", *ENGINE, "--max-num-batched-tokens", "2048", "--num-prompts", "8",
                 "--random-input-len", "1000", "--random-output-len", "8", "--no-progress",
                 "--save-result", str(out)]) == 0
    st = json.loads(out.read_text())["deployment"]["step_times"]
    assert any("past the profiled tokens (profiled up to 512, largest asked 2,048)" in e
               for e in st["extrapolated"])
    assert "past the profiled range" in st["description"]
    # And said once at the end of the run, naming the first few.
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    past = sorted(st["extrapolated"])
    assert len(warnings) == 1
    assert warnings[0].startswith(f"kvsched: warning: {len(past)} kind(s) of step priced past")
    assert all(e in warnings[0] for e in past[:3])


def test_profile_chooses_the_backend_and_conflicts_are_refused() -> None:
    assert resolved_backend_choice(EngineOptions(step_time_profile=PROFILE)) == "profiled"
    with pytest.raises(UserInputError, match="drop one of them"):
        resolved_backend_choice(EngineOptions(step_time_profile=PROFILE, step_time_backend="roofline"))
    with pytest.raises(UserInputError, match="needs a step profile"):
        build_deployment(EngineOptions(model=MODEL, step_time_backend="profiled"))


def test_bad_profile_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.json"
    data = json.loads(Path(PROFILE).read_text())
    data["steps"][0]["num_tokens"] = "many"
    bad.write_text(json.dumps(data))
    assert main(["simulate", "--model", MODEL, "--step-time-profile", str(bad), *WORKLOAD]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps[0].num_tokens='many'" in err


def test_profile_of_another_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "Llama-3.1-8B", "--step-time-profile", PROFILE, *WORKLOAD]) == 2
    assert "hidden_size=512 but meta-llama/Llama-3.1-8B has 4096" in capsys.readouterr().err
