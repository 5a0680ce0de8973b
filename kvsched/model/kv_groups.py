"""A model's KV cache groups, as vLLM's KV cache planner forms them: which
layers share a block table.

vLLM gives every attention layer a spec (full attention, or a sliding window
of W tokens). When all layers share one spec there is one group. Otherwise
(``kv_cache_planning._get_kv_cache_groups_uniform_page_size``, reached for
models whose layers all have the same page size, such as Gemma 3) layers are
bucketed by spec in order of first appearance, and every bucket is cut into
groups of ``group_size`` layers, taking every ``num_groups``-th layer, where
``group_size`` is the smallest bucket's layer count (the largest's when it is
under 1.5 times the smallest). Gemma 3 1B (22 sliding, 4 global layers) so
has six sliding-window groups and one full-attention group, in that order.

Every group's block ids index one shared pool; the model runner hands each
layer the block table of its group. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.config import KVCacheGroup
from kvsched.model.config import ModelConfig

# vLLM's threshold: a largest bucket under 1.5x the smallest sets the group size.
_PAD_RATIO = 1.5


@dataclass(slots=True, frozen=True)
class ModelKVCacheGroups:
    """``groups[g]`` holds the layers ``layers[g]`` (indices into the model's
    layers, ascending within the group)."""

    groups: tuple[KVCacheGroup, ...]
    layers: tuple[tuple[int, ...], ...]

    @property
    def layer_groups(self) -> tuple[int, ...]:
        """Each layer's group index, by layer."""
        where = {layer: g for g, members in enumerate(self.layers) for layer in members}
        return tuple(where[i] for i in range(len(where)))

    @property
    def num_shared_tensors(self) -> int:
        """K/V tensors when the groups share them as vLLM's planner lays them
        out: one per position in the largest group."""
        return max(len(members) for members in self.layers)

    @property
    def layer_tensors(self) -> tuple[int, ...]:
        """Each layer's shared tensor, by layer: the i-th layer of every group
        uses tensor i (vLLM's ``kv_cache_tensors``, each shared by one layer of
        each group). Sharing is sound only when no block id is in two groups'
        tables at once, as vLLM's one pool guarantees."""
        where = {layer: i for members in self.layers for i, layer in enumerate(members)}
        return tuple(where[i] for i in range(len(where)))


def kv_cache_groups(config: ModelConfig, block_size: int) -> ModelKVCacheGroups:
    """The KV cache groups of ``config``'s layers with ``block_size``-token blocks."""
    buckets: dict[int | None, list[int]] = {}  # window (None: full) -> layers, first seen first
    for layer, window in enumerate(config.layer_sliding_windows):
        buckets.setdefault(window, []).append(layer)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * _PAD_RATIO:
        group_size = max(sizes)
    groups: list[KVCacheGroup] = []
    members: list[tuple[int, ...]] = []
    for window, layers in buckets.items():
        num_groups = -(-len(layers) // group_size)
        for i in range(num_groups):
            part = tuple(layers[i::num_groups])
            members.append(part)
            if window is None:
                groups.append(KVCacheGroup("full_attention", block_size, len(part)))
            else:
                groups.append(KVCacheGroup("sliding_window", block_size, len(part),
                                           sliding_window=window))
    return ModelKVCacheGroups(tuple(groups), tuple(members))
