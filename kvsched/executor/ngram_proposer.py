"""The n-gram (prompt lookup) proposer: vLLM 0.33's ``NgramProposer``.

After a step, for each request that sampled, look for the suffix of its
tokens (prompt + outputs) earlier in those tokens and propose the tokens that
followed that earlier occurrence as drafts for the next step.

Which match vLLM picks (``_find_longest_matched_ngram_and_propose_tokens``,
a KMP pass over the reversed tokens):

- n, the length of the matched suffix, is the longest in
  [``prompt_lookup_min``, ``prompt_lookup_max``] whose suffix occurs earlier;
  no match of at least ``prompt_lookup_min`` tokens: no drafts.
- "Earlier" is any occurrence other than the suffix itself, overlapping it
  allowed, as long as at least one token follows it.
- Of the occurrences of that n-gram, the earliest (leftmost) one.
- The drafts are the up to K tokens after it, fewer when the tokens end
  first; K is capped at ``max_model_len - len(tokens)`` and a request with
  fewer tokens than ``prompt_lookup_min`` gets none.

vLLM's async twin (``ngram_gpu``) picks the same match: for each n it takes
the earliest occurrence and keeps the longest n that has one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvsched.config import SpeculativeConfig


def propose_ngram(token_ids: Sequence[int], min_n: int, max_n: int, k: int,
                  max_model_len: int) -> list[int]:
    """The drafts for one request whose tokens so far are ``token_ids``."""
    num_tokens = len(token_ids)
    if num_tokens < min_n:
        return []
    k = min(k, max_model_len - num_tokens)
    if k <= 0:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    # Candidates: where an earlier occurrence of the suffix ends (at most at
    # num_tokens - 2, so a token follows it), first for the 1-token suffix,
    # then narrowed one token further back per round; ascending, so the
    # first is the earliest occurrence.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    if ends.size == 0:
        return []
    best_end = int(ends[0])
    best_len = 1
    for back in range(1, max_n):
        ends = ends[ends >= back]
        if ends.size == 0:
            break
        ends = ends[tokens[ends - back] == tokens[num_tokens - 1 - back]]
        if ends.size == 0:
            break
        best_end = int(ends[0])
        best_len = back + 1
    if best_len < min_n:
        return []
    start = best_end + 1
    drafts: list[int] = tokens[start:start + k].tolist()
    return drafts


class NgramProposer:
    """Drafts for a batch: vLLM's ``NgramProposer.propose`` (a request that
    sampled nothing this step, or is at ``max_model_len``, gets none)."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.min_n, self.max_n = config.ngram_lookup()
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len

    def propose(self, histories: Sequence[Sequence[int] | None], k: int | None = None) -> list[list[int]]:
        """One list of drafts per request; ``None`` marks a request that
        sampled nothing this step. ``k`` (at most K) is the step's
        ``num_spec_tokens_to_schedule``."""
        k = self.k if k is None else min(k, self.k)
        return [[] if tokens is None else
                propose_ngram(tokens, self.min_n, self.max_n, k, self.max_model_len)
                for tokens in histories]
