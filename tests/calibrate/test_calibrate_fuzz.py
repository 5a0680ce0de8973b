"""File fuzzer for ``kvsched calibrate``'s inputs (issue 11): a vllm bench
serve --save-detailed JSON, a summary-only JSON (the means, no per-request
times) and per-request JSON lines, each made valid in the test and then
corrupted at random (see tests/test_replay_fuzz.py for the corruptions, the
harness and its limits: 2 s and 200 MB per case). Each file goes through
``kvsched.cli.main(["calibrate", ...])`` in-process (one fitted term, one
iteration: a valid file calibrates in ~15 ms): it either calibrates (exit 0)
or gives one line ``kvsched: error: ... FILE: ...`` (exit 2).

KVSCHED_FILE_FUZZ_CASES sets the number of cases per format (default 300).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_replay_fuzz import (
    assert_clean,
    check_cli,
    corrupt,
    dumps,
    run_in_subprocess,
    run_worker,
)

MODEL = "meta-llama/Llama-3.1-8B"
ENGINE = ["--model", MODEL, "--hardware", "h100-sxm", "--fit", "step_s", "--max-iterations", "1"]
FORMATS = ("bench", "summary", "jsonl")


def bench_run(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 6)
    outs = [rng.randint(1, 6) for _ in range(n)]
    data: dict[str, Any] = {
        "model_id": MODEL, "input_lens": [rng.randint(1, 300) for _ in range(n)], "output_lens": outs,
        "ttfts": [round(rng.uniform(0.01, 0.5), 4) for _ in range(n)],
        "itls": [[round(rng.uniform(0.005, 0.05), 4) for _ in range(o - 1)] for o in outs],
        "errors": [""] * n, "request_rate": rng.choice([2.0, 8.0, "inf"]), "burstiness": 1.0,
        "max_concurrency": rng.choice([None, 1, 4]), "seed": rng.randint(0, 9)}
    if rng.random() < 0.3:
        data["start_times"] = sorted(round(rng.uniform(100.0, 102.0), 3) for _ in range(n))
    if rng.random() < 0.3:
        data["latencies"] = [t + sum(g) for t, g in zip(data["ttfts"], data["itls"])]
        del data["itls"]
    return data


def summary_run(rng: random.Random) -> dict[str, Any]:
    data = bench_run(rng)
    for key in ("ttfts", "itls", "latencies", "start_times"):
        data.pop(key, None)
    data.update(mean_ttft_ms=round(rng.uniform(10, 500), 2), mean_tpot_ms=round(rng.uniform(5, 50), 2))
    return data


def jsonl_rows(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for _ in range(rng.randint(1, 6)):
        sent = round(rng.uniform(1.7e9, 1.7e9 + 10), 3)
        first = sent + round(rng.uniform(0.01, 0.5), 3)
        rows.append({"arrival_time": sent, "first_token_time": first,
                     "last_token_time": first + round(rng.uniform(0, 0.5), 3),
                     "prompt_tokens": rng.randint(1, 300), "output_tokens": rng.randint(1, 6),
                     "model": MODEL})
    return rows


def jsonl_text(rows: Any) -> str:
    if not isinstance(rows, list):
        return dumps(rows)
    return "".join(dumps(r) + "\n" for r in rows)


def make_case(fmt: str) -> Any:
    def case(rng: random.Random, folder: Path) -> tuple[list[str], str, str]:
        if fmt == "jsonl":
            data, note = corrupt(rng, jsonl_rows(rng), jsonl_text)
            path = folder / "run.jsonl"
            flag = "--requests"
        else:
            data, note = corrupt(rng, bench_run(rng) if fmt == "bench" else summary_run(rng))
            path = folder / "run.json"
            flag = "--bench"
        path.write_bytes(data)
        argv = ["calibrate", *ENGINE, flag, str(path), "-o", str(folder / "out.json")]
        if rng.random() < 0.2:  # read as a held-out run: the format is guessed
            good = folder / "good.json"
            argv = ["calibrate", *ENGINE, "--bench", str(good), "--held-out", str(path), "-o",
                    str(folder / "out.json")]
        return argv, str(path), note
    return case


def warm_up(folder: Path) -> None:
    good = folder / "good.json"
    good.write_text(json.dumps(bench_run(random.Random(0))))
    argv = ["calibrate", *ENGINE, "--bench", str(good), "-o", str(folder / "out.json")]
    assert check_cli(argv, str(good)) == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_calibrate_input_fuzz(fmt: str, tmp_path: Path) -> None:
    pytest.importorskip("aiconfigurator_core")  # the measured backend's tables
    summary = run_in_subprocess(Path(__file__), fmt, tmp_path)
    assert_clean(summary)
    assert summary["outcomes"].get("ok", 0) > 0 and summary["outcomes"].get("refused", 0) > 0


def _worker_main(argv: list[str]) -> int:
    fmt, seed, count, folder = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    assert fmt in FORMATS
    print(json.dumps(run_worker(make_case(fmt), count, seed, folder, warm_up)))
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker_main(sys.argv[2:]))
