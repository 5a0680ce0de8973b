"""The CPU tier of KV offloading (vLLM's CPUOffloadingManager with its LRU
and ARC cache policies, 0.33 and 0.34), rebuilt for kvsched.

The CPU cache holds fixed-size chunks (``blocks_per_chunk`` GPU blocks
each), keyed by the prefix-cache hash of a chunk's last block. A chunk is
written by a store job (``prepare_store`` allocates it, not yet readable;
``complete_store`` makes it readable, or drops it when the store failed)
and read by load jobs
(``prepare_load`` pins it, ``complete_load`` unpins it). Only readable,
unpinned chunks can be evicted; which one goes is the policy's choice.

Recency is request-scoped, as in vLLM: the keys a request touches are
remembered in its :class:`RequestAccess` and committed to the policy when
the request finishes (``on_request_finished``), head-of-prompt most recent.
"""

from __future__ import annotations

import abc
import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kvsched.errors import UserInputError

__all__ = [
    "EVICTION_POLICIES",
    "ARCPolicy",
    "CPUChunk",
    "CPUOffloadingManager",
    "CachePolicy",
    "LRUPolicy",
    "LookupResult",
    "RequestAccess",
    "make_policy",
]

# An offload key: the prefix-cache hash of a chunk's last GPU block.
OffloadKey = int
EVICTION_POLICIES = ("lru", "arc")
# vLLM's default cap on the store-threshold offer counter.
MAX_TRACKER_SIZE = 64_000


class LookupResult(Enum):
    MISS = 0
    HIT = 1
    # Present but its store has not completed: not readable yet.
    HIT_PENDING = 2


@dataclass(slots=True)
class CPUChunk:
    """One CPU slot. ``ref_cnt``: -1 while its store is in flight, else the
    number of loads reading it."""

    chunk_id: int
    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass(slots=True)
class RequestAccess:
    """What one request did to the CPU cache (vLLM's ReqContext with the
    manager's and the LRU policy's per-request state). ``positions``: key ->
    the token count its chunk ends at, filled by the connector."""

    positions: dict[OffloadKey, int] = field(default_factory=dict)
    lru_rank: int | None = None
    keys: list[OffloadKey] = field(default_factory=list)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted: set[OffloadKey] = field(default_factory=set)
    reused: set[OffloadKey] = field(default_factory=set)
    store_misses: set[OffloadKey] = field(default_factory=set)
    # Keys this request offered so far, each counted once toward the store
    # threshold where the manager counts once per request.
    counted: set[OffloadKey] = field(default_factory=set)
    finished: bool = False


class CachePolicy(abc.ABC):
    """Chunk organisation and eviction order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abc.abstractmethod
    def get(self, key: OffloadKey) -> CPUChunk | None: ...

    @abc.abstractmethod
    def insert(self, key: OffloadKey, chunk: CPUChunk, access: RequestAccess) -> None: ...

    @abc.abstractmethod
    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, CPUChunk]] | None:
        """Exactly ``n`` unpinned, readable chunks outside ``protected``, or
        None (and no change) when there are fewer."""

    def on_store_miss(self, keys: Sequence[OffloadKey], access: RequestAccess) -> None:
        """Keys about to be stored (absent from the cache)."""
        return None

    def on_request_access(self, keys: Sequence[OffloadKey], access: RequestAccess) -> None:
        """Keys the request sees for the first time."""
        return None

    @abc.abstractmethod
    def on_request_finished(self, keys: Sequence[OffloadKey], inserted_only: set[OffloadKey],
                            reused: set[OffloadKey], access: RequestAccess) -> None:
        """The request's keys, head to tail, committed once."""

    def mark_evictable(self, key: OffloadKey) -> None:
        return None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        return None

    @abc.abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` (its store failed: the chunk never became readable)."""


class LRUPolicy(CachePolicy):
    """Least recently used first. A rank orders chunks (smaller: evicted
    first). A running request holds one provisional rank for all its keys,
    the tail of its prompt before its head; when it finishes its keys get
    fresh ranks, tail first, so its head is the most recent.

    Eviction takes the evictable chunks in (rank, key) order, from a
    min-heap of (rank, key) entries instead of a sort of the cache per
    eviction: an entry is pushed whenever an evictable key gets a rank or a
    key becomes evictable, it is live while its key is evictable at exactly
    that rank, and entries gone stale are dropped when they surface (or
    when they outnumber the live ones, by a rebuild)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.chunks: dict[OffloadKey, CPUChunk] = {}
        self.ranks: dict[OffloadKey, tuple[int, int]] = {}
        self.evictable: set[OffloadKey] = set()
        self.next_rank = 0
        # (rank, key) of every evictable key, plus stale entries.
        self.heap: list[tuple[tuple[int, int], OffloadKey]] = []

    def _request_rank(self, access: RequestAccess) -> int:
        if access.lru_rank is None:
            self.next_rank += 1
            access.lru_rank = self.next_rank
        return access.lru_rank

    def _set_rank(self, key: OffloadKey, rank: tuple[int, int]) -> None:
        self.ranks[key] = rank
        if key in self.evictable:
            self._push(key)

    def _push(self, key: OffloadKey) -> None:
        """An entry for evictable ``key`` at its rank."""
        heap = self.heap
        heapq.heappush(heap, (self.ranks[key], key))
        if len(heap) > 2 * len(self.evictable) + 64:
            # Mostly stale entries: rebuild from the live ones.
            ranks = self.ranks
            heap[:] = [(ranks[k], k) for k in self.evictable]
            heapq.heapify(heap)

    def get(self, key: OffloadKey) -> CPUChunk | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: CPUChunk, access: RequestAccess) -> None:
        self.chunks[key] = chunk
        position = access.positions.get(key)
        if position is None:
            self.next_rank += 1
            rank = (self.next_rank, 0)
        else:
            rank = (self._request_rank(access), -position)
        if chunk.ref_cnt == 0:
            self.evictable.add(key)
        self._set_rank(key, rank)

    def on_request_access(self, keys: Sequence[OffloadKey], access: RequestAccess) -> None:
        rank = self._request_rank(access)
        ranks = self.ranks
        for key in keys:
            position = access.positions.get(key)
            if position is None or key not in self.chunks:
                continue
            # A rank only moves forward (a chunk another request ranked later
            # keeps its rank).
            new = (rank, -position)
            if new > ranks[key]:
                self._set_rank(key, new)

    def on_request_finished(self, keys: Sequence[OffloadKey], inserted_only: set[OffloadKey],
                            reused: set[OffloadKey], access: RequestAccess) -> None:
        for key in reversed(keys):
            if key in self.chunks:
                self.next_rank += 1
                self._set_rank(key, (self.next_rank, 0))

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, CPUChunk]] | None:
        if n == 0:
            return []
        heap = self.heap
        ranks = self.ranks
        evictable = self.evictable
        taken: list[tuple[tuple[int, int], OffloadKey]] = []
        kept: list[tuple[tuple[int, int], OffloadKey]] = []
        popped: set[OffloadKey] = set()
        while len(taken) < n and heap:
            entry = heapq.heappop(heap)
            rank, key = entry
            # Stale (another rank now, or not evictable), or a copy of an
            # entry already popped (a key back at a rank it held before).
            if key in popped or key not in evictable or ranks[key] != rank:
                continue
            popped.add(key)
            (kept if key in protected else taken).append(entry)
        for entry in kept:
            heapq.heappush(heap, entry)
        if len(taken) < n:
            for entry in taken:
                heapq.heappush(heap, entry)
            return None
        out = []
        for _, key in taken:
            evictable.remove(key)
            del ranks[key]
            out.append((key, self.chunks.pop(key)))
        return out

    def mark_evictable(self, key: OffloadKey) -> None:
        self.evictable.add(key)
        self._push(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.evictable.remove(key)

    def remove(self, key: OffloadKey) -> None:
        # Its heap entries, if any, go stale: the key is no longer evictable.
        del self.chunks[key]
        self.ranks.pop(key, None)
        self.evictable.discard(key)


class ARCPolicy(CachePolicy):
    """Adaptive replacement: T1 holds chunks used once, T2 chunks reused;
    B1/B2 remember keys recently evicted from each. A store of a key found
    in B1 grows T1's target size, one found in B2 shrinks it; eviction takes
    from T1 while it is at least its target, else from T2."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.target_t1_size = 0.0
        self.t1: OrderedDict[OffloadKey, CPUChunk] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, CPUChunk] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> CPUChunk | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: CPUChunk, access: RequestAccess) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        # The ghost lists keep their keys: a failed store evicted nothing.
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def on_store_miss(self, keys: Sequence[OffloadKey], access: RequestAccess) -> None:
        for key in reversed(keys):
            if key in self.b1:
                self.target_t1_size = min(self.target_t1_size + max(1, len(self.b2) / len(self.b1)),
                                          self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target_t1_size = max(self.target_t1_size - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def on_request_finished(self, keys: Sequence[OffloadKey], inserted_only: set[OffloadKey],
                            reused: set[OffloadKey], access: RequestAccess) -> None:
        for key in reversed(keys):
            if key in inserted_only:
                # Storing is no reuse: recency only.
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, CPUChunk]] | None:
        if n == 0:
            return []

        def candidates(entries: Iterator[tuple[OffloadKey, CPUChunk]]) -> Iterator[OffloadKey]:
            return (k for k, c in entries if c.ref_cnt == 0 and k not in protected)

        # One forward scan over each list (a candidate skipped is never
        # revisited), deciding per eviction with T1's size as it would be.
        t1_scan = candidates(iter(self.t1.items()))
        t2_scan = candidates(iter(self.t2.items()))
        picked: list[tuple[OffloadKey, bool]] = []
        t1_size = len(self.t1)
        for _ in range(n):
            key = None
            from_t1 = False
            if t1_size >= int(self.target_t1_size):
                key = next(t1_scan, None)
                from_t1 = key is not None
            if key is None:
                key = next(t2_scan, None)
            if key is None:
                key = next(t1_scan, None)
                if key is None:
                    return None
                from_t1 = True
            if from_t1:
                t1_size -= 1
            picked.append((key, from_t1))
        out = []
        for key, from_t1 in picked:
            if from_t1:
                out.append((key, self.t1.pop(key)))
                self.b1[key] = None
            else:
                out.append((key, self.t2.pop(key)))
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return out


def make_policy(name: str, capacity: int) -> CachePolicy:
    if name == "lru":
        return LRUPolicy(capacity)
    if name == "arc":
        return ARCPolicy(capacity)
    raise UserInputError(f"eviction_policy={name!r}: unknown policy; use one of {EVICTION_POLICIES}")


class CPUOffloadingManager:
    """``num_chunks`` CPU slots under a cache policy. ``store_threshold``
    >= 2: a chunk is stored only once it was offered that often; with
    ``count_once_per_request`` (vLLM 0.34) each request's offers of a key
    count once, else (0.33) every offer counts."""

    def __init__(self, num_chunks: int, policy: str = "lru", store_threshold: int = 1,
                 count_once_per_request: bool = False) -> None:
        if num_chunks < 1:
            raise UserInputError(f"num_cpu_blocks={num_chunks}: must be >= 1")
        self.num_chunks = num_chunks
        self.policy = make_policy(policy, num_chunks)
        self.store_threshold = store_threshold
        # Slots handed out so far (never shrinks) and the freed ones, reused last-freed first.
        self.num_allocated = 0
        self.free_list: list[int] = []
        self.num_evictable = 0
        self.counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.count_once_per_request = count_once_per_request

    @property
    def num_used_chunks(self) -> int:
        """Slots holding a chunk (the trace's ``cpu_chunks``)."""
        return self.num_allocated - len(self.free_list)

    def _num_free(self) -> int:
        return len(self.free_list) + self.num_chunks - self.num_allocated

    def _allocate(self, n: int) -> list[CPUChunk]:
        fresh = min(n, self.num_chunks - self.num_allocated)
        chunks = [CPUChunk(self.num_allocated + i) for i in range(fresh)]
        self.num_allocated += fresh
        chunks.extend(CPUChunk(self.free_list.pop()) for _ in range(n - fresh))
        return chunks

    def _count_offers(self, keys: Sequence[OffloadKey], counted: set[OffloadKey]) -> None:
        """One more offer of each of ``keys``; ``counted``: keys whose offers
        by this request no longer count (they stay tracked)."""
        counts = self.counts
        assert counts is not None
        offered = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                if key not in counted:
                    counts[key] += 1
                offered.add(key)
        # Full: the oldest not offered now makes room.
        evictable = len(counts) - len(offered)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= MAX_TRACKER_SIZE:
                if evictable == 0:
                    continue
                counts.popitem(last=False)
                evictable -= 1
            counts[key] = 1

    def _record_access(self, keys: Iterable[OffloadKey], access: RequestAccess,
                       reused: Iterable[OffloadKey] = ()) -> None:
        new = []
        for key in keys:
            if key not in access.seen:
                assert not access.finished, "new keys after the request finished"
                access.seen.add(key)
                access.keys.append(key)
                new.append(key)
        if new:
            self.policy.on_request_access(new, access)
        # Reading back a chunk this request stored is no reuse.
        access.reused.update(k for k in reused if k not in access.inserted)

    def lookup(self, key: OffloadKey) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Sequence[OffloadKey], access: RequestAccess) -> list[int]:
        """Pin ``keys`` (all readable) for a load; their CPU slots."""
        slots = []
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.is_ready, f"chunk {key} is not readable"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
            slots.append(chunk.chunk_id)
        self._record_access(keys, access, reused=keys)
        return slots

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(self, keys: Sequence[OffloadKey],
                      access: RequestAccess) -> tuple[list[OffloadKey], list[int]] | None:
        """Allocate slots for the offered ``keys`` not cached yet (and past
        the store threshold), evicting if needed: the keys to store and
        their slots, or None when too few chunks can be evicted."""
        counted: set[OffloadKey] = access.counted if self.count_once_per_request else set()
        if self.counts is not None:
            self._count_offers(keys, counted)
        to_store = []
        present = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                present.append(key)
        if self.counts is not None:
            counts = self.counts
            to_store = [k for k in to_store if counts.get(k, 0) >= self.store_threshold]
            if self.count_once_per_request:
                counted.update(keys)
        misses = [k for k in to_store if k not in access.store_misses]
        if misses:
            self.policy.on_store_miss(misses, access)
            access.store_misses.update(misses)
        recorded = set(to_store) | set(present)
        self._record_access([k for k in keys if k in recorded], access, reused=present)
        if not to_store:
            return [], []
        num_to_evict = len(to_store) - self._num_free()
        if num_to_evict > 0:
            if num_to_evict > self.num_evictable:
                return None
            # Chunks offered now stay: the request relies on them.
            evicted = self.policy.evict(num_to_evict, set(keys))
            if evicted is None:
                return None
            self.num_evictable -= len(evicted)
            self.free_list.extend(chunk.chunk_id for _, chunk in evicted)
        chunks = self._allocate(len(to_store))
        for key, chunk in zip(to_store, chunks):
            self.policy.insert(key, chunk, access)
        access.inserted.update(to_store)
        return to_store, [c.chunk_id for c in chunks]

    def complete_store(self, keys: Iterable[OffloadKey], success: bool = True) -> None:
        """The store of ``keys`` is done: its chunks become readable, or, when
        it failed, are dropped and their slots freed (in ``keys``' order: the
        last freed is reused first)."""
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None or chunk.is_ready:
                continue
            if success:
                chunk.ref_cnt = 0
                self.num_evictable += 1
                self.policy.mark_evictable(key)
            else:
                self.policy.remove(key)
                self.free_list.append(chunk.chunk_id)

    def on_request_finished(self, access: RequestAccess) -> None:
        if access.finished:
            return
        access.finished = True
        positions = access.positions
        keys = list(access.keys)
        if all(k in positions for k in keys):
            keys.sort(key=positions.__getitem__)
        self.policy.on_request_finished(keys, access.inserted - access.reused, access.reused, access)
