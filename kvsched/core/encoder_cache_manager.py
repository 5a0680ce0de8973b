"""The encoder cache of a multimodal model, as vLLM's scheduler keeps it
(vLLM's EncoderCacheManager, and compute_mm_encoder_budget for its size).

Space is counted in encoder embeddings. An entry is keyed by the item's
identifier (its mm hash), so requests showing the same image share one
encoder output. An entry no request refers to any more stays cached but
becomes *freeable*; it is evicted, oldest freeable first, only when an
allocation needs its room, and the evicted identifiers are reported to the
workers with the next SchedulerOutput.

The bookkeeping deliberately uses the same containers as vLLM's (sets of
input indices, an insertion-ordered map of freeable entries): which entry is
evicted first depends on the order references were dropped, and that order
follows from iterating those sets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from kvsched.errors import UserInputError
from kvsched.request import Request

__all__ = ["EncoderCacheManager", "compute_mm_encoder_budget"]


class EncoderCacheManager:
    __slots__ = ("cache_size", "num_free_slots", "num_freeable_slots", "cached", "num_embeds_by_hash",
                 "request_cached_ids", "request_hash_refs", "freeable", "freed")

    def __init__(self, cache_size: int) -> None:
        self.cache_size = cache_size
        # Slots not held by any entry, and slots an allocation could have
        # after evicting every freeable entry.
        self.num_free_slots = cache_size
        self.num_freeable_slots = cache_size
        # identifier -> ids of the requests referring to the entry (empty:
        # cached but freeable).
        self.cached: dict[str, set[str]] = {}
        self.num_embeds_by_hash: dict[str, int] = {}
        # request id -> its input indices holding a reference, and per
        # identifier how many of them (a request may show one image twice:
        # its reference lasts until the last occurrence is freed).
        self.request_cached_ids: dict[str, set[int]] = {}
        self.request_hash_refs: dict[str, dict[str, int]] = {}
        # identifier -> embeddings, oldest freeable first (eviction order).
        self.freeable: OrderedDict[str, int] = OrderedDict()
        # Evicted since the last get_freed_mm_hashes().
        self.freed: list[str] = []

    def check_and_update_cache(self, request: Request, input_id: int) -> bool:
        """Whether the item's encoder output is cached; if so the request
        now refers to it (taking it off the freeable list if nobody did)."""
        mm_hash = request.mm_features[input_id].identifier
        refs = self.cached.get(mm_hash)
        if refs is None:
            return False
        if not refs:
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        refs.add(request.request_id)
        self._add_cached_input_id(request.request_id, input_id, mm_hash)
        return True

    def get_cached_num_encoder_embeds(self, request: Request, input_id: int) -> int | None:
        return self.num_embeds_by_hash.get(request.mm_features[input_id].identifier)

    def can_allocate(self, request: Request, input_id: int, encoder_compute_budget: int,
                     num_embeds_to_schedule: int) -> bool:
        """Whether the item fits the encoder budget left this step and the
        cache (with ``num_embeds_to_schedule`` embeddings already planned
        this call); evicts freeable entries, oldest first, when that makes
        it fit. The eviction stands even if the caller then schedules
        nothing (vLLM's does too)."""
        num_embeds = request.mm_features[input_id].num_embeds
        if num_embeds > encoder_compute_budget:
            return False
        num_embeds += num_embeds_to_schedule
        if num_embeds <= self.num_free_slots:
            return True
        if num_embeds > self.num_freeable_slots:
            return False
        while num_embeds > self.num_free_slots:
            mm_hash, size = self.freeable.popitem(last=False)
            del self.cached[mm_hash]
            del self.num_embeds_by_hash[mm_hash]
            self.freed.append(mm_hash)
            self.num_free_slots += size
        return True

    def allocate(self, request: Request, input_id: int) -> None:
        """Room for the item's encoder output (can_allocate said it fits)."""
        feature = request.mm_features[input_id]
        mm_hash = feature.identifier
        rid = request.request_id
        refs = self.cached.setdefault(mm_hash, set())
        num_embeds = feature.num_embeds
        known = self.num_embeds_by_hash.setdefault(mm_hash, num_embeds)
        # The scheduler refuses one identifier with two sizes (add_request).
        assert known == num_embeds, mm_hash
        assert self.num_free_slots >= num_embeds and self.num_freeable_slots >= num_embeds
        refs.add(rid)
        self._add_cached_input_id(rid, input_id, mm_hash)
        self.num_free_slots -= num_embeds
        self.num_freeable_slots -= num_embeds

    def _add_cached_input_id(self, rid: str, input_id: int, mm_hash: str) -> None:
        ids = self.request_cached_ids.setdefault(rid, set())
        if input_id in ids:
            return
        ids.add(input_id)
        refs = self.request_hash_refs.setdefault(rid, {})
        refs[mm_hash] = refs.get(mm_hash, 0) + 1

    def get_cached_input_ids(self, request: Request) -> AbstractSet[int]:
        return self.request_cached_ids.get(request.request_id, _NO_IDS)

    def free_encoder_input(self, request: Request, input_id: int) -> None:
        """Drop the request's reference to one item; an entry nobody refers
        to becomes freeable (its room is reclaimed only on eviction)."""
        rid = request.request_id
        mm_hash = request.mm_features[input_id].identifier
        ids = self.request_cached_ids.get(rid)
        if ids is not None and input_id in ids:
            ids.remove(input_id)
            refs = self.request_hash_refs[rid]
            refs[mm_hash] -= 1
            if not refs[mm_hash]:
                del refs[mm_hash]
            if not ids:
                del self.request_cached_ids[rid]
                del self.request_hash_refs[rid]
        holders = self.cached.get(mm_hash)
        if not holders:
            return
        # The request shows the item again later: its reference stays.
        if mm_hash in self.request_hash_refs.get(rid, ()):
            return
        holders.discard(rid)
        if not holders:
            size = self.num_embeds_by_hash[mm_hash]
            self.freeable[mm_hash] = size
            self.num_freeable_slots += size

    def free(self, request: Request) -> None:
        """Drop every reference the request holds (finished, preempted, or
        not admitted after all)."""
        for input_id in list(self.get_cached_input_ids(request)):
            self.free_encoder_input(request, input_id)

    def get_freed_mm_hashes(self) -> list[str]:
        """The identifiers evicted since the last call, for the workers; an
        entry evicted and allocated again since then is kept off the list."""
        freed = [h for h in self.freed if h not in self.cached]
        self.freed = []
        return freed

    def check_invariants(self, live_request_ids: set[str]) -> None:
        """The slot counts agree with the entries; only live requests refer
        to an entry; the freeable ones are exactly those nobody refers to."""
        held = sum(self.num_embeds_by_hash.values())
        assert set(self.cached) == set(self.num_embeds_by_hash), "an entry without a size"
        assert self.num_free_slots == self.cache_size - held, (self.num_free_slots, held)
        assert set(self.freeable) == {h for h, refs in self.cached.items() if not refs}
        assert self.num_freeable_slots == self.num_free_slots + sum(self.freeable.values())
        for mm_hash, refs in self.cached.items():
            assert refs <= live_request_ids, f"{mm_hash} referred to by a finished request"
        assert set(self.request_cached_ids) <= live_request_ids, "a finished request holds inputs"


_NO_IDS: frozenset[int] = frozenset()


def compute_mm_encoder_budget(max_num_encoder_input_tokens: int, encoder_cache_size: int,
                              max_num_batched_tokens: int, disable_chunked_mm_input: bool,
                              mm_max_tokens_per_item: Mapping[str, int]) -> tuple[int, int]:
    """(encoder budget per step, encoder cache size) as vLLM derives them:
    each at least the model's largest item, so any item can be encoded and
    cached alone; (0, 0) for a model with no non-text modality. With
    chunked multimodal input disabled, an item must fit one step's token
    budget (vLLM refuses to start otherwise)."""
    if not mm_max_tokens_per_item:
        return 0, 0
    largest = max(mm_max_tokens_per_item.values())
    if disable_chunked_mm_input and largest > max_num_batched_tokens:
        raise UserInputError(
            f"disable_chunked_mm_input=True: a multimodal item of {largest} tokens can never be "
            f"scheduled within max_num_batched_tokens={max_num_batched_tokens}; raise "
            "max_num_batched_tokens or allow chunked multimodal input")
    return max(max_num_encoder_input_tokens, largest), max(encoder_cache_size, largest)
