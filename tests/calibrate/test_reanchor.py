"""kvsched.calibrate.reanchor: a profile carried to a slower (or faster)
machine by one logged run. The logged runs here are made from the profile's
own prices times known factors, so the factors are what must come back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvsched.calibrate.reanchor import MIN_DRIFT_STEPS, measure_drift, reanchored
from kvsched.calibrate.step_matching import IterationReplay, ReplayedStep
from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.host import HostTerms
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import StepProfile, load_profile
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig
from kvsched.profile.iteration_log import IterationLine

DATA = Path(__file__).parents[1] / "perf" / "data"


def backend(profile: StepProfile | None = None, host: HostTerms | None = None) -> ProfiledStepTimeModel:
    return ProfiledStepTimeModel(load_model_spec(DATA / "tiny_llama"), get_hardware("h100-sxm"),
                                 ParallelConfig(), RuntimeConfig(async_scheduling=False),
                                 profile or load_profile(DATA / "tiny_llama_profile.json"), host=host)


def decode(n: int, kv: int) -> BatchShape:
    return BatchShape.decode(n, kv)


def prefill(n: int) -> BatchShape:
    return BatchShape(n, 1, 1, 0, 0, n, n, n * (n + 1) // 2)


def logged_run(model: ProfiledStepTimeModel, prefill_factor: float, decode_factor: float,
               count: int = 30) -> tuple[IterationReplay, list[IterationLine]]:
    """``count`` decode steps and ``count`` prefill steps, each logged at
    its kind's factor times the profile's price."""
    steps: list[ReplayedStep] = []
    log: list[IterationLine] = []
    for k in range(count):
        kinds = ((decode(1 + k % 8, 200 + 40 * k), decode_factor), (prefill(64 + 8 * k), prefill_factor))
        for shape, factor in kinds:
            steps.append(ReplayedStep(shape, {}, [], []))
            log.append(IterationLine(len(log), 0, 0, 0, 0, 1e3 * factor * model.gpu_time(shape), engine=0))
    return IterationReplay([], steps, None, "", 0), log


def test_the_drift_of_each_kind_comes_back() -> None:
    model = backend()
    replay, log = logged_run(model, 1.2, 1.5)
    drift = measure_drift(model, replay, log)
    assert drift.steps == 60
    assert drift.prefill_factor == pytest.approx(1.2, rel=1e-9)
    assert drift.decode_factor == pytest.approx(1.5, rel=1e-9)
    assert 1.2 - 1e-9 <= drift.p10 <= drift.factor <= drift.p90 <= 1.5 + 1e-9


def test_a_uniform_drift_scales_every_price() -> None:
    model = backend()
    replay, log = logged_run(model, 1.3, 1.3)
    profile = reanchored(model.profile, measure_drift(model, replay, log), "warmup.json")
    moved = backend(profile)
    # Least squares is linear in the step times: every price moves by 1.3.
    for shape in (decode(4, 1000), prefill(300), BatchShape(260, 3, 3, 2, 500, 258, 258, 258 * 259 // 2)):
        assert moved.gpu_time(shape) == pytest.approx(1.3 * model.gpu_time(shape), rel=1e-9)
    assert "re-anchored on warmup.json" in profile.notes[-1]
    assert profile.fit is None and model.profile.fit is not None  # the original is untouched


def test_each_profiled_step_is_scaled_by_its_kind() -> None:
    model = backend()
    replay, log = logged_run(model, 1.2, 1.5)
    # The test profile has prefill steps only: every other one made a decode step.
    before = [s if i % 2 else dataclasses.replace(s, prefill_tokens=0)
              for i, s in enumerate(model.profile.steps)]
    after = reanchored(dataclasses.replace(model.profile, steps=before), measure_drift(model, replay, log),
                       "w").steps
    assert len(after) == len(before)
    assert any(s.prefill_tokens for s in before) and any(not s.prefill_tokens for s in before)
    for old, new in zip(before, after):
        factor = 1.2 if old.prefill_tokens else 1.5
        assert new.elapsed_ms == pytest.approx(factor * old.elapsed_ms, rel=1e-9)
        assert dataclasses.replace(new, elapsed_ms=old.elapsed_ms) == old


def test_a_run_that_cannot_re_anchor_is_refused() -> None:
    model = backend()
    replay, log = logged_run(model, 1.2, 1.5)
    stuck = dataclasses.replace(replay, diverged_at=3, reason="step 3: no arrivals give the logged batch")
    with pytest.raises(UserInputError, match="step 3"):
        measure_drift(model, stuck, log)
    short, short_log = logged_run(model, 1.2, 1.5, count=(MIN_DRIFT_STEPS - 1) // 2)
    with pytest.raises(UserInputError, match=f"at least {MIN_DRIFT_STEPS}"):
        measure_drift(model, short, short_log)
    drift = measure_drift(model, replay, log)
    # Host terms are not in the iteration clock: the drift is the forward pass's alone.
    host = HostTerms(prefill_step_per_layer_s=0.0, vllm_version="any", hardware_class="any",
                     provenance="test", step_s=1e-3)
    assert measure_drift(backend(host=host), replay, log) == drift
    with pytest.raises(UserInputError, match="not a speed change"):
        reanchored(model.profile, dataclasses.replace(drift, decode_factor=1e6), "w")
