"""The benchmark datasets as workloads: shared prefixes reach the simulator
as shared tokens, --request-rate re-paces a trace, BurstGPT's own
timestamps, the random dataset with a tokenizer, the dataset flags through
the run spec, and the refusals."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.run import build_workload
from kvsched.sim.workload import (
    UNIQUE_TOKEN_BASE,
    ApproximateTokenizer,
    BenchDatasetOptions,
    arrival_times_of_rate,
    load_bench_dataset,
    load_jsonl,
    random_workload,
    repaced,
)
from kvsched.sim.workload.tokenizer import HFTokenizer, read_tokenizer

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "benchdatasets"
GOLDENS = ROOT / "tests" / "conformance" / "bench_datasets"


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return read_tokenizer(DATA / "tokenizer" / "tokenizer.json")


def _load(name: str, tok: HFTokenizer, path: Path | None = None, n: int = 20, rate: float | None = None,
          **options: object) -> object:
    return load_bench_dataset(name, path, tok, num_prompts=n, seed=0, request_rate=rate, burstiness=1.0,
                              max_concurrency=None, options=BenchDatasetOptions(**options))  # type: ignore[arg-type]


def test_prefix_repetition_prompts_share_their_prefix_tokens(tok: HFTokenizer) -> None:
    w = load_bench_dataset("prefix_repetition", None, tok, num_prompts=6, seed=0, request_rate=None,
                           burstiness=1.0, max_concurrency=None,
                           options=BenchDatasetOptions(prefix_repetition_prefix_len=40,
                                                       prefix_repetition_suffix_len=8,
                                                       prefix_repetition_num_prefixes=2))
    firsts = [r.prompt_runs[0] for r in w.requests]
    # Two prefixes of 40 tokens (+1 BOS), each the first run of three prompts.
    assert sorted({token for token, _ in firsts}) == [2, 3]
    assert all(token < UNIQUE_TOKEN_BASE and count >= 35 for token, count in firsts)
    assert sum(1 for token, _ in firsts if token == firsts[0][0]) == 3
    # Every prompt then has tokens of its own.
    assert all(r.prompt_runs[-1][0] >= UNIQUE_TOKEN_BASE for r in w.requests)
    assert all(r.arrival_time == 0.0 for r in w.requests)


def test_oversampled_copies_share_their_whole_prompt(tok: HFTokenizer) -> None:
    w = load_bench_dataset("sharegpt", DATA / "sharegpt.json", tok, num_prompts=45, seed=11,
                           request_rate=None, burstiness=1.0, max_concurrency=None,
                           options=BenchDatasetOptions())
    golden = json.loads((GOLDENS / "sharegpt_oversample.json").read_text())["requests"]
    assert [r.num_prompt_tokens for r in w.requests] == [g["server_prompt_len"] for g in golden]
    shared = [r for r in w.requests if r.prompt_runs[0][0] < UNIQUE_TOKEN_BASE]
    assert shared  # 45 asked, fewer pass the filter: copies
    assert all(len(r.prompt_runs) == 1 for r in shared)
    runs = [r.prompt_runs for r in shared]
    assert any(runs.count(x) > 1 for x in runs)


def test_request_rate_repaces_a_trace_and_keeps_its_lengths(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [(0.0, 30, 5), (7.5, 12, 9), (9.0, 44, 2), (100.0, 8, 1)]
    trace.write_text("".join(json.dumps({"arrival_time": t, "input_tokens": i, "output_tokens": o}) + "\n"
                             for t, i, o in rows))
    w = repaced(load_jsonl(trace), 2.0, 1.0, seed=3)
    assert [(r.num_prompt_tokens, r.output_len) for r in w.requests] == [(i, o) for _, i, o in rows]
    assert [r.arrival_time for r in w.requests] == arrival_times_of_rate(4, 2.0, 1.0, 3)
    assert w.requests[-1].arrival_time == pytest.approx(2.0)  # vLLM ends the schedule at n / rate
    assert [r.arrival_time for r in repaced(load_jsonl(trace), math.inf, 1.0, 0).requests] == [0.0] * 4


def test_request_rate_repaces_a_trace_through_the_run_spec(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_time": 10.0 * k, "input_tokens": 5, "output_tokens": 2})
                             + "\n" for k in range(5)))
    spec = parse_spec(["--dataset-name", "jsonl", "--dataset-path", str(trace), "--request-rate", "5",
                       "--burstiness", "inf"]).workload.resolved()
    assert [r.arrival_time for r in build_workload(spec).requests] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_burstgpt_timestamps_replay_the_gpt4_rows_in_file_order(tok: HFTokenizer) -> None:
    w = _load("burstgpt", tok, DATA / "burstgpt.csv", n=4, burstgpt_timestamps=True)
    # The GPT-4 rows with a response, in file order, at their Timestamp less the first one.
    lines = (DATA / "burstgpt.csv").read_text().splitlines()[1:]
    kept = [row.split(",") for row in lines if row.split(",")[1] == "GPT-4" and int(row.split(",")[3]) > 0]
    t0 = float(kept[0][0])
    assert [r.arrival_time for r in w.requests] == [float(k[0]) - t0 for k in kept[:4]]  # type: ignore[attr-defined]
    assert [r.output_len for r in w.requests] == [int(k[3]) for k in kept[:4]]  # type: ignore[attr-defined]


def test_random_with_a_tokenizer_sends_vllms_lengths(tok: HFTokenizer) -> None:
    golden = json.loads((GOLDENS / "random_ratio_prefix.json").read_text())["requests"]
    w = random_workload(num_prompts=20, input_len=64, output_len=16, range_ratio=0.5, prefix_len=10, seed=7,
                        tokenizer=tok)
    assert [r.num_prompt_tokens for r in w.requests] == [g["server_prompt_len"] for g in golden]
    assert [r.output_len for r in w.requests] == [g["expected_output_len"] for g in golden]
    # The BOS and the prefix are one shared run.
    assert {r.prompt_runs[0] for r in w.requests} == {(1, 11)}


def test_the_approximation_counts_bytes_and_says_so() -> None:
    a = ApproximateTokenizer()
    assert (a.exact, a.count("abcdefgh"), a.count("abcdefghi", add_special_tokens=False)) == (False, 3, 3)


def test_dataset_flags_reach_the_spec_and_come_back() -> None:
    argv = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "24",
            "--prefix-repetition-suffix-len", "12", "--prefix-repetition-num-prefixes", "3",
            "--prefix-repetition-output-len", "10", "--num-prompts", "20", "--disable-shuffle",
            "--tokenizer", str(DATA / "tokenizer"), "--request-rate", "2.5"]
    spec = parse_spec(argv)
    w = spec.workload
    given = (w.prefix_repetition_prefix_len, w.prefix_repetition_num_prefixes, w.disable_shuffle)
    assert given == (24, 3, True)
    assert parse_spec(spec_argv(spec)) == spec
    built = build_workload(w.resolved())
    assert len(built.requests) == 18  # 20 // 3 prompts for each of 3 prefixes
    assert max(r.arrival_time for r in built.requests) == pytest.approx(18 / 2.5)


@pytest.mark.parametrize(("argv", "words"), [
    (["--dataset-name", "hf", "--dataset-path", "x"], ["--hf-name", "VisionArena-Chat"]),
    (["--dataset-name", "sharegpt", "--dataset-path", str(DATA / "sharegpt.json"), "--time-scale", "2"],
     ["--time-scale=2", "--request-rate"]),
    (["--dataset-name", "custom", "--dataset-path", str(DATA / "sharegpt.json")], [".jsonl"]),
    (["--dataset-name", "prefix_repetition", "--num-prompts", "3"], ["--num-prompts=3", "num-prefixes=10"]),
])
def test_bad_dataset_flags_are_refused(argv: list[str], words: list[str]) -> None:
    with pytest.raises(UserInputError) as info:
        build_workload(parse_spec(argv).workload.resolved())
    assert all(w in str(info.value) for w in words), str(info.value)


def test_the_saved_workload_names_the_dataset_flags_and_pacing() -> None:
    from kvsched.sim.results import workload_dict

    spec = parse_spec(["--dataset-name", "sonnet", "--dataset-path", str(DATA / "sonnet.txt"),
                       "--sonnet-input-len", "300", "--sonnet-prefix-len", "100", "--num-prompts", "4",
                       "--tokenizer", str(DATA / "tokenizer")]).workload.resolved()
    saved = workload_dict(spec, build_workload(spec))
    given = (saved["sonnet_input_len"], saved["sonnet_prefix_len"], saved["request_rate"])
    assert given == (300, 100, math.inf)
    assert "sonnet_output_len" not in saved and saved["tokenizer"] == str(DATA / "tokenizer")


def test_a_tokenizer_id_not_downloaded_is_the_approximation_a_missing_path_an_error(tmp_path: Path) -> None:
    from kvsched.sim.workload import load_tokenizer

    tok, warning = load_tokenizer("m", "no-such-org/no-such-model")
    assert not tok.exact and warning is not None and "no-such-org/no-such-model" in warning
    # A pasted line's path of another machine too.
    assert not load_tokenizer("m", "/models/elsewhere/llama")[0].exact
    with pytest.raises(UserInputError, match="--tokenizer"):
        load_tokenizer("m", str(tmp_path))


def test_the_json_range_ratio_sets_input_and_output_apart() -> None:
    golden = json.loads((GOLDENS / "random_ratio_dict.json").read_text())["requests"]
    spec = parse_spec(["--num-prompts", "15", "--random-input-len", "30", "--random-output-len", "50",
                       "--random-range-ratio", '{"input": 0.3, "output": 0.9}', "--seed", "3",
                       "--tokenizer", str(DATA / "tokenizer")])
    assert (spec.workload.random_range_ratio, spec.workload.random_output_range_ratio) == (0.3, 0.9)
    assert parse_spec(spec_argv(spec)) == spec
    w = build_workload(spec.workload.resolved())
    assert [r.output_len for r in w.requests] == [g["expected_output_len"] for g in golden]
    assert [r.num_prompt_tokens for r in w.requests] == [g["server_prompt_len"] for g in golden]
    with pytest.raises((UserInputError, argparse.ArgumentError), match="exactly"):
        parse_spec(["--random-range-ratio", '{"input": 0.3}'])


def test_the_run_spec_carries_every_dataset_option_with_the_same_default() -> None:
    """The run spec is flat, as vllm bench serve's flags are: WorkloadSpec
    is a BenchDatasetOptions (its fields declared once, there), handed to the
    benchmark datasets as it is, and its JSON form names each field once."""
    import dataclasses

    from kvsched.sim.spec import WorkloadSpec, spec_from_json, spec_to_json
    from kvsched.sim.workload import BenchDatasetOptions

    spec = WorkloadSpec(dataset_name="sonnet", sonnet_input_len=300, no_oversample=True)
    assert isinstance(spec, BenchDatasetOptions)
    names = [f.name for f in dataclasses.fields(WorkloadSpec)]
    assert len(names) == len(set(names))
    assert {f.name for f in dataclasses.fields(BenchDatasetOptions)} <= set(names)
    data = spec_to_json(parse_spec([]))
    data["workload"].update(dataset_name="sonnet", sonnet_input_len=300, no_oversample=True)
    assert spec_from_json(data).workload.sonnet_input_len == 300
