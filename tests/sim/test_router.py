"""The router's rules, one test each, with hand-computed choices.

The ``vllm`` router follows vLLM 0.33.0's ``DPLBAsyncMPClient.get_core_engine_for_request``
(vllm/v1/engine/core_client.py); tests/conformance/test_dp_router.py checks it
against choices recorded from that code.
"""

from __future__ import annotations

import pytest

from kvsched.sim.router import Router, vllm_score


class FakeRank:
    """Published stats and an in-flight count, set by the test."""

    def __init__(self, waiting: int = 0, running: int = 0, usage: float = 0.0,
                 in_flight: int = 0) -> None:
        self.stats = (waiting, running, usage)
        self.in_flight = in_flight

    def load_stats(self) -> tuple[int, int, float]:
        return self.stats

    def num_unfinished(self) -> int:
        return self.in_flight


def test_round_robin_takes_ranks_in_turn() -> None:
    ranks = [FakeRank(running=5), FakeRank(), FakeRank(running=3)]
    rr = Router("round-robin", 3, 0.1)
    assert [rr.choose(ranks, 0.0) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_reads_exact_counts_and_ties_go_low() -> None:
    ranks = [FakeRank(running=5), FakeRank(waiting=1), FakeRank(running=3)]
    ll = Router("least-loaded", 3, 0.1)
    assert ll.choose(ranks, 0.0) == 1  # 5, 1, 3
    ranks[1].stats = (3, 0, 0.0)
    assert ll.choose(ranks, 0.0) == 1  # 5, 3, 3: the lower rank
    assert ll.choose(ranks, 0.0) == 1  # nothing changed, nothing rotates


def test_score_waiting_penalty_grows_with_kv_usage() -> None:
    assert vllm_score(2, 0, 0.3, 0) == 2.0              # under half usage: no penalty
    assert vllm_score(2, 0, 0.5, 0) == 2.0
    assert vllm_score(2, 0, 0.75, 0) == 2.0 + 2 * 6 * 0.25  # 5.0
    assert vllm_score(2, 3, 1.0, 0) == 5.0 + 2 * 6 * 0.5    # 17.0
    assert vllm_score(0, 3, 1.0, 0) == 3.0              # no waiting: no penalty
    assert vllm_score(1, 1, 0.0, 7) == 7.0              # the in-flight floor


@pytest.mark.parametrize(("usage", "expected"), [(0.3, 0), (0.9, 1)])
def test_vllm_router_penalises_waiting_on_full_kv(usage: float, expected: int) -> None:
    # Rank 0: 2 waiting; rank 1: 3 running. 2 < 3 until KV pressure adds
    # 2 * 6 * (0.9 - 0.5) = 4.8 to rank 0.
    ranks = [FakeRank(waiting=2, usage=usage), FakeRank(running=3, usage=usage)]
    assert Router("vllm", 2, 0.1).choose(ranks, 0.0) == expected


def test_vllm_router_counts_its_own_sends_until_the_next_stats() -> None:
    # No in-flight floor here (the fake ranks report none): only the local
    # waiting increment spreads the requests.
    ranks = [FakeRank(running=2), FakeRank()]
    r = Router("vllm", 2, stats_interval=0.1)
    # Scores 2, 0 -> rank 1 (now 1 waiting); 2, 1 -> rank 1; 2, 2, the scan
    # starting at rank 0 this time -> rank 0.
    assert [r.choose(ranks, 0.0) for _ in range(3)] == [1, 1, 0]


def test_vllm_router_sees_load_changes_only_at_the_next_stats() -> None:
    ranks = [FakeRank(), FakeRank(running=3)]
    r = Router("vllm", 2, stats_interval=0.1)
    assert r.choose(ranks, 0.0) == 0     # 0 vs 3
    ranks[0].stats = (0, 10, 0.0)        # rank 0 fills up
    assert r.choose(ranks, 0.05) == 0    # stale: 1 (its own send) vs 3
    assert r.choose(ranks, 0.2) == 1     # new stats: 10 vs 3


def test_vllm_router_in_flight_floor_outlasts_stats() -> None:
    # Stats say both ranks are empty, but rank 0 still has 3 of this front
    # end's requests unfinished: max(3, 0) vs max(0, 0).
    ranks = [FakeRank(in_flight=3), FakeRank()]
    assert Router("vllm", 2, 0.1).choose(ranks, 0.0) == 1


def test_vllm_router_ties_rotate() -> None:
    # Fresh, equal stats before every request (the interval is short), so the
    # front end's own counts never break the tie: the scan start does.
    ranks = [FakeRank(), FakeRank(), FakeRank()]
    r = Router("vllm", 3, stats_interval=0.1)
    assert [r.choose(ranks, 0.2 * i) for i in range(5)] == [0, 1, 2, 0, 1]
