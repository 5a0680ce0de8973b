"""kvsched calibrate's fit: recovers known host terms from synthetic runs
(bench files, per-request JSON lines, summary-only files); the optimiser on
a bounded linear model. The fits need the measured backend's tables: the
``runs`` fixture skips them without aiconfigurator-core."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from calibrate_runs import ENGINE, MODEL, TRUTH, terms_file

from kvsched.calibrate import Calibrator, load_run
from kvsched.calibrate.fit import FloatArray, bounded_least_squares, trust_region_fit
from kvsched.cli import main
from kvsched.perf.host import HostTerms, load_host_terms
from kvsched.sim.deployment import EngineOptions, build_deployment


def assert_recovered(fitted: HostTerms, names: tuple[str, ...] = (
        "per_prefill_request_s", "step_s", "per_sampled_request_s", "arrival_s", "per_prompt_token_s",
        "per_prefill_token_s")) -> None:
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


def test_the_optimiser_fits_a_bounded_linear_model() -> None:
    a = np.array([[1.0, 2.0], [3.0, 1.0], [0.5, 4.0]])
    truth = np.array([2.0, 0.5])
    fit = bounded_least_squares(lambda x: a @ x - a @ truth, np.array([10.0, 10.0]))
    assert fit.x == pytest.approx(truth, abs=1e-6)
    assert fit.converged and fit.loss < 1e-14
    # The unconstrained minimum of b has x1 < 0: the fit holds it at the bound 0.
    b = np.array([-1.0, 1.0, 0.0])
    fit = bounded_least_squares(lambda x: a @ x - b, np.array([1.0, 1.0]))
    assert fit.x[1] == pytest.approx(0.0, abs=1e-9) and fit.x[1] >= 0.0
    assert fit.x[0] == pytest.approx(float(a[:, 0] @ b) / float(a[:, 0] @ a[:, 0]), abs=1e-6)
    # One step allowed: stopped before the minimum, and said so.
    fit = bounded_least_squares(lambda x: a @ x - b, np.array([1.0, 1.0]), max_iterations=1)
    assert fit.iterations == 1 and not fit.converged


def test_the_optimiser_reads_the_slope_through_stairs() -> None:
    """A linear model seen through a staircase (each coordinate rounded to
    0.01, as a replay's latencies jump when a term moves an arrival across
    a step): differences finer than a stair see no slope and the
    trust-region fit with them stays where it started; implicit filtering's
    coarse secants find the stair of the minimum."""
    a = np.array([[1.0, 2.0], [3.0, 1.0], [0.5, 4.0]])
    truth = np.array([2.0, 0.5])

    def stairs(x: FloatArray) -> FloatArray:
        return np.asarray(a @ (np.round(x / 0.01) * 0.01) - a @ truth, dtype=np.float64)

    start = np.array([0.2, 0.2])
    fine = trust_region_fit(stairs, start, diff_step=1e-3)
    assert fine.x == pytest.approx(start, abs=0.01)
    fit = bounded_least_squares(stairs, start)
    assert fit.x == pytest.approx(truth, abs=0.005)
    assert fit.loss == 0.0 and fit.converged
