"""The scheduler side of a KV connector, with vLLM 0.33's names.

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
from dataclasses import dataclass
from typing import Any

from kvsched.core.output import KVConnectorOutput, SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request

__all__ = ["KVConnectorBase", "KVConnectorOutput", "KVTransferConfig"]

# vLLM's kv_role values; producers hand KV off when a request completes,
# consumers load it.
KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")
_PRODUCERS = ("kv_both", "kv_producer")
_CONSUMERS = ("kv_both", "kv_consumer")
# vLLM's kv_load_failure_policy values: a failed load finishes the request
# with an error, or its tokens are recomputed.
LOAD_FAILURE_POLICIES = ("fail", "recompute")


@dataclass(slots=True, frozen=True)
class KVTransferConfig:
    """The parts of vLLM's KVTransferConfig the scheduler reads."""

    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "fail"

    def __post_init__(self) -> None:
        if self.kv_role not in KV_ROLES:
            raise UserInputError(f"kv_role={self.kv_role!r}: unknown role; use one of {KV_ROLES}")
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise UserInputError(f"kv_load_failure_policy={self.kv_load_failure_policy!r}: unknown "
                                 f"policy; use one of {LOAD_FAILURE_POLICIES}")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in _PRODUCERS

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in _CONSUMERS


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
