"""The ``kvsched`` command line: replay, --trace, --explain, and clean errors."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvsched.cli import main

SUMMARY_KEYS = {"engine", "steps", "preemptions", "scheduler_seconds"}

# a takes 2 of the 3 usable blocks in step 0; b needs 2 (its whole prompt)
# and waits until a finishes; c would fit but is queued behind b. Step 1
# admits b and c; step 2 finishes both.
BLOCKING: dict[str, Any] = {
    "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64},
    "cache": {"block_size": 4, "num_gpu_blocks": 4},
    "requests": [
        {"request_id": "a", "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 1},
        {"request_id": "b", "prompt_token_ids": [9, 10, 11, 12, 13, 14], "max_tokens": 2},
        {"request_id": "c", "prompt_token_ids": [17], "max_tokens": 2},
    ],
}
BLOCKING_STEPS = 3


@pytest.fixture(autouse=True)
def _keep_sigpipe() -> Iterator[None]:
    """main() may reset SIGPIPE for the process; keep pytest's handler."""
    saved = signal.getsignal(signal.SIGPIPE) if hasattr(signal, "SIGPIPE") else None
    yield
    if saved is not None:
        signal.signal(signal.SIGPIPE, saved)


def _write(tmp_path: Path, obj: Any, name: str = "s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def _summary(stdout: str) -> dict[str, Any]:
    summary = json.loads(stdout.splitlines()[-1])
    assert set(summary) == SUMMARY_KEYS
    assert summary["engine"] == "kvsched"
    return summary


def test_replay_prints_one_summary_line_and_writes_the_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario, trace = _write(tmp_path, BLOCKING), tmp_path / "t.jsonl"
    assert main(["replay", str(scenario), "--trace", str(trace)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert len(captured.out.splitlines()) == 1
    summary = _summary(captured.out)
    assert summary["steps"] == BLOCKING_STEPS
    assert summary["preemptions"] == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == summary["steps"]
    assert [r["step"] for r in records] == list(range(BLOCKING_STEPS))
    assert records[1]["new"] == ["b", "c"]


def test_replay_without_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_write(tmp_path, BLOCKING))]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    assert _summary(out)["steps"] == BLOCKING_STEPS
    assert list(tmp_path.iterdir()) == [tmp_path / "s.json"]


def test_module_entry_point(tmp_path: Path) -> None:
    scenario, trace = _write(tmp_path, BLOCKING), tmp_path / "t.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "kvsched.cli", "replay", str(scenario), "--trace", str(trace)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert len(proc.stdout.splitlines()) == 1
    summary = _summary(proc.stdout)
    assert len(trace.read_text().splitlines()) == summary["steps"] == BLOCKING_STEPS


def test_explain_prints_a_table_with_not_admitted_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_write(tmp_path, BLOCKING)), "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = _summary(lines[-1])
    step_lines = [line for line in lines if line.startswith("step")]
    assert len(step_lines) == summary["steps"]
    not_admitted = [line for line in lines if "not admitted" in line]
    # Only step 0 holds b (no room for its prompt) and c (behind b).
    table = lines[:-1]
    assert table.index(step_lines[1]) > table.index(not_admitted[-1])
    assert all("kv_blocks" in line for line in not_admitted)
    assert any(" b" in line.split(":")[0] for line in not_admitted)
    assert any("queued behind b" in line for line in not_admitted)


@pytest.mark.parametrize("name, content, expected", [
    ("missing file", None, "nope.json"),
    ("invalid JSON", '{"scheduler": {', "JSON"),
    ("bad field", json.dumps({**BLOCKING, "requests": [
        {"request_id": "a", "prompt_token_ids": [1], "max_tokens": "x"}]}), "max_tokens"),
    ("bad config", json.dumps({**BLOCKING, "scheduler": {"max_num_seqs": 0}}), "max_num_seqs"),
    ("request too long", json.dumps({**BLOCKING, "requests": [
        {"request_id": "a", "prompt_token_ids": list(range(64)), "max_tokens": 1}]}),
     "max_model_len"),
])
def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     name: str, content: str | None, expected: str) -> None:
    path = tmp_path / "nope.json"
    if content is not None:
        path.write_text(content)
    code = main(["replay", str(path), "--trace", str(tmp_path / "t.jsonl")])
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    err_lines = captured.err.splitlines()
    assert len(err_lines) == 1, captured.err
    assert err_lines[0].startswith("kvsched: error:")
    assert expected in err_lines[0]
    assert "Traceback" not in captured.err


def test_bad_input_through_the_entry_point_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvsched.cli", "replay", str(tmp_path / "missing.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert proc.stderr.startswith("kvsched: error:")
    assert len(proc.stderr.splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_non_string_abort_id_is_one_error_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {**BLOCKING, "aborts": [{"step": 0, "request_ids": [["a"]]}]})
    code = main(["replay", str(path)])
    captured = capsys.readouterr()
    assert code != 0
    assert captured.err.startswith("kvsched: error:")
    assert len(captured.err.splitlines()) == 1


def test_engine_commands_without_torch_say_what_to_install(tmp_path: Path) -> None:
    # A process where importing torch fails, as on a machine without it.
    code = ("import sys; sys.modules['torch'] = None; from kvsched.cli import main; "
            f"sys.exit(main(['generate', '--model', {str(tmp_path)!r}, '--prompt', 'x']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "needs the torch package" in r.stderr and "Traceback" not in r.stderr


def test_core_simulator_and_cli_import_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import kvsched, kvsched.cli, "
            "kvsched.commands.simulate, kvsched.sim.dp, kvsched.model; print(kvsched.RequestOutput.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "RequestOutput"


def test_the_simulator_imports_no_scipy_until_a_fit_needs_it() -> None:
    # SciPy is ~50 MB of RSS and half a second: only fits (calibrate, a
    # step profile's fit) may import it, and the profiled backend is
    # imported by every simulation.
    code = ("import sys; import kvsched.cli, kvsched.commands.simulate, kvsched.sim.run, "
            "kvsched.perf.profiled; print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_every_flag_has_help(command: str) -> None:
    from kvsched.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    actions = [a for a in sub.choices[command]._actions if not isinstance(a, argparse._HelpAction)]
    assert len(actions) > 30  # the walk sees the engine, workload and output groups
    missing = [a.option_strings[0] for a in actions if not (a.help or "").strip()]
    assert missing == [], f"kvsched {command}: flags without help: {missing}"


# A one-token prompt the connector loads whole, asynchronously: after each
# load it has nothing left to compute, is reset and looked up again (vLLM
# 0.33's livelock). The first load is not yet a loop; the second is.
WHOLE_ONE_TOKEN_LOAD: dict[str, Any] = {
    "kv_connector": {"type": "scripted", "load_failure_policy": "recompute"},
    "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64},
    "cache": {"block_size": 16, "num_gpu_blocks": 8, "enable_prefix_caching": True},
    "max_steps": 5,
    "requests": [{"request_id": "a", "prompt_token_ids": [5], "max_tokens": 2, "ignore_eos": True,
                  "external_hit_tokens": 1, "load_async": True}],
}


def test_explain_says_when_the_run_is_stuck_in_a_vllm_livelock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_write(tmp_path, WHOLE_ONE_TOKEN_LOAD)), "--explain"]) != 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("step")]
    assert len(steps) == 5
    stuck = [i for i, line in enumerate(lines) if line.strip().startswith("stuck:")]
    assert stuck and stuck[0] > steps[1] and stuck[0] < steps[2]
    # replay follows the default release, 0.34, which keeps 0.33's livelocks.
    assert "vLLM 0.34 livelock (whole_one_token_load): a:" in lines[stuck[0]]
    assert "waiting_for_remote_kvs" in lines[steps[0] + 1]
    assert "max_steps=5" in captured.err
