"""Why waiting requests were not admitted in a step.

vLLM's scheduler stops admitting at the first waiting request it cannot take
and says nothing about it; seed 003's user could not tell why 16 prompts that
fit the token budget were scheduled 2, 5 or 7 at a time. The scheduler records
the one reason admission stopped (cheap, on every step); this module turns it
into a line per waiting request, only when asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvsched.core.output import NotAdmitted
from kvsched.request import Request

REASON_TOKEN_BUDGET = "token_budget"
REASON_MAX_NUM_SEQS = "max_num_seqs"
REASON_KV_BLOCKS = "kv_blocks"
REASON_CHUNKED_PREFILL_OFF = "chunked_prefill_off"
REASON_ADMISSION_POLICY = "admission_policy"
REASON_PREEMPTION = "preemption"
# Passed over (the scan goes on behind them): one more adapter than
# max_loras, or preempted while a step of theirs is still in flight.
REASON_MAX_LORAS = "max_loras"
REASON_OUTPUT_IN_FLIGHT = "output_in_flight"

# KV connector (passed over too): an asynchronous load in flight (vLLM's
# WAITING_FOR_REMOTE_KVS: the remote KV not yet received), a failed one that
# will be recomputed, and a lookup the connector answered "ask again" (None).
REASON_WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
REASON_KV_LOAD_FAILED = "kv_load_failed"
REASON_KV_LOOKUP_PENDING = "kv_lookup_pending"
# vLLM 0.34's --max-num-inflight-kv-loads: its asynchronous load would be one
# more than the cap allows (it waits at the head of its queue).
REASON_KV_LOAD_CAP = "max_num_inflight_kv_loads"
# Multimodal (passed over, the scan goes on): the first mm item its chunk
# reaches cannot be encoded this step, for lack of encoder budget or of
# encoder cache room, so nothing of it is scheduled; or, with
# disable_chunked_mm_input, the chunk would cover only part of an item.
REASON_ENCODER_BUDGET = "encoder_budget"
REASON_ENCODER_CACHE = "encoder_cache"
REASON_CHUNKED_MM_INPUT = "chunked_mm_input_off"

# A Mamba group in "align" mode: its chunk would end before the next block
# boundary the state must be written on (vLLM's block-aligned split gives 0).
REASON_MAMBA_ALIGNMENT = "mamba_block_alignment"

REASONS = (REASON_TOKEN_BUDGET, REASON_MAX_NUM_SEQS, REASON_KV_BLOCKS,
           REASON_CHUNKED_PREFILL_OFF, REASON_ADMISSION_POLICY, REASON_PREEMPTION,
           REASON_MAX_LORAS, REASON_OUTPUT_IN_FLIGHT, REASON_WAITING_FOR_REMOTE_KVS,
           REASON_KV_LOAD_FAILED, REASON_KV_LOOKUP_PENDING, REASON_KV_LOAD_CAP,
           REASON_ENCODER_BUDGET, REASON_ENCODER_CACHE, REASON_CHUNKED_MM_INPUT,
           REASON_MAMBA_ALIGNMENT)

# vLLM's livelocks with a KV connector (it spins for ever in them;
# SCENARIO_FORMAT.md's notes on 0.33.0; 0.34.0 keeps them, shown live and by
# goldens_0_34/probes/failed_load_reservation). Scheduler.livelock()
# recognises them.
LIVELOCK_WHOLE_ONE_TOKEN_LOAD = "whole_one_token_load"
LIVELOCK_FAILED_LOAD_SELF_RESERVED = "failed_load_self_reserved"
LIVELOCK_REMOTE_READ_NEVER_FITS = "remote_read_never_fits"

_LIVELOCK_TEXT = {
    LIVELOCK_WHOLE_ONE_TOKEN_LOAD: (
        "a one-token prompt loaded whole: once loaded it has no token left to compute, "
        "is reset to 0 computed tokens and asks the connector again, for ever"),
    LIVELOCK_FAILED_LOAD_SELF_RESERVED: (
        "an asynchronous load that failed under kv_load_failure_policy=recompute keeps its "
        "own reservation for in-flight prefills, so its new load needs its blocks twice; "
        "with nothing else to free blocks it is never readmitted"),
    LIVELOCK_REMOTE_READ_NEVER_FITS: (
        "an asynchronous remote read does not fit the free blocks (with the in-flight "
        "reservations and draft slots) and nothing running or loading will free any"),
}


@dataclass(frozen=True, slots=True)
class Livelock:
    """A state vLLM never leaves (it keeps stepping): which, who, and the
    release whose scheduler is in it."""

    kind: str  # a LIVELOCK_* constant
    request_ids: tuple[str, ...]
    vllm_version: str

    def message(self) -> str:
        return (f"vLLM {self.vllm_version} livelock ({self.kind}): {', '.join(self.request_ids)}: "
                f"{_LIVELOCK_TEXT[self.kind]}")


def explain_waiting(waiting: Iterable[Request], reason: str | None, detail: str,
                    head_id: str | None,
                    skipped: Mapping[str, tuple[str, str]] | None = None) -> list[NotAdmitted]:
    """One entry per request still waiting after the step, in queue order.

    A request passed over gets its own reason (``skipped``); the request
    admission stopped at gets the full detail; those behind it are held by
    the same reason (the queue is served in order).
    """
    out: list[NotAdmitted] = []
    for request in waiting:
        rid = request.request_id
        if skipped and rid in skipped:
            out.append(NotAdmitted(rid, *skipped[rid]))
        elif reason is None:
            continue
        elif head_id is None or rid == head_id:
            out.append(NotAdmitted(rid, reason, detail))
        else:
            out.append(NotAdmitted(rid, reason, f"queued behind {head_id}"))
    return out
