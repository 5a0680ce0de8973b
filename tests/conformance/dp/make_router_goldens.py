"""Golden engine choices of vLLM 0.33.0's DP load balancer, from its own code.

vLLM's front end picks an engine for each request in
``DPLBAsyncMPClient.get_core_engine_for_request`` (vllm/v1/engine/core_client.py)
and lowers its in-flight counts in ``DPLBAsyncMPClient.process_engine_outputs``.
Both only read and write plain attributes of the client, so this script calls
them, unbound, on a minimal stand-in object (no engines, no ZMQ, no GPU) and
replays scripted events:

- ``{"stats": [[waiting, running, kv_cache_usage], ...]}``: a stats message
  from the coordinator (it replaces the client's ``lb_engines``);
- ``{"route": ID}``: a request; vLLM's chosen engine index is recorded;
- ``{"finish": [ID, ...]}``: outputs saying these requests finished.

One API server (``client_count`` 1, ``client_index`` 0), as kvsched models.
Run it with the reference Python (``bash ../shared/reference/setup.sh``):

    ~/.cache/kvsched-reference/venv/bin/python tests/conformance/dp/make_router_goldens.py

It rewrites router_goldens.json next to it; the cases are deterministic
(hand-written ones, then seeded random ones), so rerunning changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import vllm
from vllm.v1.engine.core_client import DPLBAsyncMPClient

HERE = Path(__file__).parent
OUT = HERE / "router_goldens.json"

Event = dict[str, Any]


def _client(dp_size: int) -> SimpleNamespace:
    """The attributes the two methods use, as DPLBAsyncMPClient.__init__ and
    DPAsyncMPClient.__init__ set them for client 0 of 1."""
    return SimpleNamespace(
        client_count=1,
        reqs_in_flight={},
        streaming_reqs=set(),
        engine_inflight=Counter(),
        core_engines=[rank.to_bytes(2, "little") for rank in range(dp_size)],
        lb_engines=[[0, 0, 0.0] for _ in range(dp_size)],
        eng_start_index=0,
    )


def replay(dp_size: int, events: list[Event]) -> list[int]:
    client = _client(dp_size)
    chosen: list[int] = []
    for event in events:
        if "stats" in event:
            client.lb_engines = [list(s) for s in event["stats"]]
        elif "route" in event:
            request = SimpleNamespace(request_id=event["route"], resumable=False,
                                      data_parallel_rank=None, pooling_params=None)
            engine = DPLBAsyncMPClient.get_core_engine_for_request(client, request)  # type: ignore[arg-type]
            chosen.append(client.core_engines.index(engine))
        else:
            outputs = SimpleNamespace(finished_requests=set(event["finish"]))
            asyncio.run(DPLBAsyncMPClient.process_engine_outputs(client, outputs))  # type: ignore[arg-type]
    return chosen


def _routes(prefix: str, n: int) -> list[Event]:
    return [{"route": f"{prefix}{i}"} for i in range(n)]


def hand_cases() -> list[tuple[str, int, list[Event]]]:
    return [
        # Nothing known yet: equal scores, the rotating scan start spreads them.
        ("empty_engines_rotate", 3, _routes("r", 7)),
        # Low KV usage: no waiting penalty, waiting counts like running.
        ("waiting_low_kv_no_penalty", 2,
         [{"stats": [[2, 0, 0.3], [0, 3, 0.3]]}, {"route": "a"}]),
        # High KV usage: 2 waiting at 90% weigh 2 + 2*6*0.4 = 6.8 > 3 running.
        ("waiting_high_kv_penalty", 2,
         [{"stats": [[2, 0, 0.9], [0, 3, 0.9]]}, {"route": "a"}]),
        # At exactly 50% the penalty is still zero.
        ("waiting_half_kv_boundary", 2,
         [{"stats": [[3, 0, 0.5], [0, 4, 0.5]]}, {"route": "a"}]),
        # Between stats messages each routed request counts as one more
        # waiting on its engine; a new message replaces those counts.
        ("own_sends_between_stats", 2,
         [{"stats": [[0, 3, 0.0], [0, 0, 0.0]]}, *_routes("a", 5),
          {"stats": [[0, 3, 0.0], [0, 1, 0.0]]}, *_routes("b", 3)]),
        # The in-flight floor: a snapshot that shows an engine empty does not
        # erase the requests this front end has there and that have not finished.
        ("in_flight_floor_survives_stats", 2,
         [*_routes("a", 4), {"stats": [[0, 0, 0.0], [0, 0, 0.0]]}, *_routes("b", 2)]),
        # Finished requests leave the in-flight count.
        ("finishes_lower_in_flight", 3,
         [*_routes("a", 6), {"stats": [[0, 0, 0.0]] * 3}, {"finish": ["a0", "a3"]},
          *_routes("b", 3)]),
        # Ties after a stats reset rotate rather than favour engine 0.
        ("ties_rotate_after_reset", 4,
         [*_routes("a", 2), {"finish": ["a0", "a1"]}, {"stats": [[0, 0, 0.0]] * 4},
          *_routes("b", 6)]),
        # A clear minimum wins whatever the scan start.
        ("clear_minimum_any_start", 3,
         [*_routes("a", 2), {"stats": [[0, 5, 0.0], [0, 5, 0.0], [0, 1, 0.0]]},
          {"finish": ["a0", "a1"]}, *_routes("b", 3)]),
    ]


def random_case(seed: int) -> tuple[str, int, list[Event]]:
    rng = random.Random(seed)
    dp_size = rng.randint(2, 5)
    events: list[Event] = []
    live: list[str] = []
    n = 0
    for _ in range(rng.randint(20, 40)):
        roll = rng.random()
        if roll < 0.2:
            events.append({"stats": [[rng.randint(0, 6), rng.randint(0, 10),
                                      rng.choice([0.0, 0.25, 0.5, 0.625, 0.75, 0.875, 1.0])]
                                     for _ in range(dp_size)]})
        elif roll < 0.3 and live:
            done = rng.sample(live, rng.randint(1, min(3, len(live))))
            live = [rid for rid in live if rid not in done]
            events.append({"finish": done})
        else:
            rid = f"s{seed}-{n}"
            n += 1
            live.append(rid)
            events.append({"route": rid})
    return f"random_{seed}", dp_size, events


def main() -> int:
    cases = hand_cases() + [random_case(seed) for seed in range(24)]
    out = {
        "source": f"vLLM {vllm.__version__} DPLBAsyncMPClient.get_core_engine_for_request "
                  "and process_engine_outputs, client_count 1, client_index 0",
        "cases": [{"name": name, "dp_size": dp, "events": events, "chosen": replay(dp, events)}
                  for name, dp, events in cases],
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    routed = sum(len(c["chosen"]) for c in out["cases"])
    print(f"{OUT.name}: {len(cases)} cases, {routed} routed requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
