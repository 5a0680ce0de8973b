"""The encoder path's pieces, checked against hand-computed values: the
encoder cache (vLLM's EncoderCacheManager rules), the budget derivation, the
multimodal part of the block hashes, the scheduler's refusals and the
--explain reasons. (Whole scenarios against vLLM itself:
tests/conformance/test_multimodal.py.)"""

from __future__ import annotations

import pytest
from sched_helpers import run_step

from kvsched import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core import explain
from kvsched.core.encoder_cache_manager import EncoderCacheManager, compute_mm_encoder_budget
from kvsched.core.kv_cache_manager import KVCacheManager, mm_block_keys
from kvsched.errors import UserInputError
from kvsched.request import MultiModalFeature
from kvsched.scenario import parse_scenario

IMAGE = 7


def image_request(rid: str, items: list[tuple[str, int, int]], num_tokens: int,
                  max_tokens: int = 2) -> Request:
    """A prompt of ``num_tokens`` text tokens with images (identifier,
    offset, length) written over it as placeholder tokens."""
    tokens = [11] * num_tokens
    for _, offset, length in items:
        tokens[offset:offset + length] = [IMAGE] * length
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens),
                   mm_features=[MultiModalFeature(i, o, n) for i, o, n in items])


# -- the encoder cache --------------------------------------------------------

def test_cache_shares_frees_lazily_and_evicts_oldest_freeable_first() -> None:
    ecm = EncoderCacheManager(100)
    a = image_request("a", [("x", 0, 40)], 50)
    b = image_request("b", [("y", 0, 30)], 50)
    c = image_request("c", [("x", 5, 40)], 50)
    assert ecm.can_allocate(a, 0, 100, 0)
    ecm.allocate(a, 0)
    ecm.allocate(b, 0)
    assert (ecm.num_free_slots, ecm.num_freeable_slots) == (30, 30)
    assert ecm.check_and_update_cache(c, 0)  # shared: no room taken
    assert (ecm.num_free_slots, ecm.num_freeable_slots) == (30, 30)
    ecm.free_encoder_input(a, 0)  # c still refers to x
    assert ecm.num_freeable_slots == 30
    ecm.free(b)
    ecm.free(c)  # y freeable first, then x
    assert list(ecm.freeable) == ["y", "x"]
    assert (ecm.num_free_slots, ecm.num_freeable_slots) == (30, 100)
    d = image_request("d", [("z", 0, 50)], 60)
    # 50 > 30 free: evicts y (30 -> 60 free), enough; x stays.
    assert ecm.can_allocate(d, 0, 100, 0)
    assert ecm.freed == ["y"] and "x" in ecm.cached
    ecm.allocate(d, 0)
    assert ecm.get_freed_mm_hashes() == ["y"] and ecm.get_freed_mm_hashes() == []
    ecm.check_invariants({"d"})


def test_cache_refuses_beyond_budget_and_freeable_room() -> None:
    ecm = EncoderCacheManager(60)
    a = image_request("a", [("x", 0, 40)], 50)
    b = image_request("b", [("y", 0, 30)], 50)
    assert not ecm.can_allocate(a, 0, 39, 0)  # one short of the encoder budget
    ecm.allocate(a, 0)
    assert not ecm.can_allocate(b, 0, 100, 0)  # 30 > 20 free, nothing freeable
    assert ecm.freed == []
    assert ecm.can_allocate(b, 0, 100, 0) is False


def test_evicted_then_allocated_again_is_not_reported() -> None:
    ecm = EncoderCacheManager(40)
    a = image_request("a", [("x", 0, 40)], 50)
    b = image_request("b", [("y", 0, 40)], 50)
    ecm.allocate(a, 0)
    ecm.free(a)
    assert ecm.can_allocate(b, 0, 40, 0)  # evicts x
    ecm.allocate(b, 0)
    ecm.free(b)
    assert ecm.can_allocate(a, 0, 40, 0)  # evicts y, x comes back
    ecm.allocate(a, 0)
    assert ecm.get_freed_mm_hashes() == ["y"]


def test_a_repeated_image_keeps_its_reference_until_its_last_occurrence() -> None:
    ecm = EncoderCacheManager(100)
    a = image_request("a", [("x", 0, 20), ("x", 30, 20)], 60)
    ecm.allocate(a, 0)
    assert ecm.check_and_update_cache(a, 1)
    ecm.free_encoder_input(a, 0)
    assert not ecm.freeable  # index 1 still refers to x
    ecm.free_encoder_input(a, 1)
    assert list(ecm.freeable) == ["x"]


def test_embed_mask_counts_embeddings() -> None:
    f = MultiModalFeature("m", 4, 6, "image", [False, True, True, False, True, True])
    assert f.num_embeds == 4 and f.end == 10
    assert f.embeds_in_range(0, 1) == 0 and f.embeds_in_range(0, 3) == 2
    assert f.embeds_in_range(3, 6) == 2


def test_budget_is_raised_to_the_largest_item() -> None:
    assert compute_mm_encoder_budget(100, 50, 512, False, {"image": 80}) == (100, 80)
    assert compute_mm_encoder_budget(100, 50, 512, False, {}) == (0, 0)
    with pytest.raises(UserInputError, match="disable_chunked_mm_input"):
        compute_mm_encoder_budget(100, 50, 64, True, {"image": 80})


# -- block hashes ---------------------------------------------------------------

def test_same_tokens_other_image_share_only_the_blocks_before_it() -> None:
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=32, block_size=4, enable_prefix_caching=True), 256)
    a = image_request("a", [("x", 6, 8)], 20)
    b = image_request("b", [("y", 6, 8)], 20)
    c = image_request("c", [("x", 6, 8)], 20)
    text = Request("t", list(a.prompt_token_ids))
    ha, hb, hc = (list(kv.block_hashes(r, 5)) for r in (a, b, c))
    ht = list(kv.block_hashes(text, 5))
    assert ha[0] == hb[0] == ht[0]  # positions 0-3: no image there
    assert all(x != y for x, y in zip(ha[1:], hb[1:]))  # the image starts in block 1
    assert ha == hc and ha[1] != ht[1]


def test_mm_keys_name_the_offset_within_the_block() -> None:
    f = MultiModalFeature("x", 6, 8)
    assert mm_block_keys([f], 4, 8) == (("mm", "x", 2),)
    assert mm_block_keys([f], 12, 16) == (("mm", "x", -6),)
    assert mm_block_keys([f], 16, 20) == ()
    assert mm_block_keys([f], 0, 4) == ()


# -- the scheduler ----------------------------------------------------------------

def mm_scheduler(*, budget: int = 64, encoder_budget: int | None = None, cache_size: int | None = None,
                 explain_admission: bool = False, largest: int = 40) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=512,
                             max_num_encoder_input_tokens=encoder_budget, encoder_cache_size=cache_size)
    return Scheduler(config, CacheConfig(num_gpu_blocks=64, block_size=4),
                     explain_admission=explain_admission, mm_max_tokens_per_item={"image": largest})


def test_text_scheduler_refuses_images() -> None:
    sched = Scheduler(SchedulerConfig(max_model_len=512), CacheConfig(num_gpu_blocks=64, block_size=4))
    with pytest.raises(UserInputError, match="no encoder"):
        sched.add_request(image_request("a", [("x", 0, 8)], 10))


def test_one_identifier_one_size() -> None:
    sched = mm_scheduler()
    sched.add_request(image_request("a", [("x", 0, 8)], 10))
    with pytest.raises(UserInputError, match="'x' has 9 embeddings"):
        sched.add_request(image_request("b", [("x", 0, 9)], 10))


def test_identifier_sizes_are_kept_only_while_something_shares_them() -> None:
    sched = mm_scheduler()
    sched.add_request(image_request("a", [("x", 0, 8), ("x", 12, 8)], 24, max_tokens=1))
    for _ in range(4):
        run_step(sched)
    assert not sched.requests
    assert sched._mm_num_embeds == {}  # nothing in flight remembers "x"
    # "x" is still in the encoder cache (freeable): it keeps its size.
    with pytest.raises(UserInputError, match="'x' has 9 embeddings"):
        sched.add_request(image_request("b", [("x", 0, 9)], 10))
    assert not sched.requests


def test_item_larger_than_the_model_declares_is_refused() -> None:
    sched = mm_scheduler(largest=40)
    with pytest.raises(UserInputError, match="could never be encoded"):
        sched.add_request(image_request("a", [("x", 0, 70)], 80))


def test_waiting_request_passed_over_for_encoder_budget_says_so() -> None:
    # Budget 40 = the largest image: a's image takes it, b's image (at the
    # start of its prompt) must wait, so b schedules nothing and is passed over.
    sched = mm_scheduler(budget=256, encoder_budget=40, explain_admission=True)
    sched.add_request(image_request("a", [("x", 2, 40)], 50))
    sched.add_request(image_request("b", [("y", 0, 40)], 50))
    output, _ = run_step(sched)
    assert list(output.num_scheduled_tokens) == ["a"]
    assert output.scheduled_encoder_inputs == {"a": [0]}
    (held,) = output.not_admitted or []
    assert (held.request_id, held.reason) == ("b", explain.REASON_ENCODER_BUDGET)
    assert "0 of max_num_encoder_input_tokens=40" in held.detail
    output, _ = run_step(sched)
    assert output.scheduled_encoder_inputs == {"b": [0]}


def test_running_chunk_stops_before_an_image_the_cache_cannot_take() -> None:
    # Cache 40: a holds x (referenced until a's decoder passes it); b's
    # chunk stops right before y.
    sched = mm_scheduler(budget=128, encoder_budget=100, cache_size=40)
    sched.add_request(image_request("a", [("x", 0, 40)], 41, max_tokens=4))
    sched.add_request(image_request("b", [("y", 30, 40)], 80))
    output, _ = run_step(sched)
    assert output.num_scheduled_tokens == {"a": 41, "b": 30}
    assert output.scheduled_encoder_inputs == {"a": [0]}
    output, _ = run_step(sched)  # a passed x after step 0: x freeable, evicted for y
    assert output.scheduled_encoder_inputs == {"b": [0]}
    assert output.free_encoder_mm_hashes == ["x"]


def test_scenario_refuses_bad_items() -> None:
    base = {"cache": {"num_gpu_blocks": 64},
            "requests": [{"request_id": "a", "prompt_token_ids": [1] * 20, "max_tokens": 2,
                          "mm_items": [{"identifier": "x", "offset": 5, "length": 10}]}]}
    assert parse_scenario(base).mm_max_tokens_per_item == {"image": 10}

    def refused(items: list[dict[str, object]], match: str) -> None:
        bad = {**base, "requests": [{**base["requests"][0], "mm_items": items}]}
        with pytest.raises(UserInputError, match=match):
            parse_scenario(bad)

    refused([{"identifier": "x", "offset": 15, "length": 10}], "past the prompt")
    refused([{"identifier": "x", "offset": 0, "length": 10}, {"identifier": "y", "offset": 5, "length": 3}],
            "prompt order")
    refused([{"identifier": "x", "offset": 0, "length": 4}, {"identifier": "x", "offset": 5, "length": 3}],
            "gives this identifier 4 embeddings")
    refused([{"identifier": "x", "offset": 0, "length": 4, "size": 3}], "unknown key")
    refused([{"identifier": "x", "offset": 0, "length": 4, "modality": "smell"}], "modality")
    refused([{"identifier": "x", "offset": 0, "length": 3, "is_embed": [True]}], "is_embed")
    with pytest.raises(UserInputError, match="pipeline_parallel_size=2"):
        parse_scenario({**base, "pipeline_parallel_size": 2})
