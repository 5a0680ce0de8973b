"""What the scheduler hands to the model runner, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class NewRequestData:
    """A request the runner sees for the first time (its whole prompt)."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds: running ones, then resumed ones.

    Lists are aligned with ``req_ids``. ``new_block_ids[i]`` is None when the
    request got no new block this step; for a resumed request it is its whole
    block table, and ``resumed_token_ids`` carries the tokens it must recompute.
    ``num_computed_tokens`` is the count before this step's tokens.
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    resumed_token_ids: dict[str, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class NotAdmitted:
    """Why a waiting request was not admitted in a step (``--explain``)."""

    request_id: str
    reason: str  # one of the REASON_* constants in kvsched.core.explain
    detail: str


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # request id -> tokens this step, running requests first, then admitted ones.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: set[str]
    # Requests that finished since the previous schedule() (runner frees them).
    finished_req_ids: set[str]
    # Filled only when the scheduler was built with explain=True.
    not_admitted: list[NotAdmitted] | None = None


@dataclass(slots=True)
class ModelRunnerOutput:
    """Sampled tokens, aligned with ``req_ids``; an empty list for a request
    that is still mid-way through a chunked prefill."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]


@dataclass(slots=True)
class RequestOutput:
    """New tokens of one request after a step, and its finish reason if done."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | None = None
