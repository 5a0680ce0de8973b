"""The random dataset of vllm bench serve: defaults, vLLM's draws for a seed,
length ranges, the arrival process, the shared prefix and bad arguments."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from kvsched.sim.workload import RANDOM_PREFIX_TOKEN, UNIQUE_TOKEN_BASE, Workload, random_workload


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_random_defaults_are_vllm_bench_defaults() -> None:
    w = random_workload()
    assert len(w) == 1000
    assert {r.num_prompt_tokens for r in w.requests} == {1024}
    assert {r.output_len for r in w.requests} == {128}
    assert {r.arrival_time for r in w.requests} == {0.0}  # request rate inf
    assert w.max_concurrency is None
    assert w.requests[7].prompt_runs == ((UNIQUE_TOKEN_BASE + 7, 1024),)


def test_random_matches_vllm_for_the_same_seed() -> None:
    # Golden values from vLLM 0.33.0's get_sampling_params (default_rng(3),
    # range ratio 0.5, no special tokens) and get_request (np.random.seed(3),
    # rate 2, burstiness 0.5).
    w = random_workload(8, 1000, 200, 0.5, request_rate=2.0, burstiness=0.5, seed=3)
    assert [r.request_id for r in w.requests] == [f"random-{i}" for i in range(8)]
    assert [r.num_prompt_tokens for r in w.requests] == [1312, 585, 679, 737, 681, 1302, 1370, 1082]
    assert [r.output_len for r in w.requests] == [107, 118, 166, 187, 224, 196, 153, 132]
    assert [r.arrival_time for r in w.requests] == [
        0.40886230662139794, 0.521773587789365, 2.6759537918878915, 2.6969970717084983,
        2.700531318579925, 2.7017222500608566, 3.3134555479123784, 4.0]


def test_random_length_ranges_and_determinism() -> None:
    ratio = {"input": 0.3, "output": 0.95}
    w = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=5)
    inputs = [r.num_prompt_tokens for r in w.requests]
    outputs = [r.output_len for r in w.requests]
    # [floor(70.7), ceil(131.3)] and [max(1, floor(10*0.05)), ceil(10*1.95)], every value hit.
    assert set(inputs) == set(range(70, 133))
    assert set(outputs) == set(range(1, 21))
    same = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=5)
    assert same == w
    other = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=6)
    assert [r.num_prompt_tokens for r in other.requests] != inputs


def gaps(w: Workload) -> list[float]:
    times = [0.0] + [r.arrival_time for r in w.requests]
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_random_arrival_process(burstiness: float, cv: float) -> None:
    n, rate = 20_000, 4.0
    w = random_workload(n, input_len=1, output_len=1, request_rate=rate, burstiness=burstiness, seed=1)
    g = gaps(w)
    assert w.requests[-1].arrival_time == pytest.approx(n / rate, rel=1e-12)  # vLLM rescales to n/rate
    assert statistics.fmean(g) == pytest.approx(1 / rate, rel=1e-9)
    # Gamma(shape k) gaps have coefficient of variation 1/sqrt(k).
    assert statistics.pstdev(g) / statistics.fmean(g) == pytest.approx(cv, rel=0.1)
    assert all(x >= 0 for x in g)


def test_random_constant_rate_when_burstiness_is_infinite() -> None:
    w = random_workload(10, input_len=1, output_len=1, request_rate=5.0, burstiness=math.inf)
    assert [r.arrival_time for r in w.requests] == pytest.approx([0.2 * (i + 1) for i in range(10)])


def test_random_prefix_is_shared_exactly() -> None:
    w = random_workload(5, input_len=30, output_len=4, prefix_len=100, range_ratio=0.5, seed=2)
    a, b = w.requests[0].prompt_token_ids(), w.requests[1].prompt_token_ids()
    assert a[:100] == [RANDOM_PREFIX_TOKEN] * 100
    assert common_prefix(a, b) == 100
    assert all(r.num_prompt_tokens >= 115 for r in w.requests)
    only_prefix = random_workload(2, input_len=0, prefix_len=8)
    assert only_prefix.requests[0].prompt_runs == ((RANDOM_PREFIX_TOKEN, 8),)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_prompts": 0}, "num_prompts"),
    ({"input_len": 0}, "prefix_len"),
    ({"range_ratio": 1.0}, "range_ratio"),
    ({"range_ratio": {"input": 0.1}}, "range_ratio"),
    ({"request_rate": 0}, "request_rate"),
    ({"burstiness": 0}, "burstiness"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"seed": -1}, "seed"),
])
def test_random_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        random_workload(num_prompts=kwargs.pop("num_prompts", 3), **kwargs)  # type: ignore[arg-type]
