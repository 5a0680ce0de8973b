"""The scheduler side of a KV connector, with vLLM 0.33's names (and 0.34's
``may_load_async``).

A KV connector moves KV blocks between this scheduler's GPU cache and
somewhere else (another instance for prefill/decode disaggregation, a CPU
tier for offloading). The scheduler asks it, at admission, how many tokens
beyond the local prefix-cache hit it can supply and whether the load is
asynchronous (``get_num_new_matched_tokens``), tells it the blocks given to
the request (``update_state_after_alloc``), hands it every batch's metadata
(``build_connector_meta``) and, when a request finishes, asks whether its
blocks must be held while they are sent (``request_finished``). The worker
side reports completions in each batch's output (:class:`KVConnectorOutput`),
which ``Scheduler.update_from_output`` processes.
"""

from __future__ import annotations

import abc
import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_cache_manager import KVCacheManager
from kvsched.core.output import KVConnectorOutput, SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request

__all__ = ["KVConnectorBase", "KVConnectorOutput", "KVTransferConfig", "combined_role", "multi_child_configs",
           "parse_kv_transfer_config"]

# vLLM's kv_role values; producers hand KV off when a request completes,
# consumers load it.
KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")
_PRODUCERS = ("kv_both", "kv_producer")
_CONSUMERS = ("kv_both", "kv_consumer")
# vLLM's kv_load_failure_policy values: a failed load finishes the request
# with an error, or its tokens are recomputed.
LOAD_FAILURE_POLICIES = ("fail", "recompute")


# The connectors a user's --kv-transfer-config may name, by vLLM's factory
# names (NixlConnector is vLLM's alias of the pull-mode NixlPullConnector;
# MultiConnector lists several in kv_connector_extra_config.connectors).
KV_CONNECTORS = ("NixlConnector", "NixlPullConnector", "MultiConnector")
MULTI_CONNECTOR = "MultiConnector"
# The connectors a MultiConnector may hold (offloading: vLLM's native
# OffloadingConnector, which --kv-offloading-size also makes).
MULTI_CHILD_CONNECTORS = ("NixlConnector", "NixlPullConnector", "OffloadingConnector")
# vLLM's KVTransferConfig fields (it refuses others) and the JSON types each
# takes; the ones kvsched models are kept, the rest only checked.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "kv_connector": (str, type(None)), "engine_id": (str, type(None)),
    "kv_buffer_device": (str,), "kv_role": (str, type(None)), "kv_port": (int,),
    "kv_connector_extra_config": (dict,), "kv_connector_module_path": (str, type(None)),
    "enable_permute_local_kv": (bool,), "kv_load_failure_policy": (str,),
}


@dataclass(slots=True, frozen=True)
class KVTransferConfig:
    """The parts of vLLM's KVTransferConfig the scheduler reads.
    ``kv_connector`` (vLLM's factory name) and ``kv_connector_extra_config``
    are set when the config came from a user's ``--kv-transfer-config``
    (:func:`parse_kv_transfer_config`); the replay's connectors leave them
    unset."""

    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "fail"
    kv_connector: str | None = None
    kv_connector_extra_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    engine_id: str | None = None

    def __post_init__(self) -> None:
        if self.kv_role not in KV_ROLES:
            raise UserInputError(f"kv_role={self.kv_role!r}: unknown role; use one of {KV_ROLES}")
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise UserInputError(f"kv_load_failure_policy={self.kv_load_failure_policy!r}: unknown "
                                 f"policy; use one of {LOAD_FAILURE_POLICIES}")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in _PRODUCERS

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in _CONSUMERS


def combined_role(roles: Sequence[str]) -> str:
    """The role of connectors taken together: a producer when one of them
    produces, a consumer when one consumes (vLLM 0.34's MultiConnector)."""
    producer = any(r in _PRODUCERS for r in roles)
    consumer = any(r in _CONSUMERS for r in roles)
    if producer and consumer:
        return "kv_both"
    if producer:
        return "kv_producer"
    if consumer:
        return "kv_consumer"
    raise UserInputError(f"kv_role={list(roles)!r}: no connector has a role; give each one of {KV_ROLES}")


def parse_kv_transfer_config(value: str | Mapping[str, Any], where: str = "--kv-transfer-config",
                             allowed: tuple[str, ...] = KV_CONNECTORS) -> KVTransferConfig:
    """A user's ``--kv-transfer-config`` (a JSON object as vLLM's ``vllm
    serve`` takes it, or the object already decoded) as a KVTransferConfig.
    Every field vLLM refuses is refused here too (unknown fields, wrong
    types, a connector without ``kv_role``), and so are the connectors
    kvsched does not rebuild; each error names the field, the value and the
    fix. The connector's own ``kv_connector_extra_config`` keys are checked
    when the connector is built, except a MultiConnector's ``connectors``,
    each checked here as a config of its own (``allowed``: the connector
    names accepted)."""
    if isinstance(value, str):
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as e:
            raise UserInputError(f"{where}: not valid JSON ({e}); give an object such as "
                                 '\'{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}\'') from None
    else:
        obj = value
    if not isinstance(obj, Mapping):
        raise UserInputError(f"{where}: must be a JSON object, not {type(obj).__name__}; give "
                             '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}')
    for key, val in obj.items():
        types = _FIELD_TYPES.get(key)
        if types is None:
            close = difflib.get_close_matches(str(key), _FIELD_TYPES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserInputError(f"{where}: unknown field {key!r} (vLLM's KVTransferConfig refuses "
                                 f"it); {hint}valid fields: {', '.join(_FIELD_TYPES)}")
        # bool is an int in Python; vLLM's kv_port takes no true/false.
        if not isinstance(val, types) or (key == "kv_port" and isinstance(val, bool)):
            names = " or ".join("null" if t is type(None) else {"str": "a string", "int": "an integer",
                                "dict": "an object", "bool": "true or false"}[t.__name__] for t in types)
            raise UserInputError(f"{where}: {key}={val!r}: must be {names}")
    connector = obj.get("kv_connector")
    role = obj.get("kv_role")
    if connector is None:
        raise UserInputError(f"{where}: kv_connector is missing or null: kvsched models a KV "
                             f"connector's scheduler side; give one of {', '.join(allowed)}")
    if connector not in allowed:
        raise UserInputError(f"{where}: kv_connector={connector!r}: kvsched does not rebuild this "
                             f"connector here; use one of {', '.join(allowed)}")
    if obj.get("kv_connector_module_path") is not None:
        raise UserInputError(f"{where}: kv_connector_module_path={obj['kv_connector_module_path']!r}: "
                             "kvsched cannot load a connector from a module; remove the field")
    if role is None:
        raise UserInputError(f"{where}: kv_role is missing: vLLM needs it with a kv_connector; give "
                             f"one of {', '.join(KV_ROLES)}")
    if role not in KV_ROLES:
        raise UserInputError(f"{where}: kv_role={role!r}: unknown role; use one of {', '.join(KV_ROLES)}")
    policy = obj.get("kv_load_failure_policy", "fail")
    if policy not in LOAD_FAILURE_POLICIES:
        raise UserInputError(f"{where}: kv_load_failure_policy={policy!r}: unknown policy; use one of "
                             f"{', '.join(LOAD_FAILURE_POLICIES)}")
    config = KVTransferConfig(kv_role=role, kv_load_failure_policy=policy, kv_connector=connector,
                              kv_connector_extra_config=dict(obj.get("kv_connector_extra_config", {})),
                              engine_id=obj.get("engine_id"))
    if connector == MULTI_CONNECTOR:
        multi_child_configs(config, where)
    return config


def multi_child_configs(config: KVTransferConfig,
                        where: str = "--kv-transfer-config") -> list[KVTransferConfig]:
    """The children of a MultiConnector's config (vLLM's JSON:
    ``kv_connector_extra_config.connectors``, a list of KVTransferConfig
    objects), each checked as a config of its own, in order; a child without
    ``engine_id`` takes the parent's, as vLLM does."""
    raw = config.kv_connector_extra_config.get("connectors")
    path = f"{where}: kv_connector_extra_config.connectors"
    if not isinstance(raw, list) or not raw:
        raise UserInputError(f"{path}={raw!r:.80}: MultiConnector needs a non-empty list of connector "
                             'configs, e.g. [{"kv_connector": "NixlConnector", "kv_role": "kv_both"}, '
                             '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
                             '"kv_connector_extra_config": {"cpu_bytes_to_use": 8589934592}}]')
    unknown = [k for k in config.kv_connector_extra_config if k != "connectors"]
    if unknown:
        raise UserInputError(f"{where}: kv_connector_extra_config.{unknown[0]}: MultiConnector reads only "
                             "'connectors'; move the setting into a child connector's own "
                             "kv_connector_extra_config")
    children = []
    for i, child in enumerate(raw):
        child_where = f"{where}: kv_connector_extra_config.connectors[{i}]"
        if not isinstance(child, Mapping):
            raise UserInputError(f"{child_where}={child!r:.80}: must be a KVTransferConfig object")
        parsed = parse_kv_transfer_config(child, child_where, MULTI_CHILD_CONNECTORS)
        if parsed.engine_id is None and config.engine_id is not None:
            parsed = KVTransferConfig(parsed.kv_role, parsed.kv_load_failure_policy, parsed.kv_connector,
                                      parsed.kv_connector_extra_config, config.engine_id)
        children.append(parsed)
    return children


class KVConnectorBase(abc.ABC):
    """A connector's scheduler side (vLLM's KVConnectorBase_V1, role
    SCHEDULER). Subclasses answer the lookup, record allocations and build
    each batch's metadata; the rest has vLLM's defaults."""

    def __init__(self, config: KVTransferConfig) -> None:
        self.kv_transfer_config = config

    @property
    def requires_kv_delivery(self) -> bool:
        """A request preempted while a batch that scheduled it is in flight
        drops that batch's output (it is recomputed rather than handing off
        blocks the preemption freed). vLLM's default: producer roles."""
        return self.kv_transfer_config.is_kv_producer

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        """The scheduler's KV cache manager, for a connector that reads the
        requests' prefix-cache hashes (vLLM's default: nothing to do)."""
        return None

    @abc.abstractmethod
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond the (block-aligned) local hit ``num_computed_tokens``
        the connector can supply, and whether the load is asynchronous.
        None: cannot tell yet, ask again next step."""

    @abc.abstractmethod
    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """The request was given ``block_ids``; ``num_external_tokens`` of
        them are to be loaded (0: nothing to load)."""

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        """The metadata the worker side gets with this batch; resets the
        connector's per-step state."""

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """The worker's report for a processed batch."""
        return None

    def request_kv_transfer_params(self, request: Request) -> Mapping[str, Any] | None:
        """The request's ``kv_transfer_params`` as the connector holds them
        (vLLM keeps them on the request; kvsched's connectors that read them
        keep each request's), or None."""
        return None

    def may_load_async(self, request: Request) -> bool:
        """Whether ``get_num_new_matched_tokens`` may answer with an
        asynchronous load for ``request`` (vLLM 0.34, read when the request
        is queued with --max-num-inflight-kv-loads: such requests wait in
        async_kv_waiting and may start loading while the batch is full; a
        false positive holds other loads back until a slot frees). vLLM's
        default: the request's ``do_remote_prefill`` (a P/D decode read)."""
        params = self.request_kv_transfer_params(request)
        return bool(params and params.get("do_remote_prefill"))

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """The request finished: whether its blocks must be held until the
        worker reports them in ``finished_sending``, and transfer
        parameters for its output."""
        return False, None

    def has_pending_block_frees(self) -> bool:
        """True while a delayed free is in flight: the scheduler waits for it
        rather than preempting."""
        return False

    def has_pending_push_work(self) -> bool:
        """Connector work in flight that keeps the engine stepping."""
        return False

    def decode_stretch_refusal(self, running: Sequence[Request]) -> str | None:
        """Why a pure-decode stretch of ``running`` (nothing waiting, every
        request decoding) may not be taken in one jump with this connector,
        or None when each of its steps provably leaves the connector with
        nothing to do but what ``advance_decode_stretch`` does. The
        connector's part of ``kvsched.core.fast_forward.stretch_refusal``;
        a connector that does not say refuses."""
        return f"{type(self).__name__} does not say when a decode step leaves it idle"

    def advance_decode_stretch(self, running: Sequence[Request], new_blocks: Sequence[list[int]]) -> None:
        """What ``build_connector_meta`` of the stretch's steps did to the
        connector's state (``decode_stretch_refusal`` said None before it):
        ``new_blocks[i]``, the blocks running request i took in the stretch,
        in order; each request's tokens are as after the stretch."""
        raise NotImplementedError(f"{type(self).__name__} takes no decode stretch")

    def idle_metadata(self) -> Any:
        """The metadata a step of a decode stretch gives the worker (one
        that starts nothing)."""
        raise NotImplementedError(f"{type(self).__name__} takes no decode stretch")
