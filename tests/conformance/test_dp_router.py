"""kvsched's ``vllm`` router against vLLM 0.33.0's DP load balancer.

dp/router_goldens.json holds scripted stats messages, requests and finishes,
and the engine vLLM's own ``DPLBAsyncMPClient.get_core_engine_for_request``
chose for each request (written by dp/make_router_goldens.py, which needs the
reference vLLM environment; this test only reads the file). The same events
go through kvsched's Router: a stats message is what the ranks publish at the
router's next refresh, and every rank counts the requests routed to it that
have not finished.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.sim.router import Router

GOLDENS = json.loads((Path(__file__).parent / "dp" / "router_goldens.json").read_text())
CASES: list[dict[str, Any]] = GOLDENS["cases"]


class ScriptedRank:
    def __init__(self) -> None:
        self.stats: tuple[int, int, float] = (0, 0, 0.0)
        self.in_flight: set[str] = set()

    def load_stats(self) -> tuple[int, int, float]:
        return self.stats

    def num_unfinished(self) -> int:
        return len(self.in_flight)


def kvsched_choices(dp_size: int, events: list[dict[str, Any]]) -> list[int]:
    ranks = [ScriptedRank() for _ in range(dp_size)]
    # One stats interval per message: the router refreshes exactly once after each.
    router = Router("vllm", dp_size, stats_interval=1.0)
    now = 0.0
    chosen: list[int] = []
    for event in events:
        if "stats" in event:
            for rank, (waiting, running, usage) in zip(ranks, event["stats"]):
                rank.stats = (waiting, running, usage)
            now += 1.0
        elif "route" in event:
            index = router.choose(ranks, now)
            ranks[index].in_flight.add(event["route"])
            chosen.append(index)
        else:
            for rank in ranks:
                rank.in_flight -= set(event["finish"])
    return chosen


def test_goldens_cover_the_rules() -> None:
    assert GOLDENS["source"].startswith("vLLM 0.33.0 DPLBAsyncMPClient")
    names = {c["name"] for c in CASES}
    assert {"waiting_high_kv_penalty", "own_sends_between_stats", "in_flight_floor_survives_stats",
            "ties_rotate_after_reset"} <= names
    assert len(CASES) >= 30 and sum(len(c["chosen"]) for c in CASES) >= 500


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_router_matches_vllm(case: dict[str, Any]) -> None:
    assert kvsched_choices(case["dp_size"], case["events"]) == case["chosen"]
