"""Host and framework time of a vLLM engine step, as named and fitted terms.

The measured kernel tables (:mod:`kvsched.perf.kernels`) price what the GPU
runs. What they cannot hold is time the host adds around the kernels, which
depends on how vLLM drives them. Each such term here has a physical meaning
and a unit, and its value is fitted on real serving runs (never set by hand
to match one row) and stored with its provenance in one file per vLLM
version and hardware class (``kvsched/perf/data/host_terms_*.json``);
``kvsched simulate --calibration FILE`` replaces them with a user's own
(``kvsched calibrate`` fits them for any backend).

Terms (seconds). Each is paid by the thing that causes it, nowhere else:

- ``step_s`` (per engine step): the GPU idles between two steps' kernels
  while the host samples, copies the sampled ids back and prepares the next
  inputs, the part async scheduling does not hide.
- ``per_sampled_request_s`` (per request that samples a token in a step,
  i.e. per streamed token): the sampler's and the output processing's work
  per sequence in that gap.
- ``per_prefill_request_s`` (per request with prefill tokens in a step):
  the host's per-request work for a prompt chunk (input preparation, the
  attention metadata of a prefill, the persistent batch's bookkeeping).
- ``per_prefill_token_s`` (per prefill token computed in a step): work that
  grows with the new prompt tokens a step computes (not with the prompt: a
  prefix-cache hit computes only its tail).
- ``prefill_launch_per_layer_s`` (per model layer, a floor on a step with
  prefill tokens): such a step does not run as one captured CUDA graph
  (vLLM captures decode-only batches; mixed batches run piecewise, attention
  outside the graphs), so the host launches each layer's pieces itself. The
  launches overlap the GPU's work: the forward pass takes at least the
  layers' launch time, and a long prefill, whose kernels outlast the
  launches, pays nothing.
- ``prefill_step_per_layer_s`` (per model layer, per step with any prefill
  token, added): the form fitted before 2026-12-05. It charges a 15-token
  tail after a prefix-cache hit as much as an 8k prompt; kept so old
  calibration files load and the ablation (docs/validation.md) can judge
  it; the default file's selection decides whether it is used.
- ``dp_sync_s`` (per step, data parallel only): the ranks agree every step
  on whether any of them has work (a collective on the CPU side).
- ``arrival_s`` (per request): from the client's send to the request
  reaching the scheduler: HTTP, request validation, the hand-over from the
  API server to the engine core.
- ``per_prompt_token_s`` (per prompt token, at arrival): tokenisation of the
  prompt in the API server, before the request reaches the scheduler (every
  prompt token, cached or not: the server tokenises the whole prompt).

Every step-time backend carries host terms and adds the per-step ones to
every step it prices, in one place (``StepTimeModel.add_host_gaps`` and
``add_prefill_host``; the same float in a fast-forward stretch): the
measured backend and the roofline the fitted file of their hardware's class
(:func:`default_host_terms`; no pricing goes without host time), the
profiled backend the terms its profile measured, a ``--calibration FILE``
replaces either. The arrival terms
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
from kvsched.fields import is_number
from kvsched.jsonfile import field_mismatch, read_json_file

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
         "per_prompt_token_s", "per_prefill_request_s", "per_prefill_token_s", "prefill_launch_per_layer_s")
# The terms a file may leave out (0 then): those added after files were
# first written, so every calibration written before still loads.
OPTIONAL_TERMS = frozenset({"per_prefill_request_s", "per_prefill_token_s", "prefill_launch_per_layer_s"})


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
    per_prefill_request_s: float = 0.0
    per_prefill_token_s: float = 0.0
    prefill_launch_per_layer_s: float = 0.0

    def __post_init__(self) -> None:
        for name in TERMS:
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) \
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


# Each term's display unit (its value times the factor).
TERM_UNITS: dict[str, tuple[str, float]] = {
    "prefill_step_per_layer_s": ("ms", 1e3), "step_s": ("ms", 1e3),
    "per_sampled_request_s": ("us", 1e6), "dp_sync_s": ("ms", 1e3),
    "arrival_s": ("ms", 1e3), "per_prompt_token_s": ("us", 1e6),
    "per_prefill_request_s": ("ms", 1e3), "per_prefill_token_s": ("us", 1e6),
    "prefill_launch_per_layer_s": ("us", 1e6)}


def format_term(name: str, value: float) -> str:
    """A term's value in its display unit (``"0.28 ms"``)."""
    unit, factor = TERM_UNITS[name]
    return f"{value * factor:.4g} {unit}"


def describe_terms(h: HostTerms) -> str:
    """Every non-zero term by name and value, or "all 0"."""
    return ", ".join(f"{n} {format_term(n, v)}" for n, v in h.terms().items() if v) or "all 0"


NO_HOST_TIME = HostTerms(0.0, "any", "any", "no host terms (kernel time only)")


def is_default_class(hardware_name: str) -> bool:
    """Whether the default file was fitted on this hardware's class
    (NVIDIA data-centre GPUs); the catalog names every NVIDIA part so."""
    return hardware_name.upper().startswith("NVIDIA")


def default_host_terms(hardware_name: str) -> tuple[HostTerms, str]:
    """The host terms a backend without its own uses on ``hardware_name``,
    and what to say about them: the fitted default file, whose class is
    NVIDIA's; another vendor's device borrows it, and the note says so (a
    host's launch and sampling costs are of the same order on any
    accelerator, where none at all would price TTFTs 15-65 % low:
    docs/validation.md). The one owner of that choice, for the measured
    backend and the roofline alike."""
    terms = load_host_terms(DEFAULT_FILE)
    if is_default_class(hardware_name):
        return terms, ""
    return terms, (f"host terms borrowed from {terms.hardware_class} GPUs: none fitted for "
                   f"{hardware_name}; kvsched calibrate fits your own")


# ``--calibration none``: price the kernels alone, no host time (an
# ablation, or a test that pins a roofline's arithmetic).
NO_CALIBRATION = "none"


def load_calibration(value: str) -> HostTerms:
    """The host terms ``--calibration VALUE`` names: a file, or
    :data:`NO_CALIBRATION` for none at all."""
    return NO_HOST_TIME if value == NO_CALIBRATION else load_host_terms(value)


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
    if mismatch := field_mismatch(data, expected, OPTIONAL_TERMS):
        raise UserInputError(f"calibration file {str(p)!r}: {mismatch} "
                             f"(fields: {', '.join(sorted(expected))})")
    for key in ("vllm_version", "hardware_class", "provenance"):
        if not isinstance(data[key], str):
            raise UserInputError(f"calibration file {str(p)!r}: {key}={data[key]!r} must be a string")
    try:
        return HostTerms(**data)
    except ValueError as e:
        raise UserInputError(f"calibration file {str(p)!r}: {e}") from None


def save_host_terms(terms: HostTerms, path: str | Path) -> None:
    Path(path).write_text(json.dumps(terms.to_json(), indent=2) + "\n", encoding="utf-8")
