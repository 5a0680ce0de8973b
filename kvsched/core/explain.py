"""Why waiting requests were not admitted in a step.

vLLM's scheduler stops admitting at the first waiting request it cannot take
and says nothing about it; seed 003's user could not tell why 16 prompts that
fit the token budget were scheduled 2, 5 or 7 at a time. The scheduler records
the one reason admission stopped (cheap, on every step); this module turns it
into a line per waiting request, only when asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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

REASONS = (REASON_TOKEN_BUDGET, REASON_MAX_NUM_SEQS, REASON_KV_BLOCKS,
           REASON_CHUNKED_PREFILL_OFF, REASON_ADMISSION_POLICY, REASON_PREEMPTION,
           REASON_MAX_LORAS, REASON_OUTPUT_IN_FLIGHT)


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
