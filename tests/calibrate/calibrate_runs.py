"""The synthetic runs calibrate's tests fit: Llama-3.1-8B on an H100 SXM,
simulated with known host terms (TRUTH) and saved as vllm bench serve files."""

from __future__ import annotations

from pathlib import Path

from kvsched.cli import main
from kvsched.perf.host import HostTerms, save_host_terms

MODEL = "meta-llama/Llama-3.1-8B"
ENGINE = ["--model", MODEL, "--hardware", "h100-sxm"]
# The synthetic ground truth, and a start far from it (each term 2-5x off).
TRUTH = {"per_prefill_request_s": 3e-3, "step_s": 0.5e-3, "per_sampled_request_s": 20e-6,
         "dp_sync_s": 0.0, "arrival_s": 4e-3, "per_prompt_token_s": 2e-6,
         "per_prefill_token_s": 8e-6}
START = {"per_prefill_request_s": 6e-3, "step_s": 0.1e-3, "per_sampled_request_s": 5e-6,
         "dp_sync_s": 0.0, "arrival_s": 15e-3, "per_prompt_token_s": 8e-6,
         "per_prefill_token_s": 2e-6}
# Mixed lengths (input 80-1520, output 3-61) so prompt-length terms show.
WORKLOAD = ["--num-prompts", "120", "--random-input-len", "800", "--random-output-len", "32",
            "--random-range-ratio", "0.9", "--no-progress"]


def terms_file(path: Path, values: dict[str, float], note: str) -> Path:
    # The per-layer charge of the 2026-11-26 form stays 0 unless named.
    save_host_terms(HostTerms(vllm_version="test", hardware_class="h100-sxm", provenance=note,
                              **{"prefill_step_per_layer_s": 0.0, **values}), path)
    return path


def simulate(folder: Path, name: str, extra: list[str]) -> Path:
    out = folder / f"{name}.json"
    code = main(["simulate", *ENGINE, "--step-time-backend", "measured", "--calibration",
                 str(folder / "truth.json"), *WORKLOAD, *extra, "--save-result", str(out),
                 "--save-detailed"])
    assert code == 0
    return out


def make_runs(folder: Path) -> dict[str, Path]:
    """Runs simulated with the known terms: concurrency 1 (the engine is idle
    at every arrival, so TTFT shows the arrival terms and TPOT a batch of one),
    64 (large batches, prefill mixed with decodes), and two held-out runs at
    another concurrency and at a Poisson rate."""
    terms_file(folder / "truth.json", TRUTH, "synthetic truth")
    terms_file(folder / "start.json", START, "far start")
    return {"folder": folder,
            "c1": simulate(folder, "c1", ["--max-concurrency", "1"]),
            "c64": simulate(folder, "c64", ["--max-concurrency", "64"]),
            "c16": simulate(folder, "c16", ["--max-concurrency", "16", "--seed", "7"]),
            "r8": simulate(folder, "r8", ["--request-rate", "8", "--seed", "3"])}
