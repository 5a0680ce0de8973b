"""``--request-timeout`` through the commands: simulate, compare and tune
take it (the shared workload flags), report the requests that timed out as
failed with their reason, and refuse a bad value in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.cli import main

# One request at a time, each a prefill and 99 decode steps: every one takes
# far longer than a millisecond (a step of Llama-3.1-8B on an H100 reads its
# 16 GB of weights: ~5 ms at the least).
ONE_AT_A_TIME = ["--num-prompts", "20", "--random-input-len", "100", "--random-output-len", "100",
                 "--max-concurrency", "1", "--step-time-backend", "roofline", "--no-progress"]
NEVER_IN_TIME = ["--request-timeout", "0.001"]


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "Traceback" not in err and "usage:" not in err
    return lines[0]


def test_simulate_reports_timed_out_requests_as_failed(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["simulate", *ONE_AT_A_TIME, *NEVER_IN_TIME, "--save-result", str(out),
                 "--save-detailed"]) == 0
    printed = capsys.readouterr().out
    assert "request timeout 0.001 s" in printed
    assert "Failed requests: 20 of 20, by reason:" in printed
    assert "20  timeout (first: random-0)" in printed
    saved = json.loads(out.read_text())
    assert (saved["completed"], saved["failed"]) == (0, 20)
    assert saved["failed_reasons"] == {"timeout": 20}
    # vllm bench serve's per-request errors, and the lists' failed entries.
    assert len(saved["errors"]) == 20
    assert all(e.startswith("timeout: no complete response within --request-timeout=0.001 s")
               for e in saved["errors"])
    assert saved["output_lens"] == [0] * 20
    assert saved["workload"]["request_timeout"] == 0.001
    assert saved["run_spec"]["workload"]["request_timeout"] == 0.001


def test_simulate_with_a_timeout_that_never_fires_predicts_the_same(tmp_path: Path) -> None:
    plain, patient = tmp_path / "plain.json", tmp_path / "patient.json"
    assert main(["simulate", *ONE_AT_A_TIME, "--save-result", str(plain)]) == 0
    assert main(["simulate", *ONE_AT_A_TIME, "--request-timeout", "1e6", "--save-result", str(patient)]) == 0
    a, b = json.loads(plain.read_text()), json.loads(patient.read_text())
    assert b["failed"] == 0 and b["completed"] == 20
    for key in ("duration", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_e2el_ms",
                "output_throughput", "max_output_tokens_per_s"):
        assert a[key] == b[key], key


def test_compare_shows_the_failed_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "all.json"
    # 60 requests over 3 s, each ~0.5 s alone: a thousand slots serve them in
    # time, one slot cannot (its queue grows past the timeout).
    assert main(["compare", "--num-prompts", "60", "--random-input-len", "512", "--random-output-len", "64",
                 "--request-rate", "20", "--no-progress", "--request-timeout", "5",
                 "--save-result", str(out), "--variant", "wide:", "--variant", "one: --max-num-seqs 1"]) == 0
    printed = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert rows["wide"]["failed"] == 0 and rows["wide"]["completed"] == 60
    failed = rows["one"]["failed"]
    assert failed > 0 and rows["one"]["completed"] == 60 - failed
    assert rows["one"]["failed_reasons"] == {"timeout": failed}
    table = printed[printed.index("variant "):].splitlines()
    assert table[0].rstrip().endswith("Failed")
    assert table[2].split()[0] == "wide" and table[2].split()[-1] == "0"
    one = next(line for line in table if line.startswith("one "))
    assert one.split()[-1] == str(failed)
    assert f"[one] Failed requests: {failed} of 60, by reason:" in printed


def test_tune_shows_the_failed_count_and_reproduces_the_timeout(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune.json"
    assert main(["tune", "--max-gpus", "1", "--num-prompts", "60", "--random-input-len", "256",
                 "--random-output-len", "24", *NEVER_IN_TIME, "--slo", "ttft:100000", "--max-num-seqs",
                 "default", "--max-num-batched-tokens", "default", "--no-cache", "--workers", "1",
                 "--no-progress", "--save-result", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["ranked"]
    for e in data["ranked"]:
        # Every request timed out: no latency to meet the SLO with.
        assert e["metrics"]["failed"] == 60 and e["metrics"]["completed"] == 0
        assert e["metrics"]["failed_reasons"] == {"timeout": 60}
        assert e["meets_slo"] is False
        args = e["simulate_args"]
        assert args[args.index("--request-timeout") + 1] == "0.001"
    head = next(line for line in printed.splitlines() if line.lstrip().startswith("#"))
    assert "failed" in head.split()
    first = next(line for line in printed.splitlines() if line.startswith("  1  "))
    assert first.split()[head.split().index("failed") - len(head.split())] == "60"


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "abc", "1e400"])
@pytest.mark.parametrize("command", [
    ["simulate", "--num-prompts", "2", "--no-progress"],
    ["compare", "--num-prompts", "2", "--no-progress", "--variant", "a:"],
    ["tune", "--max-gpus", "1", "--num-prompts", "2", "--slo", "ttft:100", "--no-cache", "--workers", "1",
     "--no-progress"],
])
def test_a_bad_timeout_is_one_error_line(command: list[str], value: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--request-timeout", value]) == 2
    line = one_error_line(capsys)
    assert line.startswith("kvsched: error: ")
    assert "--request-timeout=" in line and "leave it out for no timeout" in line
