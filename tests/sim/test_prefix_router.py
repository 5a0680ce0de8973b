"""The prefix-aware router (llm-d's precise prefix-cache scorer with its
queue and KV-usage scorers, weights 3 / 2 / 2): hand-computed scores, the
cached rank winning at equal load and losing to a much busier one, scoring
that leaves every rank as it was, and a DP run of shared prompts that hits
the prefix cache more often than round-robin."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import StepTimeModel
from kvsched.sim.client import Client
from kvsched.sim.cluster import Cluster
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.instance import EngineInstance
from kvsched.sim.rank import Rank
from kvsched.sim.router import Routable, Router, prefix_aware_scores
from kvsched.sim.simulator import SimConfig
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

BLOCK = 16
SC = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=16, max_model_len=4096)
CC = CacheConfig(num_gpu_blocks=400, block_size=BLOCK)
DENSE = StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))


def _prompt(i: int, group: int, prefix: int, own: int) -> WorkloadRequest:
    """Request ``i``: ``prefix`` tokens of system prompt ``group`` (token id
    2 + group, an id no workload generator uses), then ``own`` tokens of its own."""
    return WorkloadRequest(f"r{i}", 0.0, ((2 + group, prefix), (UNIQUE_TOKEN_BASE + i, own)), 4)


def _finish(rank: Rank, spec: WorkloadRequest) -> None:
    """Run ``spec`` on ``rank`` to the end: its prompt's blocks stay cached, free."""
    assert rank.receive(spec, 0.0)
    t = 0.0
    while rank.busy():
        plan = rank.plan()
        assert plan is not None
        rank.complete(plan, t, 0.01)
        t += 0.01


def _ranks(n: int) -> list[Rank]:
    return [Rank(SC, CC, workload_name="t") for _ in range(n)]


def test_scores_by_hand() -> None:
    # Matched blocks 0, 2, 6: the ranks with hits normalise among themselves
    # (2 -> 0, 6 -> 1), rank 0 has none (0). Waiting 4, 0, 2: queue scores
    # 0, 1, 0.5. Usage 0.5, 0.25, 0.0.
    assert prefix_aware_scores([0, 2, 6], [4, 0, 2], [0.5, 0.25, 0.0]) == [
        0.0 + 0.0 + 1.0,        # 3*0 + 2*0   + 2*0.5
        0.0 + 2.0 + 1.5,        # 3*0 + 2*1   + 2*0.75
        3.0 + 1.0 + 2.0]        # 3*1 + 2*0.5 + 2*1
    # One rank with hits: it alone scores 1; equal queues all score 1.
    assert prefix_aware_scores([0, 3], [1, 1], [0.0, 0.0]) == [4.0, 7.0]
    # Equal hits on every rank: all 1, the prefix decides nothing.
    assert prefix_aware_scores([5, 5], [0, 1], [0.0, 0.0]) == [3.0 + 2.0 + 2.0, 3.0 + 0.0 + 2.0]


@pytest.mark.parametrize("start", [0, 1, 2])
def test_cached_rank_wins_at_equal_load(start: int) -> None:
    ranks = _ranks(3)
    _finish(ranks[1], _prompt(0, 0, 160, 20))
    assert [r.load_stats() for r in ranks] == [(0, 0, 0.0)] * 3
    router = Router("prefix-aware", 3)
    router.next_rank = start  # wherever the tie scan starts
    assert router.choose(ranks, 0.0, _prompt(1, 0, 160, 30)) == 1
    # Another system prompt is cached nowhere: all tie, the scan's first wins.
    router.next_rank = start
    assert router.choose(ranks, 0.0, _prompt(2, 1, 160, 30)) == start


def test_ties_rotate() -> None:
    ranks = _ranks(3)
    router = Router("prefix-aware", 3)
    assert [router.choose(ranks, 0.0, _prompt(i, 0, 64, 8)) for i in range(4)] == [0, 1, 2, 0]


def test_load_beats_the_prefix_on_a_much_busier_rank() -> None:
    ranks = _ranks(2)
    _finish(ranks[1], _prompt(0, 0, 160, 20))
    spec = _prompt(1, 0, 160, 30)
    # Rank 1 gets 10 waiting requests: queue score 0 against rank 0's 1. With
    # 3 for the prefix against 2 for the queue, it still wins: 3 + 0 + 2 > 0 + 2 + 2.
    for i in range(10):
        assert ranks[1].receive(_prompt(100 + i, 1, 48, 1000), 0.0)
    assert Router("prefix-aware", 2).choose(ranks, 0.0, spec) == 1
    # Steps admit them (66 blocks each, 399 usable) until rank 1's KV cache
    # is over half used with some still waiting: 3 + 2 * 0 + 2 * (1 - usage)
    # < 4 = rank 0's total.
    t = 0.0
    while ranks[1].load_stats()[2] <= 0.5:
        plan = ranks[1].plan()
        assert plan is not None
        ranks[1].complete(plan, t, 0.01)
        t += 0.01
    assert ranks[1].load_stats()[0] >= 1 and ranks[0].load_stats() == (0, 0, 0.0)
    assert Router("prefix-aware", 2).choose(ranks, 0.0, spec) == 0


def _state(rank: Rank) -> tuple[object, ...]:
    """Everything of a rank's KV cache that a lookup could change."""
    m = rank.sched.kv_cache_manager
    pool = m.block_pool
    return (dict(pool.cached), list(pool.block_hash), list(pool.ref_cnt), pool.num_free,
            list(pool.free_queue), m.num_private, {k: list(v) for k, v in m.req_to_blocks.items()},
            dict(m.num_cached_block), len(rank.sched.waiting), len(rank.sched.running))


def test_scoring_changes_no_rank_state() -> None:
    ranks = _ranks(2)
    _finish(ranks[0], _prompt(0, 0, 160, 20))
    assert ranks[1].receive(_prompt(1, 1, 96, 40), 0.0)
    plan = ranks[1].plan()
    assert plan is not None
    ranks[1].complete(plan, 0.0, 0.01)
    before = [_state(r) for r in ranks]
    router = Router("prefix-aware", 2)
    # Shared prefixes, a prompt of no full block, and a private prompt (its
    # keys would be handed out by the manager if scoring asked for them).
    for spec in (_prompt(2, 0, 160, 5), _prompt(3, 1, 96, 7), _prompt(4, 0, 3, 5),
                 WorkloadRequest("private", 0.0, ((UNIQUE_TOKEN_BASE + 5, 300),), 4)):
        router.choose(ranks, 0.0, spec)
    assert [_state(r) for r in ranks] == before


class ScoringRoundRobin(Router):
    """Round-robin that also asks a prefix-aware router each time and
    ignores its answer."""

    def __init__(self, size: int) -> None:
        super().__init__("round-robin", size)
        self.scorer = Router("prefix-aware", size)
        self.asked: list[int] = []

    def choose(self, ranks: Sequence[Routable], now: float, spec: WorkloadRequest | None = None) -> int:
        self.asked.append(self.scorer.choose(ranks, now, spec))
        return super().choose(ranks, now, spec)


def _groups_workload(n: int) -> Workload:
    # 3 system prompts of 320 tokens in a scrambled order, 5 requests a second.
    return Workload("groups", tuple(
        WorkloadRequest(f"r{i}", i * 0.2, ((2 + (i * 7 % 11) % 3, 320), (UNIQUE_TOKEN_BASE + i, 64)), 16)
        for i in range(n)))


def _cluster(router: Router, workload: Workload, size: int) -> tuple[Cluster, list[Rank]]:
    config = SimConfig(SC, CC, DENSE)
    ranks = [config.make_rank(workload, seed=i) for i in range(size)]
    return Cluster([EngineInstance(r, DENSE, True) for r in ranks], Client(workload), router), ranks


def test_a_run_that_only_scores_equals_a_run_that_does_not() -> None:
    wl = _groups_workload(60)
    plain, _ = _cluster(Router("round-robin", 3), wl, 3)
    scoring = ScoringRoundRobin(3)
    scored, _ = _cluster(scoring, wl, 3)
    a = plain.run()
    b = scored.run()
    assert len(scoring.asked) == 60
    assert scoring.asked != [i % 3 for i in range(60)]  # the scorer would have routed otherwise
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b, strict=True):
        ma, mb = ra.metrics(), rb.metrics()
        for m in (ma, mb):
            m.pop("simulation_wall_seconds", None)
        assert ma["completed"] == 20
        assert ma == mb


def test_shared_prompts_hit_the_cache_more_with_prefix_aware_routing() -> None:
    # 4 replicas, 3 system prompts of 20 blocks, 80 requests of 384 tokens,
    # 400 blocks per replica (nothing is ever evicted). Round-robin: every
    # replica computes every system prompt once, 12 misses; prefix-aware on
    # replicas this lightly loaded: each system prompt computed once, 3.
    wl = _groups_workload(80)
    config = SimConfig(SC, CC, DENSE)
    rates = {}
    for router in ("round-robin", "prefix-aware"):
        result = DPSimulator(config, wl, DPOptions(4, router=router)).run().combined().metrics()
        rates[router] = result["prefix_cache_hit_rate"]
    assert rates["round-robin"] == pytest.approx((80 - 12) * 320 / (80 * 384))
    assert rates["prefix-aware"] == pytest.approx((80 - 3) * 320 / (80 * 384))


def test_prefix_aware_needs_the_request() -> None:
    with pytest.raises(ValueError, match="needs the request"):
        Router("prefix-aware", 2).choose(_ranks(2), 0.0)
