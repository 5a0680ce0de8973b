"""NixlConnector's scheduler side in pull mode (vLLM 0.33's NixlConnector,
alias of NixlPullConnector), for prefill/decode disaggregation, and the
reference oracle's scripted worker side for it
(../shared/reference/SCENARIO_FORMAT.md, "`nixl`").

What the scheduler sees of a P/D pair, rebuilt from vLLM's behaviour:

- A decode instance gets requests whose ``kv_transfer_params`` say
  ``do_remote_prefill``: the connector offers the whole prompt beyond the
  local prefix-cache hit, always asynchronously, so the request waits in
  WAITING_FOR_REMOTE_KVS until the worker reports the read done
  (``finished_recving``). The read is started once per request: after its
  first allocation the request forgets ``do_remote_prefill``, so a preempted
  or failed one recomputes its prompt locally.
- A prefill instance gets requests whose params say ``do_remote_decode``:
  when one finishes with ``stop`` or ``length`` the connector holds its
  blocks (``delay_free_blocks``) until the worker reports them sent
  (``finished_sending``: the decode side read them, or the lease of
  ``kv_lease_duration`` seconds ran out), and returns the params the decode
  side needs. Any other finish (an abort, an error) frees at once.

vLLM keeps the params on the request; kvsched's requests carry none, so the
connector keeps each request's params (a copy: they change as it runs).
Not modelled (refused): bidirectional transfers (``bidirectional_kv_xfer``),
the host buffer (``kv_buffer_device`` cpu on a GPU), push mode, prompts cut
short for Mamba or EAGLE/MTP drafters (kvsched's drafters are n-gram ones).
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_connector import KVConnectorBase, KVConnectorOutput, KVTransferConfig
from kvsched.core.output import SchedulerOutput
from kvsched.core.scripted_connector import DueCompletions
from kvsched.errors import UserInputError
from kvsched.fields import is_number
from kvsched.request import Request, RequestStatus

# The params a read needs besides remote_block_ids; without all of them
# NixlConnector starts no read (vLLM warns and loads nothing).
REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
# kv_connector_extra_config keys vLLM's NIXL connector reads, and their
# defaults. Those the scheduler does not read (worker-side) are accepted as
# they are; bidirectional_kv_xfer must stay off.
EXTRA_DEFAULTS: dict[str, Any] = {"kv_lease_duration": 30, "kv_recompute_threshold": 64,
                                  "bidirectional_kv_xfer": False, "decoder_kv_blocks_ttl": 480}
WORKER_EXTRA_KEYS = ("backends", "num_threads", "enforce_handshake_compat", "engine_ttl",
                     "push_registration_timeout")
# The finishes whose blocks a prefill instance holds for the decode side.
_HANDED_OFF = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
# The oracle's replay fills these into a decode request's params when missing.
REPLAY_REMOTE_DEFAULTS: dict[str, Any] = {"remote_engine_id": "kvsched-prefill",
                                          "remote_host": "localhost", "remote_port": 5600}
# The oracle's fixed engine id (vLLM draws a uuid when none is given).
REPLAY_ENGINE_ID = "kvsched-replay"
# The per-request keys the oracle's NIXL worker reads (single values).
NIXL_REQUEST_KEYS = ("load_steps", "load_fail", "send_steps")


@dataclass(slots=True)
class NixlRecv:
    """A read for the worker (vLLM's ReqMeta): the local blocks to fill (the
    request's blocks past its local prefix-cache hit; none for a
    notify-only entry), how many blocks the local hit covers, and whether
    the scheduler parked the request waiting for it (``awaiting_kvs``;
    false: only tell the prefill side to free its blocks)."""

    req_id: str
    local_block_ids: list[int]
    local_num_computed_blocks: int
    kv_transfer_params: dict[str, Any]
    awaiting_kvs: bool


@dataclass(slots=True)
class NixlMetadata:
    """Scheduler -> worker for one batch (vLLM's NixlConnectorMetadata):
    reads to start, finished requests whose blocks to hold for the decode
    side (with their lease in seconds: unread blocks are freed when it runs
    out), requests that started a hand-off in this batch, and those whose
    hand-off was dropped (aborted)."""

    reqs_to_recv: dict[str, NixlRecv] = field(default_factory=dict)
    reqs_to_send: dict[str, float] = field(default_factory=dict)
    reqs_in_batch: set[str] = field(default_factory=set)
    reqs_not_processed: set[str] = field(default_factory=set)


def check_nixl_extra_config(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The NIXL settings of ``kv_connector_extra_config``, checked, with
    vLLM's defaults filled in."""
    known = (*EXTRA_DEFAULTS, *WORKER_EXTRA_KEYS)
    for key in extra:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserInputError(f"kv_connector_extra_config.{key}: unknown NixlConnector setting; "
                                 f"{hint}known: {', '.join(known)}")
    settings = {**EXTRA_DEFAULTS, **{k: v for k, v in extra.items() if k in EXTRA_DEFAULTS}}
    for key in ("kv_lease_duration", "kv_recompute_threshold", "decoder_kv_blocks_ttl"):
        value = settings[key]
        if not is_number(value) or value < 0:
            raise UserInputError(f"kv_connector_extra_config.{key}={value!r}: must be a number >= 0 "
                                 f"(vLLM's default: {EXTRA_DEFAULTS[key]})")
    if settings["bidirectional_kv_xfer"]:
        raise UserInputError(f"kv_connector_extra_config.bidirectional_kv_xfer="
                             f"{settings['bidirectional_kv_xfer']!r}: kvsched does not model "
                             "bidirectional NIXL transfers; remove it or set it to false")
    return settings


class NixlConnector(KVConnectorBase):
    """NixlConnector's scheduler side (pull mode). ``kv_transfer_params``:
    each request's params by request id (more with
    :meth:`set_kv_transfer_params`); ``block_size`` the cache's."""

    def __init__(self, config: KVTransferConfig, block_size: int,
                 kv_transfer_params: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        super().__init__(config)
        if config.kv_connector not in (None, "NixlConnector", "NixlPullConnector"):
            raise UserInputError(f"kv_connector={config.kv_connector!r}: NixlConnector needs "
                                 "\"NixlConnector\" (or \"NixlPullConnector\")")
        settings = check_nixl_extra_config(config.kv_connector_extra_config)
        self.kv_lease_duration = float(settings["kv_lease_duration"])
        self.kv_recompute_threshold = int(settings["kv_recompute_threshold"])
        self.engine_id = config.engine_id or REPLAY_ENGINE_ID
        self.block_size = block_size
        self.params: dict[str, dict[str, Any]] = {}
        for rid, params in (kv_transfer_params or {}).items():
            self.set_kv_transfer_params(rid, params)
        # Request id -> its local prefix-cache hit at the last lookup.
        self._num_local: dict[str, int] = {}
        self._meta = NixlMetadata()

    def set_kv_transfer_params(self, request_id: str, params: Mapping[str, Any]) -> None:
        """A request's params (vLLM's ``extra_args["kv_transfer_params"]``),
        before it is added to the scheduler."""
        if not isinstance(params, Mapping):
            raise UserInputError(f"request {request_id}: kv_transfer_params={params!r:.80}: must be an "
                                 "object such as {\"do_remote_prefill\": true}")
        if params.get("do_remote_prefill"):
            # vLLM asserts on a read without remote_block_ids, and parks a
            # request whose other remote fields are missing for ever.
            missing = [k for k in REMOTE_KEYS if k not in params]
            if not params.get("remote_block_ids"):
                missing.insert(0, "remote_block_ids")
            if missing:
                raise UserInputError(f"request {request_id}: kv_transfer_params sets do_remote_prefill "
                                     f"but lacks {', '.join(missing)}; give the prefill side's "
                                     "kv_transfer_params (its request_finished output)")
        self.params[request_id] = dict(params)

    def request_kv_transfer_params(self, request: Request) -> Mapping[str, Any] | None:
        """Its params as they are now: ``do_remote_prefill`` is cleared once
        its read was planned (vLLM's NIXL connector edits the request's)."""
        return self.params.get(request.request_id)

    def _has_remote(self, params: Mapping[str, Any]) -> bool:
        return bool(params.get("remote_block_ids")) and all(k in params for k in REMOTE_KEYS)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        params = self.params.get(request.request_id)
        if params is None:
            return 0, False
        self._num_local[request.request_id] = num_computed_tokens
        if params.get("do_remote_prefill"):
            # The whole prompt beyond the local hit is read from the prefill side.
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        if params.get("do_remote_decode") and self._has_remote(params):
            # A prefill request the decode side holds blocks for (a second
            # turn); read only when worth it (kv_recompute_threshold). Only
            # a bidirectional connector starts that read, which kvsched
            # refuses, so such a request waits for ever, as in vLLM.
            count = min(int(params.get("remote_num_tokens") or 0),
                        request.num_prompt_tokens) - num_computed_tokens
            if count > 0:
                if self.kv_recompute_threshold > 0 and count < self.kv_recompute_threshold:
                    return 0, False
                return count, True
        return 0, False

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        params = self.params.get(rid)
        if not params:
            return
        if params.get("do_remote_decode"):
            self._meta.reqs_in_batch.add(rid)
        if params.get("do_remote_prefill"):
            if self._has_remote(params):
                # The blocks past the local hit are the ones the read fills
                # (vLLM: the request's blocks without a hash); none when
                # there is nothing to read.
                num_local_blocks = self._num_local.get(rid, 0) // self.block_size
                local = list(block_ids[num_local_blocks:]) if num_external_tokens > 0 else []
                self._meta.reqs_to_recv[rid] = NixlRecv(rid, local, num_local_blocks, dict(params),
                                                        num_external_tokens > 0)
            # One read per request, whatever happens to it afterwards.
            params["do_remote_prefill"] = False
            params["_remote_blocks_processed"] = True

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> NixlMetadata:
        meta, self._meta = self._meta, NixlMetadata()
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        return None

    def decode_stretch_refusal(self, running: Sequence[Request]) -> str | None:
        """Reads start at admission and hand-offs at a finish: a decode step
        with neither pending in this batch leaves the connector idle."""
        meta = self._meta
        if meta.reqs_to_recv or meta.reqs_to_send or meta.reqs_in_batch or meta.reqs_not_processed:
            return "the NIXL connector has reads or hand-offs for the next batch"
        return None

    def advance_decode_stretch(self, running: Sequence[Request], new_blocks: Sequence[list[int]]) -> None:
        """Nothing changes: each step's metadata was empty."""
        return None

    def idle_metadata(self) -> NixlMetadata:
        return NixlMetadata()

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._num_local.pop(rid, None)
        params = self.params.pop(rid, None)
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            # Finished before its first allocation (aborted while queued):
            # the worker only tells the prefill side to free its blocks.
            self._meta.reqs_to_recv[rid] = NixlRecv(rid, [], 0, params, False)
            return False, None
        if not params.get("do_remote_decode"):
            return False, None  # a decode-side request: nothing to hand off
        if request.status not in _HANDED_OFF:
            self._meta.reqs_not_processed.add(rid)
            return False, None
        # The blocks holding the computed tokens are what the decode side reads.
        computed = list(block_ids[:-(-request.num_computed_tokens // self.block_size)])
        delay = bool(computed)
        if delay:
            self._meta.reqs_to_send[rid] = self.kv_lease_duration
        return delay, {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": [computed], "remote_engine_id": self.engine_id,
            "remote_request_id": rid,
            "remote_num_tokens": request.num_computed_tokens if delay else 0,
        }


def replay_kv_transfer_params(spec: Mapping[str, Any], block_size: int) -> dict[str, Any] | None:
    """A scenario request's params as the oracle's replay passes them: a
    decode request (``do_remote_prefill``) gets the remote fields it lacks,
    one remote block per ``block_size`` prompt tokens."""
    raw = spec.get("kv_transfer_params")
    if raw is None:
        return None
    params = dict(raw)
    if params.get("do_remote_prefill"):
        for key, value in REPLAY_REMOTE_DEFAULTS.items():
            params.setdefault(key, value)
        params.setdefault("remote_request_id", spec["request_id"])
        num_blocks = -(-len(spec["prompt_token_ids"]) // block_size)
        params.setdefault("remote_block_ids", [list(range(1, 1 + num_blocks))])
    return params


class NixlScriptedWorker:
    """The oracle's NIXL worker side: ``capture`` is called once per
    executed batch, in order, and returns the batch's report and the ids
    whose read failed in it. A read the scheduler parked (``awaiting_kvs``)
    is reported done ``load_steps`` batches after the batch that carried it
    (1: that batch), with ``load_fail`` also as failed with the blocks it
    filled invalid; a held request is reported sent ``send_steps`` batches
    after the batch that carried it. ``specs``: each request's
    NIXL_REQUEST_KEYS."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]]) -> None:
        self.specs = specs
        self.batch = -1
        self.due: dict[int, DueCompletions] = defaultdict(DueCompletions)

    def _steps(self, rid: str, key: str) -> int:
        steps = self.specs.get(rid, {}).get(key)
        return 1 if steps is None else int(steps)

    def capture(self, meta: Any) -> tuple[KVConnectorOutput, set[str]]:
        assert isinstance(meta, NixlMetadata)
        self.batch += 1
        b = self.batch
        for rid, recv in meta.reqs_to_recv.items():
            if not recv.awaiting_kvs:
                continue  # notify-only: nothing comes back
            d = self.due[b + self._steps(rid, "load_steps") - 1]
            d.recv.add(rid)
            if self.specs.get(rid, {}).get("load_fail"):
                d.failed.add(rid)
                d.invalid.update(recv.local_block_ids)
        for rid in meta.reqs_to_send:
            self.due[b + self._steps(rid, "send_steps") - 1].send.add(rid)
        d = self.due.pop(b) if b in self.due else DueCompletions()
        return KVConnectorOutput(d.send, d.recv, d.failed, d.invalid), set(d.failed)
