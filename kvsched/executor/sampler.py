"""Token sampling for one engine step, in vLLM v1's order.

Logprobs come from the raw logits; then min_tokens masking, penalties, and
either greedy argmax or temperature, min-p, top-k, top-p and an exponential
race. Everything is batched except the per-request seeded draws, which keep a
seeded request's tokens independent of whatever else is in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from kvsched.errors import UserInputError
from kvsched.request import SAMPLING_EPS, SamplingParams


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 + the number of tokens with a strictly greater logprob
    decoded_token: str | None = None


@dataclass(slots=True)
class SamplingState:
    """A request's sampling inputs; one per request, owned by the runner."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the runner appends each sampled token
    generator: torch.Generator | None  # set when params.seed is not None
    # Which vocab ids the prompt holds, built on first use by the repetition
    # penalty so long prompts are not re-read every step.
    prompt_mask: Tensor | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]  # per row; None when params.logprobs is None


class Sampler:
    """Samples one token per row of a [N, V] float32 logits tensor."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu",
                 eos_token_ids: tuple[int, ...] = ()) -> None:
        self.device = torch.device(device)
        # Draws for unseeded random rows; seeded rows use their own generator.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # The model's EOS ids (config.json and generation_config.json), which
        # min_tokens masks for every request, as vLLM's all_stop_token_ids.
        self.eos_token_ids = eos_token_ids

    def make_generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.seed is None:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params.seed)
        return generator

    def sample(self, logits: Tensor, states: list[SamplingState]) -> SamplerOutput:
        n = logits.shape[0]
        if logits.dim() != 2 or n != len(states):
            raise UserInputError(f"logits shape={tuple(logits.shape)}: must be [N, vocab] with N = the "
                             f"number of sampling states ({len(states)}); pass one state per row")
        random_rows = [i for i, state in enumerate(states) if state.params.temperature >= SAMPLING_EPS]
        logprob_rows = [i for i, state in enumerate(states) if state.params.logprobs is not None]
        processed = self.process(logits, states)
        if not random_rows:
            token_ids = _argmax(processed)
        elif len(random_rows) == n:
            token_ids = self._sample_random(processed, states, random_rows)
        else:
            token_ids = _argmax(processed)
            sampled = self._sample_random(processed, states, random_rows)
            for row, token in zip(random_rows, sampled):
                token_ids[row] = token

        logprobs: list[dict[int, Logprob] | None] = [None] * n
        if logprob_rows:
            _gather_logprobs(logits, states, logprob_rows, token_ids, logprobs)
        return SamplerOutput(token_ids, logprobs)

    def process(self, logits: Tensor, states: list[SamplingState]) -> Tensor:
        """The logits after min_tokens masking and the penalties (a copy when
        either applies: the raw logits stay intact for logprobs)."""
        penalty_rows: list[int] = []
        min_tokens_rows: list[int] = []
        for i, state in enumerate(states):
            p = state.params
            if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
                penalty_rows.append(i)
            if len(state.output_token_ids) < p.min_tokens:
                min_tokens_rows.append(i)
        if not (min_tokens_rows or penalty_rows):
            return logits
        processed = logits.clone()
        if min_tokens_rows:
            mask_stop_tokens(processed, states, min_tokens_rows, self.eos_token_ids)
        if penalty_rows:
            apply_penalties(processed, states, penalty_rows)
        return processed

    def target_probs(self, processed: Tensor, params: list[SamplingParams]) -> Tensor:
        """Each row's distribution as vLLM's rejection sampler verifies drafts
        against it (apply_sampling_constraints): processed logits over the
        temperature, top-k and top-p applied, softmax. vLLM leaves min-p out
        there (it filters only the bonus token's draw), and so does this."""
        x = processed / _tensor([p.temperature for p in params], np.float32,
                                processed.device).unsqueeze(1)
        threshold = _filter_threshold(x, params, use_min_p=False)
        if threshold is not None:
            x = x.masked_fill(x < threshold, -math.inf)
        return torch.softmax(x, dim=-1)

    def _sample_random(self, logits: Tensor, states: list[SamplingState], rows: list[int]) -> list[int]:
        device = logits.device
        vocab_size = logits.shape[1]
        params = [states[i].params for i in rows]
        x = logits if len(rows) == logits.shape[0] else logits[_tensor(rows, np.int64, device)]
        x = x / _tensor([p.temperature for p in params], np.float32, device).unsqueeze(1)
        x_max = x.amax(dim=-1, keepdim=True)
        threshold = _filter_threshold(x, params, x_max=x_max)
        # Exponential race: argmax(w / q) with q ~ Exp(1) picks token t with
        # probability w[t] / sum(w), so w need not be normalised.
        weights = torch.exp(x - x_max)
        if threshold is not None:
            weights = weights.masked_fill(x < threshold, 0.0)
        return _argmax(weights / self._exponential_draws(states, rows, vocab_size, device))

    def _exponential_draws(self, states: list[SamplingState], rows: list[int], vocab_size: int,
                           device: torch.device) -> Tensor:
        """Exp(1) noise: one [V] draw per seeded row from its own generator, so
        its sequence depends only on the request; one batched draw for the rest."""
        q = torch.empty(len(rows), vocab_size, device=device)
        unseeded: list[int] = []
        for j, i in enumerate(rows):
            state = states[i]
            if state.params.seed is None:
                unseeded.append(j)
                continue
            if state.generator is None:
                state.generator = self.make_generator(state.params)
            q[j].exponential_(generator=state.generator)
        if unseeded:
            # -log(U) is Exp(1) too, and ~2.5x cheaper than exponential_ on CPU;
            # U = 0 gives q = inf: that token just cannot win this draw.
            noise = torch.rand(len(unseeded), vocab_size, device=device,
                               generator=self.generator).log_().neg_()
            if len(unseeded) == len(rows):
                q = noise
            else:
                q[_tensor(unseeded, np.int64, device)] = noise
        # A zero draw would make a dropped token's 0/0 a NaN, which argmax picks.
        return q.clamp_min_(torch.finfo(q.dtype).tiny)


def _filter_threshold(x: Tensor, params: list[SamplingParams], *, use_min_p: bool = True,
                      x_max: Tensor | None = None) -> Tensor | None:
    """Per row of the temperature-scaled logits ``x``, the value below which
    a token is filtered out (None: no filter in any row). Every filter is a
    threshold: min-p, then top-k, then top-p on what is left. Like vLLM,
    tokens tied with the last kept one are kept too."""
    device = x.device
    vocab_size = x.shape[1]
    threshold: Tensor | None = None
    if use_min_p and any(p.min_p > 0 for p in params):
        # p < min_p * p_max  <=>  x < x_max + log(min_p)
        if x_max is None:
            x_max = x.amax(dim=-1, keepdim=True)
        log_min_p = [math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params]
        threshold = x_max + _tensor(log_min_p, np.float32, device).unsqueeze(1)
    use_top_k = any(0 < p.top_k < vocab_size for p in params)
    use_top_p = any(p.top_p < 1 for p in params)
    if use_top_k or use_top_p:
        sorted_x = _sort_descending(x)  # once, for both
        if use_top_k:
            k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
            kth = sorted_x.gather(1, _tensor(k, np.int64, device).unsqueeze(1) - 1)
            threshold = kth if threshold is None else torch.maximum(threshold, kth)
        if use_top_p:
            if threshold is not None:
                sorted_x = sorted_x.masked_fill(sorted_x < threshold, -math.inf)
            probs = torch.softmax(sorted_x, dim=-1)
            # Keep a token while the mass strictly before it is below top_p:
            # the smallest prefix reaching top_p. Rows with top_p=1 skip the
            # test, so rounding in the cumsum cannot cut their tail.
            top_p = _tensor([p.top_p if p.top_p < 1 else 2.0 for p in params], np.float32, device)
            num_kept = ((probs.cumsum(dim=-1) - probs) < top_p.unsqueeze(1)).sum(dim=-1, keepdim=True)
            last_kept = sorted_x.gather(1, num_kept.clamp_min(1) - 1)
            threshold = last_kept if threshold is None else torch.maximum(threshold, last_kept)
    return threshold


def mask_stop_tokens(logits: Tensor, states: list[SamplingState], rows: list[int],
                     eos_token_ids: tuple[int, ...] = ()) -> None:
    """In place, for the given rows: below min_tokens a request may not sample
    its stop ids, its EOS nor the model's ``eos_token_ids`` -- even with
    ignore_eos, as vLLM masks all_stop_token_ids."""
    vocab_size = logits.shape[1]
    mask_rows: list[int] = []
    mask_cols: list[int] = []
    for i in rows:
        p = states[i].params
        if len(states[i].output_token_ids) >= p.min_tokens:
            continue
        ids = set(p.stop_token_ids).union(eos_token_ids)
        if p.eos_token_id is not None:
            ids.add(p.eos_token_id)
        for t in ids:
            if t < vocab_size:  # an id the model cannot produce needs no mask
                mask_rows.append(i)
                mask_cols.append(t)
    if mask_rows:
        device = logits.device
        logits[_tensor(mask_rows, np.int64, device), _tensor(mask_cols, np.int64, device)] = -math.inf


def apply_penalties(logits: Tensor, states: list[SamplingState], rows: list[int]) -> None:
    """In place, for the given rows: repetition penalty over prompt and output
    tokens; frequency and presence penalties over output tokens (as vLLM)."""
    device = logits.device
    vocab_size = logits.shape[1]
    params = [states[i].params for i in rows]
    index = _tensor(rows, np.int64, device)
    x = logits[index]
    output_counts = _token_counts([states[i].output_token_ids for i in rows], vocab_size, device)
    output_mask = output_counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        penalty = _tensor([p.repetition_penalty for p in params], np.float32, device).unsqueeze(1)
        seen = _prompt_masks([states[i] for i in rows], vocab_size, device) | output_mask
        x = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)
    frequency = _tensor([p.frequency_penalty for p in params], np.float32, device).unsqueeze(1)
    presence = _tensor([p.presence_penalty for p in params], np.float32, device).unsqueeze(1)
    x = x - frequency * output_counts - presence * output_mask
    logits[index] = x


def _token_counts(token_lists: list[list[int]], vocab_size: int, device: torch.device) -> Tensor:
    """[R, V] count of each token per row: one scatter_add over the rows padded
    with the out-of-vocab id V (whose column is then dropped)."""
    width = max(map(len, token_lists), default=0)
    padded = [t + [vocab_size] * (width - len(t)) for t in token_lists]
    ids = _tensor(padded, np.int64, device).view(len(token_lists), width)
    counts = torch.zeros(len(token_lists), vocab_size + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))
    return counts[:, :vocab_size]


def _prompt_masks(states: list[SamplingState], vocab_size: int, device: torch.device) -> Tensor:
    """[R, V] bool: the tokens of each row's prompt (cached per request)."""
    missing = [s for s in states if s.prompt_mask is None or s.prompt_mask.shape[0] != vocab_size]
    if missing:
        masks = _token_counts([s.prompt_token_ids for s in missing], vocab_size, device) > 0
        for s, mask in zip(missing, masks):
            s.prompt_mask = mask.clone()  # not a view pinning the whole batch
    return torch.stack([s.prompt_mask for s in states if s.prompt_mask is not None])


def _gather_logprobs(raw_logits: Tensor, states: list[SamplingState], rows: list[int],
                     token_ids: list[int], out: list[dict[int, Logprob] | None]) -> None:
    """The sampled token's logprob and rank, plus the top-k, from raw logits."""
    device = raw_logits.device
    logprobs = torch.log_softmax(raw_logits[_tensor(rows, np.int64, device)], dim=-1)
    sampled = _tensor([token_ids[i] for i in rows], np.int64, device).unsqueeze(1)
    sampled_logprob = logprobs.gather(1, sampled)
    ranks: list[int] = ((logprobs > sampled_logprob).sum(dim=-1) + 1).tolist()
    sampled_values: list[float] = sampled_logprob.squeeze(1).tolist()
    k_max = min(max(states[i].params.logprobs or 0 for i in rows), logprobs.shape[1])
    top_values: list[list[float]] = [[] for _ in rows]
    top_ids: list[list[int]] = [[] for _ in rows]
    if k_max:
        values, ids = logprobs.topk(k_max, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    for j, i in enumerate(rows):
        entry = {token_ids[i]: Logprob(sampled_values[j], ranks[j])}
        k = states[i].params.logprobs or 0
        values_j = top_values[j][:k]
        for pos, (token, value) in enumerate(zip(top_ids[j][:k], values_j)):
            if token not in entry:
                # Every token with a greater logprob is earlier in the top list.
                entry[token] = Logprob(value, 1 + sum(1 for v in values_j[:pos] if v > value))
        out[i] = entry


# numpy does these CPU conversions and kernels several times faster than torch
# for the sampler's small [N, V] shapes (measured: list -> tensor ~7x,
# argmax ~10x, value sort ~25x).

def _tensor(values: list[int] | list[float] | list[list[int]], dtype: type[np.generic],
            device: torch.device) -> Tensor:
    return torch.from_numpy(np.asarray(values, dtype=dtype)).to(device)


def _argmax(x: Tensor) -> list[int]:
    """Row-wise argmax as a list (the first index on ties, as torch)."""
    result: list[int]
    if x.device.type == "cpu" and x.dtype == torch.float32:
        result = x.detach().numpy().argmax(axis=1).tolist()
    else:
        result = x.argmax(dim=-1).tolist()
    return result


def _sort_descending(x: Tensor) -> Tensor:
    """Each row's values, largest first (values only: filters are thresholds)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(-np.sort(-x.detach().numpy(), axis=1))
    return x.sort(dim=-1, descending=True).values
