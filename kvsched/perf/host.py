"""Host and framework time of a vLLM engine step, as named and fitted terms.

The measured kernel tables (:mod:`kvsched.perf.kernels`) price what the GPU
runs. What they cannot hold is time the host adds around the kernels, which
depends on how vLLM drives them. Each such term here has a physical meaning
and a unit, and its value is fitted on real serving runs (never set by hand
to match one row) and stored with its provenance in one file per vLLM
version and hardware class (``kvsched/perf/data/host_terms_*.json``);
``kvsched simulate --calibration FILE`` replaces them with a user's own
(``kvsched calibrate`` fits them for any backend).

Terms (seconds; a file names every one):

- ``prefill_step_per_layer_s`` (per model layer, per step with prefill
  tokens): a step with prefill tokens does not run as one captured CUDA
  graph (vLLM captures decode-only batches; mixed batches run piecewise,
  attention outside the graphs), so the host launches each layer's pieces
  itself. Decode-only steps do not pay it.
- ``step_s`` (per engine step): the GPU idles between two steps' kernels
  while the host samples, copies the sampled ids back and prepares the next
  inputs, the part async scheduling does not hide.
- ``per_sampled_request_s`` (per request that samples a token in a step):
  the sampler's and the output processing's work per sequence in that gap.
- ``dp_sync_s`` (per step, data parallel only): the ranks agree every step
  on whether any of them has work (a collective on the CPU side).
- ``arrival_s`` (per request): from the client's send to the request
  reaching the scheduler: HTTP, request validation, the hand-over from the
  API server to the engine core.
- ``per_prompt_token_s`` (per prompt token, at arrival): tokenisation of the
  prompt in the API server, before the request reaches the scheduler.

Every step-time backend carries host terms and adds the per-step ones to
every step it prices, in one place (``StepTimeModel.add_host_gaps`` and
``add_prefill_host``; the same float in a fast-forward stretch): the
measured backend its fitted file by default, the roofline and the profiled
backend none unless ``--calibration FILE`` gives them. The arrival terms
delay the moment a request enters the engine while its TTFT still counts
from the send. RuntimeConfig's CPU time (``cpu_step_s`` and
``cpu_per_request_s``, overlapped with the forward pass under async
scheduling) is apart from these terms and not fitted.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import read_json_file

DATA_DIR = Path(__file__).resolve().parent / "data"
# The fitted file the measured backend uses by default (vLLM 0.24 tables,
# NVIDIA data-centre GPUs).
DEFAULT_FILE = DATA_DIR / "host_terms_vllm-0.24_nvidia.json"
# A host-terms file is about a kilobyte; one over a MiB is the wrong file.
MAX_FILE_BYTES = 2**20
# No host overhead of one step, request or token lasts a second (fitted
# values are micro- to milliseconds); more is a unit slip, and at 1e300 s a
# run's clock overflows.
MAX_TERM_S = 1.0
# Every term, in the order a file and the fitting code list them.
TERMS = ("prefill_step_per_layer_s", "step_s", "per_sampled_request_s", "dp_sync_s", "arrival_s",
         "per_prompt_token_s")


@dataclass(frozen=True, slots=True)
class HostTerms:
    prefill_step_per_layer_s: float
    vllm_version: str
    hardware_class: str
    provenance: str
    step_s: float = 0.0
    per_sampled_request_s: float = 0.0
    dp_sync_s: float = 0.0
    arrival_s: float = 0.0
    per_prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in TERMS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value <= MAX_TERM_S:
                raise UserInputError(f"host term {name}={value!r}: must be a number of seconds in "
                                 f"[0, {MAX_TERM_S:g}] (a value in ms or us belongs in seconds)")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def arrival_delay(self, num_prompt_tokens: int) -> float:
        """Seconds from a request's send to its reaching the scheduler; never
        less than ``arrival_s`` (the event loop relies on that floor)."""
        return self.arrival_s + self.per_prompt_token_s * num_prompt_tokens

    @property
    def delays_arrivals(self) -> bool:
        return self.arrival_s > 0.0 or self.per_prompt_token_s > 0.0

    def terms(self) -> dict[str, float]:
        """The fitted values by name (no metadata)."""
        return {name: float(getattr(self, name)) for name in TERMS}


NO_HOST_TIME = HostTerms(0.0, "any", "any", "no host terms (kernel time only)")


def load_host_terms(path: str | Path = DEFAULT_FILE) -> HostTerms:
    """Host terms from a JSON file (a fitted default, or ``kvsched
    calibrate``'s output); a clear error naming the file and field."""
    p = Path(path)
    data = read_json_file(str(p), MAX_FILE_BYTES, "a calibration file (host terms, JSON)",
                          fix="a host-terms file is about a kilobyte: check the path",
                          label=f"calibration file {str(p)!r}")
    if not isinstance(data, dict):
        raise UserInputError(f"calibration file {str(p)!r}: expected a JSON object of host terms")
    expected = {"vllm_version", "hardware_class", "provenance", *TERMS}
    missing = sorted(expected - data.keys())
    unknown = sorted(data.keys() - expected)
    if missing or unknown:
        raise UserInputError(f"calibration file {str(p)!r}: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unknown {', '.join(unknown)}" if unknown else "") if part)
            + f" (fields: {', '.join(sorted(expected))})")
    for key in ("vllm_version", "hardware_class", "provenance"):
        if not isinstance(data[key], str):
            raise UserInputError(f"calibration file {str(p)!r}: {key}={data[key]!r} must be a string")
    try:
        return HostTerms(**data)
    except ValueError as e:
        raise UserInputError(f"calibration file {str(p)!r}: {e}") from None


def save_host_terms(terms: HostTerms, path: str | Path) -> None:
    Path(path).write_text(json.dumps(terms.to_json(), indent=2) + "\n", encoding="utf-8")
