"""What the offline API returns, shaped like vLLM's ``RequestOutput``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (kvsched generates one per request: ``n`` = 1)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    # Per generated token: {token id: Logprob}, when SamplingParams.logprobs is set.
    logprobs: list[dict[int, Any]] | None
    finish_reason: str | None = None  # "stop", "length" or "abort"
    # The stop string or stop token id that ended the sequence, if any.
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (``time.time()`` seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # Prompt tokens whose KV came from the prefix cache at first admission.
    num_cached_tokens: int = 0
    prompt_logprobs: None = field(default=None)
