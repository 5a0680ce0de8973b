"""The scheduler: each step, which requests get how many tokens.

Decisions match vLLM 0.33.0's synchronous v1 scheduler. A step is three phases:

1. ``_schedule_running``: running requests in order, each capped by
   ``long_prefill_token_threshold``, the remaining token budget and
   ``max_model_len``; when KV blocks run out, preempt (FCFS: the last running
   request; priority: the max of (priority, arrival_time)) and retry.
2. ``_schedule_waiting``: unless phase 1 preempted, admit waiting requests in
   queue order (prefix-cache hit first) until the budget, ``max_num_seqs``,
   the KV cache, chunked prefill being off, or the admission policy stops it.
3. ``_make_output``: the ``SchedulerOutput`` for the runner.

``update_from_output`` then appends sampled tokens and applies the stop checks
in vLLM's order (EOS unless ignore_eos, stop token ids, max_tokens or
max_model_len).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain, islice

from kvsched.config import (
    CacheConfig,
    LoRAConfig,
    SchedulerConfig,
    SpeculativeConfig,
    batch_queue_size,
    check_speculative_settings,
)
from kvsched.core import explain
from kvsched.core.encoder_cache_manager import EncoderCacheManager, compute_mm_encoder_budget
from kvsched.core.hybrid_kv_cache import (
    HybridKVCacheManager,
    is_hybrid,
    make_kv_cache_manager,
    mamba_block_aligned_split,
    mamba_checkpoint_alignment,
    needs_mamba_block_aligned_split,
)
from kvsched.core.kv_connector import KVConnectorBase, KVConnectorOutput
from kvsched.core.output import (
    CachedRequestData,
    DraftTokenIds,
    EngineCoreOutput,
    EngineCoreOutputs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    SpecDecodingStats,
)
from kvsched.core.policies import AdmissionPolicy
from kvsched.core.request_queue import FCFSRequestQueue, RequestQueue, create_request_queue, priority_order
from kvsched.errors import UserInputError
from kvsched.request import (
    FINISH_REASONS,
    NO_DRAFTS,
    TOKEN_ID_LIMIT,
    MultiModalFeature,
    Request,
    RequestStatus,
    check_token_ids,
)
from kvsched.vllm_versions import rules_for

RUNNING = RequestStatus.RUNNING
WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
# "Allocated nothing" (read only).
_NO_NEW_BLOCKS: list[int] = []
PREEMPTED = RequestStatus.PREEMPTED
WAITING = RequestStatus.WAITING
STOPPED = RequestStatus.FINISHED_STOPPED
LENGTH_CAPPED = RequestStatus.FINISHED_LENGTH_CAPPED
# Admission stops that cannot lift while the running requests only decode
# (see kvsched.core.fast_forward).
_STABLE_STOPS = frozenset({None, explain.REASON_MAX_NUM_SEQS, explain.REASON_KV_BLOCKS,
                           explain.REASON_TOKEN_BUDGET, explain.REASON_CHUNKED_PREFILL_OFF})


def _check_token_list(what: str, tokens: object, limit: int) -> None:
    """Raise unless ``tokens`` is a list of int token ids below ``limit``
    (the common case checked inline, the error worded by check_token_ids)."""
    if type(tokens) is not list:
        raise TypeError(f"{what} must be a list of token ids, got {type(tokens).__name__}")
    for token in tokens:
        if type(token) is not int or not 0 <= token < limit:
            check_token_ids(what, tokens, limit)


def _bad_tokens(tokens: list[int], limit: int) -> bool:
    try:
        check_token_ids("", tokens, limit)
    except ValueError:
        return True
    return False


@dataclass(slots=True)
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int


@dataclass(slots=True, init=False)
class _Step:
    """Working state of one schedule() call (its own ``__init__``: see
    kvsched.core.output's module doc)."""

    token_budget: int
    num_scheduled_tokens: dict[str, int]
    running_req_ids: list[str]
    new_reqs: list[Request]
    resumed_reqs: list[Request]
    new_block_ids: dict[str, list[int]]
    preempted: list[Request]
    computed_at_admission: dict[str, int]
    # Why admission stopped (a REASON_* of kvsched.core.explain; named apart
    # from Request.stop_reason, the stop token of a finished request), the
    # request it stopped at (or None), and the detail.
    admission_stop: str | None
    admission_stop_at: str | None
    admission_stop_detail: str
    # Running requests scheduled, then preempted later in the step (rare).
    unscheduled: list[str] | None
    # Speculative decoding: the drafts scheduled per request.
    spec: dict[str, list[int]]
    # Scheduled requests left mid-prefill (they sample nothing).
    prefill_chunks: list[str]
    # A running request scheduled this step was mid-prefill when scheduled
    # (vLLM's prefill_scheduled: no padded admissions then).
    prefill_scheduled: bool
    # Waiting requests passed over this step (LoRA cap, output in flight),
    # with why: they keep their place in the queue.
    skipped: list[Request] | None
    skip_reasons: dict[str, tuple[str, str]] | None
    # KV connector: the loads this step started, {id: (tokens, asynchronous)},
    # and whether its waiting scan passed over a request (its lookup said
    # "ask again", or it waits for a load).
    kv_loads: dict[str, tuple[int, bool]] | None
    kv_skipped: bool
    # Why async_kv_waiting's head stayed there while the scan went on (vLLM
    # 0.34's in-flight KV load cap, or no blocks for a load started with
    # the batch full): (reason, request id, detail), else None.
    async_stop: tuple[str, str, str] | None
    # Multimodal: encoder embeddings this step may still encode (vLLM's
    # encoder_compute_budget), and the mm items scheduled for encoding per
    # request (None until one is).
    encoder_budget: int
    encoder_inputs: dict[str, list[int]] | None

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.num_scheduled_tokens = {}
        self.running_req_ids = []
        self.new_reqs = []
        self.resumed_reqs = []
        self.new_block_ids = {}
        self.preempted = []
        self.computed_at_admission = {}
        self.admission_stop = None
        self.admission_stop_at = None
        self.admission_stop_detail = ""
        self.unscheduled = None
        self.spec = {}
        self.prefill_chunks = []
        self.prefill_scheduled = False
        self.skipped = None
        self.skip_reasons = None
        self.kv_loads = None
        self.kv_skipped = False
        self.async_stop = None
        self.encoder_budget = 0
        self.encoder_inputs = None



@dataclass(slots=True, init=False)
class _EncoderPlan:
    """What _try_schedule_encoder_inputs decided for one request: the mm
    items to encode (indices), duplicates of them in the same request, the
    tokens left to schedule, the encoder budget after it, and the item that
    cut the chunk short with why (None: none did)."""

    inputs: list[int]
    duplicates: list[int]
    num_new_tokens: int
    encoder_budget: int
    cut: tuple[str, MultiModalFeature] | None

    def __init__(self, num_new_tokens: int, encoder_budget: int) -> None:
        self.inputs = []
        self.duplicates = []
        self.num_new_tokens = num_new_tokens
        self.encoder_budget = encoder_budget
        self.cut = None


def _entries_in_order(num_scheduled: dict[str, int],
                      model_runner_output: ModelRunnerOutput) -> list[list[int]]:
    """The runner's sampled entries in the order the batch was scheduled
    (the runner may list its requests in another order)."""
    req_ids = model_runner_output.req_ids
    sampled = model_runner_output.sampled_token_ids
    if req_ids == list(num_scheduled):
        return sampled
    index = {rid: i for i, rid in enumerate(req_ids)}
    return [sampled[index[rid]] for rid in num_scheduled]


def _mid_prefill_error(rid: str, entry: object) -> UserInputError:
    return UserInputError(f"model_runner_output: {rid} was mid-way through its prefill in this step "
                          f"and samples no token, got {entry!r:.80}; pass []")

class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 admission_policy: AdmissionPolicy | None = None,
                 explain_admission: bool = False, runner_inputs: bool = True,
                 vocab_size: int | None = None,
                 speculative_config: SpeculativeConfig | None = None,
                 lora_config: LoRAConfig | None = None,
                 kv_connector: KVConnectorBase | None = None,
                 mm_max_tokens_per_item: Mapping[str, int] | None = None) -> None:
        """``runner_inputs``: put in each SchedulerOutput what a model runner
        needs to run the step - new requests' prompts and block tables,
        resumed requests' block tables and tokens. A simulator runs no model
        and passes False: those lists are then empty (copying them is per
        token and per block work), everything else is as usual.
        ``vocab_size``: the model's vocabulary; prompt and sampled token ids
        must lie below it (without it, below ``TOKEN_ID_LIMIT``).
        ``speculative_config``: speculative decoding (drafts scheduled for
        verification, rejected ones rolled back); ``lora_config``: the cap on
        distinct LoRA adapters among running requests. Async scheduling is
        ``scheduler_config.async_scheduling``. ``kv_connector``: a KV
        connector's scheduler side (kvsched.core.kv_connector); its work runs
        inside the usual phases, and without one they run as before.
        ``mm_max_tokens_per_item``: a multimodal model's largest item per
        modality, in tokens; requests may then carry mm items, and the
        scheduler keeps vLLM's encoder budget and encoder cache (sized by
        compute_mm_encoder_budget). None: a text-only model."""
        if vocab_size is not None and (type(vocab_size) is not int or not 0 < vocab_size <= TOKEN_ID_LIMIT):
            raise UserInputError(f"vocab_size={vocab_size!r}: must be an int in [1, {TOKEN_ID_LIMIT}] "
                             "(the model's vocabulary size), or None")
        if speculative_config is not None and not isinstance(speculative_config, SpeculativeConfig):
            raise TypeError(f"speculative_config={speculative_config!r:.80}: must be a kvsched "
                            "SpeculativeConfig or None")
        if lora_config is not None and not isinstance(lora_config, LoRAConfig):
            raise TypeError(f"lora_config={lora_config!r:.80}: must be a kvsched LoRAConfig or None")
        if kv_connector is not None and not isinstance(kv_connector, KVConnectorBase):
            raise TypeError(f"kv_connector={kv_connector!r:.80}: must be a kvsched KVConnectorBase "
                            "(kvsched.core.kv_connector) or None")
        check_speculative_settings(scheduler_config, speculative_config)
        num_spec = speculative_config.num_speculative_tokens if speculative_config else 0
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.speculative_config = speculative_config
        # The long-prefill threshold as this release applies it (0: never).
        self._long_prefill_threshold = scheduler_config.long_prefill_token_threshold
        if (rules_for(scheduler_config.vllm_version).long_prefill_threshold_needs_chunked_prefill
                and not scheduler_config.enable_chunked_prefill):
            self._long_prefill_threshold = 0
        # K: drafts per step; the drafter's own KV slots past the scheduled tokens.
        self.num_spec_tokens = num_spec
        self.num_lookahead_tokens = speculative_config.num_lookahead_tokens if speculative_config else 0
        self.async_scheduling = scheduler_config.async_scheduling
        self.pipeline_parallel_size = scheduler_config.pipeline_parallel_size
        self.max_steps_in_flight = batch_queue_size(self.async_scheduling, self.pipeline_parallel_size)
        # Batches overlap (async scheduling or PP; vLLM's max_concurrent_batches
        # > 1): tokens in flight are counted and a preempted request's
        # output still arrives ("stale").
        self._overlap = self.max_steps_in_flight > 1
        # Async with PP (vLLM's V2 runner): a request that samples waits PP
        # steps before its next decode (vLLM's decode stagger); 0 otherwise.
        self._decode_stagger = self.pipeline_parallel_size if (
            self.async_scheduling and self.pipeline_parallel_size > 1) else 0
        # schedule() calls so far (vLLM's current_step; only the stagger reads
        # it, and fast-forward, which PP never takes, does not count its steps).
        self.current_step = 0
        self.lora_config = lora_config
        self.max_loras = lora_config.max_loras if lora_config is not None else 0
        # Neither drafts nor placeholders: the running phase and the output
        # update take their fast paths (the general ones give the same
        # result; tests/core/test_spec_async.py checks it).
        self._plain = not num_spec and not self._overlap
        # Async without drafts: the running phase's fast path (placeholders
        # counted); the general path gives the same result
        # (tests/core/test_spec_async.py checks it).
        self._fast_running = not num_spec and not self._decode_stagger
        # The drafts a request waits for under async scheduling: K -1s
        # (vLLM's _spec_token_placeholders). Shared, never mutated.
        self._spec_placeholders: list[int] = [-1] * num_spec
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.block_size = cache_config.block_size
        # Several KV cache groups (cache.kv_groups): vLLM's coordinator over
        # one pool, with allocate_slots called for every scheduled request.
        self.hybrid_kv_cache = is_hybrid(cache_config)
        # vLLM's need_mamba_block_aligned_split (a Mamba group, prefix caching on).
        self._mamba_split = needs_mamba_block_aligned_split(cache_config)
        # What lets a final prefill chunk run past the last cacheable
        # boundary (the backend exports that state); None: never.
        self._mamba_checkpoint_alignment = mamba_checkpoint_alignment(cache_config)
        # vLLM also publishes a synchronous Mamba request's finalized states
        # after each output (the general update path does it).
        self._cache_after_output = self._mamba_split and not self.async_scheduling
        if self.hybrid_kv_cache:
            self._refuse_with_kv_groups(speculative_config, kv_connector)
            self._fast_running = False
            if self._cache_after_output:
                self._plain = False
        # vLLM's max_in_flight_tokens: one token budget per batch in flight
        # (the sliding-window admission cap counts them).
        self.kv_cache_manager = make_kv_cache_manager(
            cache_config, self.max_model_len, self.max_steps_in_flight * self.max_num_scheduled_tokens)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        # vLLM 0.34's cache-aware admission: it reorders by position, which
        # only an FCFS queue has, by prefix-cache hits, which need a prefix
        # cache; 0 (off) otherwise. The window and the KV usage it starts at.
        self._cache_aware_window = (
            scheduler_config.cache_aware_admission_window
            if scheduler_config.policy == "fcfs" and cache_config.enable_prefix_caching else 0)
        self._cache_aware_threshold = scheduler_config.cache_aware_admission_threshold
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.admission_policy = admission_policy
        # Optional policy methods (kvsched.core.policies), looked up once.
        self._begin_step = getattr(admission_policy, "begin_step", None)
        self._defer_prefill_chunks = getattr(admission_policy, "defer_prefill_chunks", None)
        self._end_step = getattr(admission_policy, "end_step", None)
        # True fills SchedulerOutput.not_admitted every step (``--explain``).
        self.explain_admission = explain_admission
        self.runner_inputs = runner_inputs
        self.token_limit = TOKEN_ID_LIMIT if vocab_size is None else vocab_size
        # Outputs of schedule() calls that scheduled something, oldest first,
        # until update_from_output() applies them: vLLM's synchronous engine
        # runs one step at a time, its async engine keeps its batch queue
        # full; each output is applied exactly once, in order.
        self._in_flight: deque[SchedulerOutput] = deque()
        self._priority = scheduler_config.policy == "priority"
        # True while the admission outcome is known to repeat as long as the
        # running requests only decode: set by schedule(), cleared by anything
        # that changes the queues. A fact fast-forward's rule reads
        # (kvsched.core.fast_forward.stretch_refusal), not the rule itself.
        self.decode_stable = False
        self._init_encoder(mm_max_tokens_per_item)
        self._init_connector(kv_connector)

    def _refuse_with_kv_groups(self, speculative_config: SpeculativeConfig | None,
                               kv_connector: KVConnectorBase | None) -> None:
        """What kvsched does not model with hybrid KV cache groups yet: refused
        by name rather than approximated."""
        what = None
        if speculative_config is not None and (
                speculative_config.num_lookahead_tokens
                or any(g.kind == "mamba" for g in self.cache_config.kv_groups)):
            what = ("speculative decoding with a drafter (EAGLE's block drop, lookahead slots) or "
                    "beside a mamba group (its speculative state blocks)")
        elif kv_connector is not None:
            what = "a KV connector (per-group loads and deferred frees)"
        elif self.pipeline_parallel_size > 1:
            what = "pipeline parallelism (checked with one group only)"
        if what is not None:
            raise UserInputError(f"cache.kv_groups: {what} is not modelled with hybrid KV cache "
                                 "groups yet; drop one or the other")

    def _init_encoder(self, mm_max_tokens_per_item: Mapping[str, int] | None) -> None:
        """A multimodal model's encoder budget and cache (vLLM's
        MultiModalBudget). Its requests take the general paths: the fast
        ones know nothing of encoder inputs."""
        self.encoder_cache_manager: EncoderCacheManager | None = None
        self.max_num_encoder_input_tokens = 0
        # Identifier -> [embeddings, live requests carrying it]: one
        # identifier must name an item of one size while anything can share
        # it (a live request, or the encoder cache's entry). Entries leave
        # with their last request, so the map grows with what is in flight.
        self._mm_num_embeds: dict[str, list[int]] = {}
        self._mm_cut_inside_item = False
        self._mm_cut_refused_unchunked = False
        if mm_max_tokens_per_item is None:
            return
        if not isinstance(mm_max_tokens_per_item, Mapping) or any(
                not isinstance(k, str) or type(v) is not int or v < 1
                for k, v in mm_max_tokens_per_item.items()):
            raise UserInputError(f"mm_max_tokens_per_item={mm_max_tokens_per_item!r:.80}: must map each "
                                 "modality (str) to its largest item in tokens (an int >= 1)")
        config = self.scheduler_config
        budget, cache_size = compute_mm_encoder_budget(
            *config.encoder_limits(), config.max_num_batched_tokens, config.disable_chunked_mm_input,
            mm_max_tokens_per_item)
        self.max_num_encoder_input_tokens = budget
        self.encoder_cache_manager = EncoderCacheManager(cache_size)
        self._fast_running = False
        self._plain = False
        rules = rules_for(config.vllm_version)
        self._mm_cut_inside_item = rules.chunked_mm_input_off_cuts_inside_item
        self._mm_cut_refused_unchunked = (rules.mm_cut_refused_without_chunked_prefill
                                          and not config.enable_chunked_prefill)

    def _init_connector(self, connector: KVConnectorBase | None) -> None:
        """The KV connector's state (vLLM's names). Waiting requests that hold
        blocks (an asynchronous load, or promoted after one) wait in
        ``kv_holding_waiting``, scanned before ``waiting``."""
        self.connector = connector
        self.kv_holding_waiting = create_request_queue(self.scheduler_config.policy)
        # vLLM 0.34's --max-num-inflight-kv-loads (None: off, and this queue
        # stays empty): requests the connector may load asynchronously
        # (may_load_async) wait here, not in ``waiting``, so that their loads
        # can start while the batch is full; the scan merges both queues by
        # arrival (priority: by request order).
        self.async_kv_waiting = create_request_queue(self.scheduler_config.policy)
        self._inflight_kv_load_cap: int | None = None
        # The loads the cap counts: started and not yet admitted, looked up
        # again or finished (vLLM's in-progress and completed-waiting fetch
        # stages), and those whose request was aborted mid-load (their
        # blocks stay held until the worker reports the load done).
        self._inflight_kv_loads: set[str] = set()
        self._aborted_kv_loads: set[str] = set()
        # Loads reported done (or failed, recompute policy) not yet promoted.
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        # Running requests whose output of a batch in flight a failed load
        # dropped: vLLM skips their update, so the placeholders that batch
        # added stay counted until a preemption resets them (and kvsched,
        # deciding as vLLM does, keeps them too). Only check_invariants reads it.
        self._dropped_placeholder_ids: set[str] = set()
        # Requests still prefilling or loading: their remaining blocks are
        # reserved against an asynchronous load's admission.
        self._inflight_prefills: dict[str, Request] = {}
        # livelock()'s evidence: the request whose asynchronous load did
        # not fit in the last waiting scan while nothing else could free
        # blocks, and the one-token prompts already loaded whole once.
        self._kv_blocked_load: str | None = None
        self._whole_one_token_loads: set[str] = set()
        self.recompute_kv_load_failures = True
        self.defer_block_free = False
        self.requires_kv_delivery = False
        # Batches scheduled / processed, to fence deferred frees.
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque[tuple[int, list[int], int]] = deque()
        if connector is None:
            return
        config = connector.kv_transfer_config
        self._inflight_kv_load_cap = self.scheduler_config.max_num_inflight_kv_loads
        self.recompute_kv_load_failures = config.kv_load_failure_policy == "recompute"
        # Two batches in flight (async scheduling): a consumer's load could
        # fill a freed block a batch in flight still writes.
        self.defer_block_free = self._overlap and config.is_kv_consumer
        self.requires_kv_delivery = connector.requires_kv_delivery
        # The connector's work sits in update_from_output's general path.
        self._plain = False
        num_spec_step = 1 + self.num_spec_tokens + self.num_lookahead_tokens if self.num_spec_tokens else 0
        self._spec_decode_step_blocks = -(-num_spec_step // self.block_size)

    # -- requests in and out --------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request; a bad one raises ValueError (TypeError for a
        wrong type) and changes nothing."""
        self.check_request(request)
        for identifier in {f.identifier: None for f in request.mm_features}:
            entry = self._mm_num_embeds.get(identifier)
            if entry is None:
                size = next(f.num_embeds for f in request.mm_features if f.identifier == identifier)
                self._mm_num_embeds[identifier] = [size, 1]
            else:
                entry[1] += 1
        request.stop_len = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len)
        if self._inflight_kv_load_cap is not None and self.connector is not None \
                and self.connector.may_load_async(request):
            self.async_kv_waiting.add_request(request)
        else:
            self.waiting.add_request(request)
        self.requests[request.request_id] = request
        self.decode_stable = False

    def check_request(self, request: Request) -> None:
        """Raise ValueError if ``add_request`` would refuse ``request``."""
        if not isinstance(request, Request):
            raise TypeError(f"request={request!r:.80}: must be a kvsched Request")
        if request.request_id in self.requests:
            raise UserInputError(f"request_id={request.request_id!r} is already in the scheduler; "
                             "request ids must be unique")
        request.validate(self.max_model_len, self.token_limit)
        if request.mm_features:
            self._check_mm_request(request)
        if request.status != WAITING or request.num_computed_tokens or request.output_token_ids:
            raise UserInputError(f"request {request.request_id}: already used (status "
                             f"{request.status.name}); create a fresh Request")
        # The most KV a request can ever hold: everything but its last token.
        # (With speculative decoding its last steps may also hold drafts; a
        # request that fits only without them can spin in vLLM, which
        # accepts it all the same, and so does kvsched.)
        max_len = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len) - 1
        need = self.kv_cache_manager.min_blocks_to_hold(max_len)
        usable = self.cache_config.num_gpu_blocks - 1
        if need > usable:
            raise UserInputError(
                f"request {request.request_id}: prompt {request.num_prompt_tokens} + "
                f"max_tokens {request.max_tokens} needs up to {need} KV blocks but the cache "
                f"has {usable}; it could never run (vLLM would hang on it). Lower max_tokens, "
                "shorten the prompt, or give the cache more blocks")

    def _check_mm_request(self, request: Request) -> None:
        """A request's mm items fit this scheduler's encoder: it has one,
        each item fits its budget and cache alone, and an identifier keeps
        one size (vLLM fails a request that reuses one for other content;
        kvsched refuses it up front)."""
        rid = request.request_id
        ecm = self.encoder_cache_manager
        if ecm is None:
            raise UserInputError(f"request {rid}: has mm items but the scheduler has no encoder (a "
                                 "text-only model); pass mm_max_tokens_per_item to the Scheduler")
        sizes: dict[str, int] = {}
        for f in request.mm_features:
            if f.num_embeds > min(self.max_num_encoder_input_tokens, ecm.cache_size):
                raise UserInputError(
                    f"request {rid}: mm item {f.identifier!r} has {f.num_embeds} embeddings, more than "
                    f"the encoder budget ({self.max_num_encoder_input_tokens}) or cache "
                    f"({ecm.cache_size}) hold, so it could never be encoded; raise "
                    "mm_max_tokens_per_item to the model's largest item")
            known = sizes.get(f.identifier)
            if known is None:
                live = self._mm_num_embeds.get(f.identifier)
                cached = ecm.num_embeds_by_hash.get(f.identifier, f.num_embeds)
                known = live[0] if live is not None else cached
            if known != f.num_embeds:
                raise UserInputError(
                    f"request {rid}: mm item {f.identifier!r} has {f.num_embeds} embeddings, but that "
                    f"identifier was given {known} before; an identifier names one item's content "
                    "(its mm hash): give this item its own identifier")
            sizes[f.identifier] = f.num_embeds

    def finish_requests(self, request_ids: str | Iterable[str],
                        finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED,
                        ) -> list[Request]:
        """Finish requests from outside (abort), whatever state they are in.
        Unknown or already finished ids are ignored; returns those finished.
        Bad arguments raise before anything changes."""
        if type(finished_status) is not RequestStatus or not RequestStatus.is_finished(finished_status):
            raise UserInputError(f"finished_status={finished_status!r} is not a finished status; "
                             "use e.g. RequestStatus.FINISHED_ABORTED")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif not isinstance(request_ids, Iterable):
            raise TypeError(f"request_ids={request_ids!r:.80}: must be a request id (str) or an "
                            "iterable of them")
        else:
            request_ids = list(request_ids)
            for rid in request_ids:
                if not isinstance(rid, str):
                    raise TypeError(f"request_ids: {rid!r:.80} is not a request id; ids are str")
        done: list[Request] = []
        seen: set[str] = set()
        for rid in request_ids:
            request = self.requests.get(rid)
            # A finished request whose blocks a KV connector still holds
            # stays known; finishing it again does nothing.
            if request is not None and rid not in seen and not request.is_finished():
                seen.add(rid)
                done.append(request)
        if self.connector is not None:
            self._finish_requests_connector(done, finished_status)
            return done
        waiting = self._leave_running(done)
        if waiting:
            self.waiting.remove_requests(waiting)
        for request in done:
            request.status = finished_status
            self._free_request(request)
        if done:
            self.decode_stable = self.decode_stable and not self.waiting
        return done

    def _leave_running(self, done: list[Request]) -> list[Request]:
        """The running ones of ``done`` leave the running list; the others
        (waiting in a queue) are returned for their queue to drop."""
        if any(r.status == RUNNING for r in done):
            drop = {id(r) for r in done if r.status == RUNNING}
            self.running = [r for r in self.running if id(r) not in drop]
        return [r for r in done if r.status != RUNNING]

    def _forget_mm_items(self, request: Request) -> None:
        """The request leaves: its identifiers' live counts drop."""
        for identifier in {f.identifier: None for f in request.mm_features}:
            entry = self._mm_num_embeds[identifier]
            entry[1] -= 1
            if not entry[1]:
                del self._mm_num_embeds[identifier]

    def _free_request(self, request: Request) -> None:
        if self.encoder_cache_manager is not None and request.mm_features:
            self.encoder_cache_manager.free(request)
        if self.connector is not None:
            self._free_request_connector(request)
            return
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        self._dropped_placeholder_ids.discard(request.request_id)
        if request.mm_features:
            self._forget_mm_items(request)

    # -- the KV connector's bookkeeping ---------------------------------------
    def _finish_requests_connector(self, done: list[Request], finished_status: RequestStatus) -> None:
        """finish_requests with a connector: requests leave every queue; one
        aborted during its asynchronous load keeps its blocks until the
        load is reported done (unless that was reported already)."""
        waiting = self._leave_running(done)
        if waiting:
            plain = [r for r in waiting if r in self.waiting]
            if plain:
                self.waiting.remove_requests(plain)
            holding = [r for r in waiting if r in self.kv_holding_waiting]
            if holding:
                self.kv_holding_waiting.remove_requests(holding)
            if self.async_kv_waiting:
                self.async_kv_waiting.remove_requests(waiting)
        for request in done:
            rid = request.request_id
            delay = False
            if self.encoder_cache_manager is not None and request.mm_features:
                self.encoder_cache_manager.free(request)
            if request.status == WAITING_FOR_REMOTE_KVS:
                delay = rid not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(rid)
                self.failed_recving_kv_req_ids.discard(rid)
            request.status = finished_status
            self._free_request_connector(request, delay)
            if delay and self._inflight_kv_load_cap is not None:
                # Its blocks stay held until the load is reported done.
                self._aborted_kv_loads.add(rid)
        self.decode_stable = False

    def _free_request_connector(self, request: Request, delay_free_blocks: bool = False) -> None:
        """A finished request with a connector: the connector may hold its
        blocks (``request_finished``) until ``finished_sending``; until its
        blocks are freed it stays in ``requests``."""
        assert self.connector is not None
        rid = request.request_id
        self._inflight_prefills.pop(rid, None)
        self._whole_one_token_loads.discard(rid)
        if self._inflight_kv_load_cap is not None:
            self._inflight_kv_loads.discard(rid)
        delay, _ = self.connector.request_finished(request, self.kv_cache_manager.get_block_ids(rid))
        self.finished_req_ids.add(rid)
        if not (delay or delay_free_blocks):
            self._free_blocks(request)

    def _free_blocks(self, request: Request) -> None:
        self._free_request_blocks(request)
        del self.requests[request.request_id]
        self._dropped_placeholder_ids.discard(request.request_id)
        if request.mm_features:
            self._forget_mm_items(request)

    def _free_request_blocks(self, request: Request) -> None:
        """Free a request's blocks, or, while a batch in flight may still
        write them (a consumer connector under async scheduling), hold them
        back until that batch is processed."""
        if not self.defer_block_free or request.last_sched_seq <= self.processed_step_seq:
            self.kv_cache_manager.free(request)
            return
        blocks, num_cached = self.kv_cache_manager.pop_blocks_for_free(request)
        if blocks:
            self.deferred_frees.append((self.sched_step_seq, blocks, num_cached))

    def count_fenced_batches(self, scheduled: int, processed: int) -> int:
        """A decode stretch (kvsched.core.fast_forward) scheduled
        ``scheduled`` batches and processed ``processed``: count them for
        the deferred-free fence (nothing is deferred then, so nothing
        drains). Returns the last scheduled batch's sequence number."""
        assert not self.deferred_frees, "a stretch starts with no deferred free"
        self.sched_step_seq += scheduled
        self.processed_step_seq += processed
        return self.sched_step_seq

    def _drain_deferred_frees(self) -> None:
        """Return deferred blocks whose batch has been processed, in order."""
        frees = self.deferred_frees
        while frees and frees[0][0] <= self.processed_step_seq:
            _, blocks, num_cached = frees.popleft()
            self.kv_cache_manager.free_popped(blocks, num_cached)

    def _inflight_prefill_reserved_blocks(self) -> int:
        """Blocks the requests still prefilling or loading need to finish
        (vLLM's reservation against an asynchronous load)."""
        held = self.kv_cache_manager.req_to_blocks
        bs = self.block_size
        extra = 1 + self.num_spec_tokens + self.num_lookahead_tokens if self.num_spec_tokens else 0
        total = 0
        for rid, request in self._inflight_prefills.items():
            need = -(-(min(request.num_tokens, self.max_model_len) + extra) // bs) - len(held.get(rid, ()))
            if need > 0:
                total += need
        return total

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting): waiting counts the requests holding KV blocks
        while they wait (kv_holding_waiting) and those waiting to start an
        asynchronous load (async_kv_waiting) too."""
        return len(self.running), (len(self.waiting) + len(self.kv_holding_waiting)
                                   + len(self.async_kv_waiting))

    @property
    def step_in_flight(self) -> bool:
        """True between a schedule() that scheduled something and the
        update_from_output() that applies its result."""
        return bool(self._in_flight)

    @property
    def num_steps_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def in_flight_outputs(self) -> Sequence[SchedulerOutput]:
        """The SchedulerOutputs awaiting update_from_output, oldest first
        (read only: ``replace_in_flight`` is how fast-forward changes them)."""
        return self._in_flight

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones the next schedule() has
        still to report (vLLM's has_requests: the engine keeps stepping);
        with a KV connector also finished requests whose blocks it holds
        and its pending work."""
        if self.connector is not None:
            return (self.has_unfinished_requests() or bool(self.finished_req_ids)
                    or len(self.requests) > len(self.running) + len(self.waiting)
                    + len(self.kv_holding_waiting) + len(self.async_kv_waiting)
                    or self.connector.has_pending_push_work())
        return bool(self.running) or bool(self.waiting) or bool(self.finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        return (len(self.running) + len(self.waiting) + len(self.kv_holding_waiting)
                + len(self.async_kv_waiting))

    def has_inflight_prefills(self) -> bool:
        """With a KV connector: requests still prefilling or loading whose
        remaining blocks are reserved against an asynchronous load."""
        return bool(self._inflight_prefills)

    def has_unfinished_requests(self) -> bool:
        return (bool(self.running) or bool(self.waiting) or bool(self.kv_holding_waiting)
                or bool(self.async_kv_waiting))

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        pc = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + len(self.async_kv_waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=pc.queries + pc.preempted_queries,
            prefix_cache_hits=pc.hits + pc.preempted_hits,
            num_preemptions=self.num_preemptions,
        )

    # -- the step -------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if len(self._in_flight) >= self.max_steps_in_flight:
            if self._overlap:
                raise UserInputError(f"schedule(): {len(self._in_flight)} steps are in flight; call "
                                 "update_from_output() on the oldest first (vLLM's async engine "
                                 f"keeps at most {self.max_steps_in_flight} batches in its queue)")
            raise UserInputError("schedule(): the previous step's SchedulerOutput has not been applied; "
                             "call update_from_output(scheduler_output, model_runner_output) first "
                             "(vLLM's synchronous engine runs one step at a time)")
        self.current_step += 1
        step = _Step(self.max_num_scheduled_tokens)
        step.encoder_budget = self.max_num_encoder_input_tokens
        if self._mamba_split:
            self._hybrid_kv().new_step_starts()
        if self._begin_step is not None:
            self._begin_step(self)
        # The threshold keeps one long prefill from starving the others; with
        # a single request there is nobody to starve (vLLM drops it then), and
        # from 0.34 on it applies only with chunked prefill (_threshold_applies).
        threshold = self._long_prefill_threshold
        if (len(self.running) + len(self.waiting) + len(self.kv_holding_waiting)
                + len(self.async_kv_waiting) <= 1):
            threshold = 0
        defer_prefills = self._defer_prefill_chunks is not None and self._defer_prefill_chunks(self)
        if defer_prefills:
            # Running requests mid-prefill sit this step out (the general path).
            self._schedule_running_preempting(step, threshold, 0, skip_prefill_chunks=True)
        elif self._fast_running:
            self._schedule_running(step, threshold)
        else:
            self._schedule_running_preempting(step, threshold, 0)
        if step.preempted:
            step.admission_stop = explain.REASON_PREEMPTION
            step.admission_stop_detail = "a running request was preempted this step; no admissions"
        else:
            if self._cache_aware_window and not defer_prefills:
                self._reorder_waiting_by_cached_prefix()
            if self.connector is not None:
                self._schedule_waiting_connector(step, threshold)
            else:
                self._schedule_waiting(step, threshold)
        output = self._make_output(step)
        if not self._plain:
            self._update_after_schedule(output)
        if self.connector is not None:
            self._connector_after_schedule(output, step)
        # Pure decode (every running request scheduled for exactly one token,
        # nobody admitted, resumed or preempted) with admission held for a
        # stable reason, or nothing waiting: the next steps admit nothing.
        # (Fast-forward covers placeholders, not drafts.)
        n = len(self.running)
        self.decode_stable = not self.num_spec_tokens and (not self.waiting or (
            output.total_num_scheduled_tokens == n and len(output.num_scheduled_tokens) == n
            and not step.new_reqs and not step.resumed_reqs and not step.preempted
            and step.admission_stop in _STABLE_STOPS and step.skipped is None and not step.kv_skipped
            # Each step may reorder the queue anew (its order carries over).
            and not (self._cache_aware_window and len(self.waiting) >= 2))
            # Loads may start while the batch is full.
        ) and not self.async_kv_waiting and self.encoder_cache_manager is None
        if self._end_step is not None:
            self._end_step(self, output)
        if output.num_scheduled_tokens:
            self._in_flight.append(output)
        return output

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        """With drafts or placeholders: under async scheduling count the
        batch's tokens in flight and its unknown outputs as placeholders
        (vLLM's AsyncScheduler._update_after_schedule):
        a request that samples gets 1 + its drafts, and K placeholder drafts
        for its next step."""
        output.num_spec_tokens_to_schedule = self.num_spec_tokens
        if not self.async_scheduling:
            if self._overlap:  # synchronous PP: no placeholders, tokens in flight
                requests = self.requests
                for rid, n in output.num_scheduled_tokens.items():
                    requests[rid].num_in_flight_tokens += n
            return
        stagger = self._decode_stagger
        eligible = self.current_step + stagger
        spec = output.scheduled_spec_decode_tokens
        placeholders = self._spec_placeholders
        requests = self.requests
        for rid, n in output.num_scheduled_tokens.items():
            request = requests[rid]
            request.num_in_flight_tokens += n
            if request.is_prefill_chunk:
                continue
            drafts = spec.get(rid)
            request.num_output_placeholders += 1 + (len(drafts) if drafts else 0)
            request.spec_token_ids = placeholders
            if stagger:
                request.next_decode_eligible_step = eligible

    def _schedule_running(self, step: _Step, threshold: int) -> None:
        """Phase 1, fast path (no drafts; synchronous, or async with its
        placeholders): while every running request fits, a plain pass.
        At the first one that does not, ``_schedule_running_preempting`` takes
        over from it. Scheduling a request advances its num_computed_tokens at
        once (vLLM does it after all phases; nothing in between reads it)."""
        running = self.running
        kv = self.kv_cache_manager
        req_to_blocks = kv.req_to_blocks
        num_cached_block = kv.num_cached_block
        caching = kv.enable_caching
        bs = self.block_size
        max_model_len_1 = self.max_model_len - 1
        budget = step.token_budget
        num_scheduled = step.num_scheduled_tokens
        scheduled = step.running_req_ids
        for request in running:
            if budget <= 0:
                break
            # Inlined copy of _num_running_tokens (a call per request costs ~10%).
            computed = request.num_computed_tokens
            num_tokens = request.num_tokens
            # Async: the tokens of the steps in flight are placeholders.
            placeholders = request.num_output_placeholders
            if placeholders and (computed + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
                continue  # as in _schedule_running_preempting
            num_new = num_tokens + placeholders - computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if num_new > max_model_len_1 - computed:
                num_new = max_model_len_1 - computed
            if num_new <= 0:
                continue
            rid = request.request_id
            end = computed + num_new
            # Most steps a request's new tokens fit its last block and fill no
            # block that has to enter the prefix cache (only known tokens
            # do): no allocation at all.
            if end > len(req_to_blocks[rid]) * bs or (
                    caching and (end if end < num_tokens else num_tokens) // bs
                    > num_cached_block.get(rid, 0)):
                new_blocks = kv.allocate_slots(request, num_new)
                if new_blocks is None:
                    step.token_budget = budget
                    self._schedule_running_preempting(step, threshold, running.index(request))
                    return
                if new_blocks:
                    step.new_block_ids[rid] = new_blocks
            scheduled.append(rid)
            num_scheduled[rid] = num_new
            budget -= num_new
            request.num_computed_tokens = end
            if end < num_tokens + placeholders:
                request.is_prefill_chunk = True
                step.prefill_chunks.append(rid)
            else:
                request.is_prefill_chunk = False
        step.token_budget = budget

    def _num_running_tokens(self, request: Request, budget: int, threshold: int) -> int:
        """Tokens for a running request: all it lacks (its drafts and, under
        async scheduling, its placeholders included), capped by the
        threshold, the remaining budget and max_model_len (one position for
        the sample)."""
        computed = request.num_computed_tokens
        num_new = (request.num_tokens + len(request.spec_token_ids)
                   + request.num_output_placeholders - computed)
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget, self.max_model_len - 1 - computed)

    def _schedule_running_preempting(self, step: _Step, threshold: int, req_index: int,
                                     skip_prefill_chunks: bool = False) -> None:
        """Phase 1 from ``running[req_index]`` on, preempting when blocks run
        out: FCFS takes the last running request, priority the max of
        (priority, arrival_time); retry until the request fits or is itself
        the victim. ``skip_prefill_chunks`` skips requests whose last
        scheduling left them mid-prefill (vLLM's defer_prefills)."""
        running = self.running
        kv = self.kv_cache_manager
        allocate_slots = kv.allocate_slots
        # Hybrid groups: vLLM's allocate_slots runs for every request (it
        # frees blocks that left a window even when nothing is allocated),
        # so no table is looked at for the no-allocation shortcut below.
        req_to_blocks: dict[str, list[int]] = {} if self.hybrid_kv_cache else kv.req_to_blocks
        num_cached_block = kv.num_cached_block
        caching = kv.enable_caching
        bs = self.block_size
        lookahead = self.num_lookahead_tokens
        num_scheduled = step.num_scheduled_tokens
        scheduled = step.running_req_ids
        new_block_ids = step.new_block_ids
        budget = step.token_budget
        current_step = self.current_step
        staggered = self._decode_stagger > 0
        while req_index < len(running) and budget > 0:
            request = running[req_index]
            if skip_prefill_chunks and request.is_prefill_chunk:
                req_index += 1
                continue
            placeholders = request.num_output_placeholders
            if placeholders and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
                # Async: the steps in flight reach max_tokens even if every
                # draft is rejected; another step would be wasted.
                req_index += 1
                continue
            if staggered and current_step < request.next_decode_eligible_step:
                # Async with PP: its last decode is PP steps back at most.
                req_index += 1
                continue
            num_new = self._num_running_tokens(request, budget, threshold)
            if self._mamba_split:
                num_new = self._mamba_aligned(request, num_new)
            if num_new <= 0:
                req_index += 1
                continue
            encoding: _EncoderPlan | None = None
            if request.mm_features and self.encoder_cache_manager is not None:
                encoding = self._try_schedule_encoder_inputs(request, request.num_computed_tokens,
                                                             num_new, step.encoder_budget)
                num_new = encoding.num_new_tokens
                if num_new == 0:
                    # Its next mm item cannot be encoded this step (budget
                    # or cache); those behind it still may run.
                    req_index += 1
                    continue
            rid = request.request_id
            end = request.num_computed_tokens + num_new
            num_tokens = request.num_tokens
            blocks = req_to_blocks.get(rid)
            # As in _schedule_running: no allocation when the tokens (and
            # lookahead slots) fit the last block and no known block fills.
            if blocks is not None and end + lookahead <= len(blocks) * bs and not (
                    caching and (end if end < num_tokens else num_tokens) // bs
                    > num_cached_block.get(rid, 0)):
                new_blocks: list[int] | None = _NO_NEW_BLOCKS
            else:
                new_blocks = None
            while new_blocks is None:
                new_blocks = allocate_slots(request, num_new, num_lookahead_tokens=lookahead)
                if new_blocks is not None:
                    break
                if self.connector is not None and self._connector_blocks_preemption():
                    break
                victim = self._pick_victim()
                if self.defer_block_free and victim.last_sched_seq > self.processed_step_seq:
                    # A batch in flight still writes its blocks: preempting
                    # it would free nothing now.
                    break
                if self._priority:
                    victim_index = running.index(victim)
                    del running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                    vid = victim.request_id
                    if vid in num_scheduled:
                        # Already scheduled this step: give its tokens back.
                        scheduled.remove(vid)
                        budget += num_scheduled.pop(vid)
                        new_block_ids.pop(vid, None)
                        step.spec.pop(vid, None)
                        if step.encoder_inputs is not None and vid in step.encoder_inputs:
                            # And its encoder budget (vLLM restores it too,
                            # though a request of this step that encodes
                            # something sets the budget from its own plan
                            # below, made before this refund).
                            step.encoder_budget += sum(victim.mm_features[i].num_embeds
                                                       for i in step.encoder_inputs.pop(vid))
                        if step.unscheduled is None:
                            step.unscheduled = []
                        step.unscheduled.append(vid)
                else:
                    running.pop()
                self._preempt_request(victim)
                step.preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                if self._priority and request.status == PREEMPTED:
                    # It was the lowest-priority request and preempted itself;
                    # those after it may still fit, and req_index already
                    # points at the next one.
                    continue
                break
            if new_blocks:
                new_block_ids[rid] = new_blocks
            scheduled.append(rid)
            num_scheduled[rid] = num_new
            budget -= num_new
            if encoding is not None and encoding.inputs:
                self._allocate_encoder_inputs(step, request, encoding)
            computed = request.num_computed_tokens
            if request.is_prefill_chunk:
                step.prefill_scheduled = True
            drafts = request.spec_token_ids
            if drafts:
                # The part of this step past the known tokens and the
                # placeholders is drafts (fewer when the budget cut it).
                num_drafts = computed + num_new - request.num_tokens - placeholders
                if num_drafts > 0:
                    step.spec[rid] = drafts[:num_drafts] if len(drafts) > num_drafts else drafts
                request.spec_token_ids = NO_DRAFTS
            end = computed + num_new
            request.num_computed_tokens = end
            if end < request.num_tokens + placeholders:
                request.is_prefill_chunk = True
                step.prefill_chunks.append(rid)
            else:
                request.is_prefill_chunk = False
            req_index += 1
        step.token_budget = budget

    def _hybrid_kv(self) -> HybridKVCacheManager:
        kv = self.kv_cache_manager
        assert isinstance(kv, HybridKVCacheManager)
        return kv

    def _mamba_aligned(self, request: Request, num_new: int, num_computed: int = 0,
                       hit: list[int] = _NO_NEW_BLOCKS) -> int:
        """vLLM's Mamba block-aligned split of ``num_new`` tokens (``num_computed``
        and ``hit``: a waiting request's prefix hit)."""
        threshold = self.scheduler_config.long_prefill_token_threshold
        budget = self.max_num_scheduled_tokens
        return mamba_block_aligned_split(
            request, num_new, num_computed, self.block_size,
            min(budget, threshold) if threshold > 0 else budget,
            self._hybrid_kv().junction(request, hit), self._mamba_checkpoint_alignment)

    def _pick_victim(self) -> Request:
        if self._priority:
            # max() keeps the first of equal keys, as vLLM's does.
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt_request(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, requeue at the head. A
        step still in flight for it (async) delivers its tokens later as
        "stale" output, which moves no counter."""
        if self.connector is not None:
            self._free_request_blocks(request)
            self._inflight_prefills.pop(request.request_id, None)
            # A producer drops the stale output (its blocks are gone); a
            # dropped share not yet drained stays dropped.
            request.drop_stale_output = self.requires_kv_delivery or (
                request.drop_stale_output and request.num_stale_output_tokens > 0)
        else:
            self.kv_cache_manager.free(request)
        if self.encoder_cache_manager is not None and request.mm_features:
            self.encoder_cache_manager.free(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        if request.spec_token_ids:
            request.spec_token_ids = NO_DRAFTS
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        self._dropped_placeholder_ids.discard(request.request_id)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def _schedule_waiting(self, step: _Step, threshold: int) -> None:
        """Phase 2: admit from the waiting queue, in order, until something
        stops it. Requests the LoRA cap or an output still in flight keep
        out are passed over and keep their place."""
        waiting = self.waiting
        kv = self.kv_cache_manager
        reserve_full = self.scheduler_config.scheduler_reserve_full_isl
        loras = self._running_loras()
        budget = step.token_budget
        while waiting:
            if budget <= 0:
                step.admission_stop = explain.REASON_TOKEN_BUDGET
                step.admission_stop_detail = f"token budget of {self.max_num_scheduled_tokens} used up"
                break
            if self._running_full(step):
                break
            request = waiting.peek_request()
            if request.num_stale_output_tokens or (loras is not None and request.lora_id):
                passed_over = self._pass_over_reason(request, loras)
                if passed_over is not None:
                    self._skip(step, *passed_over)
                    continue
            if self._held_by_policy(step, request):
                break
            hit_blocks, num_computed = kv.get_computed_blocks(request)
            tokens = self._admission_tokens(step, request, num_computed, budget, threshold)
            if tokens is None:
                break
            num_new, padded = tokens
            # vLLM applies the Mamba alignment before the encoder caps.
            if self._mamba_split:
                num_new = self._mamba_aligned(request, num_new, num_computed, hit_blocks)
                if num_new == 0:
                    self._stop_at(step, explain.REASON_MAMBA_ALIGNMENT, request,
                                  "its chunk would end before the next Mamba block boundary")
                    break
            encoding: _EncoderPlan | None = None
            if request.mm_features and self.encoder_cache_manager is not None:
                encoding = self._encoder_admission(step, request, num_computed, num_new,
                                                   lambda reason, detail: self._skip(step, reason, detail))
                if encoding is None:
                    continue
                num_new = encoding.num_new_tokens
            if kv.allocate_slots(request, num_new, num_computed, hit_blocks,
                                 full_sequence_must_fit=reserve_full,
                                 num_lookahead_tokens=self.num_lookahead_tokens) is None:
                if encoding is not None:
                    # Not admitted after all: drop the cache references its
                    # plan took (evictions it caused stand).
                    assert self.encoder_cache_manager is not None
                    self.encoder_cache_manager.free(request)
                detail = ""
                if self.explain_admission:
                    need = kv.num_blocks_needed(request, num_new, hit_blocks, reserve_full)
                    what = "its whole sequence" if reserve_full else f"{num_new} tokens"
                    detail = (f"needs {need} free KV blocks for {what}, "
                              f"{kv.block_pool.get_num_free_blocks()} free")
                    if self._mamba_split and self._hybrid_kv().waits_for_same_step_state(hit_blocks):
                        detail = ("its prefix hit is a Mamba state another request caches in this "
                                  "step; vLLM looks it up again next step")
                self._stop_at(step, explain.REASON_KV_BLOCKS, request, detail)
                break
            kv.record_prefix_cache_stats(request, num_computed)
            waiting.pop_request()
            self._admit(step, request, num_new, num_computed, padded, loras)
            budget -= num_new
            if encoding is not None and encoding.inputs:
                self._allocate_encoder_inputs(step, request, encoding)
        step.token_budget = budget
        if step.skipped:
            # Back at the head, in their order (vLLM's prepend_requests).
            waiting.prepend_requests(step.skipped)

    # -- the encoder (multimodal models) --------------------------------------
    def _try_schedule_encoder_inputs(self, request: Request, num_computed: int, num_new: int,
                                     encoder_budget: int) -> _EncoderPlan:
        """The mm items whose encoder must run for the request's tokens
        [num_computed, num_computed + num_new) this step, and the tokens
        left once an item that cannot be encoded cuts the chunk short
        before it (vLLM's _try_schedule_encoder_inputs). In item order:
        with chunked mm input off, a chunk covering part of an item stops
        before it; an identifier already planned in this call is a
        duplicate (no second encoding); an item in the encoder cache is
        referred to (nothing to encode); one the budget or the cache (after
        evicting freeable entries) cannot take stops the chunk before it
        (no token at all if the chunk starts inside it); an item whose
        part in the window has no embedding is skipped; the rest are
        planned and charged to the budget."""
        ecm = self.encoder_cache_manager
        assert ecm is not None
        plan = _EncoderPlan(num_new, encoder_budget)
        window_end = num_computed + num_new
        chunked_off = self.scheduler_config.disable_chunked_mm_input
        planned: set[str] = set()
        num_planned = 0
        for i, f in enumerate(request.mm_features):
            start = f.offset
            if start + f.length <= num_computed:
                continue
            if start >= window_end:
                break
            if chunked_off and num_computed + plan.num_new_tokens < start + f.length and (
                    self._mm_cut_inside_item or num_computed <= start):
                plan.num_new_tokens = start - num_computed if num_computed < start else 0
                plan.cut = (explain.REASON_CHUNKED_MM_INPUT, f)
                break
            if f.identifier in planned:
                plan.duplicates.append(i)
                continue
            if ecm.check_and_update_cache(request, i):
                continue
            if not ecm.can_allocate(request, i, plan.encoder_budget, num_planned):
                if num_computed < start:
                    plan.num_new_tokens = min(plan.num_new_tokens, start - num_computed)
                else:
                    plan.num_new_tokens = 0
                plan.cut = (explain.REASON_ENCODER_BUDGET if f.num_embeds > plan.encoder_budget
                            else explain.REASON_ENCODER_CACHE, f)
                break
            if not f.embeds_in_range(max(0, num_computed - start), min(f.length, window_end - start)):
                continue
            num_planned += f.num_embeds
            plan.encoder_budget -= f.num_embeds
            planned.add(f.identifier)
            plan.inputs.append(i)
        return plan

    def _encoder_admission(self, step: _Step, request: Request, num_computed: int, num_new: int,
                           skip: Callable[[str, str], None]) -> _EncoderPlan | None:
        """The encoder plan of a waiting request about to be admitted, or
        None when it is passed over this step (``skip(reason, detail)``:
        nothing to schedule, the scan goes on behind it, as vLLM's does)."""
        plan = self._try_schedule_encoder_inputs(request, num_computed, num_new, step.encoder_budget)
        cut_unchunked = (self._mm_cut_refused_unchunked and 0 < plan.num_new_tokens
                         < request.num_tokens - num_computed)
        if cut_unchunked:
            # Chunked prefill is off: the prompt must go in whole.
            assert self.encoder_cache_manager is not None
            self.encoder_cache_manager.free(request)
            plan.num_new_tokens = 0
        if plan.num_new_tokens:
            return plan
        reason, item = plan.cut if plan.cut is not None else (explain.REASON_ENCODER_BUDGET, None)
        detail = ""
        if self.explain_admission:
            detail = self._encoder_cut_detail(reason, item, plan, cut_unchunked)
            if cut_unchunked:
                reason = explain.REASON_CHUNKED_PREFILL_OFF
        skip(reason, detail)
        return None

    def _encoder_cut_detail(self, reason: str, item: MultiModalFeature | None, plan: _EncoderPlan,
                            cut_unchunked: bool) -> str:
        """Why the encoder left a waiting request nothing to schedule (--explain)."""
        ecm = self.encoder_cache_manager
        assert ecm is not None and item is not None
        what = f"its {item.modality} {item.identifier!r} ({item.num_embeds} embeddings, tokens " \
               f"{item.offset}..{item.end - 1})"
        if cut_unchunked:
            return (f"{what} cannot be encoded this step and chunked prefill is off, so the prompt "
                    "cannot go in part of the way")
        if reason == explain.REASON_CHUNKED_MM_INPUT:
            return f"{what} does not fit the rest of this step and disable_chunked_mm_input is on"
        if reason == explain.REASON_ENCODER_BUDGET:
            return (f"{what} needs encoder budget: {plan.encoder_budget} of "
                    f"max_num_encoder_input_tokens={self.max_num_encoder_input_tokens} left this step")
        return (f"{what} does not fit the encoder cache: {ecm.num_free_slots} of {ecm.cache_size} "
                f"slots free, {ecm.num_freeable_slots} after evicting unused entries")

    def _allocate_encoder_inputs(self, step: _Step, request: Request, plan: _EncoderPlan) -> None:
        """A scheduled request's planned items take their encoder budget
        and cache room; its duplicates refer to the entry just made."""
        ecm = self.encoder_cache_manager
        assert ecm is not None
        if step.encoder_inputs is None:
            step.encoder_inputs = {}
        step.encoder_inputs[request.request_id] = plan.inputs
        step.encoder_budget = plan.encoder_budget
        for i in plan.inputs:
            ecm.allocate(request, i)
        for i in plan.duplicates:
            ecm.check_and_update_cache(request, i)

    def _free_encoder_inputs(self, request: Request) -> None:
        """After a step: the request's cache references to items its
        decoder has computed past (placeholders of steps in flight do not
        count: a rejected draft could roll back into an item)."""
        ecm = self.encoder_cache_manager
        assert ecm is not None
        ids = ecm.get_cached_input_ids(request)
        if not ids:
            return
        computed = request.num_computed_tokens - request.num_output_placeholders
        features = request.mm_features
        for i in list(ids):
            if features[i].end <= computed:
                ecm.free_encoder_input(request, i)

    def _running_loras(self) -> set[int] | None:
        """The adapters of the running batch, where max_loras caps them
        (None: LoRA off, nothing to check)."""
        if not self.max_loras:
            return None
        return {r.lora_id for r in self.running if r.lora_id}

    def _running_full(self, step: _Step) -> bool:
        """Admission stops: max_num_seqs requests are running."""
        if len(self.running) < self.max_num_running_reqs:
            return False
        step.admission_stop = explain.REASON_MAX_NUM_SEQS
        step.admission_stop_detail = (f"{len(self.running)} requests running, "
                                      f"max_num_seqs={self.max_num_running_reqs}")
        return True

    def _pass_over_reason(self, request: Request, loras: set[int] | None) -> tuple[str, str] | None:
        """Why a waiting request is passed over this step, keeping its place
        at the head (None: it is not): the one owner of both scans' skips
        that do not depend on a KV connector."""
        if request.num_stale_output_tokens and not request.drop_stale_output:
            # Preempted with a step in flight: resuming before its output
            # arrives could sample a position twice.
            return (explain.REASON_OUTPUT_IN_FLIGHT,
                    f"preempted with {request.num_stale_output_tokens} tokens still in flight")
        lora_id = request.lora_id
        if loras is not None and lora_id and len(loras) == self.max_loras and lora_id not in loras:
            return (explain.REASON_MAX_LORAS,
                    f"adapter {lora_id} would be one more than max_loras={self.max_loras} "
                    f"(running: {sorted(loras)})")
        return None

    def _held_by_policy(self, step: _Step, request: Request) -> bool:
        """Admission stops at ``request``: the admission policy holds it."""
        policy = self.admission_policy
        if policy is None:
            return False
        hold = policy.hold_reason(self, request)
        if hold is None:
            return False
        self._stop_at(step, explain.REASON_ADMISSION_POLICY, request, hold)
        return True

    def _admit(self, step: _Step, request: Request, num_new: int, num_computed: int, padded: bool,
               loras: set[int] | None) -> bool:
        """A waiting request (already taken off its queue) joins the running
        ones with ``num_new`` tokens scheduled on top of ``num_computed``:
        the one owner of an admission's bookkeeping, with or without a KV
        connector. True when it is left mid-prefill (a chunk)."""
        self.running.append(request)
        if request.status == WAITING:
            step.new_reqs.append(request)
        else:
            step.resumed_reqs.append(request)
        rid = request.request_id
        step.num_scheduled_tokens[rid] = num_new
        step.computed_at_admission[rid] = num_computed
        request.status = RUNNING
        if loras is not None and request.lora_id:
            loras.add(request.lora_id)
        if padded:
            step.spec[rid] = self._spec_placeholders
        end = num_computed + num_new
        request.num_computed_tokens = end
        if end < request.num_tokens:
            request.is_prefill_chunk = True
            step.prefill_chunks.append(rid)
            return True
        request.is_prefill_chunk = False
        return False

    def _admission_tokens(self, step: _Step, request: Request, num_computed: int, budget: int,
                          threshold: int) -> tuple[int, bool] | None:
        """Tokens to schedule for a waiting request being admitted with
        ``num_computed`` tokens already there (prefix hit, loaded KV), and
        whether they are padded with placeholder drafts; None when admission
        stops at it (the stop recorded). The one owner of the admission's
        token count, with or without a KV connector: a one-token admission
        under speculative decoding is padded with K placeholder drafts (vLLM
        keeps the batch a uniform decode batch, and would rather not admit it
        than admit it unpadded), then the long-prefill threshold, then the
        budget (chunked, or a stop when chunked prefill is off)."""
        num_spec = self.num_spec_tokens
        num_new = request.num_tokens - num_computed
        padded = False
        if num_new == 1 and num_spec and not step.prefill_scheduled and (
                step.running_req_ids or num_computed) and (
                num_computed + num_spec + 2 <= self.max_model_len):
            if 1 + num_spec > budget:
                self._stop_at(step, explain.REASON_TOKEN_BUDGET, request,
                              f"needs {1 + num_spec} tokens (1 + {num_spec} padding drafts), "
                              f"{budget} left in the budget")
                return None
            num_new = 1 + num_spec
            padded = True
        if 0 < threshold < num_new:
            num_new = threshold
        if num_new > budget:
            if not self.scheduler_config.enable_chunked_prefill:
                self._stop_at(step, explain.REASON_CHUNKED_PREFILL_OFF, request,
                              f"needs {num_new} tokens at once, {budget} left in the budget "
                              "and chunked prefill is off")
                return None
            num_new = budget
        return num_new, padded

    def _connector_blocks_preemption(self) -> bool:
        """A delayed free in flight will give blocks back: wait for it
        rather than preempt."""
        assert self.connector is not None
        return self.connector.has_pending_block_frees()

    def _schedule_waiting_connector(self, step: _Step, threshold: int) -> None:
        """Phase 2 with a KV connector (vLLM's waiting scan with its
        connector calls): waiting requests holding blocks first
        (``kv_holding_waiting``), then the rest. A request whose
        asynchronous load finished is promoted; a fresh admission asks the
        connector for tokens beyond the local hit; an asynchronous load
        gets its blocks and waits in WAITING_FOR_REMOTE_KVS; a synchronous
        one is admitted at once with the loaded tokens computed.

        With vLLM 0.34's in-flight KV load cap the rest is two queues,
        ``waiting`` and ``async_kv_waiting``, taken by whichever head comes
        first; a new asynchronous load starts only below the cap; and once
        no running slot or token budget is left the scan goes on over
        ``async_kv_waiting`` alone, starting loads (which take neither)
        until a request there needs a slot. Without the cap that queue is
        empty and the scan is 0.33's."""
        connector = self.connector
        assert connector is not None
        holding = self.kv_holding_waiting
        waiting = self.waiting
        async_waiting = self.async_kv_waiting
        kv = self.kv_cache_manager
        loras = self._running_loras()
        skipped_holding: list[Request] = []
        skipped_waiting: list[Request] = []
        skipped_async: list[Request] = []
        # Asynchronous loads started this step: they join kv_holding_waiting
        # behind every request already there (vLLM 0.34; in 0.33 the scan
        # only reaches them once that queue is drained, so the order is the
        # same).
        started_loads: list[Request] = []
        loads: dict[str, tuple[int, bool]] = {}

        explaining = self.explain_admission
        self._kv_blocked_load = None

        def skip(queue: RequestQueue, reason: str, detail: str) -> None:
            request = queue.pop_request()
            if request.num_computed_tokens > 0 or request.status == WAITING_FOR_REMOTE_KVS:
                (skipped_holding if queue is holding else started_loads).append(request)
            elif queue is async_waiting:
                skipped_async.append(request)
            else:
                skipped_waiting.append(request)
            if explaining:
                if step.skip_reasons is None:
                    step.skip_reasons = {}
                step.skip_reasons[request.request_id] = (reason, detail)

        budget = step.token_budget
        max_running = self.max_num_running_reqs
        # Cleared once async_kv_waiting's head cannot start a load this step.
        take_async = True
        while True:
            # No running slot or budget left: only asynchronous loads start.
            loads_only = budget <= 0 or len(self.running) >= max_running
            queue: RequestQueue
            if not loads_only:
                queue = holding if holding else self._next_waiting_queue(take_async)
            elif take_async and async_waiting:
                queue = async_waiting
            else:
                if budget > 0 and (holding or waiting or async_waiting):
                    self._running_full(step)
                break
            if not queue:
                break
            request = queue.peek_request()
            rid = request.request_id
            if request.status == WAITING_FOR_REMOTE_KVS:
                if rid not in self.finished_recving_kv_req_ids:
                    if rid in self.failed_recving_kv_req_ids:
                        skip(queue, explain.REASON_KV_LOAD_FAILED,
                             "its asynchronous KV load failed; under kv_load_failure_policy="
                             "recompute it is looked up again once the worker reports it done")
                    else:
                        skip(queue, explain.REASON_WAITING_FOR_REMOTE_KVS,
                             "WAITING_FOR_REMOTE_KVS: its asynchronous KV load is in flight")
                    continue
                self._promote_loaded(request)
            passed_over = self._pass_over_reason(request, loras)
            if passed_over is not None:
                skip(queue, *passed_over)
                continue
            if self._held_by_policy(step, request):
                break
            num_external = 0
            load_async = False
            looked_up = request.num_computed_tokens == 0
            if looked_up:
                hit_blocks, num_local = kv.get_computed_blocks(request)
                ext, load_async = connector.get_num_new_matched_tokens(request, num_local)
                if ext is None:
                    skip(queue, explain.REASON_KV_LOOKUP_PENDING,
                         "the connector's get_num_new_matched_tokens said to ask again")
                    continue
                num_external = ext
                num_computed = num_local + ext
                if self._inflight_kv_load_cap is not None:
                    # A new lookup: an earlier load of its (a failed one)
                    # no longer counts against the cap.
                    self._inflight_kv_loads.discard(rid)
            else:
                hit_blocks, num_local = _NO_NEW_BLOCKS, 0
                num_computed = request.num_computed_tokens
            if (load_async and not self._admits_inflight_kv_load()) or (loads_only and not load_async):
                # Over the cap, or it needs the running slot or budget there
                # is none of: it waits at the head of its queue. From
                # async_kv_waiting the scan goes on with the other queues.
                if load_async:
                    detail = (f"its asynchronous KV load would be one more than "
                              f"max_num_inflight_kv_loads={self._inflight_kv_load_cap} "
                              f"({len(self._inflight_kv_loads)} loading or loaded and not yet "
                              f"running, {len(self._aborted_kv_loads)} aborted mid-load)"
                              if explaining else "")
                    if queue is not async_waiting:
                        self._stop_at(step, explain.REASON_KV_LOAD_CAP, request, detail)
                        break
                    step.async_stop = (explain.REASON_KV_LOAD_CAP, rid, detail)
                # (loads_only scans async_kv_waiting alone: queue is it here.)
                take_async = False
                continue
            padded = False
            encoding: _EncoderPlan | None = None
            if load_async:
                num_new = 0
            else:
                tokens = self._admission_tokens(step, request, num_computed, budget, threshold)
                if tokens is None:
                    break
                num_new, padded = tokens
                if request.mm_features and self.encoder_cache_manager is not None:
                    encoding = self._encoder_admission(step, request, num_computed, num_new,
                                                       partial(skip, queue))
                    if encoding is None:
                        continue
                    num_new = encoding.num_new_tokens
            reserved = (self._inflight_prefill_reserved_blocks() + self._spec_decode_step_blocks
                        if load_async else 0)
            if kv.allocate_slots(request, num_new, num_local, hit_blocks,
                                 full_sequence_must_fit=self.scheduler_config.scheduler_reserve_full_isl,
                                 num_lookahead_tokens=0 if load_async else self.num_lookahead_tokens,
                                 num_external_computed_tokens=num_external,
                                 delay_cache_blocks=load_async,
                                 reserved_blocks=reserved) is None:
                detail = self._kv_blocks_detail(reserved) if explaining else ""
                if loads_only:
                    # The requests not scanned wait for a running slot or
                    # budget; this one for blocks.
                    step.async_stop = (explain.REASON_KV_BLOCKS, rid, detail)
                    if budget > 0:
                        self._running_full(step)
                else:
                    self._stop_at(step, explain.REASON_KV_BLOCKS, request, detail)
                if load_async and self._nothing_frees_blocks(request):
                    self._kv_blocked_load = rid
                if encoding is not None:
                    # Not admitted after all (as in _schedule_waiting).
                    assert self.encoder_cache_manager is not None
                    self.encoder_cache_manager.free(request)
                break
            connector.update_state_after_alloc(request, kv.get_block_ids(rid), num_external)
            if num_external:
                loads[rid] = (num_external, load_async)
            if looked_up:
                kv.record_prefix_cache_stats(request, num_local)
            if load_async:
                request.status = WAITING_FOR_REMOTE_KVS
                request.num_computed_tokens = num_computed
                self._inflight_prefills[rid] = request
                if self._inflight_kv_load_cap is not None:
                    self._inflight_kv_loads.add(rid)
                skip(queue, explain.REASON_WAITING_FOR_REMOTE_KVS,
                     f"WAITING_FOR_REMOTE_KVS: asynchronous KV load of {num_external} tokens started")
                continue
            queue.pop_request()
            if self._inflight_kv_load_cap is not None:
                self._inflight_kv_loads.discard(rid)
            if self._admit(step, request, num_new, num_computed, padded, loras):
                self._inflight_prefills[rid] = request
            budget -= num_new
            if encoding is not None and encoding.inputs:
                self._allocate_encoder_inputs(step, request, encoding)
        if budget <= 0 and step.admission_stop is None and (holding or waiting or async_waiting):
            step.admission_stop = explain.REASON_TOKEN_BUDGET
            step.admission_stop_detail = f"token budget of {self.max_num_scheduled_tokens} used up"
        step.token_budget = budget
        # Back at the head of their queues, in their order.
        if skipped_holding:
            holding.prepend_requests(skipped_holding)
        for request in started_loads:
            holding.add_request(request)
        if skipped_waiting:
            waiting.prepend_requests(skipped_waiting)
        if skipped_async:
            async_waiting.prepend_requests(skipped_async)
        step.kv_skipped = bool(skipped_holding or skipped_waiting or skipped_async or started_loads)
        step.kv_loads = loads

    def _next_waiting_queue(self, take_async: bool) -> RequestQueue:
        """``waiting`` or ``async_kv_waiting``, whichever head comes first:
        by request order under the priority policy, else by strictly earlier
        arrival (a tie goes to ``waiting``); ``take_async`` False: waiting."""
        async_waiting = self.async_kv_waiting
        if not take_async or not async_waiting:
            return self.waiting
        if not self.waiting:
            return async_waiting
        a, w = async_waiting.peek_request(), self.waiting.peek_request()
        if self._priority:
            first = priority_order(a) < priority_order(w)
        else:
            first = a.arrival_time < w.arrival_time
        return async_waiting if first else self.waiting

    def _admits_inflight_kv_load(self) -> bool:
        """A new asynchronous load stays within max_num_inflight_kv_loads."""
        cap = self._inflight_kv_load_cap
        return cap is None or len(self._inflight_kv_loads) + len(self._aborted_kv_loads) < cap

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM 0.34's cache-aware admission, at the start of the waiting
        phase: once the KV cache usage reaches the threshold, the requests
        among the first ``window`` of ``waiting`` that merely wait (status
        WAITING, nothing computed) are put back into the same slots,
        deepest cached prefix first (a probe with nothing taken; the last
        token is never a hit), ties by position. The others keep their
        slots."""
        waiting = self.waiting
        if len(waiting) < 2 or self.kv_cache_manager.usage < self._cache_aware_threshold:
            return
        head = list(islice(waiting, self._cache_aware_window))
        slots = [i for i, r in enumerate(head) if r.status == WAITING and not r.num_computed_tokens]
        if len(slots) < 2:
            return
        probe = self.kv_cache_manager.get_computed_blocks
        cached = {i: probe(head[i])[1] for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order):
            reordered[slot] = head[source]
        assert isinstance(waiting, FCFSRequestQueue)  # the window is 0 under priority
        waiting.replace_head(reordered)

    def _kv_blocks_detail(self, reserved: int) -> str:
        """What holds the KV blocks an admission with a connector did not
        get (``--explain`` only)."""
        parts = [f"{self.kv_cache_manager.block_pool.get_num_free_blocks()} blocks free"]
        if reserved:
            parts.append(f"{reserved} reserved for prefills and loads in flight")
        held = [rid for rid, r in self.requests.items() if r.is_finished()]
        if held:
            parts.append(f"finished {', '.join(held)} hold theirs until their KV is sent "
                         "(delayed free)")
        return "; ".join(parts)

    def _nothing_frees_blocks(self, request: Request) -> bool:
        """Nothing but ``request`` could change the free blocks: none
        running, no step in flight, none finished holding its blocks
        (delayed free), no pending block frees, and every other request
        holding blocks while it waits queued behind ``request`` (the scan
        stops at ``request`` and never reaches them) with nothing left to
        report (its load, if any, already reported done: a load failing
        later could free its blocks)."""
        assert self.connector is not None
        if (self.running or self._in_flight or self.connector.has_pending_block_frees()
                or any(r.is_finished() for r in self.requests.values())):
            return False
        ahead = True
        for r in self.kv_holding_waiting:
            if r is request:
                ahead = False
            elif ahead or (r.status == WAITING_FOR_REMOTE_KVS
                           and r.request_id not in self.finished_recving_kv_req_ids):
                return False
        return True

    def _held_behind(self, request: Request) -> tuple[str, ...]:
        """The requests holding blocks while they wait behind ``request``."""
        return tuple(r.request_id for r in self.kv_holding_waiting if r is not request)

    def livelock(self) -> explain.Livelock | None:
        """The vLLM livelock this scheduler is in, read from its
        state (None when it is in none). vLLM keeps stepping in these for
        ever; the caller decides what to do (replay --explain says so, the
        simulator stops the engine). Exact, not a guess from idle steps:

        - a one-token prompt loading its only token again, after a first
          whole load reset it to 0 computed tokens: the connector answered
          the same lookup the same way, and will again once this load lands;
        - the last waiting scan stopped at an asynchronous load that did not
          fit while nothing ran, no step was in flight, no delayed free was
          pending, every other request holding blocks waited behind it with
          its load reported, and nothing has run since: the next scan sees
          the same free blocks and stops there again (a failed load under
          recompute that still counts its own reservation, or a remote read
          that never fits, as NIXL with drafts). The requests behind it are
          named too: the blocks they hold are the ones it lacks, and the
          scan never reaches them to let them run and free them.

        A load the worker fails every time (a script) is not recognised: it
        depends on the worker, not on the scheduler's state.
        """
        if self.connector is None:
            return None
        again = self._whole_one_token_loads
        whole = tuple(r.request_id for r in self.kv_holding_waiting
                      if r.request_id in again and r.status == WAITING_FOR_REMOTE_KVS
                      and r.num_tokens == 1 and r.num_computed_tokens == 1
                      and r.request_id not in self.failed_recving_kv_req_ids)
        if whole:
            return explain.Livelock(explain.LIVELOCK_WHOLE_ONE_TOKEN_LOAD, whole,
                                    self.scheduler_config.vllm_version)
        rid = self._kv_blocked_load
        request = self.requests.get(rid) if rid is not None else None
        if (request is None or request.status not in (WAITING, PREEMPTED)
                or not self._nothing_frees_blocks(request)):
            return None
        rid = request.request_id
        kind = (explain.LIVELOCK_FAILED_LOAD_SELF_RESERVED if rid in self._inflight_prefills
                else explain.LIVELOCK_REMOTE_READ_NEVER_FITS)
        return explain.Livelock(kind, (rid, *self._held_behind(request)),
                                self.scheduler_config.vllm_version)

    def _promote_loaded(self, request: Request) -> None:
        """An asynchronous load reported done: cache what it loaded (after a
        failure, what is valid; with nothing valid its blocks are freed and
        it is looked up again), and leave the last token to compute when it
        loaded everything. It waits (or, once preempted, is resumed) as
        any other request from here on."""
        rid = request.request_id
        kv = self.kv_cache_manager
        if rid in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.remove(rid)
            if request.num_computed_tokens:
                kv.cache_blocks(request, request.num_computed_tokens)
            else:
                kv.free(request)
        else:
            kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            if request.num_tokens == 1:
                self._whole_one_token_loads.add(rid)
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(rid)
        request.status = PREEMPTED if request.num_preemptions else WAITING

    def _connector_after_schedule(self, output: SchedulerOutput, step: _Step) -> None:
        """After a schedule() with a connector: the loads it started, the
        worker's metadata, the fence of deferred frees, and which requests
        are still prefilling."""
        assert self.connector is not None
        output.kv_loads = step.kv_loads
        output.kv_connector_metadata = self.connector.build_connector_meta(output)
        requests = self.requests
        if self.defer_block_free and output.total_num_scheduled_tokens > 0:
            self.sched_step_seq += 1
            seq = self.sched_step_seq
            for rid in output.num_scheduled_tokens:
                requests[rid].last_sched_seq = seq
        inflight = self._inflight_prefills
        if inflight:
            for rid in output.num_scheduled_tokens:
                if not requests[rid].is_prefill_chunk:
                    inflight.pop(rid, None)

    def _async_stop_reasons(self, step: _Step) -> dict[str, tuple[str, str]] | None:
        """The step's reasons for passed-over requests, plus, when
        async_kv_waiting stopped at its head while the scan went on, why its
        head stayed and that the others wait behind it (``--explain``)."""
        if step.async_stop is None:
            return step.skip_reasons
        reason, head, detail = step.async_stop
        reasons = dict(step.skip_reasons or {})
        for r in self.async_kv_waiting:
            rid = r.request_id
            if rid not in reasons:
                reasons[rid] = (reason, detail) if rid == head else (
                    reason, f"queued behind {head} in async_kv_waiting")
        return reasons

    def _skip(self, step: _Step, reason: str, detail: str) -> None:
        """Pass over the head of the waiting queue for this step."""
        request = self.waiting.pop_request()
        if step.skipped is None:
            step.skipped = []
            step.skip_reasons = {}
        step.skipped.append(request)
        assert step.skip_reasons is not None
        step.skip_reasons[request.request_id] = (reason, detail)

    @staticmethod
    def _stop_at(step: _Step, reason: str, request: Request, detail: str) -> None:
        step.admission_stop = reason
        step.admission_stop_at = request.request_id
        step.admission_stop_detail = detail

    def _make_output(self, step: _Step) -> SchedulerOutput:
        """Phase 3: the SchedulerOutput for the runner."""
        get_block_ids = self.kv_cache_manager.get_block_ids
        admitted = step.computed_at_admission
        cached = CachedRequestData(
            req_ids=step.running_req_ids,
            new_block_ids=step.new_block_ids,
        )
        if self.runner_inputs:
            new_reqs = [
                NewRequestData(r.request_id, r.prompt_token_ids, get_block_ids(r.request_id),
                               admitted[r.request_id], r.sampling_params)
                for r in step.new_reqs
            ]
            for r in step.resumed_reqs:
                rid = r.request_id
                cached.req_ids.append(rid)
                cached.resumed_req_ids.add(rid)
                cached.new_block_ids[rid] = get_block_ids(rid)
                cached.num_computed_tokens[rid] = admitted[rid]
                cached.resumed_token_ids[rid] = list(r.all_token_ids)
        else:
            new_reqs = [NewRequestData(r.request_id, [], [], admitted[r.request_id], r.sampling_params)
                        for r in step.new_reqs]
            for r in step.resumed_reqs:
                rid = r.request_id
                cached.req_ids.append(rid)
                cached.resumed_req_ids.add(rid)
                cached.num_computed_tokens[rid] = admitted[rid]
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=step.num_scheduled_tokens,
            # Exact: every change to the budget is mirrored in the dict (seed 000).
            total_num_scheduled_tokens=self.max_num_scheduled_tokens - step.token_budget,
            preempted_req_ids={r.request_id for r in step.preempted},
            finished_req_ids=self.finished_req_ids,
            admission_stop=step.admission_stop,
        )
        if step.spec:
            output.scheduled_spec_decode_tokens = step.spec
        if self.encoder_cache_manager is not None:
            if step.encoder_inputs:
                output.scheduled_encoder_inputs = step.encoder_inputs
            output.free_encoder_mm_hashes = self.encoder_cache_manager.get_freed_mm_hashes()
        if step.prefill_chunks:
            chunks = set(step.prefill_chunks)
            if step.unscheduled is not None:
                chunks.difference_update(step.unscheduled)
            output.prefill_chunk_req_ids = chunks
        if step.unscheduled is not None:
            output.unscheduled_req_ids = step.unscheduled
        if self.explain_admission:
            head = step.admission_stop_at if step.admission_stop in (
                explain.REASON_KV_BLOCKS, explain.REASON_CHUNKED_PREFILL_OFF,
                explain.REASON_ADMISSION_POLICY) else None
            queued: Iterable[Request] = (self.waiting if self.connector is None else chain(
                self.kv_holding_waiting, self.waiting, self.async_kv_waiting))
            output.not_admitted = explain.explain_waiting(
                queued, step.admission_stop, step.admission_stop_detail, head,
                self._async_stop_reasons(step))
        self.finished_req_ids = set()
        return output

    # -- after the model ran --------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, apply stop checks, free finished requests.

        The runner's output is checked against the step it answers
        (``_check_step``, then per entry below); a bad one raises
        ValueError/TypeError and leaves the scheduler exactly as it was.
        The rules: the output answers the last schedule() (each is applied
        once, in order; a step that scheduled nothing needs none); it has
        one entry per scheduled request; a request that reached the end of
        its sequence samples exactly one token (no drafts are scheduled),
        one still mid-prefill samples none; token ids are ints below the
        vocabulary. A request aborted after schedule() may have anything
        well-typed: its tokens are dropped."""
        self._check_step(scheduler_output, model_runner_output)
        if self.connector is not None:
            return self._update_from_output_connector(scheduler_output, model_runner_output)
        if not self._plain:
            return self._update_from_output_general(scheduler_output, model_runner_output)
        req_ids = model_runner_output.req_ids
        sampled = model_runner_output.sampled_token_ids
        get_request = self.requests.get
        limit = self.token_limit
        stopped: list[Request] = []
        dropped: list[str] = []
        # One pass checks each entry and appends its token (a second,
        # checking-only pass would cost a sixth of the step). An entry found
        # bad undoes the appends before it; the stop checks and the freeing
        # wait until every entry has passed.
        # Builtins and globals as locals: looked up once, not per request.
        type_, len_, list_, int_, running = type, len, list, int, RUNNING
        for rid, new_token_ids in zip(req_ids, sampled):
            request = get_request(rid)
            if request is None or request.status is not running:
                # Aborted between schedule() and now (its id may even have
                # been reused by a new, still waiting request): dropped.
                if type(new_token_ids) is not list or _bad_tokens(new_token_ids, limit):
                    self._undo_samples(req_ids[:req_ids.index(rid)])
                    self._bad_entry(rid, new_token_ids, None)
                if new_token_ids:
                    dropped.append(rid)
                continue
            if type_(new_token_ids) is list_ and len_(new_token_ids) == 1 and not request.is_prefill_chunk:
                token = new_token_ids[0]
                if type_(token) is int_ and 0 <= token < limit:
                    # Request.append_output, inlined (a call per request
                    # costs a tenth of this loop).
                    request.output_token_ids.append(token)
                    if not request._outputs_in_all:
                        request.all_token_ids.append(token)
                    request.num_tokens += 1
                    if token in request.all_stop_ids or request.num_tokens >= request.stop_len:
                        stopped.append(request)
                    continue
            elif type(new_token_ids) is list and not new_token_ids and request.is_prefill_chunk:
                continue  # mid-way through a chunked prefill
            self._undo_samples(req_ids[:req_ids.index(rid)])
            self._bad_entry(rid, new_token_ids, request)
        if scheduler_output.num_scheduled_tokens:
            self._in_flight.popleft()
        finished: list[EngineCoreOutput] = []
        if stopped:
            # A single token was appended: the checks set the status and reason.
            finished = self._finish_stopped([(r, self.apply_stop_checks(r, [r.output_token_ids[-1]]))
                                             for r in stopped])
        return EngineCoreOutputs(model_runner_output, finished, dropped)

    def _check_step(self, scheduler_output: SchedulerOutput,
                    model_runner_output: ModelRunnerOutput) -> None:
        """The whole-output rules of update_from_output: types, the step it
        answers, one entry per scheduled request."""
        if not isinstance(scheduler_output, SchedulerOutput):
            raise TypeError(f"scheduler_output={scheduler_output!r:.80}: must be the "
                            "SchedulerOutput that schedule() returned")
        if not isinstance(model_runner_output, ModelRunnerOutput):
            raise TypeError(f"model_runner_output={model_runner_output!r:.80}: must be a "
                            "ModelRunnerOutput")
        num_scheduled = scheduler_output.num_scheduled_tokens
        req_ids = model_runner_output.req_ids
        sampled = model_runner_output.sampled_token_ids
        if type(req_ids) is not list or type(sampled) is not list:
            raise TypeError("model_runner_output: req_ids and sampled_token_ids must be lists "
                            f"(got {type(req_ids).__name__} and {type(sampled).__name__})")
        if (not self._in_flight or scheduler_output is not self._in_flight[0]) and (
                num_scheduled or req_ids or sampled):
            raise UserInputError("update_from_output: this SchedulerOutput is not the step awaiting its "
                             "result (it was applied already, is from a later or an earlier step, "
                             "or from another scheduler); apply each step's output once, in order")
        if len(req_ids) != len(num_scheduled) or len(sampled) != len(req_ids) or (
                list(num_scheduled) != req_ids and (
                    not all(type(r) is str for r in req_ids) or set(num_scheduled) != set(req_ids))):
            raise UserInputError(
                "model_runner_output: req_ids/sampled_token_ids must cover exactly the "
                f"{len(num_scheduled)} scheduled requests (got {len(req_ids)} ids, "
                f"{len(sampled)} token lists); pass one entry per scheduled request")

    def _receives_output(self, request: Request | None) -> bool:
        """Whether a step's output for ``request`` is applied: it runs, or it
        was preempted while the step was in flight (its "stale" output still
        arrives). Finished or aborted requests are gone; a waiting request
        under the same id is another request."""
        return request is not None and (request.status is RUNNING or (
            request.status is PREEMPTED and request.num_stale_output_tokens > 0))

    def _update_from_output_general(self, scheduler_output: SchedulerOutput,
                                    model_runner_output: ModelRunnerOutput,
                                    skip: set[str] | None = None) -> EngineCoreOutputs:
        """update_from_output with drafts or placeholders (vLLM's loop):
        accepted drafts are appended with the sampled token and rejected ones
        roll num_computed_tokens (and placeholders) back; under async
        scheduling the batch's tokens leave the in-flight count, and the
        output of a request preempted meanwhile is appended without moving
        its reset counters. Every entry is checked before anything changes.
        ``skip``: requests whose output is discarded (a failed KV load)."""
        num_scheduled = scheduler_output.num_scheduled_tokens
        entries = _entries_in_order(num_scheduled, model_runner_output)
        spec = scheduler_output.scheduled_spec_decode_tokens
        chunks = scheduler_output.prefill_chunk_req_ids
        get_request = self.requests.get
        receives = self._receives_output
        limit = self.token_limit
        # Pass 1 checks every entry (nothing changes if one is bad) and
        # finds each entry's request: None when its output is dropped.
        targets: list[Request | None] = []
        len_, type_, list_, int_, running = len, type, list, int, RUNNING
        for rid, entry in zip(num_scheduled, entries):
            # One int token in range (the common entry) checked inline.
            if not (type_(entry) is list_ and len_(entry) == 1 and type_(entry[0]) is int_
                    and 0 <= entry[0] < limit):
                _check_token_list(f"model_runner_output: sampled_token_ids for {rid}", entry, limit)
            request = get_request(rid)
            if request is None or (request.status is not running and not receives(request)):
                targets.append(None)
                continue
            targets.append(request)
            if rid in chunks:
                if entry:
                    raise _mid_prefill_error(rid, entry)
                continue
            n = len_(entry)
            if n != 1 or spec:
                num_drafts = len(spec.get(rid, ()))
                if not 1 <= n <= 1 + num_drafts:
                    raise UserInputError(
                        f"model_runner_output: {rid} samples 1 token plus its accepted drafts "
                        f"({num_drafts} were scheduled), so 1 to {1 + num_drafts} tokens, got {n}")
        if num_scheduled:
            self._in_flight.popleft()
        if skip:
            # Discarded as an aborted request's would be (the caller moves
            # their in-flight counts): one pass here, none per request below.
            targets = [None if t is not None and t.request_id in skip else t for t in targets]
        stats: SpecDecodingStats | None = None
        stopped: list[tuple[Request, int]] = []
        waiting_stops: list[Request] = []
        dropped: list[str] = []
        track_flight = self._overlap
        num_spec = self.num_spec_tokens
        kv = self.kv_cache_manager
        caching = kv.enable_caching
        num_cached_block = kv.num_cached_block
        bs = self.block_size
        cache_after_output = self._cache_after_output
        encoder = self.encoder_cache_manager is not None
        for (rid, n_sched), entry, request in zip(num_scheduled.items(), entries, targets):
            if request is None:
                if entry:
                    dropped.append(rid)
                continue
            stale = False
            if track_flight:
                request.num_in_flight_tokens -= n_sched
                if request.num_stale_output_tokens > 0:
                    stale = True
                    request.num_stale_output_tokens -= n_sched
                    if request.drop_stale_output:
                        continue  # a producer connector's preemption drops it
            if not entry:
                if encoder and request.mm_features:
                    self._free_encoder_inputs(request)
                continue
            drafts = spec.get(rid) if spec else None
            if drafts:
                num_accepted = len_(entry) - 1
                num_rejected = len_(drafts) - num_accepted
                if not stale:
                    if request.num_computed_tokens > 0:
                        request.num_computed_tokens -= num_rejected
                    if request.num_output_placeholders > 0:
                        request.num_output_placeholders -= num_rejected
                if stats is None:
                    stats = SpecDecodingStats(num_spec)
                stats.observe_draft(len_(drafts), num_accepted)
            if encoder and request.mm_features:
                # After the rollback, before the tokens land (vLLM's order).
                self._free_encoder_inputs(request)
            had_placeholders = request.num_output_placeholders > 0
            was_running = request.status is running
            kept = 0
            n = len_(entry)
            if n == 1 and request.num_tokens + 1 < request.stop_len and (
                    entry[0] not in request.all_stop_ids):
                # One token that cannot stop the request: Request.append_output, inlined.
                token = entry[0]
                request.output_token_ids.append(token)
                if not request._outputs_in_all:
                    request.all_token_ids.append(token)
                request.num_tokens += 1
            elif request.num_tokens + n < request.stop_len and request.all_stop_ids.isdisjoint(entry):
                request.extend_output(entry)  # no stop among them: in one go
            else:
                for kept_so_far, token in enumerate(entry, 1):
                    request.append_output(token)
                    if (token in request.all_stop_ids or request.num_tokens >= request.stop_len) \
                            and self._check_stop(request, token):
                        kept = kept_so_far
                        if not stale:
                            request.num_computed_tokens -= n - kept
                        break
            if not stale:
                if request.num_output_placeholders > 0:
                    request.num_output_placeholders -= n
                # Blocks whose tokens became known enter the prefix cache.
                if caching and was_running and (had_placeholders or num_spec or cache_after_output) and (
                        (request.num_computed_tokens - request.num_in_flight_tokens) // bs
                        > num_cached_block.get(rid, 0)):
                    kv.cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if kept:
                if encoder and request.mm_features:
                    # Freed here, not with the blocks: the order entries
                    # become freeable is the eviction order.
                    assert self.encoder_cache_manager is not None
                    self.encoder_cache_manager.free(request)
                stopped.append((request, kept))
                if not was_running:
                    waiting_stops.append(request)
        finished = self._finish_stopped(stopped, waiting_stops) if stopped else []
        return EngineCoreOutputs(model_runner_output, finished, dropped, stats)

    def _update_from_output_connector(self, scheduler_output: SchedulerOutput,
                                      model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """update_from_output with a KV connector: failed loads first (their
        requests' computed tokens cut, their output discarded), then the
        usual update, then the error finishes (``fail`` policy) and the
        transfers the worker reported done."""
        kv_output = model_runner_output.kv_connector_output
        if self.defer_block_free and scheduler_output.total_num_scheduled_tokens > 0:
            self.processed_step_seq += 1
            self._drain_deferred_frees()
        failed: set[str] = set()
        if kv_output is not None:
            if kv_output.failed_recving:
                failed |= self._handle_failed_recving(kv_output.failed_recving)
            if kv_output.invalid_block_ids:
                failed |= self._handle_invalid_blocks(kv_output.invalid_block_ids,
                                                      scheduler_output.num_scheduled_tokens)
        if failed and self._overlap:
            requests = self.requests
            for rid, n in scheduler_output.num_scheduled_tokens.items():
                if rid in failed and rid in requests:
                    requests[rid].num_in_flight_tokens -= n
                    self._dropped_placeholder_ids.add(rid)
        results = self._update_from_output_general(scheduler_output, model_runner_output, failed)
        if failed and results.dropped:
            results.dropped = [rid for rid in results.dropped if rid not in failed]
        if failed and not self.recompute_kv_load_failures:
            for request in self.finish_requests(sorted(failed), RequestStatus.FINISHED_ERROR):
                results.finished.append(EngineCoreOutput(
                    request.request_id, [], FINISH_REASONS[request.status], None))
        if kv_output is not None:
            self._update_from_kv_xfer_finished(kv_output)
        return results

    def _handle_failed_recving(self, failed_req_ids: set[str]) -> set[str]:
        """Loads that failed as a whole (only asynchronous ones count):
        under ``recompute`` nothing of them is computed; under ``fail``
        their ids are returned (they finish with an error)."""
        affected: set[str] = set()
        for rid in sorted(failed_req_ids):
            request = self.requests.get(rid)
            if request is not None and request.status == WAITING_FOR_REMOTE_KVS:
                affected.add(rid)
                if self.recompute_kv_load_failures:
                    request.num_computed_tokens = 0
                    self.failed_recving_kv_req_ids.add(rid)
        return set() if self.recompute_kv_load_failures else affected

    def _handle_invalid_blocks(self, invalid_block_ids: set[int],
                               num_scheduled: dict[str, int]) -> set[str]:
        """Blocks whose load failed: each affected request's computed tokens
        are cut to its first invalid block. Returns the requests whose
        output is discarded: under ``fail`` all affected (they finish with
        an error, the invalid blocks and those after them leave the prefix
        cache), under ``recompute`` the running ones (asynchronous loads
        keep their valid prefix when promoted)."""
        loading = [r for r in self.kv_holding_waiting if r.status == WAITING_FOR_REMOTE_KVS]
        async_ids, _ = self._cut_at_invalid_blocks(loading, invalid_block_ids, num_scheduled)
        sync_ids, evict = self._cut_at_invalid_blocks(self.running, invalid_block_ids, num_scheduled)
        if not async_ids and not sync_ids:
            return set()
        if not self.recompute_kv_load_failures:
            # The failed blocks and those after them, in every table cut,
            # leave the prefix cache by id (also where other tables or
            # blocks waiting for a deferred free share them).
            manager = self.kv_cache_manager
            evicted: set[int] = set()
            for request, first in evict:
                evicted.update(manager.req_to_blocks[request.request_id][first:])
            manager.evict_blocks(evicted, self.requests)
            frees = self.deferred_frees
            for i in range(len(frees)):
                seq, blocks, num_cached = frees[i]
                frees[i] = (seq, blocks, manager.popped_after_eviction(blocks, num_cached, evicted))
            return async_ids | sync_ids
        self.failed_recving_kv_req_ids |= async_ids
        return sync_ids

    def _cut_at_invalid_blocks(self, requests: Iterable[Request], invalid_block_ids: set[int],
                               num_scheduled: dict[str, int]
                               ) -> tuple[set[str], list[tuple[Request, int]]]:
        """Cut each request's computed tokens (before the processed batch) at
        its first invalid block; a block shared with an earlier request of
        the list is recomputed by that one. Returns the affected ids and,
        per request cut, the index of its first invalid block."""
        affected: set[str] = set()
        cuts: list[tuple[Request, int]] = []
        marked: set[int] = set()
        bs = self.block_size
        table = self.kv_cache_manager.req_to_blocks
        for request in requests:
            rid = request.request_id
            computed = request.num_computed_tokens - num_scheduled.get(rid, 0)
            blocks = table.get(rid, _NO_NEW_BLOCKS)
            hit = False
            cut = False
            for idx, block in enumerate(blocks[:-(-computed // bs)]):
                if block not in invalid_block_ids:
                    continue
                hit = True
                if block in marked:
                    continue
                marked.add(block)
                if cut:
                    continue
                cut = True
                request.num_computed_tokens = idx * bs
                cuts.append((request, idx))
            if hit:
                if not cut:
                    request.num_computed_tokens = computed
                affected.add(rid)
        return affected, cuts

    def _update_from_kv_xfer_finished(self, kv_output: KVConnectorOutput) -> None:
        """Transfers the worker reported done: a finished load lets its
        request be promoted by the next schedule() (or, if the request was
        aborted meanwhile, frees its blocks); a finished send frees the
        blocks a finished request's connector held."""
        assert self.connector is not None
        self.connector.update_connector_output(kv_output)
        requests = self.requests
        for rid in sorted(kv_output.finished_recving):
            request = requests[rid]
            if request.status == WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert request.is_finished(), f"{rid} reported loaded while {request.status.name}"
                self._aborted_kv_loads.discard(rid)
                self._free_blocks(request)
        for rid in sorted(kv_output.finished_sending):
            self._free_blocks(requests[rid])

    @staticmethod
    def _check_stop(request: Request, token: int) -> bool:
        """vLLM's check_stop after appending ``token``: EOS, stop ids, then
        the length cap. Sets the finished status; True if the request stops."""
        if token == request.eos_token_id:
            request.status = STOPPED
        elif token in request.stop_token_ids:
            request.status = STOPPED
            request.stop_reason = token
        elif request.num_tokens >= request.stop_len:
            request.status = LENGTH_CAPPED
        else:
            return False
        return True

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Drafts proposed after the last step (synchronous scheduling), to
        verify in each request's next step: vLLM's update_draft_token_ids.
        Ids of requests that finished meanwhile are ignored, and so are the
        drafts of a request still mid-prefill. Bad input raises before
        anything changes."""
        if not self.num_spec_tokens:
            raise UserInputError("update_draft_token_ids: this scheduler has no speculative decoding; "
                             "build it with speculative_config=SpeculativeConfig(...)")
        if self.async_scheduling:
            raise UserInputError("update_draft_token_ids: under async scheduling the scheduler counts "
                             "drafts as placeholders and the runner keeps the real ones (vLLM's "
                             "engine never calls it then); do not pass drafts")
        if self._in_flight:
            raise UserInputError("update_draft_token_ids: a step is in flight; drafts are proposed after "
                             "its output was applied with update_from_output")
        if not isinstance(draft_token_ids, DraftTokenIds):
            raise TypeError(f"draft_token_ids={draft_token_ids!r:.80}: must be a DraftTokenIds")
        req_ids, drafts = draft_token_ids.req_ids, draft_token_ids.draft_token_ids
        if type(req_ids) is not list or type(drafts) is not list or len(req_ids) != len(drafts):
            raise UserInputError("draft_token_ids: req_ids and draft_token_ids must be lists of the same "
                             "length (one list of drafts per request)")
        k = self.num_spec_tokens
        limit = self.token_limit
        get_request = self.requests.get
        targets: list[Request | None] = []
        for rid, tokens in zip(req_ids, drafts):
            if type(rid) is not str:
                raise TypeError(f"draft_token_ids: {rid!r:.80} is not a request id; ids are str")
            _check_token_list(f"draft_token_ids: drafts for {rid}", tokens, limit)
            if len(tokens) > k:
                raise UserInputError(f"draft_token_ids: {len(tokens)} drafts for {rid}, but "
                                 f"num_speculative_tokens is {k}; propose at most {k}")
            request = get_request(rid)
            if request is not None and request.status is not RUNNING:
                if request.is_finished():
                    # Finished in the step just applied, its blocks held by
                    # a KV connector (a delayed free): skipped, as in vLLM.
                    request = None
                else:
                    raise UserInputError(f"draft_token_ids: {rid} is not running "
                                         f"({request.status.name}); drafts are for the requests "
                                         "of the step just applied")
            targets.append(request)
        for request, tokens in zip(targets, drafts):
            if request is None:
                continue  # finished in the step just applied
            if request.is_prefill_chunk:
                request.spec_token_ids = NO_DRAFTS
            else:
                request.spec_token_ids = list(tokens) if tokens else NO_DRAFTS

    def _undo_samples(self, req_ids: list[str]) -> None:
        """Take back the tokens update_from_output appended for ``req_ids``
        (the entries before a bad one, all of which passed)."""
        get_request = self.requests.get
        for rid in req_ids:
            request = get_request(rid)
            if request is not None and request.status is RUNNING and not request.is_prefill_chunk:
                request.pop_output()

    def _bad_entry(self, rid: str, new_token_ids: object, request: Request | None) -> None:
        """Raise the error for a bad entry of a runner output (``request``:
        the running request it belongs to, or None if that was aborted)."""
        if type(new_token_ids) is not list:
            raise TypeError(f"model_runner_output: sampled_token_ids for {rid} must be a list of "
                            f"token ids, got {type(new_token_ids).__name__}")
        check_token_ids(f"model_runner_output: tokens for {rid}", new_token_ids, self.token_limit)
        assert request is not None, "unreachable: a well-typed entry of an aborted request"
        if request.is_prefill_chunk:
            raise UserInputError(
                f"model_runner_output: {rid} is mid-way through its prefill this step "
                f"({request.num_computed_tokens} of {request.num_tokens} tokens computed) and "
                f"samples no token, got {new_token_ids!r:.80}; pass []")
        raise UserInputError(
            f"model_runner_output: {rid} samples exactly one token this step (no draft "
            f"tokens were scheduled), got {len(new_token_ids)}; pass [token_id]")

    def _finish_stopped(self, stopped: list[tuple[Request, int]],
                        preempted: Sequence[Request] = ()) -> list[EngineCoreOutput]:
        """Take requests that stopped this step (and the tokens each kept) out
        of ``running`` (``preempted``: those of them that were waiting) and
        free them, in order."""
        # Freed slots and blocks matter only to requests that wait.
        self.decode_stable = self.decode_stable and not self.waiting
        if preempted:
            # Preempted while their step was in flight (async), they stopped
            # on its output: they leave the waiting queue.
            self.waiting.remove_requests(preempted)
        if len(stopped) == 1 and not preempted:
            self.running.remove(stopped[0][0])
        elif len(stopped) > len(preempted):
            drop = {id(r) for r, _ in stopped}
            self.running = [r for r in self.running if id(r) not in drop]
        finished: list[EngineCoreOutput] = []
        for request, kept in stopped:
            finished.append(EngineCoreOutput(
                request.request_id, request.output_token_ids[-kept:],
                FINISH_REASONS[request.status], request.stop_reason))
            self._free_request(request)
        return finished

    @staticmethod
    def apply_stop_checks(request: Request, new_token_ids: list[int]) -> int:
        """The stop checks in vLLM's order, token by token (a single token was
        appended already by the caller). Tokens sampled past a stop are
        dropped. If the request stopped, sets its status and returns how many
        of the tokens it kept; else returns 0."""
        single = len(new_token_ids) == 1
        for num_appended, token in enumerate(new_token_ids, 1):
            if not single:
                request.append_output(token)
            if Scheduler._check_stop(request, token):
                request.num_computed_tokens -= len(new_token_ids) - num_appended
                return num_appended
        return 0

    # -- what fast-forward changes (kvsched.core.fast_forward) ----------------
    def take_finished_req_ids(self) -> set[str]:
        """The ids finished since the last schedule(), handed over as that
        call would hand them to its output (the set starts afresh)."""
        finished = self.finished_req_ids
        self.finished_req_ids = set()
        return finished

    def replace_in_flight(self, output: SchedulerOutput | None) -> None:
        """Put ``output`` in place of the oldest step in flight, or, given
        None, drop it: a decode stretch (kvsched.core.fast_forward) applied
        that step and the ones after it, and leaves its last batch, if any,
        in flight."""
        if not self._in_flight:
            raise UserInputError("replace_in_flight: no step is in flight")
        if output is None:
            self._in_flight.popleft()
        else:
            self._in_flight[0] = output

    def finish_stopped(self, stopped: list[tuple[Request, int]]) -> list[EngineCoreOutput]:
        """Finish running requests that stopped (each with the number of
        its last tokens it kept; ``apply_stop_checks`` set their status) as
        ``update_from_output`` does: out of ``running``, freed, in order."""
        return self._finish_stopped(stopped) if stopped else []

    # -- checking -------------------------------------------------------------
    def check_invariants(self) -> None:
        running_ids = [r.request_id for r in self.running]
        waiting_ids = [r.request_id for r in self.waiting]
        assert len(set(running_ids)) == len(running_ids), "a request runs twice"
        assert len(set(waiting_ids)) == len(waiting_ids), "a request waits twice"
        assert not set(running_ids) & set(waiting_ids), "a request both runs and waits"
        # KV connector: waiting requests holding blocks, and finished ones
        # whose blocks it holds (delayed frees).
        holding_ids = [r.request_id for r in self.kv_holding_waiting]
        async_ids = [r.request_id for r in self.async_kv_waiting]
        held_ids = {rid for rid, r in self.requests.items() if r.is_finished()}
        assert not set(holding_ids) & (set(running_ids) | set(waiting_ids)), "a request waits twice"
        assert not set(async_ids) & (set(running_ids) | set(waiting_ids) | set(holding_ids)), (
            "a request waits twice")
        assert (set(running_ids) | set(waiting_ids) | set(holding_ids) | set(async_ids) | held_ids
                == set(self.requests)), "a request was lost"
        for r in self.async_kv_waiting:
            # Only fresh requests go there, and leave it to run or to load.
            assert r.status == WAITING and r.num_computed_tokens == 0 and not r.num_preemptions, (
                f"{r.request_id} waits for an asynchronous load as {r.status.name}")
            assert r.request_id not in self.kv_cache_manager.req_to_blocks, (
                f"{r.request_id} holds KV blocks in async_kv_waiting")
        if self._inflight_kv_load_cap is not None:
            for rid in self._inflight_kv_loads:
                assert any(r.request_id == rid for r in self.kv_holding_waiting), (
                    f"{rid} counts as an asynchronous KV load in flight but is not waiting on one")
            for rid in self._aborted_kv_loads:
                assert rid in self.requests and self.requests[rid].is_finished(), (
                    f"{rid} counts as an aborted KV load but is not finished and held")
        for r in self.kv_holding_waiting:
            assert r.status in (WAITING, PREEMPTED, WAITING_FOR_REMOTE_KVS), (
                f"{r.request_id} holds KV blocks while waiting as {r.status.name}")
        assert len(self.running) <= self.max_num_running_reqs, "max_num_seqs exceeded"
        # Drafts of the steps in flight are computed but not yet verified.
        unverified = self.num_spec_tokens * len(self._in_flight)
        for r in self.running:
            assert r.status == RUNNING, f"{r.request_id} in running with status {r.status.name}"
            assert len(r.all_token_ids) == r.num_tokens
            assert r.num_computed_tokens <= r.num_tokens + r.num_output_placeholders + unverified, (
                f"{r.request_id}: {r.num_computed_tokens} computed of {r.num_tokens} tokens")
            assert r.num_tokens == r.num_prompt_tokens + len(r.output_token_ids)
            assert r.num_stale_output_tokens == 0, f"{r.request_id} runs with stale output"
            assert r.num_output_placeholders >= 0
            assert r.num_output_placeholders <= r.num_in_flight_tokens + self.num_spec_tokens \
                or r.request_id in self._dropped_placeholder_ids, (
                    f"{r.request_id}: {r.num_output_placeholders} placeholders, "
                    f"{r.num_in_flight_tokens} tokens in flight")
            assert len(r.spec_token_ids) <= self.num_spec_tokens
        for r in self.waiting:
            assert r.status in (WAITING, PREEMPTED), f"{r.request_id} waits as {r.status.name}"
            assert r.num_computed_tokens == 0
            assert r.num_output_placeholders == 0 and not r.spec_token_ids
            assert 0 <= r.num_stale_output_tokens == r.num_in_flight_tokens
            assert r.request_id not in self.kv_cache_manager.req_to_blocks, (
                f"waiting {r.request_id} holds KV blocks")
        self.waiting.check_invariants()
        if self.encoder_cache_manager is not None:
            self.encoder_cache_manager.check_invariants(
                {rid for rid, r in self.requests.items() if not r.is_finished()})
        live: dict[str, int] = {}
        for r in self.requests.values():
            for identifier in {f.identifier for f in r.mm_features}:
                live[identifier] = live.get(identifier, 0) + 1
        assert {i: e[1] for i, e in self._mm_num_embeds.items()} == live, "mm identifiers not in flight"
        if self.deferred_frees:
            return  # blocks on their way back are in no table
        self.kv_cache_manager.check_invariants(
            set(self.requests), {rid for rid, r in self.requests.items() if r.private})
