"""The random dataset's lengths with the model's tokenizer, as vLLM's
RandomDataset makes them: the special tokens come off ``input_len`` before
the lengths are drawn, and every prompt's token ids are decoded and
re-encoded until their count holds (a few keep a different count, and vLLM
reports those)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsched.errors import UserInputError
from kvsched.sim.workload.tokenizer import TextTokenizer


@dataclass(slots=True, frozen=True)
class RandomLengths:
    """Per request: ``prompt_lens`` (vLLM's prompt_len: the prompt's tokens
    without the special ones), ``output_lens``; and the shared prefix's
    tokens as the server sees them (special tokens + the prefix)."""

    prompt_lens: list[int]
    output_lens: list[int]
    prefix_tokens: int
    special_tokens: int


def random_lengths(tokenizer: TextTokenizer, num_requests: int, input_len: int, output_len: int,
                   range_ratio: tuple[float, float], prefix_len: int, seed: int) -> RandomLengths:
    """vLLM's ``RandomDataset.sample`` lengths for ``seed`` (numpy's
    ``default_rng``: input lengths, output lengths, vocabulary offsets, the
    prefix, then any padding tokens the re-encoding asks for, in vLLM's
    order)."""
    import numpy as np

    input_ratio, output_ratio = range_ratio
    specials = tokenizer.num_special_tokens_to_add
    real_input_len = max(0, input_len - specials)
    input_low = math.floor(real_input_len * (1 - input_ratio))
    input_high = math.ceil(real_input_len * (1 + input_ratio))
    if prefix_len + input_low < 1:
        raise UserInputError(f"random workload: --random-prefix-len ({prefix_len}) + the shortest sampled "
                             f"input ({input_low}: --random-input-len less the tokenizer's "
                             f"{specials} special token(s), times 1 - range ratio) must be >= 1; raise "
                             "--random-input-len")
    output_low = max(1, math.floor(output_len * (1 - output_ratio)))
    output_high = max(1, math.ceil(output_len * (1 + output_ratio)))
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests).tolist()
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests).tolist()
    vocab = tokenizer.vocab_size
    offsets = rng.integers(0, vocab, size=num_requests).tolist()
    # vLLM builds this as a set difference of numpy ints; a set of distinct
    # ints below its table size iterates in ascending order, so it is sorted.
    allowed = np.array(sorted(set(range(vocab)) - set(tokenizer.all_special_ids)))

    def pad(n: int) -> list[int]:
        ids: list[int] = rng.integers(0, vocab, size=n).tolist()
        return ids

    prefix: list[int] = []
    if prefix_len > 0:
        prefix = tokenizer.settle(allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist(),
                                  prefix_len, pad)
    seqs = [prefix + allowed[(offsets[i] + i + np.arange(input_lens[i])) % len(allowed)].tolist()
            for i in range(num_requests)]
    settled = tokenizer.settle_many(seqs, [prefix_len + n for n in input_lens], pad)
    prompt_lens = [len(ids) for ids in settled]
    return RandomLengths(prompt_lens, output_lens, specials + len(prefix), specials)
