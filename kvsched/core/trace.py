"""One trace record per step, in the format of the vLLM reference oracle
(../shared/reference/SCENARIO_FORMAT.md), so traces diff field by field."""

from __future__ import annotations

from typing import Any

from kvsched.core.hybrid_kv_cache import HybridKVCacheManager
from kvsched.core.output import SchedulerOutput
from kvsched.core.scheduler import Scheduler

TRACE_FIELDS = ("scheduled", "new", "resumed", "preempted", "computed_at_admission",
                "finished", "num_free_blocks", "num_running", "num_waiting")
# Written only with speculative decoding / async scheduling; compared
# whenever either trace has them.
OPTIONAL_FIELDS = ("spec", "processed")
# Written only with a KV connector; compared whenever either trace has them
# (the id lists as sets).
KV_CONNECTOR_FIELDS = ("waiting_for_remote_kvs", "kv_load", "finished_recving", "finished_sending",
                       "load_failed", "delayed_free")
# Written only with hybrid KV cache groups (cache.kv_groups): per running
# request, in running order, per group [table length, real blocks] (the
# rest of its table is vLLM's null block), compared whenever either trace has it.
HYBRID_FIELDS = ("group_blocks",)
# Written only for a multimodal scenario; compared whenever either trace has them.
ENCODER_FIELDS = ("encoder_inputs", "freed_mm_hashes", "encoder_free_slots", "encoder_freeable_slots")
_ID_SETS = ("resumed", "preempted", "waiting_for_remote_kvs", "finished_recving",
            "finished_sending", "load_failed", "delayed_free")


def step_record(step: int, output: SchedulerOutput, finished: list[list[str]],
                scheduler: Scheduler) -> dict[str, Any]:
    """``finished`` lists [request_id, reason] for requests that ended this step
    (aborts before schedule() and stops in update_from_output)."""
    admitted = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    admitted.update(cached.num_computed_tokens)
    record = {
        "step": step,
        "scheduled": [[rid, n] for rid, n in output.num_scheduled_tokens.items()],
        "new": [n.req_id for n in output.scheduled_new_reqs],
        "resumed": sorted(cached.resumed_req_ids),
        "preempted": sorted(output.preempted_req_ids),
        "computed_at_admission": admitted,
        "finished": finished,
        "num_free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        "num_running": len(scheduler.running),
        # vLLM's get_request_counts(): waiting requests holding KV blocks, and
        # (0.34) those in async_kv_waiting, too.
        "num_waiting": scheduler.get_request_counts()[1],
    }
    if scheduler.cache_config.kv_groups:
        record["group_blocks"] = group_blocks(scheduler)
    return record


def group_blocks(scheduler: Scheduler) -> dict[str, list[list[int]]]:
    """The trace's per-group view: each running request's [table length,
    real blocks] per KV cache group."""
    kv = scheduler.kv_cache_manager
    if isinstance(kv, HybridKVCacheManager):
        return {r.request_id: kv.group_block_counts(r.request_id) for r in scheduler.running}
    out: dict[str, list[list[int]]] = {}
    for r in scheduler.running:
        n = len(kv.req_to_blocks.get(r.request_id, ()))
        out[r.request_id] = [[n, n]]
    return out


def first_difference(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> str | None:
    """The first step and field where two traces differ, or None if identical.
    ``finished``, ``resumed`` and ``preempted`` compare as sets."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        names = TRACE_FIELDS + tuple(n for n in OPTIONAL_FIELDS + KV_CONNECTOR_FIELDS + ENCODER_FIELDS
                                     + HYBRID_FIELDS
                                     if n in e or n in a)
        for name in names:
            ev, av = _normalise(name, e.get(name)), _normalise(name, a.get(name))
            if ev != av:
                return (f"step {e.get('step', i)}: {name} differs\n"
                        f"  expected: {ev}\n  actual:   {av}")
    if len(expected) != len(actual):
        return f"step count differs: expected {len(expected)}, actual {len(actual)}"
    return None


def _normalise(name: str, value: Any) -> Any:
    if name == "finished":
        return sorted(map(tuple, value or ()))
    if name in _ID_SETS:
        return sorted(value or ())
    return value
