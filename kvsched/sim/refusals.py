"""Requests that fail, as ``vllm bench serve`` meets them: refused by the
server, or given up on by the client (``--request-timeout``).

vLLM's OpenAI front end answers HTTP 400 to a request whose prompt plus
``max_tokens`` exceeds ``max_model_len`` (the engine itself would cut the
output short instead); ``vllm bench serve`` sends ``max_tokens`` = the
request's output length, so such requests come back as errors and count as
failed. :func:`split_refused` applies that check before a workload reaches
the simulated engine; :func:`failure_reasons` groups refusals (these and the
engine's own, and client timeouts: :func:`timeout_error`) by reason for
the summary and the results' ``failed_reasons``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvsched.sim.workload import RandomRequests, Workload, WorkloadRequest

_TOO_LONG = "refused by the server: prompt + output > max_model_len={n}"
# The scheduler's own refusal (kvsched.core.scheduler.check_request).
_KV_TOO_SMALL = re.compile(r"needs up to \d+ KV blocks but the cache has (\d+)")
_REQUEST_PREFIX = re.compile(r"^request \S+: ")
# A request the client gave up on (kvsched.sim.client); the reason's key.
TIMEOUT = "timeout"


def timeout_error(timeout: float) -> str:
    """The error recorded for a request the client gave up on: no complete
    response ``timeout`` seconds after its send. vLLM's server aborts such a
    request when its client disconnects (if it has not finished it yet)."""
    return (f"{TIMEOUT}: no complete response within --request-timeout={timeout:g} s of the send; the "
            "client gave up and the server aborted the request")


def too_long_error(spec: WorkloadRequest, max_model_len: int) -> str:
    """The error ``vllm bench serve`` records for ``spec``, in kvsched's words."""
    total = spec.num_prompt_tokens + spec.output_len
    return (f"{_TOO_LONG.format(n=max_model_len)} (prompt {spec.num_prompt_tokens} + output "
            f"{spec.output_len} = {total} tokens)")


def split_refused(workload: Workload, max_model_len: int
                  ) -> tuple[Workload | None, list[tuple[str, str]]]:
    """(the requests the server accepts, or None if it accepts none;
    ``(request id, error)`` for each it refuses, in workload order)."""
    requests = workload.requests
    if isinstance(requests, RandomRequests) and requests.longest_total() <= max_model_len:
        return workload, []  # all fit: no need to build a million requests to check
    accepted: list[WorkloadRequest] = []
    refused: list[tuple[str, str]] = []
    for spec in requests:
        if spec.num_prompt_tokens + spec.output_len > max_model_len:
            refused.append((spec.request_id, too_long_error(spec, max_model_len)))
        else:
            accepted.append(spec)
    if not refused:
        return workload, []
    if not accepted:
        return None, refused
    return workload.with_requests(tuple(accepted)), refused


def failure_reason(error: str) -> str:
    """The reason part of a refusal message, without the request's own numbers."""
    if error.startswith(_TOO_LONG.split("{", 1)[0]):
        return error.split(" (prompt ", 1)[0]
    if error.startswith(f"{TIMEOUT}: "):
        return TIMEOUT
    m = _KV_TOO_SMALL.search(error)
    if m:
        return (f"refused by the engine: needs more KV blocks than the cache's {m.group(1)} "
                "(it could never run)")
    return _REQUEST_PREFIX.sub("", error)


def failure_reasons(failed: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Refusal counts by reason, most frequent first (ties: first seen first)."""
    counts: dict[str, int] = {}
    for _, error in failed:
        reason = failure_reason(error)
        counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def format_failures(failed: list[tuple[str, str]], total: int) -> list[str]:
    """Summary lines: how many failed, then one line per reason with its
    count and the first request it hit."""
    if not failed:
        return []
    first: dict[str, str] = {}
    for rid, error in failed:
        first.setdefault(failure_reason(error), rid)
    lines = [f"Failed requests: {len(failed)} of {total}, by reason:"]
    for reason, count in failure_reasons(failed).items():
        lines.append(f"  {count:>6}  {reason} (first: {first[reason]})")
    return lines
