"""The simulator with pipeline parallelism: vLLM's PP batch queue on a clock of stages."""

from __future__ import annotations

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.errors import UserInputError
from kvsched.perf import get_hardware, get_model
from kvsched.perf.pipeline import PipelineStages
from kvsched.perf.step_time import BatchShape, StepTimeModel
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.results import num_gpus
from kvsched.sim.run import run
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import Workload, WorkloadRequest

STAGES = PipelineStages(pipeline_parallel_size=2, tensor_parallel_size=1, hidden_size=4096,
                        link_bw=1e11, link_latency_s=1e-5)


def _model() -> StepTimeModel:
    model = StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))
    model.pipeline = STAGES
    return model


def _prefill(n: int) -> BatchShape:
    return BatchShape(n, 1, 1, 0, 0, n, n, n * (n + 1) // 2)


def _simulate(requests: list[WorkloadRequest], budget: int, async_scheduling: bool = False):  # type: ignore[no-untyped-def]
    sc = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=4096,
                         async_scheduling=async_scheduling, pipeline_parallel_size=2)
    cc = CacheConfig(num_gpu_blocks=200, block_size=16, enable_prefix_caching=False)
    return Simulator(SimConfig(sc, cc, _model()), Workload("pp", tuple(requests))).run()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_request_pays_every_stage_and_every_hand_off(async_scheduling: bool) -> None:
    # Alone in a 2-stage pipeline: each step's batch passes both stages (its
    # whole step time plus one hand-off), one after the other. Under async
    # scheduling the next decode is scheduled early, but cannot enter the
    # pipeline before the token it decodes has left it.
    model = _model()
    result = _simulate([WorkloadRequest("only", 0.0, ((5, 100),), 4)], budget=2048,
                       async_scheduling=async_scheduling)
    prefill = model.step_time(_prefill(100)) + STAGES.transfer_time(100)
    decodes = [model.step_time(BatchShape.decode(1, 100 + i + 1)) + STAGES.transfer_time(1)
               for i in range(3)]
    (record,) = result.records
    assert record.first_token_time == pytest.approx(prefill, rel=1e-12)
    assert record.finish_time == pytest.approx(prefill + sum(decodes), rel=1e-12)
    assert record.num_output_tokens == 4


def test_two_batches_are_on_the_stages_at_once() -> None:
    # Two 100-token prompts, a budget of 100: two batches; the second enters
    # stage 0 as the first moves on to stage 1.
    model = _model()
    result = _simulate([WorkloadRequest("a", 0.0, ((5, 100),), 1),
                        WorkloadRequest("b", 0.0, ((6, 100),), 1)], budget=100)
    stage0 = model.step_time(_prefill(100)) / 2 + STAGES.transfer_time(100)
    starts = list(result.steps.start)[:2]
    assert starts == pytest.approx([0.0, stage0], rel=1e-12)
    # Busy time counts each batch's time on one stage, not its pipeline latency.
    assert result.metrics()["busy_seconds"] == pytest.approx(2 * stage0, rel=1e-12)


def test_async_pp_finishes_every_request() -> None:
    requests = [WorkloadRequest(f"r{i}", 0.01 * i, ((i, 50 + 10 * i),), 20) for i in range(6)]
    result = _simulate(requests, budget=256, async_scheduling=True)
    assert sorted(r.num_output_tokens for r in result.records) == [20] * 6
    assert not result.failed


def _spec(*flags: str):  # type: ignore[no-untyped-def]
    return parse_spec(["--model", "meta-llama/Llama-3.1-70B", "--num-prompts", "20",
                       "--random-input-len", "256", "--random-output-len", "32",
                       "--step-time-backend", "roofline", *flags])


def test_the_flag_reaches_the_deployment_and_the_gpu_count() -> None:
    result = run(_spec("-tp", "2", "-pp", "2"))
    deployment = result.prepared.deployment
    assert deployment.parallel.pipeline_parallel_size == 2
    assert deployment.scheduler_config.pipeline_parallel_size == 2
    assert "TP2 PP2" in deployment.describe()
    assert num_gpus(deployment) == 4
    assert len(result.result.records) == 20


@pytest.mark.parametrize("flags, match", [
    (("-pp", "0"), "pipeline_parallel_size=0"),
    (("-tp", "4", "-pp", "2", "--kv-offloading-size", "8"), "--kv-offloading-size"),
    (("-tp", "4", "-pp", "2", "--disaggregation", "1P1D"), "pipeline_parallel_size=2"),
])
def test_what_pp_cannot_run_with_is_refused(flags: tuple[str, ...], match: str) -> None:
    with pytest.raises(UserInputError, match=match):
        run(_spec(*flags))


def test_the_spec_round_trips_through_simulates_flags() -> None:
    spec = _spec("-tp", "2", "-pp", "4")
    assert "--pipeline-parallel-size" in spec_argv(spec)
    assert parse_spec(spec_argv(spec)).deployment == spec.deployment
