"""A scenario's timeline as every oracle driver reads it: the requests by id,
their arrival steps, the aborts by step, the last step with an event, and the
step limit (SCENARIO_FORMAT.md's defaults). Plain Python only: the drivers run
it inside the vLLM reference environments (0.33's and 0.34's), which have no
kvsched."""

from __future__ import annotations

from typing import Any, NamedTuple

# SCENARIO_FORMAT.md: a scenario without max_steps may run this many steps.
DEFAULT_MAX_STEPS = 1_000_000


class Timeline(NamedTuple):
    specs: dict[str, dict[str, Any]]
    arrivals: dict[int, list[dict[str, Any]]]
    aborts: dict[int, list[str]]
    last_event: int
    max_steps: int


def scenario_timeline(scenario: dict[str, Any]) -> Timeline:
    specs = {r["request_id"]: r for r in scenario["requests"]}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario["requests"]:
        arrivals.setdefault(int(r.get("arrival_step", 0)), []).append(r)
    aborts: dict[int, list[str]] = {}
    for a in scenario.get("aborts", []):
        aborts.setdefault(int(a["step"]), []).extend(a["request_ids"])
    return Timeline(specs, arrivals, aborts, max([*arrivals, *aborts, 0]),
                    int(scenario.get("max_steps", DEFAULT_MAX_STEPS)))
