"""The logged step-time replay: each step priced with a logged step's time,
the matching step found where a boundary fell the other way, mismatches
listed, fast-forward and a step past the log refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.host import HostTerms
from kvsched.perf.logged import LoggedStep, LoggedStepTimeModel, StepMismatch
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.run import build_group_deployment, serve, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunOptions, RunSpec
from kvsched.sim.workload import Workload, WorkloadRequest
from kvsched.sim.workload.tokens import UNIQUE_TOKEN_BASE

DATA = Path(__file__).parent / "data"
CPU = 0.5e-3, 4e-6  # RuntimeConfig's default CPU terms (per step, per request)


def replay(steps: list[LoggedStep], window: int = 0, host: HostTerms | None = None) -> LoggedStepTimeModel:
    return LoggedStepTimeModel(load_model_spec(DATA / "tiny_llama"), get_hardware("h100-sxm"),
                               ParallelConfig(), RuntimeConfig(async_scheduling=False), steps, "test log",
                               host, window)


def prefill(tokens: int) -> BatchShape:
    return BatchShape(tokens, 1, 1, 0, 0, tokens, tokens, tokens * (tokens + 1) // 2)


def decode(reqs: int) -> BatchShape:
    return BatchShape.decode(reqs, 100 * reqs)


def test_steps_in_order_take_their_logged_times_plus_the_cpu_terms() -> None:
    sm = replay([LoggedStep(256, 1, 0.300), LoggedStep(1, 1, 0.040), LoggedStep(2, 2, 0.045)])
    assert sm.step_time(prefill(256)) == pytest.approx(0.300 + CPU[0] + CPU[1])
    assert sm.step_time(decode(1)) == pytest.approx(0.040 + CPU[0] + CPU[1])
    assert sm.step_time(decode(2)) == pytest.approx(0.045 + CPU[0] + 2 * CPU[1])
    assert (sm.num_in_order, sm.num_mismatches) == (3, 0)
    assert sm.backend == "logged" and sm.pricing() == "logged"


def test_host_terms_add_to_the_logged_time() -> None:
    host = HostTerms(0.0, "v", "cpu", "test", step_s=2e-3, per_sampled_request_s=1e-4)
    sm = replay([LoggedStep(1, 1, 0.040), LoggedStep(3, 3, 0.050)], host=host)
    assert sm.step_time(decode(1)) == pytest.approx(0.040 + 2e-3 + 1e-4 + CPU[0] + CPU[1])
    assert sm.gpu_time(decode(3)) == pytest.approx(0.050 + 2e-3 + 3e-4)


def test_a_different_batch_in_order_is_priced_and_listed() -> None:
    sm = replay([LoggedStep(1, 1, 0.040), LoggedStep(257, 2, 0.340)])
    # Two batches are too few for a line: the mean logged step prices it.
    assert sm.gpu_time(decode(2)) == pytest.approx(0.190)
    assert sm.num_mismatches == 1
    assert sm.mismatches == [StepMismatch(0, (1, 1), (2, 2))]
    assert sm.gpu_time(prefill(256)) == pytest.approx(0.190)  # the cursor moved on regardless
    assert sm.num_mismatches == 2
    with pytest.raises(UserInputError, match="past the log's 2 steps"):
        sm.gpu_time(decode(1))


def test_the_window_finds_the_step_a_boundary_moved() -> None:
    # vLLM: decode, prefill+decode, 2 decodes. The simulation ran the
    # decode twice before the prefill (its request arrived a step later).
    log = [LoggedStep(1, 1, 0.040), LoggedStep(257, 2, 0.340), LoggedStep(2, 2, 0.045)]
    sm = replay(log, window=2)
    assert sm.gpu_time(decode(1)) == 0.040
    assert sm.gpu_time(decode(1)) == 0.040   # behind the cursor: the cursor stays
    assert sm.gpu_time(BatchShape(257, 2, 2, 1, 101, 256, 256, 256 * 257 // 2)) == 0.340
    assert sm.gpu_time(decode(2)) == 0.045
    assert (sm.num_in_order, sm.num_behind, sm.num_ahead, sm.num_mismatches) == (3, 1, 0, 0)
    # And a step the simulation skipped: the match ahead moves the cursor past it.
    sm = replay(log, window=2)
    assert sm.gpu_time(BatchShape(257, 2, 2, 1, 101, 256, 256, 256 * 257 // 2)) == 0.340
    assert sm.gpu_time(decode(2)) == 0.045
    assert (sm.num_ahead, sm.num_skipped, sm.num_in_order) == (1, 1, 1)


def test_a_batch_outside_the_window_takes_its_nearest_logged_step() -> None:
    # Times on the line 10 ms + 1 ms per token + 5 ms per request, but the
    # (258, 3) step, 40 ms above it.
    log = [LoggedStep(1, 1, 0.016), LoggedStep(2, 2, 0.022), LoggedStep(2, 2, 0.022), LoggedStep(2, 2, 0.022),
           LoggedStep(258, 3, 0.323), LoggedStep(3, 3, 0.028)]
    sm = replay(log, window=1)
    assert sm.gpu_time(decode(1)) == 0.016
    # (258, 3) is 3 steps ahead, outside the window: priced from there, the cursor stays.
    assert sm.gpu_time(BatchShape(258, 3, 3, 2, 200, 256, 256, 256 * 257 // 2)) == 0.323
    assert (sm.num_elsewhere, sm.next_index, sm.num_mismatches) == (1, 1, 0)
    # A batch the log never ran: priced by the line through the log's
    # steps (not the 22 ms decode at the cursor), listed, the cursor on.
    line_5x5 = sm.gpu_time(decode(5))
    assert 0.030 < line_5x5 < 0.050
    assert sm.mismatches == [StepMismatch(1, (2, 2), (5, 5))] and sm.next_index == 2
    # In order (window 0) nothing is looked for: the same line prices it.
    sm = replay(log)
    sm.gpu_time(decode(1))
    assert sm.gpu_time(BatchShape(5, 5, 5, 5, 100, 0, 0, 0)) == pytest.approx(line_5x5)
    assert (sm.num_elsewhere, sm.num_mismatches) == (0, 1)


def test_a_fast_forward_stretch_and_a_step_past_the_log_are_refused() -> None:
    sm = replay([LoggedStep(1, 1, 0.040)])
    with pytest.raises(UserInputError, match="fast-forward off"):
        sm.decode_step_times(1, 100, 1, 5)
    sm.gpu_time(decode(1))
    with pytest.raises(UserInputError, match="past the log's 1 steps"):
        sm.gpu_time(decode(1))


@pytest.mark.parametrize(("tokens", "reqs", "seconds", "match"), [
    (0, 0, 0.1, "at least one token"), (2, 3, 0.1, "at least one token"), (1, 1, -1.0, "elapsed_s"),
    (1, 1, float("nan"), "elapsed_s")])
def test_bad_logged_steps_are_refused(tokens: int, reqs: int, seconds: float, match: str) -> None:
    with pytest.raises(UserInputError, match=match):
        LoggedStep(tokens, reqs, seconds)


def test_bad_window_and_empty_log_are_refused() -> None:
    with pytest.raises(UserInputError, match="window=-1"):
        replay([LoggedStep(1, 1, 0.1)], window=-1)
    with pytest.raises(UserInputError, match="no logged steps"):
        replay([])


def test_a_run_through_serve_takes_the_logged_times() -> None:
    # One request of a 4-token prompt and 3 output tokens: a prefill step and
    # two decodes, priced 0.1, 0.2 and 0.3 s (plus the CPU terms).
    engine = EngineOptions(model=str(DATA / "tiny_llama"), max_num_seqs=4, max_num_batched_tokens=512,
                           max_model_len=512, async_scheduling=False, num_gpu_blocks_override=64,
                           step_time_backend="roofline")
    spec = RunSpec(DeploymentSpec((InstanceGroup(engine=engine),)), options=RunOptions(fast_forward=False))
    deployment, _ = build_group_deployment(spec.deployment.group)
    d = deployment
    model = LoggedStepTimeModel(d.model, d.hardware, d.parallel, d.runtime,
                                [LoggedStep(4, 1, 0.1), LoggedStep(1, 1, 0.2), LoggedStep(1, 1, 0.3)])
    deployment = dataclasses.replace(deployment, step_model=model)
    workload = Workload("one", (WorkloadRequest("r", 0.0, ((UNIQUE_TOKEN_BASE, 4),), 3),))
    result = serve(deployment, spec.deployment.group, workload, sim_config(deployment, spec), spec.options)
    step = CPU[0] + CPU[1]
    assert result.records.first_token_time[0] == pytest.approx(0.1 + step)
    assert result.records.finish_time[0] == pytest.approx(0.6 + 3 * step)
    assert (model.num_in_order, model.num_mismatches) == (3, 0)
