"""``kvsched compare`` and the simulator's prefill cadence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvsched.cli import main
from kvsched.commands import compare
from kvsched.commands.compare import parse_variants
from kvsched.errors import CannotServe

BASE = ["--num-prompts", "60", "--random-input-len", "512", "--random-output-len", "64",
        "--request-rate", "20", "--no-progress"]


def test_variants_override_only_the_flags_they_name(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "all.json"
    assert main(["compare", *BASE, "--save-result", str(out),
                 "--variant", "base:", "--variant", "small: --max-num-seqs 4"]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs 1024" in text and "max_num_seqs 4" in text
    assert "vs base" in text
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["base", "small"]
    # Same workload for both; fewer slots means longer waits for the first token.
    assert rows[0]["total_input_tokens"] == rows[1]["total_input_tokens"]
    assert rows[1]["mean_ttft_ms"] > rows[0]["mean_ttft_ms"]


def test_the_same_variant_twice_gives_the_same_numbers(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["compare", *BASE, "--save-result", str(out),
                 "--variant", "a: --max-num-seqs 16", "--variant", "b: --max-num-seqs 16"]) == 0
    a, b = json.loads(out.read_text())
    for key in ("mean_ttft_ms", "mean_tpot_ms", "duration", "output_throughput", "p99_itl_ms"):
        assert a[key] == b[key]


def test_variants_from_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text("baseline: ''\ncadence: --prefill-schedule-interval 3\nlist: [--max-num-seqs, '8']\n")
    assert parse_variants([], str(path)) == [
        ("baseline", []), ("cadence", ["--prefill-schedule-interval", "3"]),
        ("list", ["--max-num-seqs", "8"])]


@pytest.mark.parametrize("specs, words", [
    (["no colon here"], "NAME: FLAGS"),
    (["a:", "a:"], "unique"),
    ([], "no variants"),
])
def test_bad_variant_lists(specs: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_variants(specs, None)


@pytest.mark.parametrize("flags", ["--max-num-seqs lots", "--no-such-flag 3"])
def test_bad_variant_flag_is_one_error_line(flags: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--variant", f"x: {flags}"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched: error:") and "'x'" in err[0]


def test_prefill_cadence_holds_prefills_and_raises_ttft(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert main(["compare", *BASE, "--save-result", str(out), "--variant", "off:",
                 "--variant", "every 4: --prefill-schedule-interval 4"]) == 0
    off, cadence = json.loads(out.read_text())
    assert cadence["mean_ttft_ms"] > off["mean_ttft_ms"]
    assert cadence["total_output_tokens"] == off["total_output_tokens"]
    assert cadence["fast_forwarded_steps"] == 0  # fast-forward assumes no admission policy


def test_balance_seed_preset_runs_every_policy_and_prints_the_seed_table(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The full preset takes ~30 s here; the same variants on fewer requests.
    assert main(["compare", "--preset", "balance-seed", "--num-prompts", "40",
                 "--random-output-len", "60", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "DeepSeek-V3.1" in out and "TP4 DP4 EP16" in out and "40 random prompts" in out
    for name in ("baseline", "balance full", "balance full-1", "prefill-cadence 2", "adp-balance",
                 "seed baseline", "seed balance"):
        assert f"\n{name} " in out, name


def test_trace_steps_is_refused_and_percentiles_are_honoured(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--variant", "a:", "--trace-steps", str(tmp_path / "t")]) != 0
    assert "trace-steps" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert main(["compare", *BASE, "--variant", "a:", "--metric-percentiles", "75",
                 "--save-result", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert "p75_ttft_ms" in row and "p99_ttft_ms" not in row


def test_jitter_preset_spreads_request_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--preset", "balance-seed-jitter", "--num-prompts", "20",
                 "--random-output-len", "40", "--variant", "extra: --max-num-seqs 8",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "range ratio 0.1" in out and "TP4 DP4 EP16" in out
    assert "\nextra " in out and "\nseed balance " in out


def error_lines(capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    captured = capsys.readouterr()
    return captured.err.strip().splitlines(), captured.out


def test_every_variant_is_checked_before_any_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--variant", "good:", "--variant", "bad: --num-prompts 0"]) != 0
    err, out = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("kvsched: error: variant 'bad':")
    assert "--num-prompts=0" in err[0]
    assert "[good]" not in out  # nothing ran


def test_a_variant_failing_while_running_keeps_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = compare.run_prepared

    def run_prepared(prepared: Any, *rest: Any) -> Any:
        if prepared.spec.engine.max_num_seqs == 7:
            raise CannotServe("the simulated engine broke")
        return real_run(prepared, *rest)

    monkeypatch.setattr(compare, "run_prepared", run_prepared)
    out = tmp_path / "r.json"
    assert main(["compare", *BASE, "--save-result", str(out), "--variant", "a:",
                 "--variant", "broken: --max-num-seqs 7", "--variant", "c: --max-num-seqs 16"]) == 1
    err, text = error_lines(capsys)
    assert err == ["kvsched: error: variant 'broken': the simulated engine broke",
                   "kvsched: error: 1 of 3 variants failed: 'broken'"]
    assert "\na " in text and "\nc " in text and "\nbroken " not in text
    assert [row["name"] for row in json.loads(out.read_text())] == ["a", "c"]


@pytest.mark.parametrize("name, content, words", [
    ("v.yaml", "a: [--max-num-seqs, 8\nb: ''\n", ["not valid YAML at line", "v.yaml"]),
    ("v.json", '{"a": "--max-num-seqs 8",}', ["not valid JSON (", "at line 1", "v.json"]),
    ("v.yaml", b"\xff\xfe\x00a: b", ["not UTF-8", "v.yaml"]),
    ("v.yaml", "- a\n- b\n", ["must map variant names to flags", "list"]),
    ("v.yaml", "a: --model 'unclosed\n", ["variant 'a'", "quotes"]),
    # PyYAML alone keeps the second 'a' and drops the first unread.
    ("v.yaml", "a: --max-num-seqs 8\na: --max-num-seqs 16\n", ["--variants=", "v.yaml", "line 2",
                                                             "duplicate key 'a'"]),
])
def test_a_malformed_variants_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               name: str, content: str | bytes, words: list[str]) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert main(["compare", *BASE, "--variants", str(path)]) != 0
    err, _ = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("kvsched: error:"), err
    assert all(w in err[0] for w in words), err[0]


def test_a_missing_variants_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--variants", str(tmp_path / "nope.yaml")]) != 0
    err, _ = error_lines(capsys)
    assert len(err) == 1 and f"--variants={tmp_path / 'nope.yaml'}" in err[0]


def test_table_columns_name_duration_and_mean_e2el_and_goodput(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["compare", *BASE, "--save-result", str(out), "--variant", "a:"]) == 0
    head = capsys.readouterr().out.splitlines()[-3]
    assert "Duration s" in head and "Mean E2EL ms" in head and "E2E s" not in head
    assert "Goodput" not in head
    assert main(["compare", *BASE, "--save-result", str(out), "--variant", "a:",
                 "--goodput", "ttft:100000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head, row = lines[-3], lines[-1]
    labels = re.split(r"\s{2,}", head.strip())
    assert labels[-1] == "Goodput req/s"
    (saved,) = json.loads(out.read_text())
    cells = row.split()
    # Every request meets a 100 s TTFT SLO: goodput is the request throughput.
    assert float(cells[-1]) == pytest.approx(saved["request_goodput"], abs=5e-4)
    assert saved["request_goodput"] == pytest.approx(saved["request_throughput"])
    assert float(cells[labels.index("Mean E2EL ms")]) == pytest.approx(saved["mean_e2el_ms"], abs=0.05)
    assert float(cells[labels.index("Duration s")]) == pytest.approx(saved["duration"], abs=0.05)


def test_compare_json_and_report_name_each_deployment(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    # H100 on measured kernels, A100 on the roofline (no tables): allowed, and marked.
    assert main(["compare", *BASE, "--save-result", str(out), "--report", str(page), "--allow-mixed-pricing",
                 "--variant", "h100:", "--variant", "a100: --hardware a100-80gb --max-num-seqs 64"]) == 0
    rows = json.loads(out.read_text())
    assert [r["pricing"] for r in rows] == ["measured", "roofline-fallback"]
    assert [r["mixed_pricing"] for r in rows] == [True, True]
    assert rows[1]["pricing_reason"] == "measured kernels not used: no measured vLLM tables for a100-80gb"
    assert [r["deployment"]["step_times"]["pricing"] for r in rows] == ["measured", "roofline-fallback"]
    assert [r["deployment"]["hardware"]["id"] for r in rows] == ["h100-sxm", "a100-80gb"]
    assert [r["deployment"]["scheduler"]["max_num_seqs"] for r in rows] == [1024, 64]
    assert all(r["deployment"]["model"]["name"] == "meta-llama/Llama-3.1-8B" for r in rows)
    assert all(r["workload"]["num_prompts"] == 60 and r["workload"]["request_rate"] == 20.0 for r in rows)
    html = page.read_text()
    assert 'data-setting="model.name" data-result="0">meta-llama/Llama-3.1-8B</td>' in html
    assert 'data-setting="hardware.id" data-result="0">h100-sxm</td>' in html
    # The second variant's differing settings are marked.
    assert 'class="num changed" data-setting="hardware.id" data-result="1">a100-80gb</td>' in html
    assert 'class="num changed" data-setting="scheduler.max_num_seqs" data-result="1">64</td>' in html
    assert 'class="num" data-setting="model.name" data-result="1">' in html


def test_compare_checks_output_paths_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "r.html"
    assert main(["compare", *BASE, "--variant", "a:", "--report", str(target)]) != 0
    err, out = error_lines(capsys)
    assert len(err) == 1 and f"--report={target}" in err[0] and out == ""


def test_a_variant_that_changes_the_workload_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: compared 20 prompts with 60 silently ("+108 % TTFT").
    assert main(["compare", *BASE, "--variant", "a: --num-prompts 20", "--variant", "b:"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "variant 'b' runs a different workload than 'a'" in err[0], err
    assert "--num-prompts=20" in err[0] and "--num-prompts=60" in err[0], err[0]


def test_every_row_says_how_its_steps_were_priced(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--variant", "a:", "--variant", "b: --max-num-seqs 64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.startswith("variant"))
    assert head.rstrip().endswith("Steps")
    rows = {line.split()[0]: line.split()[-1] for line in lines if line.startswith(("a ", "b "))}
    assert rows == {"a": "measured", "b": "measured"}


def test_variants_priced_by_different_backends_are_refused_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: both ran, the difference mixing the deployments with the pricing.
    assert main(["compare", *BASE, "--variant", "m:", "--variant", "r: --step-time-backend roofline"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and captured.out == "", err
    assert "measured: 'm'" in err[0] and "roofline: 'r'" in err[0]
    assert "--step-time-backend" in err[0] and "--allow-mixed-pricing" in err[0]


def test_allowed_mixed_pricing_marks_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *BASE, "--allow-mixed-pricing", "--variant", "m:",
                 "--variant", "r: --step-time-backend roofline"]) == 0
    captured = capsys.readouterr()
    rows = {line.split()[0]: " ".join(line.split()[-2:]) for line in captured.out.splitlines()
            if line.startswith(("m ", "r "))}
    assert rows == {"m": "measured (mixed)", "r": "roofline (mixed)"}
    assert "priced by different backends" in captured.err


def test_a_tp_size_that_falls_back_to_the_roofline_is_not_compared_silently(
        capsys: pytest.CaptureFixture[str]) -> None:
    # GB200's tables time all-reduce over 2 and 4 GPUs only: Llama-3.1-70B at
    # TP4 is priced by measured kernels, at TP8 by the roofline ("auto" falls
    # back). Before: compared side by side, the step column the only hint.
    argv = ["compare", *BASE, "--model", "meta-llama/Llama-3.1-70B", "--hardware", "gb200",
            "--variant", "tp4: --tensor-parallel-size 4", "--variant", "tp8: --tensor-parallel-size 8"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "measured: 'tp4'; roofline-fallback: 'tp8'" in err[0]
    assert "no measured all-reduce over 8 GPUs on gb200" in err[0]
    # Forcing one backend prices both alike, and they run.
    assert main([*argv, "--step-time-backend", "roofline"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[-1] for line in out if line.startswith(("tp4 ", "tp8 "))}
    assert rows == {"tp4": "roofline", "tp8": "roofline"}


def test_compare_help_has_its_whole_first_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "several variants of a deployment on the same workload, side by side" in out
