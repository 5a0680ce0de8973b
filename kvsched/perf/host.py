"""Host and framework time of a vLLM engine step, as named and fitted terms.

The measured kernel tables (:mod:`kvsched.perf.kernels`) price what the GPU
runs. What they cannot hold is time the host adds around the kernels, which
depends on how vLLM drives them. Each such term here has a physical meaning
and a unit, and its value is fitted on real serving runs (never set by hand
to match one row) and stored with its provenance in one file per vLLM
version and hardware class (``kvsched/perf/data/host_terms_*.json``);
``kvsched simulate --calibration FILE`` replaces them with a user's own.

Terms:

- ``prefill_step_per_layer_s`` (seconds per model layer, per step): a step
  with prefill tokens does not run as one captured CUDA graph (vLLM captures
  decode-only batches; mixed batches run piecewise, attention outside the
  graphs), so the host launches each layer's pieces itself. Added once per
  such step, per layer; decode-only steps do not pay it.

Host time per step and per scheduled request (scheduling, input preparation,
output processing; overlapped with the forward pass under async scheduling)
stays :class:`~kvsched.perf.step_time.RuntimeConfig`'s ``cpu_step_s`` and
``cpu_per_request_s``, not fitted yet.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
# The fitted file the measured backend uses by default (vLLM 0.24 tables,
# NVIDIA data-centre GPUs).
DEFAULT_FILE = DATA_DIR / "host_terms_vllm-0.24_nvidia.json"
TERMS = ("prefill_step_per_layer_s",)


@dataclass(frozen=True, slots=True)
class HostTerms:
    prefill_step_per_layer_s: float
    vllm_version: str
    hardware_class: str
    provenance: str

    def __post_init__(self) -> None:
        for name in TERMS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"host term {name}={value!r}: must be a finite number of seconds >= 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


NO_HOST_TIME = HostTerms(0.0, "any", "any", "no host terms (kernel time only)")


def load_host_terms(path: str | Path = DEFAULT_FILE) -> HostTerms:
    """Host terms from a JSON file (a fitted default, or ``kvsched
    calibrate``'s output); a clear error naming the file and field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"calibration file {str(p)!r} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"calibration file {str(p)!r} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"calibration file {str(p)!r}: expected a JSON object of host terms")
    expected = {"vllm_version", "hardware_class", "provenance", *TERMS}
    missing = sorted(expected - data.keys())
    unknown = sorted(data.keys() - expected)
    if missing or unknown:
        raise ValueError(f"calibration file {str(p)!r}: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unknown {', '.join(unknown)}" if unknown else "") if part)
            + f" (fields: {', '.join(sorted(expected))})")
    for key in ("vllm_version", "hardware_class", "provenance"):
        if not isinstance(data[key], str):
            raise ValueError(f"calibration file {str(p)!r}: {key}={data[key]!r} must be a string")
    return HostTerms(**data)


def save_host_terms(terms: HostTerms, path: str | Path) -> None:
    Path(path).write_text(json.dumps(terms.to_json(), indent=2) + "\n", encoding="utf-8")
