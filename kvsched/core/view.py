"""What admission policies read of a scheduler: a Protocol below both.

:mod:`kvsched.core.policies` types its hooks against :class:`SchedulerView`
rather than the scheduler class, so the scheduler (which takes a policy)
and the policies (which read a scheduler) do not import each other; the
scheduler satisfies the view structurally. Policies only read through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Protocol

from kvsched.request import Request


class PrefixLookup(Protocol):
    """The KV cache's prefix-cache lookup (``KVCacheManager.get_computed_blocks``)."""

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]: ...


class SchedulerView(Protocol):
    """The scheduler state a policy decides from (read only)."""

    @property
    def running(self) -> list[Request]: ...

    @property
    def waiting(self) -> Sized: ...

    @property
    def requests(self) -> Mapping[str, Request]: ...

    @property
    def max_num_running_reqs(self) -> int: ...

    @property
    def kv_cache_manager(self) -> PrefixLookup: ...
