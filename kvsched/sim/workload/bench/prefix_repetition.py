"""``vllm bench serve --dataset-name prefix_repetition``: a few random
prefixes, each shared by an equal share of the prompts, each prompt with
its own random suffix."""

from __future__ import annotations

import random
from typing import Any

from kvsched.errors import UserInputError
from kvsched.sim.workload.bench.sample import BenchSample
from kvsched.sim.workload.tokenizer import TextTokenizer

# vllm bench serve's defaults.
DEFAULT_PREFIX_LEN = 256
DEFAULT_SUFFIX_LEN = 256
DEFAULT_NUM_PREFIXES = 10
DEFAULT_OUTPUT_LEN = 128


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two encodings share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def sample_prefix_repetition(tokenizer: TextTokenizer, num_requests: int, seed: int,
                             prefix_len: int = DEFAULT_PREFIX_LEN, suffix_len: int = DEFAULT_SUFFIX_LEN,
                             num_prefixes: int = DEFAULT_NUM_PREFIXES, output_len: int = DEFAULT_OUTPUT_LEN,
                             disable_shuffle: bool = False) -> tuple[list[BenchSample], Any]:
    """vLLM's PrefixRepetitionRandomDataset: ``num_prefixes`` prefixes of
    ``prefix_len`` random token ids, each followed by ``num_requests //
    num_prefixes`` suffixes of ``suffix_len`` (so ``num_requests`` is rounded
    down to a multiple), every piece decoded and re-encoded to its length as
    vLLM does, all drawn from numpy's global state seeded with ``seed``;
    then shuffled by ``random.seed(seed)``. Returns the samples and that
    numpy state (vllm bench serve draws its arrival gaps from it next).

    The server sees the text of prefix + suffix encoded again with special
    tokens; the prefix's tokens it shares with the other prompts of its
    group are the leading tokens its encoding has in common with the
    prefix's own."""
    import numpy as np

    if num_prefixes < 1 or prefix_len < 0 or suffix_len < 0 or output_len < 1:
        raise UserInputError(f"prefix_repetition: --prefix-repetition-num-prefixes={num_prefixes} must "
                             f"be >= 1, -prefix-len={prefix_len} and -suffix-len={suffix_len} >= 0, "
                             f"-output-len={output_len} >= 1")
    per_prefix = num_requests // num_prefixes
    if per_prefix == 0:
        raise UserInputError(f"prefix_repetition: --num-prompts={num_requests} must be at least "
                             f"--prefix-repetition-num-prefixes={num_prefixes} (each prefix gets "
                             "num_prompts // num_prefixes prompts)")
    if prefix_len + suffix_len < 1:
        raise UserInputError("prefix_repetition: --prefix-repetition-prefix-len + -suffix-len must be >= 1")
    state = np.random.RandomState(seed)
    vocab = tokenizer.vocab_size

    def draw(n: int) -> list[int]:
        ids: list[int] = state.randint(0, vocab, size=n).tolist()
        return ids

    def exact_length(target: int) -> list[int]:
        return tokenizer.settle(draw(target), target, draw)

    specials = tokenizer.num_special_tokens_to_add
    samples: list[BenchSample] = []
    for group in range(num_prefixes):
        prefix = exact_length(prefix_len)
        prefix_server = tokenizer.encode(tokenizer.decode(prefix)) if tokenizer.exact else []
        for _ in range(per_prefix):
            combined = prefix + exact_length(suffix_len)
            if tokenizer.exact:
                server = tokenizer.encode(tokenizer.decode(combined))
                server_len, shared = len(server), common_prefix(server, prefix_server)
            else:
                server_len, shared = len(combined) + specials, len(prefix) + specials
            samples.append(BenchSample(str(len(samples)), len(combined), output_len, server_len,
                                       (group, shared)))
    if not disable_shuffle:
        random.Random(seed).shuffle(samples)
    return samples, state
