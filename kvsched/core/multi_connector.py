"""vLLM 0.33's MultiConnector, scheduler side: several KV connectors at once
(typically NixlConnector for prefill/decode disaggregation and
OffloadingConnector for a CPU tier), and the combination of their worker
sides' reports.

The rules, rebuilt from vLLM's behaviour:

- Lookup (``get_num_new_matched_tokens``): every child is asked, in the
  configured order, with the same local hit. If any child cannot tell yet
  (None) the whole answer is None (ask again next step), even when an
  earlier child had a hit. Otherwise the first child with a hit supplies the
  request's external tokens (and says whether the load is asynchronous);
  the others' hits are ignored.
- ``update_state_after_alloc``: the chosen child gets the external token
  count, every other child the same blocks with 0 (nothing to load), so a
  NIXL child that was not chosen only tells its prefill side to free.
- ``build_connector_meta``: one metadata per child, in order, plus the
  requests whose blocks more than one child holds (``extra_async_saves``).
- ``update_connector_output``: every child sees the whole report, with the
  worker metadata swapped for its own entry.
- ``request_finished``: the blocks are held if any child holds them; the
  children's transfer parameters are merged (a key given by two children is
  an error, as in vLLM). A request held by k > 1 children is reported sent
  by the worker side only once all k reported it (:func:`combine_reports`).
- ``requires_kv_delivery``, ``has_pending_block_frees``,
  ``has_pending_push_work``: true if any child's is.

The scheduler reads the load-failure policy and the role (deferred frees
under async scheduling) from the MultiConnector's own config; each child
reads its own (a NIXL child's role decides ``requires_kv_delivery``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kvsched.core.kv_cache_manager import KVCacheManager
from kvsched.core.kv_connector import KVConnectorBase, KVTransferConfig, combined_role, multi_child_configs
from kvsched.core.output import KVConnectorOutput, SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION, rules_for

__all__ = [
    "MultiConnector",
    "MultiKVConnectorMetadata",
    "MultiKVConnectorWorkerMetadata",
    "MultiScriptedWorker",
    "combine_reports",
    "connector_of_type",
    "multi_child_configs",
]

_C = TypeVar("_C", bound=KVConnectorBase)

@dataclass(slots=True)
class MultiKVConnectorMetadata:
    """Scheduler -> worker for one batch: each child's metadata, in order,
    and the requests whose blocks more than one child holds (request id ->
    how many holders beyond the first)."""

    metadata: tuple[Any, ...]
    extra_async_saves: dict[str, int] | None = None


@dataclass(slots=True)
class MultiKVConnectorWorkerMetadata:
    """Worker -> scheduler: each child's worker metadata (None where it has
    nothing to say), in order."""

    metadata: tuple[Any, ...]


class MultiConnector(KVConnectorBase):
    """Several connectors as one (see the module); ``connectors`` in the
    configured order (the first with a hit loads)."""

    def __init__(self, config: KVTransferConfig, connectors: Sequence[KVConnectorBase],
                 vllm_version: str = DEFAULT_VLLM_VERSION) -> None:
        """``vllm_version``: from 0.34 on, the MultiConnector produces /
        consumes KV when one of its children does, whatever its own
        ``kv_role`` says (kvsched.vllm_versions)."""
        if not connectors:
            raise UserInputError("kv_connector_extra_config.connectors=[]: MultiConnector needs at least "
                                 "one connector")
        if rules_for(vllm_version).multi_connector_roles_from_children:
            config = dataclasses.replace(config, kv_role=combined_role(
                [c.kv_transfer_config.kv_role for c in connectors]))
        super().__init__(config)
        self._connectors = list(connectors)
        # Request id -> index of the child chosen to load it.
        self._requests_to_connector: dict[str, int] = {}
        # Request id -> holders beyond the first, for the next batch's metadata.
        self._extra_async_saves: dict[str, int] = {}

    @property
    def sub_connectors(self) -> list[KVConnectorBase]:
        return list(self._connectors)

    @property
    def requires_kv_delivery(self) -> bool:
        return any(c.requires_kv_delivery for c in self._connectors)

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        for c in self._connectors:
            c.bind_kv_cache_manager(kv_cache_manager)

    def loading_connector(self, request_id: str) -> KVConnectorBase | None:
        """The child chosen to load ``request_id`` at its last lookup (None:
        none had a hit)."""
        i = self._requests_to_connector.get(request_id)
        return None if i is None else self._connectors[i]

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        answer: tuple[int | None, bool] = (0, False)
        for i, c in enumerate(self._connectors):
            tokens, load_async = c.get_num_new_matched_tokens(request, num_computed_tokens)
            if tokens is None:
                return None, False
            if answer[0] == 0 and tokens > 0:
                self._requests_to_connector[request.request_id] = i
                answer = (tokens, load_async)
        return answer

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34's MultiConnector: when any child may load it asynchronously."""
        return any(c.may_load_async(request) for c in self._connectors)

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        chosen = self._requests_to_connector.get(request.request_id, -1)
        for i, c in enumerate(self._connectors):
            c.update_state_after_alloc(request, block_ids, num_external_tokens if i == chosen else 0)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> MultiKVConnectorMetadata:
        meta = MultiKVConnectorMetadata(tuple(c.build_connector_meta(scheduler_output)
                                              for c in self._connectors))
        if self._extra_async_saves:
            meta.extra_async_saves, self._extra_async_saves = self._extra_async_saves, {}
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        multi = connector_output.kv_connector_worker_meta
        if multi is not None and not isinstance(multi, MultiKVConnectorWorkerMetadata):
            raise TypeError(f"kv_connector_worker_meta={multi!r:.80}: a MultiConnector's worker reports "
                            "MultiKVConnectorWorkerMetadata")
        try:
            for i, c in enumerate(self._connectors):
                if multi is not None:
                    connector_output.kv_connector_worker_meta = multi.metadata[i]
                c.update_connector_output(connector_output)
        finally:
            connector_output.kv_connector_worker_meta = multi

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        holders = 0
        params: dict[str, Any] | None = None
        for c in self._connectors:
            delay, child_params = c.request_finished(request, block_ids)
            holders += delay
            if child_params is None:
                continue
            if params is None:
                params = child_params
                continue
            clashes = params.keys() & child_params.keys()
            if clashes:
                raise ValueError(f"request {request.request_id}: two connectors of the MultiConnector "
                                 f"return kv_transfer_params {sorted(clashes)} (vLLM fails on this key "
                                 "clash); configure connectors whose parameters do not overlap")
            params.update(child_params)
        if holders > 1:
            self._extra_async_saves[request.request_id] = holders - 1
        self._requests_to_connector.pop(request.request_id, None)
        return holders > 0, params

    def has_pending_block_frees(self) -> bool:
        return any(c.has_pending_block_frees() for c in self._connectors)

    def decode_stretch_refusal(self, running: Sequence[Request]) -> str | None:
        """Idle when every child is and no extra holder waits to be sent."""
        if self._extra_async_saves:
            return "the MultiConnector has extra holders for the next batch"
        for c in self._connectors:
            why = c.decode_stretch_refusal(running)
            if why is not None:
                return why
        return None

    def advance_decode_stretch(self, running: Sequence[Request], new_blocks: Sequence[list[int]]) -> None:
        for c in self._connectors:
            c.advance_decode_stretch(running, new_blocks)

    def idle_metadata(self) -> MultiKVConnectorMetadata:
        return MultiKVConnectorMetadata(tuple(c.idle_metadata() for c in self._connectors))

    def has_pending_push_work(self) -> bool:
        return any(c.has_pending_push_work() for c in self._connectors)


def connector_of_type(connector: KVConnectorBase | None, kind: type[_C]) -> _C | None:
    """``connector`` if it is a ``kind``, else a MultiConnector's first child
    that is one (None: neither): where a NIXL connector takes a request's
    transfer parameters, or an offloading connector keeps its CPU tier."""
    if isinstance(connector, kind):
        return connector
    if isinstance(connector, MultiConnector):
        return next((c for c in connector.sub_connectors if isinstance(c, kind)), None)
    return None


def combine_reports(reports: Sequence[KVConnectorOutput | None], pending_saves: dict[str, int]
                    ) -> KVConnectorOutput | None:
    """The children's worker reports for one batch as the MultiConnector's
    worker reports them (None: nothing to report). Loads, failures and
    invalid blocks are the union; a request several children hold
    (``pending_saves``: holders beyond the first, from the metadata's
    ``extra_async_saves``, updated here) is reported sent by the last of
    them; the worker metadata is one entry per child when any has one.
    The one owner of this rule, for the replay's scripted workers and the
    simulator's timed ones."""
    if all(r is None for r in reports):
        return None
    out = KVConnectorOutput()
    metas: list[Any] = []
    for r in reports:
        if r is None:
            metas.append(None)
            continue
        out.finished_recving |= r.finished_recving
        out.failed_recving |= r.failed_recving
        out.invalid_block_ids |= r.invalid_block_ids
        metas.append(r.kv_connector_worker_meta)
        for rid in r.finished_sending:
            extra = pending_saves.get(rid)
            if extra is None:
                out.finished_sending.add(rid)
            elif extra == 1:
                del pending_saves[rid]
            else:
                pending_saves[rid] = extra - 1
    if any(m is not None for m in metas):
        out.kv_connector_worker_meta = MultiKVConnectorWorkerMetadata(tuple(metas))
    return out


class _ScriptedWorker(Protocol):
    def capture(self, meta: Any) -> tuple[KVConnectorOutput, set[str]]: ...


class MultiScriptedWorker:
    """The replay's worker side of a MultiConnector: each child's scripted
    worker sees its own metadata of every batch, in order; their reports
    are combined (:func:`combine_reports`). ``capture`` returns the report
    and the ids whose load failed."""

    def __init__(self, workers: Sequence[_ScriptedWorker]) -> None:
        self.workers = list(workers)
        self.pending_saves: dict[str, int] = {}

    def capture(self, meta: Any) -> tuple[KVConnectorOutput, set[str]]:
        assert isinstance(meta, MultiKVConnectorMetadata)
        if meta.extra_async_saves:
            self.pending_saves.update(meta.extra_async_saves)
        failed: set[str] = set()
        reports: list[KVConnectorOutput | None] = []
        for worker, child_meta in zip(self.workers, meta.metadata, strict=True):
            report, child_failed = worker.capture(child_meta)
            reports.append(report)
            failed |= child_failed
        out = combine_reports(reports, self.pending_saves)
        return (out if out is not None else KVConnectorOutput()), failed
