"""Verifying draft tokens: vLLM 0.33's ``RejectionSampler`` for drafts without
probabilities (n-gram drafts: ``draft_probs is None``).

A request verifying d drafts ran 1 + d positions: its last sampled token and
the drafts. Row j's logits (j = 0..d) predict the token after draft j - 1,
given the request's outputs followed by drafts[:j] (the penalties and
min_tokens see that history, as vLLM combines outputs with the drafts).

- Greedy (temperature 0): draft j is accepted while it equals row j's argmax;
  the first mismatch is replaced by that argmax and ends the output; after d
  accepted drafts the bonus token (the argmax of row d) follows.
- Random: vLLM treats an n-gram draft's probability as 1, so draft j is
  accepted iff ``target_prob[j][draft] >= u_j`` with ``u_j`` uniform in
  [0, 1) (float64). At the first rejection the recovered token is drawn from
  row j's target distribution with the draft token's probability zeroed
  (max(target - draft, 0) with a one-hot draft), by an exponential race with
  one Exp(1) vector per request shared by its rows. After d accepted drafts
  the bonus token is drawn from row d by the ordinary sampler. The target
  distribution is the processed logits over the temperature, top-k and
  top-p (vLLM's apply_sampling_constraints: no min-p); the bonus draw uses
  every filter. Draws come from the request's own generator when it is
  seeded (in vLLM's order: bonus, uniforms, exponentials), else from the
  sampler's.

The output is 1 to 1 + d tokens: the accepted drafts and one more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from kvsched.executor.sampler import Logprob, Sampler, SamplingState, _gather_logprobs, _tensor


@dataclass(slots=True)
class Verification:
    """One request's drafts: logits rows ``row .. row + len(drafts)``."""

    row: int
    drafts: list[int]
    state: SamplingState


@dataclass(slots=True)
class Verified:
    token_ids: list[int]  # accepted drafts, then the corrected or bonus token
    logprobs: list[dict[int, Logprob] | None]  # one per token (None entries: not asked for)


def _row_states(item: Verification) -> list[SamplingState]:
    """A sampling state per row, whose history is the outputs and the drafts
    before that row (shared when neither the penalties nor min_tokens look
    at the history)."""
    base = item.state
    p = base.params
    needs_history = (p.min_tokens > len(base.output_token_ids) or p.repetition_penalty != 1.0
                     or p.presence_penalty or p.frequency_penalty)
    if not needs_history:
        return [base] * (len(item.drafts) + 1)
    states = []
    for j in range(len(item.drafts) + 1):
        state = SamplingState(p, base.prompt_token_ids, base.output_token_ids + item.drafts[:j],
                              base.generator)
        state.prompt_mask = base.prompt_mask
        states.append(state)
    return states


def verify(sampler: Sampler, logits: Tensor, items: list[Verification]) -> list[Verified]:
    """Accept or reject each item's drafts against ``logits`` (raw, float32,
    one row per verified position); one result per item, in order."""
    results: list[Verified | None] = [None] * len(items)
    greedy = [i for i, item in enumerate(items) if item.state.params.greedy]
    random = [i for i, item in enumerate(items) if not item.state.params.greedy]
    if greedy:
        _verify_greedy(sampler, logits, [items[i] for i in greedy], greedy, results)
    if random:
        _verify_random(sampler, logits, [items[i] for i in random], random, results)
    out = [r for r in results if r is not None]
    assert len(out) == len(items)
    return out


def _verify_greedy(sampler: Sampler, logits: Tensor, items: list[Verification], where: list[int],
                   results: list[Verified | None]) -> None:
    rows: list[int] = []
    states: list[SamplingState] = []
    for item in items:
        rows.extend(range(item.row, item.row + len(item.drafts) + 1))
        states.extend(_row_states(item))
    index = _tensor(rows, np.int64, logits.device)
    # The argmax of every row, after min_tokens and the penalties (and each
    # row's logprobs: every output token of a greedy request is its row's argmax).
    out = sampler.sample(logits.index_select(0, index), states)
    offset = 0
    for k, item in zip(where, items):
        argmax = out.token_ids[offset:offset + len(item.drafts) + 1]
        lps = out.logprobs[offset:offset + len(item.drafts) + 1]
        offset += len(item.drafts) + 1
        accepted = 0
        for draft, target in zip(item.drafts, argmax):
            if draft != target:
                break
            accepted += 1
        results[k] = Verified(argmax[:accepted + 1], lps[:accepted + 1])


def _verify_random(sampler: Sampler, logits: Tensor, items: list[Verification], where: list[int],
                   results: list[Verified | None]) -> None:
    device = logits.device
    vocab_size = logits.shape[1]
    for item in items:  # before the row states copy it
        state = item.state
        if state.params.seed is not None and state.generator is None:
            state.generator = sampler.make_generator(state.params)
    row_states = [_row_states(item) for item in items]
    # Bonus tokens first, from the last row of each request (vLLM samples
    # them before verifying).
    bonus_rows = [item.row + len(item.drafts) for item in items]
    bonus = sampler.sample(logits.index_select(0, _tensor(bonus_rows, np.int64, device)),
                           [states[-1] for states in row_states])
    # Target distributions of the draft rows.
    draft_rows: list[int] = []
    draft_states: list[SamplingState] = []
    for item, states in zip(items, row_states):
        draft_rows.extend(range(item.row, item.row + len(item.drafts)))
        draft_states.extend(states[:-1])
    raw = logits.index_select(0, _tensor(draft_rows, np.int64, device))
    probs = sampler.target_probs(sampler.process(raw, draft_states),
                                 [s.params for s in draft_states])
    # Uniforms for every draft, then one exponential vector per request.
    uniforms: list[Tensor] = []
    exponentials: list[Tensor] = []
    for item in items:
        generator = item.state.generator if item.state.generator is not None else sampler.generator
        uniforms.append(torch.rand(len(item.drafts), dtype=torch.float64, device=device,
                                   generator=generator))
    for item in items:
        generator = item.state.generator if item.state.generator is not None else sampler.generator
        q = torch.empty(vocab_size, device=device).exponential_(generator=generator)
        exponentials.append(q.clamp_min_(torch.finfo(q.dtype).tiny))
    offset = 0
    for n, (k, item) in enumerate(zip(where, items)):
        d = len(item.drafts)
        p = probs[offset:offset + d]
        offset += d
        draft_ids = _tensor(item.drafts, np.int64, device)
        target = p.gather(1, draft_ids.unsqueeze(1)).squeeze(1).to(torch.float64)
        accepted_mask: list[bool] = (target >= uniforms[n]).tolist()
        accepted = 0
        while accepted < d and accepted_mask[accepted]:
            accepted += 1
        tokens = list(item.drafts[:accepted])
        if accepted == d:
            tokens.append(bonus.token_ids[n])
        else:
            row = p[accepted].clone()
            row[item.drafts[accepted]] = 0.0
            tokens.append(int(torch.argmax(row / exponentials[n])))
        lps: list[dict[int, Logprob] | None] = [None] * len(tokens)
        if item.state.params.logprobs is not None:
            rows = list(range(item.row, item.row + len(tokens)))
            states = row_states[n][:len(tokens)]
            local: list[dict[int, Logprob] | None] = [None] * len(tokens)
            _gather_logprobs(logits.index_select(0, _tensor(rows, np.int64, device)), states,
                             list(range(len(tokens))), tokens, local)
            lps = local
        results[k] = Verified(tokens, lps)
