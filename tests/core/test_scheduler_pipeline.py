"""The scheduler's pipeline-parallel rules (vLLM 0.33), by hand-counted steps.

The full decisions are checked against vLLM's engine loop in
tests/conformance/test_pipeline_parallel.py; these pin the two rules on
their own with expected values counted by hand.
"""

from __future__ import annotations

import pytest

from kvsched.config import CacheConfig, SchedulerConfig, SpeculativeConfig, check_speculative_settings
from kvsched.core.scheduler import Scheduler
from kvsched.request import Request, SamplingParams


def _scheduler(async_scheduling: bool, pp: int) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64,
                                     async_scheduling=async_scheduling, pipeline_parallel_size=pp),
                     CacheConfig(num_gpu_blocks=32, block_size=4, enable_prefix_caching=False))


def _scheduled_per_step(s: Scheduler, steps: int) -> list[int]:
    """Schedule ``steps`` batches without applying any output (the pipeline
    fills): the tokens each one schedules for request a."""
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True)))
    return [s.schedule().num_scheduled_tokens.get("a", 0) for _ in range(steps)]


def test_sync_pp_schedules_a_request_once_until_its_output_returns() -> None:
    # Synchronous PP 4: the prompt is scheduled once; with no placeholders the
    # request has nothing to compute until its output comes back.
    assert _scheduled_per_step(_scheduler(False, 4), 4) == [3, 0, 0, 0]


def test_async_pp_decodes_once_every_pp_steps() -> None:
    # Async PP 2 (queue depth 3): the prompt at step 1 (its sample is a
    # placeholder), then one decode every second step.
    s = _scheduler(True, 2)
    s.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True)))
    assert s.max_steps_in_flight == 3
    got = [s.schedule().num_scheduled_tokens.get("a", 0) for _ in range(3)]
    assert got == [3, 0, 1]


def test_async_without_pp_decodes_every_step() -> None:
    s = _scheduler(True, 1)
    assert _scheduled_per_step(s, 2) == [3, 1]


@pytest.mark.parametrize("pp", [0, 17, True, 2.0])
def test_bad_pipeline_parallel_size_is_refused(pp: object) -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        SchedulerConfig(pipeline_parallel_size=pp)  # type: ignore[arg-type]


def test_speculative_decoding_with_pp_is_refused() -> None:
    config = SchedulerConfig(pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size=2"):
        check_speculative_settings(config, SpeculativeConfig(method="ngram", num_speculative_tokens=2))
