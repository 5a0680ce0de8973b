"""kvsched calibrate on every step-time backend: runs simulated with known
host terms on the roofline, on the profiled backend (the committed synthetic
tiny-Llama profile) and on the measured one, fitted from calibrate's default
start (the shipped terms for the measured backend and the roofline; each
term's typical size for the profiled backend, which has none), recover every term within 2 % and reproduce a
held-out run. (tests/calibrate/test_fit.py fits the measured backend from a
far start, and other file formats.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from calibrate_runs import terms_file

from kvsched.calibrate import Calibrator, load_run
from kvsched.cli import main
from kvsched.perf.host import HostTerms, load_host_terms
from kvsched.sim.deployment import EngineOptions, build_deployment

DATA = Path(__file__).parents[1] / "perf" / "data"
# The synthetic ground truth (seconds), 2-40x the default start.
TRUTH = {"per_prefill_request_s": 3e-3, "step_s": 0.5e-3, "per_sampled_request_s": 20e-6,
         "dp_sync_s": 0.0, "arrival_s": 4e-3, "per_prompt_token_s": 2e-6,
         "per_prefill_token_s": 8e-6}
# What a one-rank deployment fits (dp_sync_s needs data parallelism).
TERMS_FITTED = ("per_prefill_request_s", "step_s", "per_sampled_request_s", "arrival_s",
                "per_prompt_token_s", "per_prefill_token_s")


@dataclass(frozen=True, slots=True)
class Backend:
    engine: tuple[str, ...]
    options: EngineOptions
    workload: tuple[str, ...]
    # Closed-loop concurrencies: two fitted, one held out.
    fit: tuple[int, int]
    held: int
    backend: str
    # How calibrate names its default start for this backend.
    start: str = "typical sizes (the backend has none)"


# Llama-3.1-8B on an H100 on the roofline (async scheduling: its forward
# pass, milliseconds, outlasts the roofline's 0.5 ms CPU step, so every
# term shows).
ROOFLINE = Backend(
    ("--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--step-time-backend", "roofline"),
    EngineOptions("meta-llama/Llama-3.1-8B", "h100-sxm", step_time_backend="roofline"),
    ("--num-prompts", "80", "--random-input-len", "800", "--random-output-len", "24",
     "--random-range-ratio", "0.9"), (1, 48), 12, "roofline",
    "the default host_terms_vllm-0.24_nvidia.json")
# The tiny Llama of the profile tests, inside the profiled range (512
# tokens, 32 requests a step).
_PROFILE = (str(DATA / "tiny_llama"), str(DATA / "tiny_llama_profile.json"))
PROFILED = Backend(
    ("--model", _PROFILE[0], "--step-time-profile", _PROFILE[1], "--no-async-scheduling",
     "--max-model-len", "4096", "--max-num-batched-tokens", "512", "--max-num-seqs", "32"),
    EngineOptions(_PROFILE[0], step_time_profile=_PROFILE[1], async_scheduling=False, max_model_len=4096,
                  max_num_batched_tokens=512, max_num_seqs=32),
    ("--num-prompts", "60", "--random-input-len", "300", "--random-output-len", "16",
     "--random-range-ratio", "0.9"), (1, 32), 8, "profiled")
# The measured backend (its tables need aiconfigurator-core), from its
# shipped default terms.
MEASURED = Backend(
    ("--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--step-time-backend", "measured"),
    EngineOptions("meta-llama/Llama-3.1-8B", "h100-sxm", step_time_backend="measured"),
    ROOFLINE.workload, (1, 48), 12, "measured", "the default host_terms_vllm-0.24_nvidia.json")
BACKENDS = {"roofline": ROOFLINE, "profiled": PROFILED, "measured": MEASURED}


def simulate(b: Backend, folder: Path, name: str, concurrency: int) -> Path:
    out = folder / f"{name}.json"
    assert main(["simulate", *b.engine, "--calibration", str(folder / "truth.json"), *b.workload,
                 "--max-concurrency", str(concurrency), "--seed", str(concurrency), "--no-progress",
                 "--save-result", str(out), "--save-detailed"]) == 0
    return out


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Backend, dict[str, Path]]:
    b = BACKENDS[request.param]
    if b.backend == "measured":
        pytest.importorskip("aiconfigurator_core")
    folder = tmp_path_factory.mktemp(f"calibrate-{b.backend}")
    terms_file(folder / "truth.json", TRUTH, "synthetic truth")
    runs = {"folder": folder, "held": simulate(b, folder, "held", b.held)}
    for c in b.fit:
        runs[f"c{c}"] = simulate(b, folder, f"c{c}", c)
    return b, runs


def test_calibrate_recovers_the_terms_on_any_backend(backend_runs: tuple[Backend, dict[str, Path]],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    b, runs = backend_runs
    out = runs["folder"] / "fitted.json"
    fit_files = [w for c in b.fit for w in ("--bench", str(runs[f"c{c}"]))]
    assert main(["calibrate", *b.engine, *fit_files, "--held-out", str(runs["held"]), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"step times: {b.backend}" in text and "Held-out error" in text
    assert f"Start: {b.start}" in text
    fitted = load_host_terms(out)
    for name in TERMS_FITTED:
        value, truth = getattr(fitted, name), TRUTH[name]
        assert value == pytest.approx(truth, rel=0.02), f"{b.backend} {name}: {value!r}, truth {truth!r}"
    # The held-out run, replayed with the fitted terms, matches per request.
    deployment = build_deployment(b.options)
    assert deployment.step_model.backend == b.backend
    held = load_run(str(runs["held"]), "bench")
    calibrator = Calibrator(deployment, [held], fitted, ("step_s",))
    errors = calibrator.errors([held], fitted)[0]
    assert np.median(np.abs(errors.ttft)) < 0.01
    assert np.median(np.abs(errors.tpot)) < 0.01
    # ... while the backend without host terms is off by more than that.
    zero = HostTerms(0.0, "any", "any", "none")
    assert np.median(np.abs(calibrator.errors([held], zero)[0].tpot)) > 0.02
