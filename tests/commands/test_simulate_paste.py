"""``kvsched simulate --serve "vllm serve ..." --bench "vllm bench serve ..."``
with serve and bench lines copied from vLLM's docs and users' write-ups,
unchanged (where a line uses a shell variable, its value is put in and
said so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.cli import build_parser, main
from kvsched.commands.simulate import spec_of
from kvsched.sim.flags import with_pasted
from kvsched.sim.spec import RunSpec

# vLLM's docs, docs/benchmarking/cli.md, "Responses API Benchmark"
# (https://docs.vllm.ai/en/latest/benchmarking/cli/#responses-api-benchmark).
RESPONSES_SERVE = "vllm serve openai/gpt-oss-20b"
RESPONSES_BENCH = """vllm bench serve \\
    --backend openai-responses \\
    --endpoint /v1/responses \\
    --model openai/gpt-oss-20b \\
    --dataset-name random \\
    --random-input-len 1024 \\
    --random-output-len 1024 \\
    --num-prompts 200"""
# The same page, "BFCL (Tool-Calling) Benchmark": a server with tool and
# reasoning parsers, and its client on the BFCL Hugging Face dataset.
BFCL_SERVE = """vllm serve openai/gpt-oss-20b \\
    --enable-auto-tool-choice \\
    --tool-call-parser openai \\
    --reasoning-parser openai_gptoss"""
BFCL_BENCH = """vllm bench serve \\
    --backend openai-chat \\
    --endpoint /v1/chat/completions \\
    --model openai/gpt-oss-20b \\
    --dataset-name hf \\
    --dataset-path gorilla-llm/Berkeley-Function-Calling-Leaderboard \\
    --bfcl-categories simple,live_simple,multiple \\
    --num-prompts 200"""
# The same page, "Custom Dataset".
CUSTOM_SERVE = "vllm serve meta-llama/Llama-3.1-8B-Instruct"
CUSTOM_BENCH = """vllm bench serve --port 9001 --save-result --save-detailed \\
  --backend vllm \\
  --model meta-llama/Llama-3.1-8B-Instruct \\
  --endpoint /v1/completions \\
  --dataset-name custom \\
  --dataset-path <path-to-your-data-jsonl> \\
  --skip-chat-template \\
  --num-prompts 80 \\
  --max-concurrency 1 \\
  --temperature=0.3 \\
  --top-p=0.75 \\
  --result-dir "./log/\""""
# The same page, "Replay Timed Traces" (its bench line has a `\` followed by
# spaces, kept).
TIMED_SERVE = """vllm serve Qwen/Qwen3.5-2B \\
--host 127.0.0.1 --port 8000"""
TIMED_BENCH = """vllm bench serve --model Qwen/Qwen3.5-2B \\  
--dataset-name=timed_trace --num-prompts 100 --host 127.0.0.1 \\
--port 8000 --dataset-path ./conversation_trace.jsonl \\
--ignore-eos  --self-timed --timed-trace-chunk-hash-size 512 \\
--timed-trace-sec-multiplier 0.001 """  # noqa: W291
# A user's concurrency sweep on one A100 40GB with vLLM 0.23
# (https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on): the loop's
# $C is 1 here, $((C*20)) 20 and sweep_c${C} sweep_c1.
SWEEP_SERVE = "vllm serve meta-llama/Llama-3.1-8B-Instruct"
SWEEP_BENCH = """vllm bench serve --model meta-llama/Llama-3.1-8B-Instruct \\
--dataset-name random --random-input-len 1024 --random-output-len 128 \\
--ignore-eos --max-concurrency 1 --num-prompts 20 \\
--request-rate inf --metadata vllm=0.23.0 gpu=a100-40gb \\
--save-result --result-filename sweep_c1.json"""
# Arm's learning path "Benchmark Llama throughput"
# (https://learn.arm.com/learning-paths/servers-and-cloud-computing/vllm-benchmark-quantisation/4-benchmarking/).
ARM_SERVE = """vllm serve \\
  --model meta-llama/Llama-3.1-8B \\
  --max-num-batched-tokens 8192 \\
  --max-model-len 4096 &"""
ARM_BENCH = """vllm bench serve \\
  --model meta-llama/Llama-3.1-8B \\
  --dataset-name sharegpt \\
  --dataset-path ./ShareGPT_V3_unfiltered_cleaned_split.json \\
  --num-prompts 256 \\
  --request-rate 8 \\
  --max-concurrency 10 \\
  --top-p 1 --temperature 0 \\
  --percentile-metrics ttft,tpot \\
  --metric-percentiles 50,95,99 \\
  --save-result --result-dir bench_out --result-filename serve.json"""


def spec_for(argv: list[str]) -> RunSpec:
    """The run spec ``kvsched simulate ARGV`` would run."""
    args, _ = with_pasted(build_parser().parse_args(["simulate", *argv]))
    return spec_of(args)


def test_docs_pair_runs_and_matches_the_same_run_given_as_kvsched_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pasted, flags = tmp_path / "pasted.json", tmp_path / "flags.json"
    assert main(["simulate", "--hardware", "h100-sxm", "--serve", BFCL_SERVE, "--bench", RESPONSES_BENCH,
                 "--no-progress", "--save-result", str(pasted)]) == 0
    out, err = capsys.readouterr()
    assert "Simulated Serving Benchmark Result" in out and "Successful requests:" in out
    assert ("kvsched: ignored (does not affect the prediction): --serve --enable-auto-tool-choice, "
            "--tool-call-parser, --reasoning-parser; --bench --backend, --endpoint") in err
    assert "--bench has no --ignore-eos" in err
    assert main(["simulate", "--hardware", "h100-sxm", "--model", "openai/gpt-oss-20b", "--dataset-name",
                 "random", "--random-input-len", "1024", "--random-output-len", "1024", "--num-prompts",
                 "200", "--no-progress", "--save-result", str(flags)]) == 0
    a, b = (json.loads(p.read_text()) for p in (pasted, flags))
    assert a["completed"] == 200 and a["model_id"] == "openai/gpt-oss-20b"
    for key in ("duration", "mean_ttft_ms", "p99_tpot_ms", "output_throughput", "run_spec"):
        assert a[key] == b[key], key


def test_ignored_flags_leave_the_run_spec_alone() -> None:
    base = ["--hardware", "h100-sxm", "--bench", RESPONSES_BENCH]
    assert spec_for(["--serve", BFCL_SERVE, *base]) == spec_for(["--serve", RESPONSES_SERVE, *base])
    assert spec_for(["--serve", SWEEP_SERVE, "--hardware", "a100-40gb", "--bench", SWEEP_BENCH]) == spec_for([
        "--hardware", "a100-40gb", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--random-input-len",
        "1024", "--random-output-len", "128", "--max-concurrency", "1", "--num-prompts", "20",
        "--request-rate", "inf"])
    assert spec_for(["--serve", ARM_SERVE, "--hardware", "h100-sxm"]) == spec_for([
        "--model", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "8192", "--max-model-len", "4096"])


def test_users_sweep_pair_runs_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hardware", "a100-40gb", "--serve", SWEEP_SERVE, "--bench", SWEEP_BENCH,
                 "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "Successful requests:                            20" in out
    assert "ignored (does not affect the prediction): --bench --metadata, --save-result, --result-filename" \
        in err
    assert "no --ignore-eos" not in err


@pytest.mark.parametrize("serve, bench, message", [
    (BFCL_SERVE, BFCL_BENCH, "--bfcl-categories simple,live_simple,multiple: a flag of vLLM's hf dataset"),
    (TIMED_SERVE, TIMED_BENCH, "--self-timed: a trace's own timestamps"),
    # The custom and sharegpt datasets are taken; the guides' files are not here.
    (CUSTOM_SERVE, CUSTOM_BENCH, "<path-to-your-data-jsonl>: no such file"),
    (ARM_SERVE, ARM_BENCH, "ShareGPT_V3_unfiltered_cleaned_split.json: no such file"),
])
def test_docs_pairs_kvsched_cannot_run_are_refused_by_name(
        serve: str, bench: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hardware", "h100-sxm", "--serve", serve, "--bench", bench,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "kvsched: error: " in err and message.lower() in err.lower(), err


@pytest.mark.parametrize("argv, message", [
    (["--serve", CUSTOM_SERVE], "--serve: a vllm serve line names no GPU; give kvsched's --hardware"),
    (["--hardware", "h200", "--max-num-seqs", "64", "--serve", f"{CUSTOM_SERVE} --max-num-seqs 32"],
     "--max-num-seqs=64 and --serve's --max-num-seqs 32 disagree"),
    # kvsched's default model, given: told apart from not given.
    (["--hardware", "h200", "--model", "meta-llama/Llama-3.1-8B", "--serve", RESPONSES_SERVE],
     "--model=meta-llama/Llama-3.1-8B and --serve's model openai/gpt-oss-20b disagree"),
    (["--hardware", "h200", "--num-prompts", "5", "--bench", SWEEP_BENCH],
     "--num-prompts=5 and --bench's --num-prompts 20 disagree"),
    # read as the default release, 0.34
    (["--hardware", "h200", "--serve", f"{CUSTOM_SERVE} --step-time-backend roofline"],
     "--step-time-backend is not a vllm serve flag of vLLM 0.34"),
    (["--hardware", "h200", "--serve", f"{CUSTOM_SERVE} --gpu-memory-utilisation 0.8"],
     "did you mean --gpu-memory-utilization"),
    (["--hardware", "h200", "--serve", f"{CUSTOM_SERVE} --max-model-len"], "--max-model-len needs a value"),
])
def test_bad_pastes_are_one_clear_error(argv: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_flags_beside_the_lines_that_agree_or_add_are_taken() -> None:
    spec = spec_for(["--hardware", "h200", "--max-num-seqs", "32", "--serve",
                     f"{RESPONSES_SERVE} --max-num-seqs 32", "--bench", RESPONSES_BENCH,
                     "--request-rate", "2"])
    assert spec.deployment.group.engine.max_num_seqs == 32
    assert spec.deployment.group.engine.hardware == "h200"
    assert (spec.workload.num_prompts, spec.workload.request_rate) == (200, 2.0)
