"""kvsched calibrate: recovers known host terms from synthetic runs, reads
vllm bench serve's files and per-request JSON lines, refuses bad input in
one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvsched.calibrate import (
    Calibrator,
    bounded_step,
    levenberg_marquardt,
    load_run,
    parse_bench,
    run_errors,
)
from kvsched.cli import main
from kvsched.perf.host import TERMS, HostTerms, load_host_terms, save_host_terms
from kvsched.sim.deployment import EngineOptions, build_deployment

pytest.importorskip("aiconfigurator_core")  # the measured backend's tables

MODEL = "meta-llama/Llama-3.1-8B"
ENGINE = ["--model", MODEL, "--hardware", "h100-sxm"]
# The synthetic ground truth, and a start far from it (each term 2-5x off).
TRUTH = {"prefill_step_per_layer_s": 0.3e-3, "step_s": 0.5e-3, "per_sampled_request_s": 20e-6,
         "dp_sync_s": 0.0, "arrival_s": 4e-3, "per_prompt_token_s": 2e-6}
START = {"prefill_step_per_layer_s": 0.6e-3, "step_s": 0.1e-3, "per_sampled_request_s": 5e-6,
         "dp_sync_s": 0.0, "arrival_s": 15e-3, "per_prompt_token_s": 8e-6}
# Mixed lengths (input 80-1520, output 3-61) so prompt-length terms show.
WORKLOAD = ["--num-prompts", "120", "--random-input-len", "800", "--random-output-len", "32",
            "--random-range-ratio", "0.9", "--no-progress"]


def terms_file(path: Path, values: dict[str, float], note: str) -> Path:
    save_host_terms(HostTerms(vllm_version="test", hardware_class="h100-sxm", provenance=note,
                              **values), path)
    return path


def simulate(folder: Path, name: str, extra: list[str]) -> Path:
    out = folder / f"{name}.json"
    code = main(["simulate", *ENGINE, "--step-time-backend", "measured", "--calibration",
                 str(folder / "truth.json"), *WORKLOAD, *extra, "--save-result", str(out),
                 "--save-detailed"])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs simulated with the known terms: concurrency 1 (the engine is idle
    at every arrival, so TTFT shows the arrival terms and TPOT a batch of one),
    64 (large batches, prefill mixed with decodes), and two held-out runs at
    another concurrency and at a Poisson rate."""
    folder = tmp_path_factory.mktemp("calibrate")
    terms_file(folder / "truth.json", TRUTH, "synthetic truth")
    terms_file(folder / "start.json", START, "far start")
    return {"folder": folder,
            "c1": simulate(folder, "c1", ["--max-concurrency", "1"]),
            "c64": simulate(folder, "c64", ["--max-concurrency", "64"]),
            "c16": simulate(folder, "c16", ["--max-concurrency", "16", "--seed", "7"]),
            "r8": simulate(folder, "r8", ["--request-rate", "8", "--seed", "3"])}


def assert_recovered(fitted: HostTerms, names: tuple[str, ...] = ("prefill_step_per_layer_s", "step_s",
                     "per_sampled_request_s", "arrival_s", "per_prompt_token_s")) -> None:
    for name in names:
        value, truth = getattr(fitted, name), TRUTH[name]
        assert value == pytest.approx(truth, rel=0.02), f"{name}: fitted {value!r}, truth {truth!r}"


def test_recovers_every_term_from_bench_files(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    out = runs["folder"] / "fitted.json"
    code = main(["calibrate", *ENGINE, "--calibration", str(runs["folder"] / "start.json"),
                 "--bench", str(runs["c1"]), "--bench", str(runs["c64"]),
                 "--held-out", str(runs["c16"]), "--held-out", str(runs["r8"]), "-o", str(out)])
    assert code == 0
    fitted = load_host_terms(out)
    assert_recovered(fitted)
    assert fitted.dp_sync_s == 0.0  # one DP rank: not fitted, the start's value kept
    assert fitted.hardware_class == "h100-sxm"
    assert "c1.json" in fitted.provenance and "c16.json" in fitted.provenance
    text = capsys.readouterr().out
    assert "Held-out error" in text and "closed loop: all due at 0, 64 in flight" in text
    # simulate --save-detailed writes vLLM's start_times: the open-loop run is
    # replayed at them (the draw without them: test_arrivals_are_vllm_bench_serves_draw).
    assert "sent at the file's start_times" in text
    # The held-out runs, replayed with the fitted terms, match per request.
    deployment = build_deployment(EngineOptions(MODEL, "h100-sxm", step_time_backend="measured"))
    calibrator = Calibrator(deployment, [load_run(str(runs["c1"]), "bench")], fitted, ("step_s",))
    for name in ("c16", "r8"):
        errors = calibrator.errors([load_run(str(runs[name]), "bench")], fitted)[0]
        assert np.median(np.abs(errors.ttft)) < 0.01, name
        assert np.median(np.abs(errors.tpot)) < 0.01, name
    # ... and the file works as simulate's --calibration.
    assert main(["simulate", *ENGINE, "--calibration", str(out), "--num-prompts", "4",
                 "--no-progress"]) == 0


def test_per_request_jsonl_replays_exactly_and_fits(runs: dict[str, Path]) -> None:
    """The runs as JSON lines of send, first- and last-token times (on
    another clock): replayed at their exact send times, they come out as
    they ran with the true terms; from a start off, the terms that a run at
    concurrency 1 pins are recovered."""
    paths = {}
    for name in ("c1", "c64"):
        data = json.loads(runs[name].read_text())
        path = paths[name] = runs["folder"] / f"{name}.jsonl"
        with path.open("w") as f:
            # Workload order: requests sent at the same time (the closed
            # loop's first 64) reach the engine in file order.
            for r in sorted(data["requests"], key=lambda r: int(r["request_id"].split("-")[1])):
                f.write(json.dumps({"arrival_time": 100.0 + r["send_time"],
                                    "first_token_time": 100.0 + r["send_time"] + r["ttft"],
                                    "last_token_time": 100.0 + r["send_time"] + r["e2el"],
                                    "prompt_tokens": r["input_len"], "output_tokens": r["output_len"],
                                    "model": "meta-llama/Llama-3.1-8B-Instruct"}) + "\n")
    truth = load_host_terms(runs["folder"] / "truth.json")
    deployment = build_deployment(EngineOptions(MODEL, "h100-sxm", step_time_backend="measured"))
    run = load_run(str(paths["c64"]), "requests")
    assert run.model_id == "meta-llama/Llama-3.1-8B-Instruct" and len(run.input_lens) == 120
    errors = Calibrator(deployment, [run], truth, ("step_s",)).errors([run], truth)[0]
    assert np.max(np.abs(errors.ttft)) < 1e-9 and np.max(np.abs(errors.tpot)) < 1e-9
    out = runs["folder"] / "fitted-jsonl.json"
    start = {**TRUTH, "step_s": 0.1e-3, "arrival_s": 15e-3, "per_prompt_token_s": 8e-6}
    terms_file(runs["folder"] / "start-jsonl.json", start, "three terms off")
    assert main(["calibrate", *ENGINE, "--calibration", str(runs["folder"] / "start-jsonl.json"),
                 "--requests", str(paths["c1"]), "--fit", "step_s,arrival_s,per_prompt_token_s",
                 "-o", str(out)]) == 0
    assert_recovered(load_host_terms(out), ("step_s", "arrival_s", "per_prompt_token_s"))


def test_summary_only_file_fits_on_the_means(runs: dict[str, Path]) -> None:
    """Without per-request times, a file's mean TTFT and TPOT are fitted."""
    files = []
    for name in ("c1", "c64"):
        data = json.loads(runs[name].read_text())
        for key in ("ttfts", "itls", "latencies", "start_times", "queue_times", "requests"):
            del data[key]
        path = runs["folder"] / f"{name}-means.json"
        path.write_text(json.dumps(data))
        files += ["--bench", str(path)]
    run = load_run(files[1], "bench")
    assert run.ttfts is None and run.mean_ttft_s == pytest.approx(
        json.loads(runs["c1"].read_text())["mean_ttft_ms"] / 1e3)
    out = runs["folder"] / "fitted-means.json"
    start = {**TRUTH, "step_s": 0.1e-3, "arrival_s": 12e-3}
    terms_file(runs["folder"] / "start-means.json", start, "two terms off")
    assert main(["calibrate", *ENGINE, "--calibration", str(runs["folder"] / "start-means.json"),
                 *files, "--fit", "step_s,arrival_s", "-o", str(out)]) == 0
    assert_recovered(load_host_terms(out), ("step_s", "arrival_s"))


def test_arrivals_are_vllm_bench_serves_draw() -> None:
    """A finite rate without start_times: gamma gaps from
    np.random.seed(seed), cumulated and rescaled to end at n / rate, as
    vllm bench serve draws them."""
    n, rate, burstiness, seed = 5, 4.0, 0.5, 11
    base = {"model_id": MODEL, "input_lens": [10] * n, "output_lens": [2] * n, "ttfts": [0.1] * n,
            "itls": [[0.01]] * n, "request_rate": rate, "burstiness": burstiness, "max_concurrency": None}
    gaps = np.random.RandomState(seed).gamma(burstiness, 1.0 / (rate * burstiness), n)
    expected = np.cumsum(gaps) * (n / rate) / np.sum(gaps)
    run = parse_bench({**base, "seed": seed}, "t")
    assert run.arrivals == pytest.approx(expected.tolist(), rel=1e-12)
    assert "the file's seed 11" in run.arrivals_note
    # The seed from --seed when the file has none.
    assert parse_bench(base, "t", seed=seed).arrivals == run.arrivals
    # vLLM's start_times are the actual sends: used as they are.
    exact = parse_bench({**base, "start_times": [50.0, 50.5, 50.25, 52.0, 53.0]}, "t")
    assert exact.arrivals == (0.0, 0.5, 0.25, 2.0, 3.0) and exact.max_concurrency is None
    # A closed loop: all due at 0, CONC in flight; a failed request left out.
    closed = parse_bench({**base, "request_rate": "inf", "max_concurrency": 2,
                          "errors": ["", "boom", "", "", ""]}, "t")
    assert closed.arrivals == (0.0,) * 4 and closed.max_concurrency == 2 and closed.failed == 1
    # TPOT from the ITLs: sum of the gaps over output tokens - 1.
    tpots = parse_bench({**base, "output_lens": [3] * n, "itls": [[0.01, 0.03]] * n}, "t").tpots
    assert tpots == pytest.approx([0.02] * n)


def test_bounded_step_is_the_constrained_minimiser() -> None:
    # min (d0 - 1)^2 + (d1 + 2)^2 with x + d >= 0 at x = (0, 1): d = (1, -1).
    normal = np.eye(2) * 2.0
    grad = np.array([-2.0, 4.0])
    step = bounded_step(normal, grad, np.zeros(2), np.array([0.0, 1.0]), np.array([True, True]))
    assert step == pytest.approx([1.0, -1.0])


def test_levenberg_marquardt_fits_a_bounded_linear_model() -> None:
    a = np.array([[1.0, 2.0], [3.0, 1.0], [0.5, 4.0]])
    truth = np.array([2.0, 0.5])
    fit = levenberg_marquardt(lambda x: a @ x - a @ truth, np.array([10.0, 10.0]))
    assert fit.x == pytest.approx(truth, abs=1e-6)
    # The unconstrained minimum of b has x1 < 0: the fit holds it at 0.
    b = np.array([-1.0, 1.0, 0.0])
    fit = levenberg_marquardt(lambda x: a @ x - b, np.array([1.0, 1.0]))
    assert fit.x[1] == 0.0
    assert fit.x[0] == pytest.approx(float(a[:, 0] @ b) / float(a[:, 0] @ a[:, 0]), abs=1e-6)


def test_run_errors_are_relative_per_request() -> None:
    from kvsched.calibrate import SimulatedLatencies

    run = parse_bench({"model_id": MODEL, "input_lens": [10, 20], "output_lens": [1, 3],
                       "ttfts": [0.1, 0.2], "itls": [[], [0.01, 0.01]], "request_rate": "inf"}, "t")
    sim = SimulatedLatencies(np.array([0.11, 0.18]), np.array([math.nan, 0.0125]))
    e = run_errors(run, sim)
    assert e.ttft == pytest.approx([0.1, -0.1]) and e.tpot == pytest.approx([0.25])


# --------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, no traceback


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
    bad(capsys, ["calibrate", *ENGINE, "--step-time-backend", "roofline", "--bench", c1, *out],
        "measured")
    bad(capsys, ["calibrate", *ENGINE, *out], "--bench FILE.json")
    bad(capsys, ["calibrate", *ENGINE, "--hardware", "a100-80gb", "--bench", c1, *out], "measured")
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text('{"arrival_time": 0, "first_token_time": 0.1, "prompt_tokens": 5, '
                     '"output_tokens": 2}\n')
    bad(capsys, ["calibrate", *ENGINE, "--requests", str(jsonl), *out], "line 1", "last_token_time")
    bad(capsys, ["calibrate", *ENGINE, "--bench", str(tmp_path / "missing.json"), *out], "no such file")


# --------------------------------------------------------------------------
# Bounded input files (issue 11): one ValueError naming the file and field


def small_bench(n: int = 4) -> dict[str, Any]:
    return {"model_id": MODEL, "input_lens": [10] * n, "output_lens": [3] * n, "ttfts": [0.1] * n,
            "itls": [[0.01, 0.02]] * n, "request_rate": 2.0, "burstiness": 1.0, "seed": 0,
            "errors": [""] * n}


def load_bad(tmp_path: Path, text: str | bytes, kind: str, *needles: str, name: str = "run.json") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_run(str(path), kind)
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def bench_with(**change: Any) -> str:
    return json.dumps({**small_bench(), **change})


def test_the_small_bench_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(small_bench()))
    run = load_run(str(path), "bench")
    assert run.input_lens == (10,) * 4 and run.tpots == pytest.approx([0.015] * 4)


BAD_BENCH: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("negative ttft", {"ttfts": [0.1, -0.1, 0.1, 0.1]}, ("ttfts[1]=-0.1", "must be")),
    ("huge ttft", {"ttfts": [0.1, 1e300, 0.1, 0.1]}, ("ttfts[1]=1e+300", "<= 1e+06")),
    ("bool ttft", {"ttfts": [True] * 4}, ("ttfts[0]=True", "finite number")),
    ("string itl", {"itls": [["0.01"]] * 4}, ("itls[0]='0.01'",)),
    ("huge itl", {"itls": [[1e9]] * 4}, ("itls[0]=1000000000.0",)),
    ("latency below ttft", {"itls": None, "latencies": [0.05] * 4}, ("latencies[0]=0.05", "below")),
    ("huge input len", {"input_lens": [10**12] * 4}, ("input_lens[0]=1000000000000", "[1, 16777216]")),
    ("400-digit input len", {"input_lens": [10**400] * 4}, ("input_lens[0]=an integer of 401 digits",)),
    ("float output len", {"output_lens": [3.0] * 4}, ("output_lens[0]=3.0", "integer")),
    ("negative failed len", {"errors": ["boom", "", "", ""], "output_lens": [-1, 3, 3, 3]},
     ("output_lens[0]=-1",)),
    ("error not text", {"errors": ["", 1, "", ""]}, ("errors[1]=1", "error text")),
    ("tiny rate", {"request_rate": 1e-300}, ("the arrival draw", "span")),
    ("tiny burstiness", {"burstiness": 1e-300}, ("burstiness=1e-300", ">= 1e-06")),
    ("bad seed", {"seed": -1}, ("seed=-1", "--seed")),
    ("seed beyond numpy's", {"seed": 2**32}, ("seed=4294967296",)),
    ("string time_scale", {"workload": {"time_scale": "2"}}, ("workload.time_scale='2'",)),
    ("huge concurrency", {"max_concurrency": 10**30}, ("max_concurrency=an integer of 31 digits",)),
    ("hardware not a name", {"hardware": 7}, ("hardware=7",)),
    ("far start time", {"start_times": [0.0, 1e12, 2.0, 3.0]}, ("start_times[1]=1000000000000.0",)),
    ("start span", {"start_times": [0.0, 1e7, 2.0, 3.0]}, ("start_times span",)),
    ("NaN mean", {"ttfts": None, "itls": None, "mean_ttft_ms": math.nan, "mean_tpot_ms": 5.0},
     ("mean_ttft_ms=nan",)),
    ("huge mean", {"ttfts": None, "itls": None, "mean_ttft_ms": 1e20, "mean_tpot_ms": 5.0},
     ("mean_ttft_ms=1e+20",)),
]


@pytest.mark.parametrize(("name", "change", "needles"), BAD_BENCH, ids=[b[0] for b in BAD_BENCH])
def test_bad_bench_values_are_one_clear_error(tmp_path: Path, name: str, change: dict[str, Any],
                                              needles: tuple[str, ...]) -> None:
    data = {**small_bench(), **change}
    for key in [k for k, v in change.items() if v is None]:
        del data[key]
    load_bad(tmp_path, json.dumps(data), "bench", *needles)


def test_a_failed_requests_unrecorded_send_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(bench_with(errors=["", "refused", "", ""], start_times=[5.0, None, 5.5, 6.0]))
    run = load_run(str(path), "bench")
    assert run.arrivals == (0.0, 0.5, 1.0) and run.failed == 1


@pytest.mark.parametrize("kind", ["bench", "auto"])
def test_duplicate_keys_in_a_bench_file(tmp_path: Path, kind: str) -> None:
    text = bench_with()[:-1] + ', "ttfts": [0.2, 0.2, 0.2, 0.2]}'
    load_bad(tmp_path, text, kind, "duplicate key 'ttfts'")


def test_bench_file_encoding_and_syntax(tmp_path: Path) -> None:
    load_bad(tmp_path, bench_with().encode().replace(b'"model_id"', b'"model_\xff"'), "bench", "not UTF-8")
    load_bad(tmp_path, bench_with().replace("0.1", "1" * 5000, 1), "bench", "not valid JSON")
    load_bad(tmp_path, "[" * 100_000, "bench", "nested too deeply")
    load_bad(tmp_path, bench_with()[:40], "bench", "not valid JSON")


JSONL_ROW = {"arrival_time": 100.0, "first_token_time": 100.2, "last_token_time": 101.0,
             "prompt_tokens": 12, "output_tokens": 5}


def jsonl(*rows: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


BAD_JSONL: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("NaN time", {"first_token_time": math.nan}, ("line 2", "first_token_time=nan")),
    ("inf time", {"last_token_time": math.inf}, ("line 2", "last_token_time=inf")),
    ("year 9999", {"arrival_time": 2.5e11, "first_token_time": 2.5e11 + 0.2, "last_token_time": 2.5e11 + 1},
     ("line 2", "arrival_time=250000000000.0", "within +-1e+11 s")),
    ("days-long request", {"last_token_time": 100.0 + 2e6}, ("line 2", "span")),
    ("400-digit time", {"first_token_time": 10**400},
     ("line 2", "first_token_time=an integer of 401 digits")),
    ("negative prompt", {"prompt_tokens": -5}, ("line 2", "prompt_tokens=-5")),
    ("huge output", {"output_tokens": 10**9}, ("line 2", "output_tokens=1000000000")),
    ("string length", {"prompt_tokens": "12"}, ("line 2", "prompt_tokens='12'")),
    ("error not text", {"error": 5}, ("line 2", "error=5")),
]


@pytest.mark.parametrize(("name", "change", "needles"), BAD_JSONL, ids=[b[0] for b in BAD_JSONL])
def test_bad_jsonl_values_are_one_clear_error(tmp_path: Path, name: str, change: dict[str, Any],
                                              needles: tuple[str, ...]) -> None:
    load_bad(tmp_path, jsonl(JSONL_ROW, {**JSONL_ROW, **change}), "requests", *needles, name="run.jsonl")


def test_jsonl_sends_spanning_weeks_are_refused(tmp_path: Path) -> None:
    later = {k: v + 3e6 if k.endswith("_time") else v for k, v in JSONL_ROW.items()}
    load_bad(tmp_path, jsonl(JSONL_ROW, later), "requests", "arrival_time span", name="run.jsonl")


def test_jsonl_misspelled_and_duplicate_fields(tmp_path: Path) -> None:
    row = dict(JSONL_ROW)
    row["prompt_token"] = row.pop("prompt_tokens")
    load_bad(tmp_path, jsonl(JSONL_ROW, row), "requests", "line 2", "missing prompt_tokens",
             "did you mean 'prompt_token'", name="run.jsonl")
    text = jsonl(JSONL_ROW).replace('"prompt_tokens": 12', '"prompt_tokens": 12, "prompt_tokens": 13')
    load_bad(tmp_path, text, "requests", "line 1", "duplicate key 'prompt_tokens'", name="run.jsonl")
    load_bad(tmp_path, jsonl(JSONL_ROW).encode() + b"\xc3\x28\n", "requests", "not UTF-8", name="run.jsonl")
    load_bad(tmp_path, jsonl(JSONL_ROW) + "{" * 50_000 + "\n", "requests", "line 2", name="run.jsonl")
