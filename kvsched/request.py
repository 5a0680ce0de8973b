"""A request as the scheduler sees it: tokens, sampling limits, progress, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after PREEMPTED is a finished one."""

    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


# OpenAI-style finish reasons, as vLLM reports them.
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """The sampling limits the scheduler enforces (vLLM's names and defaults)."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(slots=True, eq=False)
class Request:
    """One generation request. ``all_token_ids`` is the prompt plus the outputs
    sampled so far; ``num_computed_tokens`` is how much of it has KV in the cache
    (or is scheduled to, within the current step)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0
    arrival_time: float = 0.0

    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    all_token_ids: list[int] = field(init=False)
    output_token_ids: list[int] = field(init=False, default_factory=list)
    num_prompt_tokens: int = field(init=False)
    # Chained hashes of the full blocks of all_token_ids, filled lazily by the
    # KV cache manager (only when prefix caching is on).
    block_hashes: list[int] = field(init=False, default_factory=list)
    num_preemptions: int = field(default=0, init=False)
    # True while the request is mid-way through a chunked prefill: the step
    # that scheduled it samples no token.
    is_prefill_chunk: bool = field(default=False, init=False)
    stop_reason: int | None = field(default=None, init=False)
    # Sampling limits flattened for the hot path.
    max_tokens: int = field(init=False)
    eos_token_id: int | None = field(init=False)
    stop_token_ids: frozenset[int] = field(init=False)
    # EOS (unless ignored) and stop ids together: one membership test per token.
    all_stop_ids: frozenset[int] = field(init=False)
    # Sequence length at which the request is length-capped: prompt + max_tokens,
    # or max_model_len (set by the scheduler, which knows it).
    stop_len: int = field(init=False)

    def __post_init__(self) -> None:
        # Like vLLM: the prompt list is kept as given (not copied); the
        # growing sequence is a copy of it.
        if not isinstance(self.prompt_token_ids, list):
            self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids = self.prompt_token_ids.copy()
        self.num_prompt_tokens = len(self.prompt_token_ids)
        sp = self.sampling_params
        self.max_tokens = sp.max_tokens
        # vLLM drops the EOS id when ignore_eos is set; stop ids still apply.
        self.eos_token_id = None if sp.ignore_eos else sp.eos_token_id
        self.stop_token_ids = frozenset(sp.stop_token_ids)
        eos = () if self.eos_token_id is None else (self.eos_token_id,)
        self.all_stop_ids = self.stop_token_ids.union(eos)
        self.stop_len = self.num_prompt_tokens + sp.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def validate(self, max_model_len: int) -> None:
        """Raise ValueError for a request vLLM's front end would reject."""
        rid = self.request_id
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"request_id={rid!r}: must be a non-empty string; give it a unique name")
        if self.num_prompt_tokens == 0:
            raise ValueError(f"request {rid}: prompt_token_ids is empty; give at least one token")
        if self.num_prompt_tokens >= max_model_len:
            raise ValueError(
                f"request {rid}: prompt length {self.num_prompt_tokens} must be below "
                f"max_model_len ({max_model_len}) to leave room for one output token; "
                "shorten the prompt or raise max_model_len")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"request {rid}: priority={self.priority!r} must be an integer")
        if isinstance(self.arrival_time, bool) or not isinstance(self.arrival_time, (int, float)):
            raise ValueError(f"request {rid}: arrival_time={self.arrival_time!r} must be a number")
        sp = self.sampling_params
        if isinstance(sp.max_tokens, bool) or not isinstance(sp.max_tokens, int) or sp.max_tokens < 1:
            raise ValueError(f"request {rid}: max_tokens={sp.max_tokens!r} must be an integer >= 1")
        if not isinstance(sp.min_tokens, int) or sp.min_tokens < 0:
            raise ValueError(f"request {rid}: min_tokens={sp.min_tokens!r} must be an integer >= 0")
        if sp.min_tokens > sp.max_tokens:
            raise ValueError(
                f"request {rid}: min_tokens={sp.min_tokens} exceeds max_tokens={sp.max_tokens}; "
                "lower min_tokens or raise max_tokens")
