"""The step profile file: engine steps as a real vLLM ran and timed them.

``kvsched profile`` (:mod:`kvsched.profile`) writes it; the ``profiled``
step-time backend (:mod:`kvsched.perf.profiled`) reads it. It is one JSON
object:

- ``format`` (``"kvsched-step-profile"``) and ``version`` (2; a version 1
  file, written before the serving path was measured, still loads: no
  ``requests``, no ``serving``);
- ``model``: the checkpoint's cost fields as kvsched reads its config.json
  (:data:`MODEL_FIELDS`), so a simulation of another model is refused;
- ``hardware``: ``device`` (cpu or cuda) and ``name`` as detected;
- ``vllm``: ``version`` (as the user's Python reports it) and ``python``;
- ``serve_flags``: the vLLM server flags that change what a step costs;
- ``environment``: the vLLM environment variables that were set
  (``VLLM_CPU_KVCACHE_SPACE``, ...);
- ``kv_cache_tokens``: the KV cache vLLM reported at start-up (null when
  its log did not say);
- ``points_done``: the designed points already run (``--resume`` skips them);
- ``steps``: one record per engine step (:class:`StepRecord`): the batch as
  vLLM's iteration log states it (context/generation requests and tokens),
  the work kvsched attributes to it from the requests it sent (tokens,
  requests, sampled rows, attention pairs and decode KV), its elapsed
  milliseconds, and whether it was a warm-up (a batch shape seen for the
  first time: oneDNN builds kernels per shape, so its time is not kept);
- ``notes``: what went wrong on the way (a point whose steps the requests
  sent cannot explain), in words;
- ``fit``: the fitted step-cost model and its leave-one-out error (written
  when the profile ends; the backend refits from ``steps`` either way);
- ``requests`` (version 2): one record per request the profile streamed
  (:class:`RequestSample`): its client-side times (time to first token, the
  span between two of its streamed tokens) set against the logged steps
  that produced them, what the serving path costs beyond vLLM's iteration
  clock is read from;
- ``serving`` (version 2): the serving path's terms fitted to ``requests``
  (:class:`kvsched.perf.serving_fit.ServingFit`) and their residual error,
  null when the profile has too few requests to fit them; the profiled
  backend prices its host time with them unless ``--calibration`` is given.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import field_mismatch, read_json_file, show
from kvsched.perf.serving_fit import SAMPLE_KEYS, RequestSample, ServingFit

PROFILE_FORMAT = "kvsched-step-profile"
PROFILE_VERSION = 2
# Versions this kvsched reads: 1 has no serving-path measurement.
READ_VERSIONS = (1, 2)
# A profile of a few thousand steps is a few hundred kilobytes.
MAX_PROFILE_BYTES = 64 << 20
# The ModelSpec fields a profile records and a simulation must match.
MODEL_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size", "num_experts", "experts_per_token")
_FIX = "write it again with kvsched profile (or mend the field)"


@dataclass(frozen=True, slots=True)
class LoggedIteration:
    """One engine step as vLLM's iteration log line states it (its
    iteration number, the batch's context/generation requests and tokens,
    its elapsed time; :mod:`kvsched.profile.iteration_log` parses the line).
    Declared once, here in perf, a layer below the parser, so the parser's
    :class:`~kvsched.profile.iteration_log.IterationLine` and the profile's
    :class:`StepRecord` each extend it with their own fields."""

    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float


@dataclass(frozen=True, slots=True)
class StepRecord(LoggedIteration):
    """One engine step: vLLM's iteration log line plus the designed point it
    ran in and the work kvsched attributes to it (the fields of
    :class:`kvsched.perf.step_time.BatchShape` the fit reads). The line's
    engine index is not kept: a profile's server runs one engine."""

    point: str
    num_tokens: int
    num_reqs: int
    num_sampled: int
    prefill_tokens: int
    prefill_attn_pairs: int
    decode_kv_tokens: int
    warmup: bool = False


def _fields_of_type(cls: type, kind: type) -> tuple[str, ...]:
    """The names of the dataclass ``cls``'s fields declared as ``kind``, in
    declaration order (the order a file is checked in, so the first bad
    field named is the same one every time)."""
    hints = get_type_hints(cls)
    return tuple(f.name for f in fields(cls) if hints[f.name] is kind)


# What a step record's fields must be in the file, read off the declaration.
_STEP_INTS = _fields_of_type(StepRecord, int)
_STEP_KEYS = frozenset(f.name for f in fields(StepRecord))
# A sample's keys in the file (serving_fit.SAMPLE_KEYS): every float is a time in seconds.
_SAMPLE_INTS = tuple(k for k, kind in SAMPLE_KEYS if kind is int)
_SAMPLE_SECONDS = tuple(k for k, kind in SAMPLE_KEYS if kind is float)
_SAMPLE_KEYS = frozenset(k for k, _ in SAMPLE_KEYS)


def _step_json(step: StepRecord) -> dict[str, Any]:
    """A step record as the file holds it: the point first, then the logged
    line's fields, then the work (the key order every profile has had; the
    base class's fields come first in the declaration)."""
    return {"point": step.point, **asdict(step)}


@dataclass(slots=True)
class StepProfile:
    """A profile file's contents (see the module's docstring)."""

    model: dict[str, Any]
    hardware: dict[str, Any]
    vllm: dict[str, Any]
    serve_flags: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    kv_cache_tokens: int | None = None
    points_done: list[str] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    fit: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    path: str = ""
    # The streamed requests' client timings and the serving path's fit
    # (kvsched.perf.serving_fit; None: not measured, as in a version 1 file).
    requests: list[RequestSample] = field(default_factory=list)
    serving: ServingFit | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": self.model,
                "hardware": self.hardware, "vllm": self.vllm, "serve_flags": self.serve_flags,
                "environment": self.environment, "kv_cache_tokens": self.kv_cache_tokens,
                "points_done": self.points_done, "notes": self.notes, "fit": self.fit,
                "serving": self.serving.to_json() if self.serving is not None else None,
                "requests": [r.to_json() for r in self.requests],
                "steps": [_step_json(s) for s in self.steps]}

    def fit_steps(self) -> list[StepRecord]:
        """The steps a fit uses: every one but the warm-ups."""
        return [s for s in self.steps if not s.warmup]


def save_profile(profile: StepProfile, path: str | Path) -> None:
    """Write ``profile`` to ``path`` whole, through a temporary file, so an
    interrupted profile leaves the last complete file behind (``--resume``
    goes on from it). One step record per line keeps the file readable."""
    p = Path(path)
    data = profile.to_json()
    steps = data.pop("steps")
    requests = data.pop("requests")
    head = json.dumps(data, indent=1)[:-2]  # without the closing brace
    text = head + _record_list("requests", requests) + _record_list("steps", steps) + "\n}\n"
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def _record_list(key: str, records: list[dict[str, Any]]) -> str:
    if not records:
        return f',\n "{key}": []'
    lines = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in records)
    return f',\n "{key}": [\n  ' + lines + "\n ]"


def _bad(path: str, where: str, value: object, rule: str) -> UserInputError:
    return UserInputError(f"step profile {path!r}: {where}={show(value)}: {rule}; {_FIX}")


def _expect(path: str, data: dict[str, Any], key: str, kind: type | tuple[type, ...], rule: str) -> Any:
    if key not in data:
        raise UserInputError(f"step profile {path!r}: missing field {key!r} ({rule}); {_FIX}")
    value = data[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _bad(path, key, value, f"must be {rule}")
    return value


def _step(path: str, i: int, data: object) -> StepRecord:
    where = f"steps[{i}]"
    if not isinstance(data, dict):
        raise _bad(path, where, data, "must be an object (one engine step)")
    if mismatch := field_mismatch(data, _STEP_KEYS, {"warmup"}):
        raise UserInputError(f"step profile {path!r}: {where}: {mismatch}; {_FIX}")
    for key in _STEP_INTS:
        value = data[key]
        if not is_int(value) or value < 0:
            raise _bad(path, f"{where}.{key}", value, "must be an integer >= 0")
    ms = data["elapsed_ms"]
    if not is_number(ms) or not math.isfinite(ms) or ms <= 0:
        raise _bad(path, f"{where}.elapsed_ms", ms, "must be a positive number of milliseconds")
    if not isinstance(data["point"], str):
        raise _bad(path, f"{where}.point", data["point"], "must be a string (the designed point's name)")
    warmup = data.get("warmup", False)
    if not isinstance(warmup, bool):
        raise _bad(path, f"{where}.warmup", warmup, "must be true or false")
    if data["num_tokens"] == 0:
        raise _bad(path, f"{where}.num_tokens", 0, "a step runs at least one token")
    return StepRecord(**{**data, "elapsed_ms": float(ms), "warmup": warmup})


def _sample(path: str, i: int, data: object) -> RequestSample:
    where = f"requests[{i}]"
    if not isinstance(data, dict):
        raise _bad(path, where, data, "must be an object (one streamed request)")
    if mismatch := field_mismatch(data, _SAMPLE_KEYS):
        raise UserInputError(f"step profile {path!r}: {where}: {mismatch}; {_FIX}")
    for key in _SAMPLE_INTS:
        value = data[key]
        if not is_int(value) or value < 0:
            raise _bad(path, f"{where}.{key}", value, "must be an integer >= 0")
    for key in _SAMPLE_SECONDS:
        value = data[key]
        if not is_number(value) or not math.isfinite(value) \
                or value < 0:
            raise _bad(path, f"{where}.{key}", value, "must be a number of seconds >= 0")
    if not isinstance(data["point"], str):
        raise _bad(path, f"{where}.point", data["point"], "must be a string (the designed point's name)")
    if not isinstance(data["idle"], bool):
        raise _bad(path, f"{where}.idle", data["idle"], "must be true or false")
    return RequestSample.from_json({**data, **{k: float(data[k]) for k in _SAMPLE_SECONDS}})


def profile_from_json(data: object, path: str) -> StepProfile:
    """A profile from its parsed JSON, every field checked (one line naming
    the field, its value and the fix)."""
    if not isinstance(data, dict):
        raise _bad(path, "the file", data, "must be a JSON object (a kvsched step profile)")
    fmt = _expect(path, data, "format", str, f"the string {PROFILE_FORMAT!r}")
    if fmt != PROFILE_FORMAT:
        raise _bad(path, "format", fmt, f"must be {PROFILE_FORMAT!r} (is this a kvsched profile?)")
    version = _expect(path, data, "version", int, f"the integer {PROFILE_VERSION}")
    if version not in READ_VERSIONS:
        raise _bad(path, "version", version,
                   f"this kvsched reads versions {', '.join(map(str, READ_VERSIONS))}")
    model = _expect(path, data, "model", dict, "an object of the model's config fields")
    for key in MODEL_FIELDS:
        value = _expect(path, model, key, int, "an integer")
        if value < 0:
            raise _bad(path, f"model.{key}", value, "must be an integer >= 0")
    hardware = _expect(path, data, "hardware", dict, "an object: device and name")
    for key in ("device", "name"):
        _expect(path, hardware, key, str, "a string")
    vllm = _expect(path, data, "vllm", dict, "an object: version and python")
    _expect(path, vllm, "version", str, "a string (vLLM's version)")
    flags = _expect(path, data, "serve_flags", list, "a list of vLLM server flags (strings)")
    if not all(isinstance(f, str) for f in flags):
        raise _bad(path, "serve_flags", flags, "must be a list of strings")
    env = data.get("environment", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _bad(path, "environment", env, "must be an object of strings")
    kv = data.get("kv_cache_tokens")
    if kv is not None and (not is_int(kv) or kv < 1):
        raise _bad(path, "kv_cache_tokens", kv, "must be a positive integer or null")
    done = data.get("points_done", [])
    if not isinstance(done, list) or not all(isinstance(p, str) for p in done):
        raise _bad(path, "points_done", done, "must be a list of point names")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _bad(path, "notes", notes, "must be a list of strings")
    fit = data.get("fit")
    if fit is not None and not isinstance(fit, dict):
        raise _bad(path, "fit", fit, "must be an object or null")
    steps = _expect(path, data, "steps", list, "a list of step records")
    requests: list[Any] = []
    serving: ServingFit | None = None
    if version >= 2:
        requests = _expect(path, data, "requests", list, "a list of streamed-request records")
        raw = data.get("serving")
        if raw is not None:
            serving = ServingFit.from_json(raw, f"step profile {path!r}")
    return StepProfile(model, hardware, vllm, list(flags), dict(env), kv, list(done),
                       [_step(path, i, s) for i, s in enumerate(steps)], fit, list(notes), path,
                       [_sample(path, i, r) for i, r in enumerate(requests)], serving)


def load_profile(path: str | Path) -> StepProfile:
    """Read and check a step profile file."""
    p = str(path)
    data = read_json_file(p, MAX_PROFILE_BYTES, "a kvsched step profile (JSON)",
                          fix="a profile is at most a few megabytes: check the path",
                          label=f"step profile {p!r}")
    return profile_from_json(data, p)


def serve_flag(flags: list[str], names: tuple[str, ...], default: str | None = None) -> str | None:
    """The value of a server flag in ``flags`` (``--name value`` or
    ``--name=value``; the last one wins, as argparse reads it)."""
    value = default
    for i, word in enumerate(flags):
        for name in names:
            if word == name and i + 1 < len(flags):
                value = flags[i + 1]
            elif word.startswith(name + "="):
                value = word[len(name) + 1:]
    return value
