"""vLLM's OffloadingConnector, scheduler side, with the CPU tier
(kvsched.core.offloading_manager): KV offloading to CPU memory. 0.33 and
0.34 (kvsched.vllm_versions: the store threshold counted once per request, a
finished request's stores capped at its computed tokens, failed transfers).

What it does, rebuilt from vLLM's behaviour (one full-attention KV group):

- Chunks: ``blocks_per_chunk`` GPU blocks make one CPU chunk, keyed by the
  prefix-cache hash of its last block. Only prompt tokens are stored
  (vLLM's ``offload_prompt_only`` default).
- Stores: every batch, each scheduled (or just finished) request offers the
  complete prompt chunks its computed tokens cover that it has not offered
  yet; the CPU manager takes those it lacks (evicting if it must) and the
  batch's metadata carries one store job per request. A store the manager
  cannot place is dropped and offered again next batch.
- Loads: at admission the connector looks up the consecutive CPU chunks
  past the local prefix-cache hit; a hit is loaded asynchronously (the
  request waits in WAITING_FOR_REMOTE_KVS), or synchronously when it fits
  the step's ``sync_load_budget_tokens`` and leaves a token to compute. A
  lookup that meets a chunk still being stored, or (with prefix caching) a
  chunk another request is loading, asks again next step; so does one for
  a request with transfers in flight.
- Fences: a preempted request's in-flight jobs, and a finished request's
  stores whose GPU blocks were handed out again this batch, are listed in
  ``jobs_to_flush`` (the worker waits for them before the batch runs).
- The worker reports completed job ids (vLLM's OffloadingWorkerMetadata)
  in :class:`OffloadingWorkerMeta`. From 0.34 on it also reports which of
  them failed: a failed asynchronous load's request is in failed_recving
  (the scheduler's load-failure policy applies) and the connector never
  looks it up again (no hit, also after a preemption); a failed store's
  chunks are dropped from the CPU cache.

Not rebuilt: several KV groups (sliding window, Mamba, EAGLE drafter
groups and the partial-tail loads they enable), ``offload_prompt_only``
off, prefix-cache retention intervals, cache resets, KV events, metrics,
tiered backends; kvsched's n-gram drafters need none of the EAGLE rules,
and its requests have no prompt logprobs (vLLM 0.34 skips the lookup of a
request with ``skip_reading_external_kv``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_cache_manager import KVCacheManager
from kvsched.core.kv_connector import KVConnectorBase, KVConnectorOutput, KVTransferConfig
from kvsched.core.offloading_manager import CPUOffloadingManager, LookupResult, RequestAccess
from kvsched.core.output import SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request, RequestStatus
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION, rules_for

__all__ = [
    "OffloadJob",
    "OffloadingConnector",
    "OffloadingMetadata",
    "OffloadingWorker",
    "OffloadingWorkerMeta",
    "completed_jobs",
    "failed_jobs",
]


@dataclass(slots=True)
class OffloadJob:
    """A transfer between the request's GPU blocks ``gpu_block_ids`` (from
    index ``gpu_start`` of its block table) and CPU slots ``cpu_slots``."""

    req_id: str
    gpu_start: int
    gpu_block_ids: list[int]
    cpu_slots: list[int]
    sync: bool = False


@dataclass(slots=True)
class OffloadingMetadata:
    """Scheduler -> worker for one batch (vLLM's OffloadingConnectorMetadata)."""

    load_jobs: dict[int, OffloadJob] = field(default_factory=dict)
    store_jobs: dict[int, OffloadJob] = field(default_factory=dict)
    jobs_to_flush: set[int] = field(default_factory=set)


@dataclass(slots=True)
class OffloadingWorkerMeta:
    """The job ids the worker completed in the batch: its
    ``KVConnectorOutput.kv_connector_worker_meta`` (vLLM's), never empty;
    ``failed_jobs``: those of them that failed (vLLM 0.34)."""

    completed_jobs: set[int]
    failed_jobs: set[int] = field(default_factory=set)


def completed_jobs(output: KVConnectorOutput | None) -> set[int]:
    """The jobs a worker's report says it completed (none if it says nothing)."""
    meta = output.kv_connector_worker_meta if output is not None else None
    return meta.completed_jobs if isinstance(meta, OffloadingWorkerMeta) else set()


def failed_jobs(output: KVConnectorOutput | None) -> set[int]:
    """The completed jobs a worker's report says failed."""
    meta = output.kv_connector_worker_meta if output is not None else None
    return meta.failed_jobs if isinstance(meta, OffloadingWorkerMeta) else set()


@dataclass(slots=True)
class _Job:
    req_id: str
    keys: list[int]
    is_store: bool
    # A store's GPU blocks: a finished request's blocks may be handed out
    # again only once it is done (the fence).
    block_ids: list[int]


@dataclass(slots=True)
class _ReqState:
    """vLLM's RequestOffloadState for one full-attention group."""

    req: Request
    access: RequestAccess
    keys: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    next_stored_chunk: int = 0
    num_local_tokens: int = 0
    max_load_tokens: int | None = None
    max_offload_tokens: int | None = None
    jobs: set[int] = field(default_factory=set)
    finished_signaled: bool = False
    # A load of this request failed (vLLM 0.34): it is never looked up again.
    load_failed: bool = False


def _token_cap(params: Mapping[str, Any] | None, key: str) -> int | None:
    """A request's ``max_load_tokens`` / ``max_offload_tokens`` (vLLM ignores
    anything but an int >= 0, with a warning)."""
    raw = params.get(key) if params else None
    return raw if type(raw) is int and raw >= 0 else None


class OffloadingConnector(KVConnectorBase):
    """The scheduler side. It reads the scheduler's KV cache manager (bound
    with bind_kv_cache_manager): the requests' prefix-cache hashes and which
    GPU blocks are cached. ``kv_transfer_params``: per request id;
    ``vllm_version``: the release whose rules apply (SchedulerConfig's)."""

    def __init__(self, config: KVTransferConfig, block_size: int, num_cpu_blocks: int,
                 blocks_per_chunk: int = 1, eviction_policy: str = "lru", store_threshold: int = 0,
                 sync_load_budget_tokens: int = 0, enable_prefix_caching: bool = False,
                 kv_transfer_params: Mapping[str, Mapping[str, Any]] | None = None,
                 vllm_version: str = DEFAULT_VLLM_VERSION) -> None:
        super().__init__(config)
        if blocks_per_chunk < 1:
            raise UserInputError(f"block_size_factor={blocks_per_chunk}: must be >= 1")
        if sync_load_budget_tokens < 0:
            raise UserInputError(f"sync_load_budget_tokens={sync_load_budget_tokens}: must be >= 0")
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = block_size * blocks_per_chunk
        self.sync_load_budget = sync_load_budget_tokens
        rules = rules_for(vllm_version)
        self.manager = CPUOffloadingManager(num_cpu_blocks, eviction_policy, store_threshold,
                                            rules.offload_threshold_counts_once_per_request)
        self.finished_store_capped_at_computed = rules.offload_finished_store_capped_at_computed
        self.transfer_failures = rules.offload_transfer_failures
        self.params = kv_transfer_params or {}
        self.kv_cache_manager: KVCacheManager | None = None
        self.reqs: dict[str, _ReqState] = {}
        self.jobs: dict[int, _Job] = {}
        self.next_job_id = 0
        # Keys loads in flight read (None: prefix caching off, no check).
        self.chunks_being_loaded: set[int] | None = set() if enable_prefix_caching else None
        self.block_fences: dict[int, set[int]] = {}
        # This batch's state, reset by build_connector_meta.
        self.load_jobs: dict[int, OffloadJob] = {}
        self.sync_loads: set[str] = set()
        self.sync_load_tokens = 0
        self.jobs_to_flush: set[int] = set()
        self.allocated_blocks: set[int] = set()

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped store is a later miss.
        return False

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        self.kv_cache_manager = kv_cache_manager

    def request_kv_transfer_params(self, request: Request) -> Mapping[str, Any] | None:
        return self.params.get(request.request_id)

    # -- per-request state ---------------------------------------------------
    def _state(self, request: Request) -> _ReqState:
        rid = request.request_id
        state = self.reqs.get(rid)
        if state is None:
            params = self.params.get(rid)
            state = self.reqs[rid] = _ReqState(request, RequestAccess(),
                                               max_load_tokens=_token_cap(params, "max_load_tokens"),
                                               max_offload_tokens=_token_cap(params, "max_offload_tokens"))
        return state

    def _update_keys(self, state: _ReqState, num_tokens: int | None = None) -> None:
        """Keys for every complete chunk of the request's tokens (of its
        first ``num_tokens``, if given)."""
        assert self.kv_cache_manager is not None, "bind_kv_cache_manager first"
        bpc = self.blocks_per_chunk
        req = state.req
        num_blocks = (req.num_tokens if num_tokens is None else num_tokens) // self.block_size
        have = len(state.keys)
        if (num_blocks // bpc) <= have:
            return
        hashes = self.kv_cache_manager.block_hashes(req, num_blocks)
        positions = state.access.positions
        for i in range(have, num_blocks // bpc):
            key = hashes[i * bpc + bpc - 1]
            state.keys.append(key)
            positions[key] = (i + 1) * self.tokens_per_chunk

    def _new_job_id(self) -> int:
        job_id = self.next_job_id
        self.next_job_id += 1
        return job_id

    # -- admission -------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._state(request)
        state.block_ids.clear()
        state.next_stored_chunk = 0
        if state.jobs:
            return None, False
        self._update_keys(state)
        state.num_local_tokens = num_computed_tokens
        # A failed load is not retried: nothing the CPU tier holds is offered.
        hit = 0 if state.load_failed else self._lookup(state)
        sync = self._reserve_sync_load(state, num_computed_tokens, hit)
        return hit, bool(hit) and not sync

    def _lookup(self, state: _ReqState) -> int | None:
        """Tokens past the local hit the CPU chunks cover (whole chunks), or
        None to ask again next step."""
        tpc = self.tokens_per_chunk
        local = state.num_local_tokens
        end = min(state.req.num_tokens, len(state.keys) * tpc)
        if state.max_load_tokens is not None:
            end = min(end, local + state.max_load_tokens) // tpc * tpc
        if end - local < tpc:
            return 0
        first = local // tpc
        hits = 0
        pending = False
        for key in state.keys[first:-(-end // tpc)]:
            result = self.manager.lookup(key)
            if result is LookupResult.MISS:
                break
            hits += 1
            pending |= result is LookupResult.HIT_PENDING
        if hits == 0:
            return 0
        if pending:
            return None
        num_hit = min(end, tpc * (first + hits)) - local
        if num_hit < tpc:
            return 0
        if self.chunks_being_loaded:
            being_loaded = self.chunks_being_loaded
            if any(k in being_loaded for k in state.keys[first:-(-(local + num_hit) // tpc)]):
                return None
        return num_hit

    def _reserve_sync_load(self, state: _ReqState, num_computed: int, hit: int | None) -> bool:
        """Whether the hit is loaded synchronously: it fits what is left of
        the step's budget and leaves a token to compute."""
        rid = state.req.request_id
        self.sync_loads.discard(rid)
        if not self.sync_load_budget or not hit or num_computed + hit >= state.req.num_tokens:
            return False
        if self.sync_load_tokens + hit > self.sync_load_budget:
            return False
        self.sync_load_tokens += hit
        self.sync_loads.add(rid)
        return True

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        self.allocated_blocks.update(b for b in block_ids if b != 0)
        if not num_external_tokens:
            return
        state = self.reqs[request.request_id]
        sync = request.request_id in self.sync_loads
        bs = self.block_size
        local = state.num_local_tokens
        cached = local + num_external_tokens
        num_blocks = -(-cached // bs)
        # The load fills the blocks past the local hit from the first one
        # not in the prefix cache (a synchronous load: the first one). A
        # block is cached already when a request whose load completed
        # comes back with its last token to recompute.
        start = -(-local // bs)
        if not sync:
            assert self.kv_cache_manager is not None
            cached_blocks = self.kv_cache_manager.block_pool.hash_of_block
            while start < num_blocks and block_ids[start] in cached_blocks:
                start += 1
        num_chunks = -(-cached // self.tokens_per_chunk)
        keys = state.keys[start // self.blocks_per_chunk:num_chunks] if num_blocks > start else []
        state.next_stored_chunk = num_chunks
        slots = self.manager.prepare_load(keys, state.access)
        job_id = self._new_job_id()
        self.load_jobs[job_id] = OffloadJob(request.request_id, start, block_ids[start:num_blocks],
                                            slots, sync)
        assert not state.jobs
        state.jobs.add(job_id)
        self.jobs[job_id] = _Job(request.request_id, keys, False, [])
        if self.chunks_being_loaded is not None and not sync:
            self.chunks_being_loaded.update(keys)

    # -- each batch -------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> OffloadingMetadata:
        so = scheduler_output
        self._update_block_tables(so)
        for rid in so.preempted_req_ids:
            state = self.reqs.get(rid)
            if state is not None:
                self.jobs_to_flush.update(state.jobs - self.load_jobs.keys())
        fences = self.block_fences
        if fences:
            for bid in self.allocated_blocks:
                if bid in fences:
                    self.jobs_to_flush.update(fences[bid])
        meta = OffloadingMetadata(self.load_jobs, self._build_store_jobs(so), self.jobs_to_flush)
        # vLLM walks its finished set in hash order (per process); kvsched
        # sorts, so that a replay is deterministic.
        for rid in sorted(so.finished_req_ids):
            state = self.reqs.get(rid)
            if state is None:
                continue
            state.finished_signaled = True
            self.manager.on_request_finished(state.access)
            if not state.jobs:
                del self.reqs[rid]
        self.load_jobs = {}
        self.sync_loads = set()
        self.sync_load_tokens = 0
        self.jobs_to_flush = set()
        self.allocated_blocks = set()
        return meta

    def _update_block_tables(self, so: SchedulerOutput) -> None:
        allocated = self.allocated_blocks
        tables: list[tuple[str, list[int] | None, bool]] = [
            (r.req_id, r.block_ids, True) for r in so.scheduled_new_reqs]
        cached = so.scheduled_cached_reqs
        tables.extend((rid, cached.new_block_ids.get(rid), rid in cached.resumed_req_ids)
                      for rid in cached.req_ids)
        for rid, block_ids, full_table in tables:
            state = self.reqs.get(rid)
            if state is None:
                continue
            self._update_keys(state)
            if full_table:
                state.block_ids.clear()
            if block_ids:
                state.block_ids.extend(block_ids)
                allocated.update(b for b in block_ids if b != 0)

    def _offloadable_tokens(self, state: _ReqState, num_tokens: int) -> int:
        req = state.req
        n = min(num_tokens, req.num_tokens, req.num_prompt_tokens)
        return n if state.max_offload_tokens is None else min(n, state.max_offload_tokens)

    def _num_store_chunks(self, state: _ReqState, after: int) -> int:
        """The chunks a store may cover once ``after`` tokens are computed:
        whole offloadable chunks with blocks and keys."""
        return min(self._offloadable_tokens(state, after) // self.tokens_per_chunk,
                   len(state.block_ids) // self.blocks_per_chunk, len(state.keys))

    def _build_store_jobs(self, so: SchedulerOutput) -> dict[int, OffloadJob]:
        bpc = self.blocks_per_chunk
        jobs: dict[int, OffloadJob] = {}
        for rid in [*so.num_scheduled_tokens, *sorted(so.finished_req_ids)]:
            state = self.reqs.get(rid)
            if state is None:
                continue
            req = state.req
            if req.status == RequestStatus.FINISHED_ABORTED:
                after = req.num_computed_tokens
            elif req.is_finished():
                # The prefix cache's commit point: not the last sampled
                # token's slot. 0.34 also caps it at the computed tokens (a
                # request that failed before its prefill completed).
                after = max(req.num_prompt_tokens, req.num_tokens - 1)
                if self.finished_store_capped_at_computed:
                    after = min(after, req.num_computed_tokens)
            else:
                # vLLM builds the metadata before it counts the batch's
                # tokens as computed and adds them here; kvsched's scheduler
                # counted them already.
                after = req.num_computed_tokens
            num_chunks = self._num_store_chunks(state, after)
            first = state.next_stored_chunk
            offered = [k for i, k in enumerate(state.keys[first:num_chunks], first)
                       if all(state.block_ids[i * bpc + b] != 0 for b in range(bpc))]
            if not offered:
                state.next_stored_chunk = max(first, num_chunks)
                continue
            placed = self.manager.prepare_store(offered, state.access)
            if placed is None:
                continue  # no room: offered again next batch
            keys, slots = placed
            if not keys:
                state.next_stored_chunk = max(first, num_chunks)
                continue
            stored = set(keys)
            block_ids: list[int] = []
            start: int | None = None
            for i in range(first, num_chunks):
                if state.keys[i] not in stored:
                    continue
                for b in range(i * bpc, (i + 1) * bpc):
                    if state.block_ids[b] == 0:
                        continue
                    if start is None:
                        start = b
                    block_ids.append(state.block_ids[b])
            state.next_stored_chunk = max(first, num_chunks)
            job_id = self._new_job_id()
            state.jobs.add(job_id)
            self.jobs[job_id] = _Job(rid, keys, True, block_ids)
            jobs[job_id] = OffloadJob(rid, start or 0, block_ids, slots)
            if req.is_finished():
                for bid in block_ids:
                    self.block_fences.setdefault(bid, set()).add(job_id)
                    if bid in self.allocated_blocks:
                        self.jobs_to_flush.add(job_id)
        return jobs

    def has_pending_push_work(self) -> bool:
        return bool(self.jobs)

    # -- decode stretches ---------------------------------------------------------
    def decode_stretch_refusal(self, running: Sequence[Request]) -> str | None:
        """Only prompt tokens are stored, so a decoding request has offered
        every chunk it ever will once its stores are placed: a decode step
        then starts no job. With no job in flight (nothing completes, no
        fence) and none pending in this batch, each step only extends the
        requests' keys and block tables (``advance_decode_stretch``)."""
        if self.jobs or self.block_fences or self.load_jobs or self.jobs_to_flush or self.sync_loads:
            return "the offloading connector has transfers in flight"
        reqs = self.reqs
        for r in running:
            state = reqs.get(r.request_id)
            # Every prompt token is computed when decoding: the chunk count
            # is final (see _num_store_chunks).
            if state is not None and state.next_stored_chunk < self._num_store_chunks(
                    state, r.num_computed_tokens):
                return f"{r.request_id} has prompt chunks not stored yet (a store is offered again)"
        return None

    def advance_decode_stretch(self, running: Sequence[Request], new_blocks: Sequence[list[int]]) -> None:
        """Each step's _update_block_tables for the running requests: keys
        for the chunks the tokens of the last step's schedule() complete (one
        token fewer than now: keys depend only on the final count), and the
        new blocks appended to their tables."""
        reqs = self.reqs
        for r, blocks in zip(running, new_blocks):
            state = reqs.get(r.request_id)
            if state is None:
                continue
            self._update_keys(state, r.num_tokens - 1)
            if blocks:
                state.block_ids.extend(blocks)

    def idle_metadata(self) -> OffloadingMetadata:
        return OffloadingMetadata()

    # -- the worker's reports ---------------------------------------------------
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        failed = failed_jobs(connector_output)
        if failed and not self.transfer_failures:
            raise ValueError(f"offloading jobs {sorted(failed)} failed: vLLM 0.33's offloading worker "
                             "asserts that every transfer succeeds (failures are 0.34's)")
        for job_id in sorted(completed_jobs(connector_output)):
            job = self.jobs.pop(job_id)
            state = self.reqs[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys, success=job_id not in failed)
            else:
                if job_id in failed:
                    state.load_failed = True
                self.manager.complete_load(job.keys)
                if self.chunks_being_loaded:
                    self.chunks_being_loaded.difference_update(job.keys)
            if self.block_fences and state.req.is_finished():
                self._unfence(job_id, job.block_ids)
            state.jobs.remove(job_id)
            if state.finished_signaled and not state.jobs:
                del self.reqs[job.req_id]

    def _unfence(self, job_id: int, block_ids: list[int]) -> None:
        fences = self.block_fences
        for bid in block_ids:
            jobs = fences[bid]
            jobs.remove(job_id)
            if not jobs:
                del fences[bid]

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        state = self.reqs.get(request.request_id)
        if state is None:
            return False, None
        self._update_keys(state)
        # Its stores in flight fence their GPU blocks until they complete.
        for job_id in state.jobs:
            for bid in self.jobs[job_id].block_ids:
                self.block_fences.setdefault(bid, set()).add(job_id)
        return False, None

    def trace_fields(self, meta: OffloadingMetadata | None,
                     output: KVConnectorOutput | None) -> dict[str, Any]:
        """The oracle's ``offload`` trace key for a step: the batch's jobs
        as [job, request, first GPU block index, GPU blocks] (loads also
        whether synchronous), the fenced jobs, the jobs the processed output
        completed (``failed``: those that failed, only when some did), and
        the CPU slots in use."""
        def row(job_id: int, job: OffloadJob) -> list[Any]:
            return [job_id, job.req_id, job.gpu_start, len(job.gpu_block_ids)]
        done = completed_jobs(output)
        fields = {
            "store": [row(j, e) for j, e in sorted(meta.store_jobs.items())] if meta else [],
            "load": [[*row(j, e), e.sync] for j, e in sorted(meta.load_jobs.items())] if meta else [],
            "flush": sorted(meta.jobs_to_flush) if meta else [],
            "done": sorted(done),
            "cpu_chunks": self.manager.num_used_chunks,
        }
        failed = failed_jobs(output)
        if failed:
            # Only where some failed, so that traces without failures keep
            # the 0.33 format.
            fields["failed"] = sorted(failed)
        return fields


class OffloadingWorker:
    """The oracle's worker side (OffloadingConnectorWorker's timing). In
    batch b: last batch's stores are submitted (deferred by one batch) and
    complete in b + store_steps - 1; flushed jobs complete in b; loads start
    (a synchronous one completes in b, an asynchronous one in b + load_steps
    - 1, its request then in finished_recving). ``capture`` is called once
    per executed batch, in order (empty batches too).

    Scripted failures (vLLM 0.34's failed jobs): ``load_fail`` per request
    id, true or a list with one entry per asynchronous load of the request
    (past its end: no failure); a failed load completes as it would, its
    request also in failed_recving. Synchronous loads never fail (vLLM's
    worker raises on one: the engine stops). ``store_fail``: the job ids of
    stores that fail (ids of other jobs are ignored)."""

    def __init__(self, load_steps: int = 1, store_steps: int = 1,
                 load_fail: Mapping[str, bool | Sequence[bool]] | None = None,
                 store_fail: Sequence[int] = ()) -> None:
        if load_steps < 1 or store_steps < 1:
            raise UserInputError(f"load_steps={load_steps}, store_steps={store_steps}: must be >= 1")
        self.load_steps = load_steps
        self.store_steps = store_steps
        self.load_fail = dict(load_fail or {})
        self.store_fail = frozenset(store_fail)
        self.batch = -1
        self.unsubmitted: list[int] = []
        self.due_at: dict[int, int] = {}
        self.due: dict[int, set[int]] = {}
        self.async_loads: dict[int, str] = {}
        # Asynchronous loads started so far per request, and the jobs that fail.
        self.num_async_loads: dict[str, int] = {}
        self.failing: set[int] = set()

    def _load_fails(self, req_id: str) -> bool:
        """Whether the request's next asynchronous load fails (counts it)."""
        n = self.num_async_loads.get(req_id, 0)
        self.num_async_loads[req_id] = n + 1
        script = self.load_fail.get(req_id, False)
        if isinstance(script, bool):
            return script
        return n < len(script) and script[n]

    def _due(self, job_id: int, batch: int) -> None:
        """Job ``job_id`` completes in ``batch`` unless it is due earlier."""
        old = self.due_at.get(job_id)
        if old is not None:
            if old <= batch:
                return
            self.due[old].discard(job_id)
        self.due_at[job_id] = batch
        self.due.setdefault(batch, set()).add(job_id)

    def capture(self, meta: OffloadingMetadata) -> tuple[KVConnectorOutput, set[str]]:
        self.batch += 1
        b = self.batch
        flush = meta.jobs_to_flush
        for job_id in self.unsubmitted:
            self._due(job_id, b + self.store_steps - 1)
        for job_id in flush:
            if job_id in self.due_at or job_id in meta.store_jobs:
                self._due(job_id, b)
        for job_id, job in meta.load_jobs.items():
            if job.sync:
                self._due(job_id, b)
            else:
                self._due(job_id, b + self.load_steps - 1)
                self.async_loads[job_id] = job.req_id
                if self._load_fails(job.req_id):
                    self.failing.add(job_id)
        self.failing.update(j for j in meta.store_jobs if j in self.store_fail)
        self.unsubmitted = [j for j in meta.store_jobs if j not in flush]
        done = self.due.pop(b, set())
        recv = set()
        failed_recv = set()
        failed = done & self.failing
        self.failing -= failed
        for job_id in done:
            del self.due_at[job_id]
            rid = self.async_loads.pop(job_id, None)
            if rid is not None:
                recv.add(rid)
                if job_id in failed:
                    failed_recv.add(rid)
        meta_out = OffloadingWorkerMeta(done, failed) if done else None
        return KVConnectorOutput(finished_recving=recv, failed_recving=failed_recv,
                                 kv_connector_worker_meta=meta_out), failed_recv
