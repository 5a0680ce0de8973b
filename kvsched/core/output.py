"""What the scheduler hands to the model runner, and what comes back.

The classes made every step are dataclasses with ``init=False`` and their
own ``__init__``: the compiled build (setup.py) turns a written ``__init__``
into C, but leaves the one ``dataclass`` generates as Python, which cost 7 %
of a simulation (py-spy, 100k random requests). Their fields and defaults are
the dataclass fields' (``repr`` and ``==`` are still generated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsched.request import SamplingParams


@dataclass(slots=True, init=False)
class NewRequestData:
    """A request the runner sees for the first time (its whole prompt).
    ``prompt_token_ids`` and ``block_ids`` are empty when the scheduler was
    built with ``runner_inputs=False``."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    # What the runner samples with (None: the defaults).
    sampling_params: SamplingParams | None

    def __init__(self, req_id: str, prompt_token_ids: list[int], block_ids: list[int],
                 num_computed_tokens: int, sampling_params: SamplingParams | None = None) -> None:
        self.req_id = req_id
        self.prompt_token_ids = prompt_token_ids
        self.block_ids = block_ids
        self.num_computed_tokens = num_computed_tokens
        self.sampling_params = sampling_params


@dataclass(slots=True, init=False)
class CachedRequestData:
    """Requests the runner already holds: running ones, then resumed ones.

    ``new_block_ids`` lists only requests that got blocks this step (for a
    resumed request: its whole block table). A resumed request recomputes its
    tokens from ``num_computed_tokens`` (its prefix-cache hit) on; the tokens
    are in ``resumed_token_ids``. With ``runner_inputs=False`` a resumed
    request has neither a ``new_block_ids`` nor a ``resumed_token_ids`` entry.
    """

    req_ids: list[str]
    resumed_req_ids: set[str]
    new_block_ids: dict[str, list[int]]
    num_computed_tokens: dict[str, int]
    resumed_token_ids: dict[str, list[int]]

    def __init__(self, req_ids: list[str] | None = None, resumed_req_ids: set[str] | None = None,
                 new_block_ids: dict[str, list[int]] | None = None,
                 num_computed_tokens: dict[str, int] | None = None,
                 resumed_token_ids: dict[str, list[int]] | None = None) -> None:
        self.req_ids = [] if req_ids is None else req_ids
        self.resumed_req_ids = set() if resumed_req_ids is None else resumed_req_ids
        self.new_block_ids = {} if new_block_ids is None else new_block_ids
        self.num_computed_tokens = {} if num_computed_tokens is None else num_computed_tokens
        self.resumed_token_ids = {} if resumed_token_ids is None else resumed_token_ids


@dataclass(slots=True)
class NotAdmitted:
    """Why a waiting request was not admitted in a step (``--explain``)."""

    request_id: str
    reason: str  # one of the REASON_* constants in kvsched.core.explain
    detail: str


@dataclass(slots=True, init=False)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # request id -> tokens this step, running requests first, then admitted ones.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: set[str]
    # Requests that finished since the previous schedule() (runner frees them).
    finished_req_ids: set[str]
    # Why admission stopped this step (a REASON_* of kvsched.core.explain),
    # or None if every waiting request was admitted.
    admission_stop: str | None
    # Filled only when the scheduler was built with explain_admission=True.
    not_admitted: list[NotAdmitted] | None
    # Running requests scheduled and then preempted later in the same step
    # (their tokens went back to the budget); None when there were none.
    unscheduled_req_ids: list[str] | None
    # Speculative decoding: request id -> the draft tokens scheduled for
    # verification this step (counted in num_scheduled_tokens). ``-1``
    # entries are placeholders: padding for a request admitted with one
    # token to compute, or (async scheduling) drafts the runner proposes
    # after the step before. Empty without speculative decoding.
    scheduled_spec_decode_tokens: dict[str, list[int]]
    # K: draft tokens the drafter proposes after this step.
    num_spec_tokens_to_schedule: int
    # Scheduled requests that are mid-way through their prefill after this
    # step and sample nothing (vLLM's is_prefill_chunk, as of this step: under
    # async scheduling the request's own flag moves on with the next step).
    prefill_chunk_req_ids: frozenset[str] | set[str]
    # KV connector: what its worker side gets with this batch
    # (build_connector_meta); None without a connector.
    kv_connector_metadata: Any
    # KV connector: the loads this schedule() started, {request id:
    # (external tokens, asynchronous)}; None without a connector.
    kv_loads: dict[str, tuple[int, bool]] | None
    # Multimodal: request id -> the indices of its mm items whose encoder
    # runs in this step, and the identifiers evicted from the encoder cache
    # since the last step (the workers drop those outputs). Empty for a
    # text-only model.
    scheduled_encoder_inputs: dict[str, list[int]]
    free_encoder_mm_hashes: list[str]

    def __init__(self, scheduled_new_reqs: list[NewRequestData],
                 scheduled_cached_reqs: CachedRequestData, num_scheduled_tokens: dict[str, int],
                 total_num_scheduled_tokens: int, preempted_req_ids: set[str],
                 finished_req_ids: set[str], admission_stop: str | None = None,
                 not_admitted: list[NotAdmitted] | None = None,
                 unscheduled_req_ids: list[str] | None = None,
                 scheduled_spec_decode_tokens: dict[str, list[int]] | None = None,
                 num_spec_tokens_to_schedule: int = 0,
                 prefill_chunk_req_ids: frozenset[str] | set[str] = frozenset()) -> None:
        self.scheduled_new_reqs = scheduled_new_reqs
        self.scheduled_cached_reqs = scheduled_cached_reqs
        self.num_scheduled_tokens = num_scheduled_tokens
        self.total_num_scheduled_tokens = total_num_scheduled_tokens
        self.preempted_req_ids = preempted_req_ids
        self.finished_req_ids = finished_req_ids
        self.admission_stop = admission_stop
        self.not_admitted = not_admitted
        self.unscheduled_req_ids = unscheduled_req_ids
        self.scheduled_spec_decode_tokens = ({} if scheduled_spec_decode_tokens is None
                                             else scheduled_spec_decode_tokens)
        self.num_spec_tokens_to_schedule = num_spec_tokens_to_schedule
        self.prefill_chunk_req_ids = prefill_chunk_req_ids
        self.kv_connector_metadata = None
        self.kv_loads = None
        self.scheduled_encoder_inputs = {}
        self.free_encoder_mm_hashes = []


@dataclass(slots=True)
class KVConnectorOutput:
    """What the worker-side connector reports with a batch's output (vLLM's
    KVConnectorOutput): requests whose blocks were sent or received, loads
    that failed as a whole (``failed_recving``) and blocks whose load failed
    (``invalid_block_ids``)."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    # A connector's own report, None when it has nothing to say (vLLM's
    # kv_connector_worker_meta: the offloading connector's completed jobs).
    # A field, not a subclass: this class is compiled (setup.py), and an
    # interpreted class cannot extend a compiled one.
    kv_connector_worker_meta: Any = None


@dataclass(slots=True, init=False)
class ModelRunnerOutput:
    """Sampled tokens, aligned with ``req_ids``; an empty list for a request
    that is still mid-way through a chunked prefill."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    # Per request, aligned with req_ids: a list with one {token id: Logprob}
    # per sampled token (accepted drafts, then the last), or None; the whole
    # list is None when no request asked for logprobs. (Typed loosely:
    # Logprob lives with the torch sampler.)
    logprobs: list[Any] | None
    # KV connector: the worker side's report for this batch, or None.
    kv_connector_output: KVConnectorOutput | None

    def __init__(self, req_ids: list[str], sampled_token_ids: list[list[int]],
                 logprobs: list[Any] | None = None,
                 kv_connector_output: KVConnectorOutput | None = None) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = sampled_token_ids
        self.logprobs = logprobs
        self.kv_connector_output = kv_connector_output


@dataclass(slots=True)
class DraftTokenIds:
    """Drafts the proposer made after a step, aligned with ``req_ids``
    (vLLM's ``DraftTokenIds``); an empty list for a request that sampled
    nothing. Handed to ``Scheduler.update_draft_token_ids``."""

    req_ids: list[str]
    draft_token_ids: list[list[int]]


@dataclass(slots=True)
class SpecDecodingStats:
    """vLLM's per-step speculative decoding counters (SpecDecodingStats):
    verifications, draft tokens verified, tokens accepted, and accepted
    tokens per draft position."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's verification: ``num_accepted_tokens`` of its
        ``num_draft_tokens`` drafts accepted (the first ones, in order)."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        for i in range(num_accepted_tokens):
            per_pos[i] += 1

    def merge(self, other: SpecDecodingStats) -> None:
        """Add ``other``'s counts (another step's, or another engine's)."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        per_pos = self.num_accepted_tokens_per_pos
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            per_pos[i] += n


@dataclass(slots=True, init=False)
class EngineCoreOutput:
    """New tokens of one request after a step, and its finish reason if done."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | None

    def __init__(self, request_id: str, new_token_ids: list[int], finish_reason: str | None = None,
                 stop_reason: int | None = None) -> None:
        self.request_id = request_id
        self.new_token_ids = new_token_ids
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason


@dataclass(slots=True, init=False)
class EngineCoreOutputs:
    """What ``update_from_output`` returns.

    Requests that keep running got exactly the runner's sampled tokens, so
    only finished requests are spelled out (building an object per running
    request every step would dominate the scheduler's cost); ``outputs()``
    builds the full per-request list when a caller wants it.
    """

    model_runner_output: ModelRunnerOutput
    finished: list[EngineCoreOutput]
    # Scheduled requests whose tokens were ignored: aborted before the update.
    dropped: list[str]
    # Speculative decoding's counters for this step (None without drafts).
    spec_decoding_stats: SpecDecodingStats | None

    def __init__(self, model_runner_output: ModelRunnerOutput, finished: list[EngineCoreOutput],
                 dropped: list[str], spec_decoding_stats: SpecDecodingStats | None = None) -> None:
        self.model_runner_output = model_runner_output
        self.finished = finished
        self.dropped = dropped
        self.spec_decoding_stats = spec_decoding_stats

    def outputs(self) -> list[EngineCoreOutput]:
        done = {o.request_id: o for o in self.finished}
        dropped = set(self.dropped)
        mro = self.model_runner_output
        out = []
        for rid, tokens in zip(mro.req_ids, mro.sampled_token_ids):
            if rid in done:
                out.append(done.pop(rid))
            elif tokens and rid not in dropped:
                out.append(EngineCoreOutput(rid, list(tokens)))
        out.extend(done.values())
        return out
