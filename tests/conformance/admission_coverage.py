"""How much of a folder of 0.34 scenarios exercises vLLM 0.34's admission knobs
(docs/vllm_versions.md §3, §4), measured on kvsched's own replays (no oracle):

    python tests/conformance/admission_coverage.py FOLDER

For each scenario that sets the knob, kvsched replays it as given and with the knob
changed, and counts the scenarios whose trace the change alters:

- ``max_num_inflight_kv_loads``: routed (a request the connector may load
  asynchronously waits in async_kv_waiting), queue (the trace with an unreachable
  cap, 2**24, differs from the one without the knob: the queue merge and the loads
  started while the batch is full mattered), held (some step explains a request as
  held back by the cap), cap binds (the trace differs from the unreachable cap's);
- ``cache_aware_admission_window``: active (FCFS with prefix caching and a window),
  reorder (the trace differs with window 0).

A live comparison (compare_live_kv.py / compare_live.py --vllm-version 0.34 --keep
FOLDER) that finds every scenario identical to vLLM, together with these counts,
says how many of the identical scenarios went through the new paths.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kvsched.config import MAX_STEP_LIMIT
from kvsched.core import explain
from kvsched.core.output import SchedulerOutput
from kvsched.core.scheduler import Scheduler
from kvsched.errors import CannotServe
from kvsched.scenario import parse_scenario, replay

VERSION = "0.34"


def trace(obj: dict[str, Any], held: list[bool] | None = None) -> str:
    """kvsched's trace of the scenario ``obj`` (cut at max_steps if it gets
    there); ``held`` gets True if a step explains a request as held by the cap."""
    def on_step(step: int, output: SchedulerOutput, record: dict[str, Any], sched: Scheduler) -> None:
        reasons = {n.reason for n in output.not_admitted or ()}
        if held is not None and explain.REASON_KV_LOAD_CAP in reasons:
            held[0] = True

    out = io.StringIO()
    # A scenario vLLM never finishes stops at max_steps: its trace so far counts.
    with contextlib.suppress(CannotServe):
        replay(parse_scenario(obj, "coverage", VERSION), out, on_step=on_step if held is not None else None,
               explain=held is not None)
    return out.getvalue()


def with_knob(obj: dict[str, Any], key: str, value: object) -> dict[str, Any]:
    changed: dict[str, Any] = json.loads(json.dumps(obj))
    if value is None:
        changed["scheduler"].pop(key, None)
    else:
        changed["scheduler"][key] = value
    return changed


def may_load_async(r: dict[str, Any]) -> bool:
    value = r.get("load_async", False)
    return any(value) if isinstance(value, list) else bool(value)


def coverage(paths: list[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in paths:
        obj = json.loads(path.read_text())
        counts["scenarios"] += 1
        sc = obj.get("scheduler", {})
        if sc.get("max_num_inflight_kv_loads") is not None:
            counts["cap set"] += 1
            if any(may_load_async(r) for r in obj["requests"]):
                counts["cap: routed to async_kv_waiting"] += 1
            if sc.get("policy") == "priority":
                counts["cap: priority policy"] += 1
            held = [False]
            given = trace(obj, held)
            counts["cap: a load held back by the cap"] += held[0]
            unreachable = trace(with_knob(obj, "max_num_inflight_kv_loads", MAX_STEP_LIMIT))
            counts["cap: the cap binds (trace differs from an unreachable cap)"] += given != unreachable
            counts["cap: the queue matters (unreachable cap differs from none)"] += (
                unreachable != trace(with_knob(obj, "max_num_inflight_kv_loads", None)))
        window = sc.get("cache_aware_admission_window", 0)
        if window and sc.get("policy", "fcfs") == "fcfs" and obj["cache"].get("enable_prefix_caching"):
            counts["cache-aware active"] += 1
            counts["cache-aware: reordering changed the trace"] += (
                trace(obj) != trace(with_knob(obj, "cache_aware_admission_window", 0)))
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("folder", type=Path, help="a folder of 0.34 scenario files (*.json)")
    args = ap.parse_args(argv)
    paths = sorted(args.folder.glob("*.json"))
    for key, n in coverage(paths).items():
        print(f"{key}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
