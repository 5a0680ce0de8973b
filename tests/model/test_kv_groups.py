"""A model's KV cache groups as vLLM's planner forms them
(kv_cache_planning._get_kv_cache_groups_uniform_page_size); the expected
layouts are worked out by hand from that rule. Torch-free."""

from __future__ import annotations

from typing import Any

from kvsched.config import KVCacheGroup
from kvsched.model.config import parse_model_config
from kvsched.model.kv_groups import kv_cache_groups


def _gemma3(layers: int, **extra: Any) -> Any:
    return parse_model_config({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                               "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
                               "num_attention_heads": 4, "sliding_window": 512, **extra})


def test_gemma3_1b_six_sliding_groups_and_one_full() -> None:
    # 26 layers, every 6th global: layers 5, 11, 17, 23 full, 22 sliding.
    # Buckets in order of first appearance (layer 0 slides); group size 4
    # (22 >= 1.5 * 4); the sliding bucket splits into cdiv(22, 4) = 6 groups
    # taking every 6th sliding layer, the last two one layer short.
    groups = kv_cache_groups(_gemma3(26, sliding_window_pattern=6), 16)
    sliding = [i for i in range(26) if i not in (5, 11, 17, 23)]
    assert groups.layers == (*(tuple(sliding[i::6]) for i in range(6)), (5, 11, 17, 23))
    assert groups.layers[0] == (0, 7, 14, 21) and groups.layers[5] == (6, 13, 20)
    assert groups.groups == (
        *(KVCacheGroup("sliding_window", 16, n, sliding_window=512) for n in (4, 4, 4, 4, 3, 3)),
        KVCacheGroup("full_attention", 16, 4))
    assert groups.layer_groups[:7] == (0, 1, 2, 3, 4, 6, 5)
    # vLLM's shared tensors: the i-th layer of every group on tensor i.
    assert groups.num_shared_tensors == 4
    tensors = groups.layer_tensors
    assert [tensors[i] for i in (0, 7, 14, 21)] == [0, 1, 2, 3]
    assert [tensors[i] for i in (5, 11, 17, 23)] == [0, 1, 2, 3]
    assert [tensors[i] for i in (6, 13, 20)] == [0, 1, 2]


def test_ten_full_twenty_sliding_make_three_groups_of_ten() -> None:
    # docs/hybrid_kv_cache.md's example: (full, sliding, sliding) x 10.
    types = ["full_attention", "sliding_attention", "sliding_attention"] * 10
    groups = kv_cache_groups(_gemma3(30, layer_types=types), 32)
    assert [g.kind for g in groups.groups] == ["full_attention", "sliding_window", "sliding_window"]
    assert [g.num_layers for g in groups.groups] == [10, 10, 10]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    assert groups.layers == (tuple(range(0, 30, 3)), tuple(sliding[0::2]), tuple(sliding[1::2]))


def test_close_bucket_sizes_take_the_larger_as_group_size() -> None:
    # 12 sliding + 13 full: 13 < 1.5 * 12, so groups of 13: one each (gpt-oss-20b + EAGLE in vLLM).
    types = ["sliding_attention", "full_attention"] * 12 + ["full_attention"]
    groups = kv_cache_groups(_gemma3(25, layer_types=types), 16)
    assert [(g.kind, g.num_layers) for g in groups.groups] == [("sliding_window", 12), ("full_attention", 13)]


def test_one_kind_of_layer_is_one_group() -> None:
    llama = parse_model_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                "vocab_size": 100, "hidden_size": 64, "intermediate_size": 64,
                                "num_hidden_layers": 3, "num_attention_heads": 4})
    groups = kv_cache_groups(llama, 16)
    assert groups.groups == (KVCacheGroup("full_attention", 16, 3),) and groups.layers == ((0, 1, 2),)
    mistral = parse_model_config({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                  "vocab_size": 100, "hidden_size": 64, "intermediate_size": 64,
                                  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "sliding_window": 64,
                                  "max_position_embeddings": 1024})
    assert kv_cache_groups(mistral, 16).groups == (KVCacheGroup("sliding_window", 16, 3, sliding_window=64),)
    all_sliding = _gemma3(4, layer_types=["sliding_attention"] * 4)
    assert kv_cache_groups(all_sliding, 8).layer_groups == (0, 0, 0, 0)
