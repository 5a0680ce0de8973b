"""kvsched calibrate's command line: bad input is one line on stderr, exit
code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from calibrate_runs import ENGINE

from kvsched.cli import main
from kvsched.perf.host import TERMS

pytest.importorskip("aiconfigurator_core")  # the measured backend's tables


def bad(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsched: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def edited(runs: dict[str, Path], name: str, change: dict[str, Any], drop: tuple[str, ...] = ()) -> str:
    data = json.loads(runs["c1"].read_text())
    data.update(change)
    for key in drop:
        del data[key]
    path = runs["folder"] / name
    path.write_text(json.dumps(data))
    return str(path)


def test_bad_inputs_are_one_clear_error(runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    c1 = str(runs["c1"])
    out = ["-o", str(tmp_path / "out.json")]
    bad(capsys, ["calibrate", *ENGINE, "--bench", edited(runs, "no-ttfts.json", {}, ("ttfts",)), *out],
        "no ttfts", "--save-detailed")
    bad(capsys, ["calibrate", "--model", "Qwen/Qwen3-8B", "--hardware", "h100-sxm", "--bench", c1, *out],
        "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B")
    not_json = tmp_path / "run.json"
    not_json.write_text("model_id: llama\n")
    bad(capsys, ["calibrate", *ENGINE, "--bench", str(not_json), *out], "not valid JSON")
    bad(capsys, ["calibrate", *ENGINE, "--bench", c1, "--fit", "step_s,warp_s", *out],
        "'warp_s'", ", ".join(TERMS))
    bad(capsys, ["calibrate", *ENGINE, "--bench", c1, "--fit", "dp_sync_s", *out], "dp_sync_s",
        "--data-parallel-size")
    other = edited(runs, "other-model.json", {"model_id": "Qwen/Qwen3-8B"})
    bad(capsys, ["calibrate", *ENGINE, "--bench", c1, "--held-out", other, *out],
        f"--held-out {other}", "Qwen/Qwen3-8B")
    bad(capsys, ["calibrate", *ENGINE, "--bench", edited(runs, "fp8.json",
                 {"model_id": "nvidia/Llama-3.1-8B-Instruct-FP8"}), *out], "fp8", "bf16")
    bad(capsys, ["calibrate", *ENGINE, "--bench", c1, "--max-model-len", "512", *out],
        "max_model_len=512", "--max-model-len")
    bad(capsys, ["calibrate", *ENGINE, "--bench", edited(runs, "bad-lens.json", {"input_lens": "x"}), *out],
        "input_lens", "list")
    bad(capsys, ["calibrate", *ENGINE, *out], "--bench FILE.json")
    # Any backend calibrates (the A100 falls back to the roofline), but not on
    # another GPU's run.
    bad(capsys, ["calibrate", *ENGINE, "--hardware", "a100-80gb", "--bench", c1, *out],
        "hardware 'h100-sxm'", "--hardware h100-sxm")
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text('{"arrival_time": 0, "first_token_time": 0.1, "prompt_tokens": 5, '
                     '"output_tokens": 2}\n')
    bad(capsys, ["calibrate", *ENGINE, "--requests", str(jsonl), *out], "line 1", "last_token_time")
    bad(capsys, ["calibrate", *ENGINE, "--bench", str(tmp_path / "missing.json"), *out], "no such file")
