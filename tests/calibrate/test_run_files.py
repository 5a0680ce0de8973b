"""Reading a run's files: vllm bench serve's arrival draw, and bounded input
files (issue 11): one ValueError naming the file and field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from calibrate_runs import MODEL

from kvsched.calibrate import load_run, parse_bench


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
    ("400-digit input len", {"input_lens": [10**400] * 4}, ("input_lens[0]=<a 401-digit integer>",)),
    ("float output len", {"output_lens": [3.0] * 4}, ("output_lens[0]=3.0", "integer")),
    ("negative failed len", {"errors": ["boom", "", "", ""], "output_lens": [-1, 3, 3, 3]},
     ("output_lens[0]=-1",)),
    ("error not text", {"errors": ["", 1, "", ""]}, ("errors[1]=1", "error text")),
    ("tiny rate", {"request_rate": 1e-300}, ("the arrival draw", "span")),
    ("tiny burstiness", {"burstiness": 1e-300}, ("burstiness=1e-300", ">= 1e-06")),
    ("bad seed", {"seed": -1}, ("seed=-1", "--seed")),
    ("seed beyond numpy's", {"seed": 2**32}, ("seed=4294967296",)),
    ("string time_scale", {"workload": {"time_scale": "2"}}, ("workload.time_scale='2'",)),
    ("huge concurrency", {"max_concurrency": 10**30}, ("max_concurrency=<a 31-digit integer>",)),
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
     ("line 2", "first_token_time=<a 401-digit integer>")),
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
