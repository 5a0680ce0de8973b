"""The reference oracle's scripted KV connector and its fake worker side
(../shared/reference/SCENARIO_FORMAT.md, "`scripted`: a scripted connector").

:class:`ScriptedConnector` answers from per-request scripts: external hits,
synchronous or asynchronous loads, load failures, delayed frees.
:class:`ScriptedWorker` plays the worker side: it reads the metadata of every
executed batch, in order, and reports each transfer's completion in the
output of the batch its script says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_connector import KVConnectorBase, KVConnectorOutput, KVTransferConfig
from kvsched.core.output import SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request

# The per-request keys the connector answers from; each takes a value (every
# load) or a list (one entry per load started for the request, the default
# past its end).
SCRIPTED_REQUEST_KEYS = ("external_hit_tokens", "load_async", "load_steps", "load_fail", "send_steps")
_DEFAULTS: dict[str, Any] = {"external_hit_tokens": 0, "load_async": False, "load_steps": 1,
                             "load_fail": None}


@dataclass(slots=True)
class ScriptedLoad:
    """A load started by update_state_after_alloc, as the worker sees it."""

    req_id: str
    is_async: bool
    steps: int
    fail_request: bool
    invalid_block_ids: list[int]


@dataclass(slots=True)
class ScriptedMetadata:
    """Scheduler -> worker for one batch: the loads started and the sends
    (delayed frees, with their batch counts)."""

    loads: list[ScriptedLoad] = field(default_factory=list)
    sends: list[tuple[str, int]] = field(default_factory=list)


def scripted_value(script: Mapping[str, Any], key: str, attempt: int) -> Any:
    """A script entry for the request's ``attempt``-th load (0-based)."""
    default = _DEFAULTS[key]
    value = script.get(key, default)
    if isinstance(value, list):
        return value[attempt] if attempt < len(value) else default
    return default if value is None else value


class ScriptedConnector(KVConnectorBase):
    """Per-request scripted answers (``scripts[request_id]``, keys
    SCRIPTED_REQUEST_KEYS). ``pending_block_frees``: report
    has_pending_block_frees() while a delayed free is in flight."""

    def __init__(self, config: KVTransferConfig, scripts: Mapping[str, Mapping[str, Any]],
                 block_size: int, pending_block_frees: bool = False) -> None:
        super().__init__(config)
        self.scripts = scripts
        self.block_size = block_size
        self.report_pending_frees = pending_block_frees
        self.num_loads: dict[str, int] = {}
        # Request id -> (local tokens, external tokens, async) of its last lookup.
        self.lookups: dict[str, tuple[int, int, bool]] = {}
        self.loading: set[str] = set()
        self.sending: set[str] = set()
        self.meta = ScriptedMetadata()

    def _value(self, req_id: str, key: str) -> Any:
        return scripted_value(self.scripts.get(req_id, {}), key, self.num_loads.get(req_id, 0))

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        offered = int(self._value(rid, "external_hit_tokens"))
        is_async = bool(self._value(rid, "load_async"))
        # A synchronous load must leave a token to compute (vLLM asserts it).
        limit = request.num_tokens - num_computed_tokens - (0 if is_async else 1)
        n = max(0, min(offered, limit))
        is_async = is_async and n > 0
        self.lookups[rid] = (num_computed_tokens, n, is_async)
        return n, is_async

    def may_load_async(self, request: Request) -> bool:
        """True when any of the request's scripted loads is asynchronous (the
        0.34 oracle's scripted connector; its lookups may still answer a
        synchronous load, or none)."""
        value = self.scripts.get(request.request_id, {}).get("load_async", False)
        return any(value) if isinstance(value, list) else bool(value)

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        if not num_external_tokens:
            return
        rid = request.request_id
        num_local, n, is_async = self.lookups[rid]
        steps = int(self._value(rid, "load_steps"))
        fail = self._value(rid, "load_fail")
        if steps < 1:
            raise UserInputError(f"request {rid}: load_steps={steps}: must be >= 1")
        invalid: list[int] = []
        if fail == "request":
            if not is_async:
                raise UserInputError(f"request {rid}: load_fail='request' needs an asynchronous load "
                                     "(vLLM ignores failed_recving for a running request); set "
                                     "load_async or fail blocks with an int")
        elif fail is not None:
            if type(fail) is not int or fail < 0:
                raise UserInputError(f"request {rid}: load_fail={fail!r}: give 'request' or an int >= 0")
            bs = self.block_size
            first = num_local // bs
            invalid = block_ids[first + fail:-(-(num_local + n) // bs)]
        self.num_loads[rid] = self.num_loads.get(rid, 0) + 1
        self.meta.loads.append(ScriptedLoad(rid, is_async, steps, fail == "request", invalid))
        if is_async:
            self.loading.add(rid)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ScriptedMetadata:
        meta, self.meta = self.meta, ScriptedMetadata()
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.loading.difference_update(connector_output.finished_recving)
        self.sending.difference_update(connector_output.finished_sending)

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        steps = self.scripts.get(rid, {}).get("send_steps")
        # While its own asynchronous load is in flight the scheduler holds
        # the blocks already (until finished_recving).
        if steps is None or rid in self.loading:
            return False, None
        if int(steps) < 1:
            raise UserInputError(f"request {rid}: send_steps={steps}: must be >= 1")
        self.sending.add(rid)
        self.meta.sends.append((rid, int(steps)))
        return True, None

    def has_pending_block_frees(self) -> bool:
        return self.report_pending_frees and bool(self.sending)


@dataclass(slots=True)
class DueCompletions:
    """What a scripted worker reports at one batch (the scripted connectors'
    worker side: this one's and nixl_connector's)."""

    recv: set[str] = field(default_factory=set)
    send: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    invalid: set[int] = field(default_factory=set)
    load_failed: set[str] = field(default_factory=set)


class ScriptedWorker:
    """The worker side: ``capture`` is called once per executed batch, in
    execution order (batches with no scheduled tokens too), and returns that
    batch's report and the ids whose load failed in it (for the trace).
    A transfer started in batch b that takes s batches is reported by
    batch b + s - 1."""

    def __init__(self) -> None:
        self.batch = -1
        self.due: dict[int, DueCompletions] = defaultdict(DueCompletions)

    def capture(self, meta: ScriptedMetadata) -> tuple[KVConnectorOutput, set[str]]:
        self.batch += 1
        b = self.batch
        for load in meta.loads:
            d = self.due[b + load.steps - 1 if load.is_async else b]
            if load.is_async:
                d.recv.add(load.req_id)
            if load.fail_request:
                d.failed.add(load.req_id)
                d.load_failed.add(load.req_id)
            if load.invalid_block_ids:
                d.invalid.update(load.invalid_block_ids)
                d.load_failed.add(load.req_id)
        for rid, steps in meta.sends:
            self.due[b + steps - 1].send.add(rid)
        d = self.due.pop(b) if b in self.due else DueCompletions()
        return KVConnectorOutput(d.send, d.recv, d.failed, d.invalid), d.load_failed
