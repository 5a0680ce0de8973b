"""The n-gram proposer: vLLM 0.33's match rule (the longest suffix n-gram in
[prompt_lookup_min, prompt_lookup_max] that occurred earlier, its earliest
occurrence, the up to K tokens after it), by hand and against a brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.config import SpeculativeConfig
from kvsched.executor.ngram_proposer import NgramProposer, propose_ngram

BIG = 10**6  # a max_model_len that caps nothing


@pytest.mark.parametrize(("tokens", "lo", "hi", "k", "expected"), [
    # The 3-gram suffix [1, 2, 3] occurred at 0: the two tokens after it.
    ([1, 2, 3, 4, 1, 2, 3], 2, 3, 2, [4, 1]),
    # The longest n wins over an earlier shorter match: [3, 9] first occurs
    # at 0 (then 1), but [7, 3, 9] occurs at 3 (then 2).
    ([3, 9, 1, 7, 3, 9, 2, 7, 3, 9], 2, 3, 2, [2, 7]),
    ([3, 9, 1, 7, 3, 9, 2, 7, 3, 9], 2, 2, 2, [1, 7]),
    ([3, 9, 1, 7, 3, 9, 2, 7, 3, 9], 1, 5, 1, [2]),
    # Of several occurrences of the n-gram, the earliest.
    ([4, 5, 6, 4, 5, 7, 4, 5], 2, 2, 3, [6, 4, 5]),
    # Overlapping the suffix is allowed; the drafts stop where the tokens do.
    ([1, 1, 1, 1], 2, 2, 5, [1, 1]),
    ([1, 1, 1, 1], 1, 1, 5, [1, 1, 1]),
    # The longest match, 2 tokens, is below prompt_lookup_min: nothing.
    ([1, 2, 3, 1, 2], 3, 4, 2, []),
    # No earlier occurrence of the last token.
    ([1, 2, 3, 4], 1, 3, 2, []),
    # Fewer tokens than prompt_lookup_min, or one token.
    ([7, 7], 3, 3, 2, []),
    ([7], 1, 1, 2, []),
    ([], 1, 1, 2, []),
])
def test_hand_computed_matches(tokens: list[int], lo: int, hi: int, k: int, expected: list[int]) -> None:
    assert propose_ngram(tokens, lo, hi, k, BIG) == expected


def test_k_is_capped_by_max_model_len() -> None:
    tokens = [1, 2, 1, 2]
    assert propose_ngram(tokens, 1, 2, 5, 100) == [1, 2]
    assert propose_ngram(tokens, 1, 2, 5, 5) == [1]
    assert propose_ngram(tokens, 1, 2, 5, 4) == []


def test_the_batch_proposer_skips_requests_that_sampled_nothing() -> None:
    config = SpeculativeConfig("ngram", 3, prompt_lookup_max=2)
    proposer = NgramProposer(config, max_model_len=64)
    assert (proposer.min_n, proposer.max_n, proposer.k) == (2, 2, 3)
    histories = [[5, 6, 7, 5, 6], None, [1, 2, 3], [8, 9, 8, 9]]
    assert proposer.propose(histories) == [[7, 5, 6], [], [], [8, 9]]
    # The step's num_spec_tokens_to_schedule, never more than K.
    assert proposer.propose(histories, 1) == [[7], [], [], [8]]
    assert proposer.propose(histories, 9) == [[7, 5, 6], [], [], [8, 9]]
    # vLLM's default lookup is 5 and 5.
    assert NgramProposer(SpeculativeConfig("ngram", 2), 64).propose([[1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5]]) \
        == [[9, 1]]


def brute_force(tokens: list[int], lo: int, hi: int, k: int, max_model_len: int) -> list[int]:
    """Try every n from the longest down and every earlier start from the
    left; the first hit is the answer."""
    total = len(tokens)
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(hi, total - 1), lo - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n):  # a token follows tokens[start:start + n]
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(tokens=st.lists(st.integers(0, 4), max_size=40) | st.lists(st.integers(0, 1), max_size=40),
       lo=st.integers(1, 5), extra=st.integers(0, 4), k=st.integers(1, 8),
       room=st.integers(-2, 12))
def test_matches_a_brute_force_search(tokens: list[int], lo: int, extra: int, k: int, room: int) -> None:
    hi = lo + extra
    max_model_len = len(tokens) + room
    assert propose_ngram(tokens, lo, hi, k, max_model_len) == brute_force(tokens, lo, hi, k, max_model_len)
