"""``kvsched simulate`` from the command line, and deployment resolution."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.perf import get_hardware
from kvsched.sim.deployment import EngineOptions, build_deployment, serve_defaults
from kvsched.sim.metrics import RequestRecord
from kvsched.sim.refusals import failure_reasons, format_failures
from kvsched.sim.results import detailed_lists
from kvsched.sim.workload import WorkloadRequest

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
    for key in ("simulation_wall_seconds", "fast_forwarded_steps", "date"):
        ra.pop(key)
        rb.pop(key)
    # The run spec records the flag itself.
    assert (ra["run_spec"]["options"].pop("fast_forward"), rb["run_spec"]["options"].pop("fast_forward")) == (
        True, False)
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


# -- what a user meets -----------------------------------------------------------

def write_trace(path: Path, lengths: list[tuple[int, int]]) -> Path:
    """A jsonl trace: one request per (input, output) pair, 0.1 s apart."""
    path.write_text("".join(json.dumps({"arrival_time": 0.1 * i, "input_tokens": n_in,
                                        "output_tokens": n_out}) + "\n"
                            for i, (n_in, n_out) in enumerate(lengths)))
    return path


def one_error_line(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(the only stderr line, stdout); the line must be an error."""
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched: error:"), captured.err
    return err[0], captured.out


@pytest.mark.parametrize("extra", [[], ["--dataset-name", "jsonl"]])
@pytest.mark.parametrize("n", ["0", "-3"])
def test_num_prompts_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          n: str, extra: list[str]) -> None:
    if extra:
        extra = [*extra, "--dataset-path", str(write_trace(tmp_path / "t.jsonl", [(10, 5)]))]
    assert main(["simulate", "--no-progress", *extra, "--num-prompts", n]) != 0
    line, out = one_error_line(capsys)
    assert f"--num-prompts={n}" in line and "at least 1" in line
    assert "Simulating" not in out


def test_duration_zero_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--duration", "0"]) != 0
    line, _ = one_error_line(capsys)
    assert "--duration=0" in line


@pytest.mark.parametrize("flags, words", [
    (["--request-rate", "5", "--time-scale", "0.5"], ["--time-scale=0.5", "--request-rate"]),
    (["--burstiness", "0.5"], ["--burstiness=0.5", "--request-rate"]),
    (["--random-input-len", "100"], ["--random-input-len=100", "only for --dataset-name random"]),
    (["--random-output-len", "7"], ["--random-output-len=7", "only for --dataset-name random"]),
    (["--random-range-ratio", "0.1"], ["--random-range-ratio=0.1"]),
    (["--random-prefix-len", "4"], ["--random-prefix-len=4"]),
])
def test_random_only_flags_are_refused_with_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    flags: list[str], words: list[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(10, 5), (20, 5)])
    assert main(["simulate", "--no-progress", "--dataset-name", "jsonl", "--dataset-path", str(trace),
                 *flags]) != 0
    line, out = one_error_line(capsys)
    assert all(w in line for w in words), line
    assert "Simulating" not in out


def test_a_trace_without_random_flags_runs_and_saves_its_workload(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(10, 5), (20, 5), (30, 5)])
    out = tmp_path / "r.json"
    assert main(["simulate", "--no-progress", "--dataset-name", "jsonl", "--dataset-path", str(trace),
                 "--time-scale", "0.5", "--save-result", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "3 requests of" in first and "x0.5 (--time-scale)" in first
    workload = json.loads(out.read_text())["workload"]
    assert workload == {"dataset_name": "jsonl", "dataset_path": str(trace), "num_prompts": 3,
                        "max_concurrency": None, "time_scale": 0.5, "duration": None, "seed": 0,
                        "eos_probability": 0.0}


def test_time_scale_shows_in_the_summary_only_when_not_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--request-rate", "20", "--time-scale", "2"]) == 0
    assert "arrival times x2 (--time-scale)" in capsys.readouterr().out.splitlines()[0]
    assert main(["simulate", *SMALL, "--request-rate", "20"]) == 0
    assert "time-scale" not in capsys.readouterr().out.splitlines()[0]


def test_dataset_path_without_dataset_name_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(10, 5)])
    assert main(["simulate", *SMALL, "--dataset-path", str(trace)]) != 0
    line, _ = one_error_line(capsys)
    assert f"--dataset-path={trace}" in line and "--dataset-name" in line


def test_expert_parallel_on_a_dense_model_says_it_has_no_effect(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["simulate", *SMALL, "--tensor-parallel-size", "2", "--enable-expert-parallel",
                 "--save-result", str(out)]) == 0
    captured = capsys.readouterr()
    notes = captured.err.strip().splitlines()
    assert len(notes) == 1 and "--enable-expert-parallel has no effect" in notes[0]
    assert "dense" in notes[0] and "Llama-3.1-8B" in notes[0]
    assert "(TP2)" in captured.out.splitlines()[0]  # not "TP2 EP2"
    parallel = json.loads(out.read_text())["deployment"]["parallel"]
    assert parallel["enable_expert_parallel"] is False and parallel["expert_parallel_size"] == 1
    # An MoE model keeps it, without a note.
    assert main(["simulate", *SMALL, "--model", "Qwen3-30B-A3B", "--tensor-parallel-size", "2",
                 "--enable-expert-parallel"]) == 0
    captured = capsys.readouterr()
    assert "EP2" in captured.out.splitlines()[0] and "no effect" not in captured.err


def test_requests_over_max_model_len_are_refused_and_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # max_model_len 1100: 1000 + 100 fits exactly; 1000 + 101 and 1200 + 10 do not.
    trace = write_trace(tmp_path / "t.jsonl", [(100, 20), (1000, 100), (1000, 101), (1200, 10)])
    out = tmp_path / "r.json"
    assert main(["simulate", "--no-progress", "--dataset-name", "jsonl", "--dataset-path", str(trace),
                 "--max-model-len", "1100", "--save-result", str(out)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"Failed requests:\s+2\n", text)
    assert "Failed requests: 2 of 4, by reason:" in text
    assert re.search(r"\n\s+2  refused by the server: prompt \+ output > max_model_len=1100 "
                     r"\(first: jsonl-2\)\n", text)
    saved = json.loads(out.read_text())
    assert saved["completed"] == 2 and saved["failed"] == 2
    assert saved["failed_reasons"] == {"refused by the server: prompt + output > max_model_len=1100": 2}
    assert saved["errors"][:2] == ["", ""]
    assert saved["errors"][2].endswith("(prompt 1000 + output 101 = 1101 tokens)")
    assert saved["errors"][3].endswith("(prompt 1200 + output 10 = 1210 tokens)")
    # The request that fits exactly generates all of its tokens.
    assert saved["total_output_tokens"] == 20 + 100


def test_every_request_refused_is_one_error_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(1000, 200), (1500, 1)])
    assert main(["simulate", "--no-progress", "--dataset-name", "jsonl", "--dataset-path", str(trace),
                 "--max-model-len", "1100"]) != 0
    line, out = one_error_line(capsys)
    assert "all 2 requests" in line and "max_model_len=1100" in line and "--max-model-len" in line
    assert "Simulating" not in out


@pytest.mark.parametrize("flag", ["--save-result", "--report", "--trace-steps"])
def test_output_into_a_missing_folder_fails_before_simulating(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    target = tmp_path / "no" / "such" / "out.file"
    assert main(["simulate", *SMALL, flag, str(target)]) != 0
    line, out = one_error_line(capsys)
    assert f"{flag}={target}" in line and "does not exist" in line
    assert out == ""  # not even the "Simulating ..." line
    # A folder given as the file.
    assert main(["simulate", *SMALL, flag, str(tmp_path)]) != 0
    line, out = one_error_line(capsys)
    assert f"{flag}=" in line and "is a folder" in line and out == ""


def test_save_detailed_without_save_result_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--save-detailed"]) != 0
    line, _ = one_error_line(capsys)
    assert "--save-detailed" in line and "--save-result" in line


def test_saved_json_and_report_describe_the_whole_deployment(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["simulate", *SMALL, "--request-rate", "20", "--max-concurrency", "30",
                 "--tensor-parallel-size", "2", "--data-parallel-size", "2", "--max-num-seqs", "48",
                 "--max-num-batched-tokens", "4096", "--max-model-len", "4096", "--block-size", "32",
                 "--kv-cache-dtype", "fp8", "--long-prefill-token-threshold", "512",
                 "--no-async-scheduling", "--no-enable-prefix-caching", "--seed", "3",
                 "--save-result", str(out), "--report", str(page)]) == 0
    saved = json.loads(out.read_text())
    d = saved["deployment"]
    assert d["model"] == {"name": "meta-llama/Llama-3.1-8B", "checkpoint": "meta-llama/Llama-3.1-8B",
                          "dtype": "bf16", "quantization": None, "kv_cache_dtype": "fp8",
                          "moe": False}
    assert d["hardware"]["id"] == "h100-sxm" and d["hardware"]["name"] == "NVIDIA H100 SXM5 80GB"
    assert d["parallel"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "data_parallel_size": 2,
                             "enable_expert_parallel": False, "expert_parallel_size": 1, "num_gpus": 4,
                             "dp_routing": "vllm", "dp_stats_interval": 0.1}
    assert d["scheduler"] == {"max_num_seqs": 48, "max_num_batched_tokens": 4096, "max_model_len": 4096,
                              "enable_chunked_prefill": True, "scheduling_policy": "fcfs",
                              "long_prefill_token_threshold": 512, "async_scheduling": False,
                              "prefill_schedule_interval": 1, "admission_policy": "none"}
    assert d["cache"]["block_size"] == 32 and d["cache"]["enable_prefix_caching"] is False
    assert d["cache"]["num_gpu_blocks"] == saved["num_gpu_blocks"] > 0
    assert "per DP rank" in d["per_rank"]["num_gpu_blocks"]
    assert "rank 0's" in d["per_rank"]["rank_0_metrics"]
    assert saved["workload"] == {
        "dataset_name": "random", "dataset_path": None, "num_prompts": 40, "random_input_len": 256,
        "random_output_len": 32, "random_range_ratio": 0.0, "random_prefix_len": 0,
        "request_rate": 20.0, "burstiness": 1.0, "max_concurrency": 30, "time_scale": 1.0,
        "duration": None, "seed": 3, "eos_probability": 0.0}
    # vllm bench's flat keys stay.
    assert saved["model_id"] == "meta-llama/Llama-3.1-8B" and saved["max_num_seqs"] == 48
    assert saved["request_rate"] == 20.0 and saved["num_gpus"] == 4
    assert saved["output_throughput_per_gpu"] == pytest.approx(saved["output_throughput"] / 4)
    assert saved["total_token_throughput_per_gpu"] == pytest.approx(saved["total_token_throughput"] / 4)
    html = page.read_text()
    for setting, value in (("model.name", "meta-llama/Llama-3.1-8B"), ("model.kv_cache_dtype", "fp8"),
                           ("hardware.id", "h100-sxm"), ("parallel.num_gpus", "4"),
                           ("scheduler.max_num_seqs", "48"), ("cache.block_size", "32"),
                           ("scheduler.async_scheduling", "False"), ("workload.request_rate", "20"),
                           ("workload.max_concurrency", "30"), ("workload.seed", "3")):
        assert f'data-setting="{setting}" data-result="0">{value}</td>' in html, setting
    assert "per DP rank" in html and 'data-key="output_throughput_per_gpu"' in html


def test_unlimited_request_rate_is_saved_as_vllm_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["simulate", *SMALL, "--save-result", str(out)]) == 0
    text = out.read_text()
    assert "Infinity" not in text  # standard JSON
    saved = json.loads(text)
    assert saved["request_rate"] == "inf" and saved["workload"]["request_rate"] == "inf"


@dataclass(slots=True)
class RecordWithItls(RequestRecord):
    itls: list[float] | None = None


def test_detailed_lists_follow_vllm_bench_serve() -> None:
    specs = [WorkloadRequest(f"r{i}", 0.0, ((1000 + i, n_in),), n_out)
             for i, (n_in, n_out) in enumerate([(5, 3), (7, 2), (9, 4)])]
    records = [RecordWithItls("r2", 1.0, 1.5, 2.5, 9, 4, itls=[0.25, 0.5, 0.25]),
               RecordWithItls("r0", 0.0, 0.125, 0.375, 5, 3, itls=[0.125, 0.125])]
    lists, note = detailed_lists(specs, records, [("r1", "refused: too long")])
    assert note is None
    assert lists == {"input_lens": [5, 7, 9], "output_lens": [3, 0, 4], "ttfts": [0.125, 0.0, 0.5],
                     "itls": [[0.125, 0.125], [], [0.25, 0.5, 0.25]],
                     "latencies": [0.375, 0.0, 1.5], "start_times": [0.0, None, 1.0],
                     "queue_times": [0.0, None, 0.0],
                     "generated_texts": ["", "", ""], "errors": ["", "refused: too long", ""]}
    # due at 0.25, sent at 1.0: 0.75 s in the client's queue
    queued = [RecordWithItls("r2", 1.0, 1.5, 2.5, 9, 4, 0.25, itls=[0.25, 0.5, 0.25]), records[1]]
    assert detailed_lists(specs, queued, [("r1", "x")])[0]["queue_times"] == [0.0, None, 0.75]
    # Records without per-request ITLs: the list is left out, and the note says why.
    plain = [RequestRecord("r2", 1.0, 1.5, 2.5, 9, 4), RequestRecord("r0", 0.0, 0.125, 0.375, 5, 3)]
    lists, note = detailed_lists(specs, plain, [("r1", "refused: too long")])
    assert "itls" not in lists and note is not None and "RequestRecord.itls" in note
    assert lists["ttfts"] == [0.125, 0.0, 0.5]
    with pytest.raises(RuntimeError, match="r1"):
        detailed_lists(specs, plain, [])
    with pytest.raises(RuntimeError, match="zz"):
        detailed_lists(specs, plain, [("r1", "x"), ("zz", "y")])


def test_save_detailed_writes_vllm_bench_per_request_lists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(100, 20), (1000, 101), (300, 8)])
    out = tmp_path / "r.json"
    assert main(["simulate", "--no-progress", "--dataset-name", "jsonl", "--dataset-path", str(trace),
                 "--max-model-len", "1100", "--save-result", str(out), "--save-detailed"]) == 0
    assert "itls not written" not in capsys.readouterr().err
    saved = json.loads(out.read_text())
    # Per-request inter-token latencies, as vllm bench serve writes them.
    assert [len(x) for x in saved["itls"]] == [19, 0, 7]
    assert all(gap > 0 for gap in saved["itls"][0] + saved["itls"][2])
    assert saved["input_lens"] == [100, 1000, 300]
    assert saved["output_lens"] == [20, 0, 8]
    assert saved["generated_texts"] == ["", "", ""]
    assert saved["errors"][0] == "" and saved["errors"][2] == ""
    assert saved["errors"][1].startswith("refused by the server")
    assert saved["ttfts"][1] == 0.0 and saved["ttfts"][0] > 0 and saved["ttfts"][2] > 0
    by_id = {r["request_id"]: r for r in saved["requests"]}
    assert saved["ttfts"][0] == by_id["jsonl-0"]["ttft"]  # seconds, like the records
    assert saved["ttfts"][0] + sum(saved["itls"][0]) == pytest.approx(by_id["jsonl-0"]["e2el"])
    assert [f["request_id"] for f in saved["failed_requests"]] == ["jsonl-1"]
    # vLLM's latencies, start_times and queue_times (null where a request failed)
    assert saved["latencies"][0] == pytest.approx(by_id["jsonl-0"]["e2el"]) and saved["latencies"][1] == 0.0
    assert saved["start_times"][1] is None and saved["queue_times"][1] is None
    assert saved["start_times"][0] == 0.0 and saved["queue_times"][2] == 0.0


def test_failure_reasons_group_engine_and_server_refusals() -> None:
    failed = [
        ("a", "refused by the server: prompt + output > max_model_len=100 "
              "(prompt 90 + output 20 = 110 tokens)"),
        ("b", "request b: prompt 50 + max_tokens 9 needs up to 4 KV blocks but the cache has 3; it could "
              "never run (vLLM would hang on it). Lower max_tokens"),
        ("c", "refused by the server: prompt + output > max_model_len=100 "
              "(prompt 99 + output 2 = 101 tokens)"),
        ("d", "request d: something else"),
    ]
    assert failure_reasons(failed) == {
        "refused by the server: prompt + output > max_model_len=100": 2,
        "refused by the engine: needs more KV blocks than the cache's 3 (it could never run)": 1,
        "something else": 1,
    }
    assert format_failures(failed, 10) == [
        "Failed requests: 4 of 10, by reason:",
        "       2  refused by the server: prompt + output > max_model_len=100 (first: a)",
        "       1  refused by the engine: needs more KV blocks than the cache's 3 (it could never run) "
        "(first: b)",
        "       1  something else (first: d)",
    ]


def test_tensor_parallel_alone_says_nothing_of_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--tensor-parallel-size", "2", "--step-time-backend", "roofline"]) == 0
    out = capsys.readouterr().out
    assert "-- Engine --" in out and "rank" not in out.lower()


def test_data_parallel_tables_name_rank_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--data-parallel-size", "2", "--step-time-backend", "roofline"]) == 0
    out = capsys.readouterr().out
    assert "Engine (rank 0)" in out and "KV blocks (per rank):" in out


def test_a_burst_says_what_it_shows_and_how_to_load_steadily(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--step-time-backend", "roofline"]) == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("Note: all 40 requests arrived at t=0"))
    rate = float(re.search(r"--request-rate ([0-9.]+),", note).group(1))  # type: ignore[union-attr]
    measured = float(re.search(r"Request throughput \(req/s\):\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert rate == pytest.approx(0.7 * measured, rel=0.01)
    assert main(["simulate", *SMALL, "--step-time-backend", "roofline", "--request-rate", "5"]) == 0
    assert "Note: all" not in capsys.readouterr().out


def test_a_saved_run_repeats_from_its_run_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, again = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["simulate", *SMALL, "--max-num-seqs", "8", "--request-rate", "20",
                 "--step-time-backend", "roofline", "--save-result", str(first)]) == 0
    saved = json.loads(first.read_text())
    assert saved["run_spec"]["deployment"]["groups"][0]["engine"]["max_num_seqs"] == 8
    assert saved["run_spec"]["workload"]["num_prompts"] == 40
    assert main(["simulate", "--run-spec", str(first), "--no-progress", "--save-result", str(again)]) == 0
    repeated = json.loads(again.read_text())
    for key in ("mean_ttft_ms", "p99_tpot_ms", "duration", "num_gpu_blocks", "completed", "run_spec"):
        assert repeated[key] == saved[key], key
    capsys.readouterr()
    assert main(["simulate", "--run-spec", str(first), "--max-num-seqs", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--run-spec=" in err and "--max-num-seqs 4" in err


def test_a_bad_run_spec_file_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.json"
    path.write_text('{"workload": {"num_prompts": "many"}}')
    assert main(["simulate", "--run-spec", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvsched: error: ") and "workload.num_prompts='many'" in err, err


def test_the_summary_and_the_json_say_which_pricing_priced_the_run(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a100.json"
    # No measured tables for the A100: "auto" falls back to the roofline, and says so.
    assert main(["simulate", *SMALL, "--hardware", "a100-80gb", "--save-result", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Steps priced by: roofline-fallback: roofline (measured kernels not used: no measured vLLM " \
           "tables for a100-80gb; efficiencies: learned from vLLM 0.24.0 kernel tables" in text
    saved = json.loads(out.read_text())
    assert saved["pricing"] == "roofline-fallback"
    assert saved["pricing_reason"] == "measured kernels not used: no measured vLLM tables for a100-80gb"
    assert saved["deployment"]["step_times"]["pricing"] == "roofline-fallback"
    assert main(["simulate", *SMALL, "--save-result", str(out)]) == 0
    assert "Steps priced by: measured: measured vLLM 0.24.0 kernels" in capsys.readouterr().out
    assert json.loads(out.read_text())["pricing"] == "measured"
