"""The ``profiled`` step-time backend: steps priced from the user's own vLLM.

:class:`ProfiledStepTimeModel` prices a step's forward pass with the cost
model :mod:`kvsched.perf.profile_fit` fits to a step profile (``kvsched
profile``'s file): a fixed cost per step, a cost per token, per request, per
sampled row, per prefill attention pair and per decode KV token, each
learned from the steps a real vLLM ran on the user's machine. What vLLM's
iteration time leaves out (scheduling and output processing: its clock
starts after the step is scheduled and stops before the output is
processed) stays the host time of :class:`~kvsched.perf.step_time.RuntimeConfig`
and combines with it as for every backend (:func:`combine_step_time`). The
rest of the serving path (the gap between steps beyond that CPU time, per
step and per streamed token, and the delay from a request's send to the
scheduler) is priced by host terms (:mod:`kvsched.perf.host`): by default
those the profile measured from its own streamed requests
(:mod:`kvsched.perf.serving_fit`; none for a profile written before it
measured them); ``--calibration FILE`` replaces them (``kvsched calibrate``
fits them for this backend too). ``describe_backend`` says which.

A step larger than any the profile holds (more tokens, requests, prefill
attention pairs or decode KV) is priced by extrapolating the fit, and
counted: the result says how many steps and how far past
(``extrapolated``), as the measured backend lists queries past its tables.
A profile of another model, tensor-parallel size, dtype or KV-cache dtype
is refused.
"""

from __future__ import annotations

from kvsched.errors import UserInputError
from kvsched.perf.hardware import Hardware
from kvsched.perf.host import HostTerms, describe_terms
from kvsched.perf.models import ModelSpec
from kvsched.perf.profile_fit import SMALL_STEP_TERMS, TERMS, ProfileFit, fit_steps, small_step_index
from kvsched.perf.serving_fit import ServingFit
from kvsched.perf.step_profile import MODEL_FIELDS, StepProfile, serve_flag
from kvsched.perf.step_time import (
    FP32_DTYPES,
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    combine_step_time,
    kv_cache_dtype_bytes,
    model_dtype,
)

_PAST_NAMES = ("tokens", "requests", "prefill attention pairs", "decode KV tokens")


def profiled_tensor_parallel_size(profile: StepProfile) -> int:
    """The -tp the profiled vLLM served with (1 when its flags do not say):
    the only TP size the profile prices."""
    tp = serve_flag(profile.serve_flags, ("--tensor-parallel-size", "-tp"), "1") or "1"
    try:
        return int(tp)
    except ValueError:
        raise UserInputError(f"--step-time-profile {profile.path!r}: its server flags give "
                             f"--tensor-parallel-size {tp!r}, not an integer; profile again") from None


def check_profile_matches(profile: StepProfile, model: ModelSpec, parallel: ParallelConfig,
                          runtime: RuntimeConfig) -> None:
    """Refuse a profile taken on another model or deployment: its step times
    say nothing about this one."""
    where = f"--step-time-profile {profile.path!r}"
    for name in MODEL_FIELDS:
        have, want = profile.model.get(name), getattr(model, name)
        if have != want:
            raise UserInputError(f"{where}: profiled model {profile.model.get('name', '?')!r} has "
                                 f"{name}={have!r} but {model.name} has {want!r}; profile this model "
                                 "(kvsched profile --model ...) or simulate the profiled one")
    flags = profile.serve_flags
    tp = profiled_tensor_parallel_size(profile)
    if tp != parallel.tensor_parallel_size:
        raise UserInputError(f"{where}: profiled with --tensor-parallel-size {tp}, simulated with "
                             f"{parallel.tensor_parallel_size}; profile with the same -tp")
    dtype = serve_flag(flags, ("--dtype",), "auto")
    # A float32 profile (a CPU without fast 16-bit GEMMs serves in float32)
    # prices steps as measured; the simulated 16-bit dtype then only sizes
    # what the profile does not (its KV cache comes from the profile).
    if (dtype not in (None, "auto") and dtype.lower() not in FP32_DTYPES
            and model_dtype(dtype) != runtime.dtype):
        raise UserInputError(f"{where}: profiled with --dtype {dtype}, simulated in {runtime.dtype}; "
                             "give the profiled --dtype (or profile again)")
    kv = serve_flag(flags, ("--kv-cache-dtype",), "auto") or "auto"
    if kv_cache_dtype_bytes(kv) != runtime.kv_bytes:
        raise UserInputError(f"{where}: profiled with --kv-cache-dtype {kv}, simulated with "
                             f"{runtime.kv_cache_dtype}; give the profiled --kv-cache-dtype")


def profile_host_terms(profile: StepProfile, serving: ServingFit, runtime: RuntimeConfig) -> HostTerms:
    """The host terms of the serving path ``profile`` measured, beside the
    simulation's own CPU time per step (``runtime``'s)."""
    return serving.host_terms(str(profile.vllm.get("version", "?")), str(profile.hardware.get("name", "?")),
                              profile.path or "step profile", runtime.cpu_step_s, runtime.cpu_per_request_s)


# Where the small-step terms start in the fit's coefficients.
_FIRST_SMALL = TERMS.index(SMALL_STEP_TERMS[0])


class ProfiledStepTimeModel(StepTimeModel):
    """Steps priced by a fit to the user's own vLLM's step times (see the module)."""

    backend = "profiled"

    def __init__(self, model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                 runtime: RuntimeConfig, profile: StepProfile, fit: ProfileFit | None = None,
                 host: HostTerms | None = None) -> None:
        # Whose host terms price the steps: those given (a calibration),
        # else the serving path the profile measured, else none.
        self.host_source = "given" if host is not None else "none"
        if host is None and profile.serving is not None:
            host = profile_host_terms(profile, profile.serving, runtime)
            self.host_source = "profile"
        super().__init__(model, hardware, parallel, runtime, host)
        check_profile_matches(profile, model, parallel, runtime)
        self.profile = profile
        self.fit = fit if fit is not None else fit_steps(profile.fit_steps(),
                                                         f"step profile {profile.path!r}")
        self.coef = tuple(self.fit.terms[name] for name in TERMS)
        # Steps past the profiled range, per aggregate: (count, largest asked).
        self._past: dict[str, tuple[int, int]] = {}

    def _rebuilt(self, host: HostTerms) -> ProfiledStepTimeModel:
        twin = ProfiledStepTimeModel(self.model, self.hardware, self.parallel, self.runtime,
                                     self.profile, self.fit, host)
        if host is self.host:
            twin.host_source = self.host_source  # the same terms: the same owner
        return twin

    def describe_backend(self) -> str:
        p = self.profile
        text = (f"profiled from {p.path} (vLLM {p.vllm.get('version', '?')} on "
                f"{p.hardware.get('name', '?')}; {self.fit.describe()})")
        text += "; " + self.host_description()
        if self._past:
            n = max(count for count, _ in self._past.values())
            text += f"; {n} step(s) past the profiled range (listed in the saved JSON)"
        return text

    def host_description(self) -> str:
        """Which host terms price the steps: the profile's measured serving
        path, a calibration's, or none (and why none)."""
        h = self.host
        if self.host_source == "profile" and h is not None and self.profile.serving is not None:
            return ("host terms: the serving path the profile measured (" + describe_terms(h)
                    + f"; fitted to its streamed requests, median |error| "
                    f"{100 * self.profile.serving.gap_median_abs_error:.1f} % of the period between tokens)")
        if h is not None:
            return f"host terms given ({h.provenance}: " + describe_terms(h) + ")"
        if self.profile.requests or self.profile.serving is not None:
            return "no host terms (the profile's serving path was not fitted: see its notes)"
        return ("no host terms (the profile predates serving-path measurement: kvsched profile again, or "
                "give --calibration)")

    def forward_time(self, shape: BatchShape) -> float:
        """The step's forward pass as vLLM's iteration clock times it: the
        fit alone, without host terms (what a logged step is set against)."""
        c0, c1, c2, c3, c4, c5 = self.coef[:_FIRST_SMALL]
        # The same additions, in the same order, as decode_step_times.
        t = c0
        t += c1 * shape.num_tokens
        t += c2 * shape.num_reqs
        t += c3 * (shape.num_sampled + shape.spec_tokens)
        t += c4 * shape.prefill_attn_pairs
        t += c5 * shape.decode_kv_tokens
        t += self._small_step(shape.num_tokens)
        return t

    def _small_step(self, num_tokens: int) -> float:
        """The cost of its own a step of 1-4 tokens pays (profile_fit's
        small-step terms), 0.0 for a larger one."""
        i = small_step_index(num_tokens)
        return self.coef[_FIRST_SMALL + i] if i >= 0 else 0.0

    def _note_past(self, name: str, limit: int, asked: int, count: int) -> None:
        old = self._past.get(name)
        if old is not None:
            self.extrapolated.discard(self._past_text(name, limit, *old))
            count, asked = old[0] + count, max(old[1], asked)
        self._past[name] = (count, asked)
        self.extrapolated.add(self._past_text(name, limit, count, asked))

    @staticmethod
    def _past_text(name: str, limit: int, count: int, asked: int) -> str:
        return (f"{count} step(s) past the profiled {name} (profiled up to {limit:,}, largest asked "
                f"{asked:,}): extrapolated")

    def _check_range(self, shape: BatchShape) -> None:
        r = self.fit.range
        values = (shape.num_tokens, shape.num_reqs, shape.prefill_attn_pairs, shape.decode_kv_tokens)
        limits = (r.num_tokens, r.num_reqs, r.prefill_attn_pairs, r.decode_kv_tokens)
        for name, value, limit in zip(_PAST_NAMES, values, limits):
            if value > limit:
                self._note_past(name, limit, value, 1)

    def gpu_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        """The step's time as vLLM's iteration log measures it, from the fit."""
        if shape.num_tokens == 0:
            return 0.0
        self._check_range(shape)
        t = self.forward_time(shape)
        # The host terms (none unless calibrated), as decode_step_times adds them.
        return self.add_prefill_host(self.add_host_gaps(t, shape.num_sampled), shape)

    def decode_step_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          global_tokens: int | None = None) -> list[float]:
        """The one formula of a pure-decode step, as gpu_time's (the same
        float), plus the host time."""
        r = self.fit.range
        if num_reqs > r.num_tokens:
            self._note_past("tokens", r.num_tokens, num_reqs, count)
        if num_reqs > r.num_reqs:
            self._note_past("requests", r.num_reqs, num_reqs, count)
        last = first_kv_tokens + (count - 1) * kv_step
        if last > r.decode_kv_tokens:
            past = count if first_kv_tokens > r.decode_kv_tokens else \
                (last - r.decode_kv_tokens + kv_step - 1) // kv_step
            self._note_past("decode KV tokens", r.decode_kv_tokens, last, past)
        c0, c1, c2, c3, c4, c5 = self.coef[:_FIRST_SMALL]
        small = self._small_step(num_reqs)
        base = c0
        base += c1 * num_reqs
        base += c2 * num_reqs
        base += c3 * num_reqs
        base += c4 * 0
        cpu = self.runtime.cpu_step_s + self.runtime.cpu_per_request_s * num_reqs
        overlap = self.async_scheduling
        kvs = range(first_kv_tokens, first_kv_tokens + kv_step * count, kv_step) if kv_step \
            else (first_kv_tokens,) * count
        return [combine_step_time(self.add_host_gaps(base + c5 * kv + small, num_reqs), cpu, overlap)
                for kv in kvs]
