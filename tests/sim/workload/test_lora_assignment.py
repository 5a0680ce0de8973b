"""kvsched.sim.workload.lora: which requests name an adapter, and which."""

from __future__ import annotations

import random

import pytest

from kvsched.errors import UserInputError
from kvsched.request import SamplingParams
from kvsched.sim.workload import Workload, WorkloadRequest
from kvsched.sim.workload.lora import adapter_counts, adapter_ids_by_name, assign_loras, check_lora_workload


def workload(n: int) -> Workload:
    return Workload("w", tuple(WorkloadRequest(f"r{i}", i * 0.1, ((1, 10),), 5) for i in range(n)))


def test_round_robin_spreads_a_share_evenly() -> None:
    out = assign_loras(workload(8), range(1, 4), 0.5, "round-robin", None, 0)
    assert [r.lora_id for r in out.requests] == [0, 1, 0, 2, 0, 3, 0, 1]
    full = assign_loras(workload(5), range(1, 3), 1.0, "round-robin", None, 0)
    assert [r.lora_id for r in full.requests] == [1, 2, 1, 2, 1]


def test_full_share_random_draws_as_vllm_bench() -> None:
    # vllm bench serve: random.choice over the adapters, once per request.
    rng = random.Random(7)
    expected = [rng.choice(range(1, 5)) for _ in range(50)]
    out = assign_loras(workload(50), range(1, 5), 1.0, "random", None, 7)
    assert [r.lora_id for r in out.requests] == expected


def test_share_zero_and_share_half() -> None:
    assert adapter_counts(assign_loras(workload(20), range(1, 5), 0.0, "random", None, 1)) == {0: 20}
    counts = adapter_counts(assign_loras(workload(2000), range(1, 5), 0.5, "random", None, 1))
    assert 900 < counts[0] < 1100


def test_zipf_makes_the_first_adapter_most_popular() -> None:
    counts = adapter_counts(assign_loras(workload(4000), range(1, 9), 1.0, "random", 1.0, 3))
    # Zipf(1) over 8: adapter 1 has 1/H_8 = 36.8% of draws, adapter 8 4.6%.
    assert 0.33 < counts[1] / 4000 < 0.41
    assert counts[1] > counts[2] > counts[4] > counts[8]


def test_the_rest_of_a_request_is_kept() -> None:
    w = workload(3)
    out = assign_loras(w, range(1, 3), 1.0, "round-robin", None, 0)
    for a, b in zip(w.requests, out.requests, strict=True):
        assert (a.request_id, a.arrival_time, a.prompt_runs, a.output_len) == \
            (b.request_id, b.arrival_time, b.prompt_runs, b.output_len)
    # The scheduler's request carries it (the max_loras cap reads it).
    assert out.requests[1].to_request(SamplingParams(max_tokens=5, ignore_eos=True), 0.0).lora_id == 2


@pytest.mark.parametrize(("args", "match"), [
    ((1.5, "random", None, None), "--lora-share=1.5"),
    ((None, "zipf", None, None), "--lora-assignment"),
    ((None, "random", 0.0, None), "--lora-zipf-alpha=0"),
    ((None, "round-robin", 1.0, None), "--lora-zipf-alpha with --lora-assignment round-robin"),
    ((None, "random", None, 0), "--num-lora-adapters=0"),
])
def test_bad_values_refused(args: tuple, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UserInputError, match=match):
        check_lora_workload(*args)


def test_bench_names_pick_a_subset_by_the_servers_ids() -> None:
    served = ["sql", "chat", "code"]
    assert adapter_ids_by_name([], served) == (1, 2, 3)
    assert adapter_ids_by_name(["code", "sql"], served) == (3, 1)
    out = assign_loras(workload(4), (3, 1), 1.0, "round-robin", None, 0)
    assert [r.lora_id for r in out.requests] == [3, 1, 3, 1]
    with pytest.raises(UserInputError, match="--lora-names math: the server has no adapter"):
        adapter_ids_by_name(["math"], served)
