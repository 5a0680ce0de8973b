"""``kvsched simulate`` from the command line, and deployment resolution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.perf import get_hardware
from kvsched.sim.deployment import EngineOptions, build_deployment, serve_defaults

SMALL = ["--num-prompts", "40", "--random-input-len", "256", "--random-output-len", "32",
         "--no-progress"]


def test_serve_defaults_follow_vllm_by_device_memory() -> None:
    assert serve_defaults(get_hardware("h100-sxm")) == (8192, 1024)
    assert serve_defaults(get_hardware("b200")) == (16384, 1024)
    assert serve_defaults(get_hardware("a100-80gb")) == (2048, 256)
    assert serve_defaults(get_hardware("l40s")) == (2048, 256)


def test_deployment_uses_defaults_and_checks_the_context_fits() -> None:
    d = build_deployment(EngineOptions(model="Llama-3.1-8B", hardware="h100-sxm"))
    assert d.scheduler_config.max_num_seqs == 1024
    assert d.scheduler_config.max_model_len == 131072
    assert d.cache_config.num_gpu_blocks == d.memory.num_gpu_blocks
    with pytest.raises(ValueError, match="max_model_len"):
        build_deployment(EngineOptions(model="Llama-3.1-8B", num_gpu_blocks_override=100))
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        build_deployment(EngineOptions(model="Qwen3-8B", tensor_parallel_size=5))


def test_simulate_prints_a_table_and_saves_vllm_bench_keys(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    assert main(["simulate", *SMALL, "--save-result", str(out), "--save-detailed",
                 "--goodput", "ttft:1000", "tpot:50"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Simulating meta-llama/Llama-3.1-8B")
    assert "Serving Benchmark Result" in text and "Mean TTFT (ms):" in text
    saved = json.loads(out.read_text())
    for key in ("completed", "duration", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                "p99_e2el_ms", "request_goodput", "num_preemptions"):
        assert key in saved, key
    assert saved["completed"] == 40 and len(saved["requests"]) == 40
    assert saved["total_output_tokens"] == 40 * 32


def test_trace_steps_has_times_and_matches_step_count(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "steps.jsonl"
    out = tmp_path / "r.json"
    assert main(["simulate", *SMALL, "--trace-steps", str(trace), "--save-result", str(out)]) == 0
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == json.loads(out.read_text())["num_steps"]
    assert all(rec["duration"] > 0 for rec in lines)
    assert lines[1]["start"] == pytest.approx(lines[0]["start"] + lines[0]["duration"])


def test_fast_forward_flag_does_not_change_results(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["simulate", *SMALL, "--request-rate", "20"]
    assert main([*args, "--save-result", str(a)]) == 0
    assert main([*args, "--save-result", str(b), "--no-fast-forward"]) == 0
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
        ra.pop(key)
        rb.pop(key)
    assert ra == rb


@pytest.mark.parametrize("argv, words", [
    (["--model", "No-Such-Model"], "No-Such-Model"),
    (["--hardware", "tpu-v9"], "tpu-v9"),
    (["--dataset-name", "azure"], "needs --dataset-path"),
    (["--goodput", "latency:5"], "latency"),
    (["--metric-percentiles", "50,abc"], "metric-percentiles"),
])
def test_bad_input_is_one_error_line(argv: list[str], words: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, *argv]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched: error:") and words in err[0]


def test_default_run_says_what_it_simulated() -> None:
    done = subprocess.run([sys.executable, "-m", "kvsched.cli", "simulate", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("Simulating ") and "1000 random prompts" in first
    assert "Successful requests:" in done.stdout
