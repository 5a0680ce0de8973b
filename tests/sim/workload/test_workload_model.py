"""The workload data model: scaling and truncation, sorting, request checks,
prompts kept as runs, and the random dataset's requests built on demand."""

from __future__ import annotations

import math
import re
from array import array

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.errors import UserInputError
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import StepTimeModel
from kvsched.request import SamplingParams
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import (
    RANDOM_PREFIX_TOKEN,
    UNIQUE_TOKEN_BASE,
    RandomRequests,
    Workload,
    WorkloadRequest,
    random_workload,
)


def small_workload() -> Workload:
    reqs = tuple(WorkloadRequest(f"r{i}", float(t), ((UNIQUE_TOKEN_BASE + i, 2),), 1)
                 for i, t in enumerate([0, 1, 1, 3, 10]))
    return Workload("small", reqs, max_concurrency=2)


def test_scaled_and_truncated() -> None:
    w = small_workload()
    half = w.scaled(0.5)
    assert [r.arrival_time for r in half.requests] == [0, 0.5, 0.5, 1.5, 5]
    assert [r.request_id for r in half.requests] == [r.request_id for r in w.requests]
    assert half.max_concurrency == 2
    assert [r.request_id for r in w.truncated(num_requests=2).requests] == ["r0", "r1"]
    assert [r.request_id for r in w.truncated(duration=3).requests] == ["r0", "r1", "r2"]
    assert len(w.truncated(num_requests=4, duration=100)) == 4
    with pytest.raises(ValueError, match="time_scale"):
        w.scaled(0)
    with pytest.raises(ValueError, match="duration"):
        w.truncated(duration=-1)
    with pytest.raises(ValueError, match="no request arrives before"):
        Workload("late", (WorkloadRequest("x", 5.0, ((1, 1),), 1),)).truncated(duration=1)


def test_workload_sorts_stably_and_checks_ids() -> None:
    a = WorkloadRequest("a", 2.0, ((1, 1),), 1)
    b = WorkloadRequest("b", 1.0, ((1, 1),), 1)
    c = WorkloadRequest("c", 2.0, ((1, 1),), 1)
    assert [r.request_id for r in Workload("w", (a, b, c)).requests] == ["b", "a", "c"]
    with pytest.raises(ValueError, match="duplicate request_id 'a'"):
        Workload("w", (a, a))
    with pytest.raises(ValueError, match="requests is empty"):
        Workload("w", ())


def test_workload_request_validation() -> None:
    r = WorkloadRequest("x", 0, [[5, 2], [6, 1]], 3)  # type: ignore[arg-type]
    assert r.prompt_runs == ((5, 2), (6, 1))
    assert r.num_prompt_tokens == 3
    assert r.prompt_token_ids() == [5, 5, 6]
    cases: list[tuple[dict[str, object], str]] = [
        ({"output_len": 0}, "output_len"), ({"arrival_time": -1.0}, "arrival_time"),
        ({"arrival_time": math.nan}, "arrival_time"), ({"prompt_runs": ()}, "prompt_runs"),
        ({"prompt_runs": ((5, 0),)}, "count"), ({"prompt_runs": ((-1, 3),)}, "token_id"),
        ({"output_len": True}, "output_len"), ({"request_id": ""}, "request_id")]
    for kwargs, field in cases:
        args: dict[str, object] = {"request_id": "x", "arrival_time": 0.0, "prompt_runs": ((1, 1),),
                                   "output_len": 1}
        args.update(kwargs)
        with pytest.raises(ValueError, match=field):
            WorkloadRequest(**args)  # type: ignore[arg-type]


def test_a_huge_prompt_costs_no_token_list() -> None:
    # A 5e8-token row (a corrupt trace): the request is refused for its length,
    # as vLLM refuses it, without ever expanding its prompt.
    huge = WorkloadRequest("huge", 0.0, ((UNIQUE_TOKEN_BASE, 500_000_000),), 4)
    small = WorkloadRequest("small", 0.0, ((UNIQUE_TOKEN_BASE + 1, 100),), 4)
    request = huge.to_request(SamplingParams(max_tokens=4), 0.0)
    assert len(request.all_token_ids) == 500_000_000 and request.private
    config = SimConfig(SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=2048),
                       CacheConfig(num_gpu_blocks=200, block_size=16),
                       StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm")))
    result = Simulator(config, Workload("w", (huge, small))).run()
    assert [f[0] for f in result.failed] == ["huge"] and "max_model_len" in result.failed[0][1]
    assert [r.request_id for r in result.records] == ["small"]


def test_random_requests_are_built_on_demand_as_listed() -> None:
    # The random dataset keeps columns and builds each request when asked:
    # the same requests a list would hold, by index, slice and iteration.
    w = random_workload(num_prompts=50, input_len=30, output_len=9, range_ratio=0.5, prefix_len=4,
                        request_rate=10.0, seed=5)
    reqs = w.requests
    assert isinstance(reqs, RandomRequests) and len(reqs) == 50
    r7 = reqs[7]
    assert r7.request_id == "random-7"
    assert r7.prompt_runs[0] == (RANDOM_PREFIX_TOKEN, 4)
    assert r7.prompt_runs[1][0] == UNIQUE_TOKEN_BASE + 7 and 15 <= r7.prompt_runs[1][1] <= 45
    assert reqs[-1].request_id == "random-49" and reqs[-1] == reqs[49]
    listed = list(reqs)
    assert [r.request_id for r in listed] == [f"random-{i}" for i in range(50)]
    assert list(w.arrival_times()) == [r.arrival_time for r in listed]
    assert w.total_prompt_tokens == sum(r.num_prompt_tokens for r in listed)
    assert w.total_output_tokens == sum(r.output_len for r in listed)
    # Slices keep the ids of their position in the whole workload.
    tail = w.truncated(num_requests=10).requests
    assert [r.request_id for r in tail] == [f"random-{i}" for i in range(10)]
    assert reqs[20:23] == listed[20:23]
    cut = w.truncated(duration=listed[30].arrival_time)
    assert len(cut) == sum(1 for r in listed if r.arrival_time < listed[30].arrival_time)
    # Scaling multiplies each arrival as a WorkloadRequest would.
    half = w.scaled(0.5)
    assert [r.arrival_time for r in half.requests] == [r.arrival_time * 0.5 for r in listed]
    with pytest.raises(IndexError):
        reqs[50]


def test_random_requests_build_what_the_checked_constructor_builds() -> None:
    """Built unchecked from its columns, each request equals the one
    WorkloadRequest's own checks accept, its prompt length included."""
    reqs = RandomRequests(array("d", [0.0, 0.5, 2.0]), array("q", [3, 0, 7]), array("q", [1, 4, 9]),
                          prefix_len=5)
    for i, got in enumerate(reqs):
        runs = [(RANDOM_PREFIX_TOKEN, 5)] + ([(UNIQUE_TOKEN_BASE + i, reqs.input_lens[i])]
                                            if reqs.input_lens[i] else [])
        want = WorkloadRequest(f"random-{i}", reqs.arrivals[i], tuple(runs), reqs.output_lens[i])
        assert got == want
        assert got.num_prompt_tokens == want.num_prompt_tokens == 5 + reqs.input_lens[i]
    sliced = RandomRequests(array("d", [0.0, 1.0]), array("q", [2, 3]), array("q", [1, 1]), 0)[1:]
    assert sliced[0] == WorkloadRequest("random-1", 1.0, ((UNIQUE_TOKEN_BASE + 1, 3),), 1)


@pytest.mark.parametrize(("arrivals", "inputs", "outputs", "prefix", "message"), [
    ([0.0, float("nan")], [1, 1], [1, 1], 0, "random-1: arrival_time=nan"),
    ([0.0, 2e8], [1, 1], [1, 1], 0, "random-1: arrival_time="),
    ([0.0, 1.0], [1, 1], [1, 0], 0, "random-1: output_len=0"),
    ([0.0, 1.0], [0, 1], [1, 1], 0, "random-0: prompt_runs"),
    ([0.0, 1.0], [1, 2**40], [1, 1], 1, "random-1: 1099511627777 prompt tokens"),
    ([0.0, 1.0], [1, 1], [1], 0, "columns of 2, 2 and 1 requests"),
])
def test_random_requests_refuse_bad_columns_naming_the_request(
        arrivals: list[float], inputs: list[int], outputs: list[int], prefix: int, message: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(message)):
        RandomRequests(array("d", arrivals), array("q", inputs), array("q", outputs), prefix)
