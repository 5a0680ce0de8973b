"""kvsched.validation.silicon: a real vLLM serving row simulated as InferenceX's
client ran it, each step-time backend, the concurrency bands, and the
benchmark script that runs every row (benchmarks/validate_silicon.py).

aiconfigurator-core must be installed (the dev extra has it): nothing here
skips without it. The rows come from conftest.py's ``by_id`` fixture.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType

import pytest

from kvsched.sim.deployment import EngineOptions
from kvsched.validation.silicon import (
    SimulatedRow,
    build_run_deployment,
    concurrency_band,
    deployment_within_context,
    simulate_row,
)
from kvsched.validation.silicon_rows import (
    MEASURED_BLOCK_SIZE,
    MEASURED_GPU_MEMORY_UTILIZATION,
    MEASURED_VLLM_VERSION,
    Refusal,
    ServingRun,
    SiliconRow,
    load_rows,
    map_row,
)

REPO = Path(__file__).resolve().parents[2]

LLAMA70_H100 = "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x1024_c16_tp4_ep1_260"
GPTOSS_B200 = "2026_03_25_gpt_oss_120b_b200_sxm_vllm_fp4_agg_1024x8192_c16_tp2_0_ep1_0_613"
QWEN32_C8 = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"


def mapped(row: SiliconRow) -> ServingRun:
    run = map_row(row)
    assert isinstance(run, ServingRun), run
    return run


# -- each step-time backend ------------------------------------------------------


# ~40 s on 2 cores (two full gpt-oss runs on B200): the slow tier.
@pytest.mark.slow
def test_4_bit_rows_are_priced_by_both_backends(by_id: dict[str, SiliconRow]) -> None:
    for backend in ("roofline", "measured"):
        result = simulate_row(mapped(by_id[GPTOSS_B200]), backend)
        assert isinstance(result, SimulatedRow), result
        assert "(mxfp4)" in result.deployment


def test_backend_is_passed_to_the_engine_options(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[LLAMA70_H100])
    for backend in ("roofline", "measured"):
        built = build_run_deployment(run, backend)
        assert not isinstance(built, Refusal)
        assert built[0].step_model.backend == backend


def test_a_context_the_kv_cache_cannot_hold_becomes_the_longest_request() -> None:
    # Qwen3-32B's 40960-token context does not fit one A100's KV cache at the
    # measured runs' 0.9 (docs/public_runs.md's rows 24-26; 0.33's own 0.92
    # holds it): the longest request instead, said so.
    options = EngineOptions(model="Qwen/Qwen3-32B", hardware="a100-80gb", vllm_version=MEASURED_VLLM_VERSION,
                            block_size=MEASURED_BLOCK_SIZE,
                            gpu_memory_utilization=MEASURED_GPU_MEMORY_UTILIZATION)
    built = deployment_within_context(options, "roofline", 4196, "ISL + OSL")
    assert not isinstance(built, Refusal)
    deployment, notes = built
    assert deployment.scheduler_config.max_model_len == 4196
    assert deployment.step_model.backend == "roofline"
    (note,) = notes
    assert note.startswith("max_model_len 4196 (ISL + OSL): kvsched's KV cache cannot hold the model's "
                           "context (max_model_len=40960 needs 40960 tokens of KV but the cache holds ")
    assert note.endswith("), though the real server started")
    # A context that fits is kept, without a note.
    fits = deployment_within_context(EngineOptions(model="Qwen/Qwen3-32B", hardware="h200"), "roofline", 4196,
                                     "ISL + OSL")
    assert not isinstance(fits, Refusal)
    assert fits[0].scheduler_config.max_model_len == 40960 and fits[1] == ()
    # Not even the longest request fits: kvsched's refusal.
    refused = deployment_within_context(options, "roofline", 400_000, "ISL + OSL")
    assert isinstance(refused, Refusal) and refused.reason == "deployment refused (roofline)"


# -- one row end to end ------------------------------------------------------------


def test_one_row_simulated_warmups_excluded(by_id: dict[str, SiliconRow]) -> None:
    run = mapped(by_id[QWEN32_C8])          # CONC 8, 1024 in / 128 out, TP2 H100
    result = simulate_row(run, "roofline")
    assert isinstance(result, SimulatedRow), result
    assert result.completed == 80 and result.failed == 0       # 10 x CONC counted
    assert result.warmups == 16                                # 2 x CONC, simulated first
    assert result.warmup_duration_s > 0 and result.duration_s > 0
    assert result.mean_ttft_ms > 0 and result.mean_tpot_ms > 0
    assert result.num_gpu_blocks > 0 and "roofline" in result.step_times
    # Which pricing priced it: the roofline asked for by name, on the factors learned from the tables.
    assert result.pricing == "roofline" and "learned from vLLM 0.24.0 kernel tables" in result.step_times


# -- concurrency bands -------------------------------------------------------------


def test_concurrency_bands() -> None:
    assert [concurrency_band(c) for c in (1, 8, 9, 64, 65, 512)] == ["1-8", "1-8", "9-64", "9-64",
                                                                     "65+", "65+"]
    with pytest.raises(ValueError, match="concurrency=0"):
        concurrency_band(0)


# -- the benchmark script ----------------------------------------------------------


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = REPO / "benchmarks" / "validate_silicon.py"
    spec = importlib.util.spec_from_file_location("validate_silicon", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while the file runs; removed after the test.
    monkeypatch.setitem(sys.modules, "validate_silicon", module)
    spec.loader.exec_module(module)
    return module


def test_script_reports_and_updates_the_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(monkeypatch)
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n\n{script.BEGIN}\nold\n{script.END}\n\nafter\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert script.main(["--system", "h100_sxm", "--model", "qwen3-32b", "--limit", "2", "--no-aic",
                            "--no-progress", "--json", str(tmp_path / "r.json"),
                            "--update-doc", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith(f"{script.END}\n\nafter\n")
    # Both backends by default: two rows, two predictions each.
    assert "| all | kvsched roofline | 2 |" in text and "| all | kvsched measured | 2 |" in text
    assert "kvsched roofline: rows by pricing: roofline 2." in text
    assert "kvsched measured: rows by pricing: measured 2." in text
    assert (tmp_path / "r.json").read_text(encoding="utf-8").count('"mean_ttft_ms"') == 4
    with pytest.raises(ValueError, match="--system='a100_sxm'"):
        script.main(["--system", "a100_sxm", "--no-aic"])


def test_saved_runs_merge_into_the_tables_one_run_would_give(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(monkeypatch)
    rows = ["--system", "h100_sxm", "--model", "qwen3-32b", "--no-aic", "--no-progress"]
    paths = {name: str(tmp_path / f"{name}.json") for name in ("both", "measured", "roofline", "one")}
    bodies = {}
    for name, extra in (("both", ["--limit", "2"]), ("measured", ["--limit", "2", "--backend", "measured"]),
                        ("roofline", ["--limit", "2", "--backend", "roofline"]),
                        ("one", ["--limit", "1", "--backend", "measured"])):
        out = io.StringIO()
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            assert script.main([*rows, *extra, "--json", paths[name]]) == 0
        bodies[name] = out.getvalue()
    merged = io.StringIO()
    with redirect_stdout(merged):
        assert script.main(["--from-json", paths["measured"], "--from-json", paths["roofline"]]) == 0
    # Everything after the first line (which names the command) is the one run's.
    assert merged.getvalue().splitlines()[1:] == bodies["both"].splitlines()[1:]
    assert "from the runs `python benchmarks/validate_silicon.py" in merged.getvalue().splitlines()[0]
    # A row the measured file lacks cannot be merged silently.
    with pytest.raises(ValueError, match=r"row .* has no measured in any file"):
        script.main(["--from-json", paths["roofline"], "--from-json", paths["one"]])
    with pytest.raises(SystemExit):
        script.main(["--from-json", paths["roofline"], "--backend", "measured"])


def test_stride_keeps_every_nth_row_in_the_csvs_order(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(monkeypatch)
    rows = load_rows()
    picked = script.select_rows(rows, script.parse_args(["--system", "b200_sxm", "--stride", "6"]))
    b200 = [r.id for r in rows if r.system == "b200_sxm"]
    assert len(b200) == 623 and len(picked) == 104   # rows 0, 6, ..., 618
    assert [r.id for r in picked] == b200[0:623:6]
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()):
        script.parse_args(["--stride", "0"])
