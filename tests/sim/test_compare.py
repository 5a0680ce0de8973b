"""``kvsched compare`` and the simulator's prefill cadence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.sim.compare import parse_variants

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
