"""``vllm bench serve --dataset-name sharegpt``: the first two turns of
each ShareGPT conversation as prompt and completion."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.sim.workload.bench.sample import BenchSample, oversample
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.traces.source import read_text

# vLLM's is_valid_sequence defaults: prompts and outputs of 4 tokens or
# more, prompts up to 1024, prompt + output up to 2048.
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048


def is_valid_sequence(prompt_len: int, output_len: int, check_output: bool = True) -> bool:
    """vLLM's filter of ShareGPT (and HF) pairs, with its defaults."""
    return not (prompt_len < MIN_LEN or (check_output and output_len < MIN_LEN)
                or prompt_len > MAX_PROMPT_LEN or prompt_len + output_len > MAX_TOTAL_LEN)


def read_conversations(path: str | Path) -> list[tuple[str, str]]:
    """(first turn, second turn) of every entry with ``conversations`` of two
    turns or more, in file order (vLLM's ``ShareGPTDataset.load_data``)."""
    p, text = read_text(path)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UserInputError(f"{p}: not JSON ({e}); a ShareGPT file is a JSON list of "
                             '{"conversations": [{"from", "value"}, ...]}') from None
    if not isinstance(data, list):
        raise UserInputError(f"{p}: a ShareGPT file is a JSON list of conversations, got "
                             f"{type(data).__name__}")
    pairs = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or "conversations" not in entry:
            continue
        turns: Any = entry["conversations"]
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        values = []
        for t in turns[:2]:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                raise UserInputError(f"{p}: entry {i}: each turn needs a string 'value'")
            values.append(t["value"])
        pairs.append((values[0], values[1]))
    return pairs


def sample_sharegpt(path: str | Path, tokenizer: TextTokenizer, num_requests: int, seed: int,
                    output_len: int | None = None, disable_shuffle: bool = False,
                    no_oversample: bool = False) -> list[BenchSample]:
    """vLLM's ShareGPT sampling: the conversations shuffled by
    ``random.seed(seed); random.shuffle``, then each (prompt, completion)
    tokenized (with special tokens), kept if :func:`is_valid_sequence`
    (outputs not checked when ``output_len`` is given) until
    ``num_requests``, then oversampled."""
    pairs = read_conversations(path)
    if not disable_shuffle:
        random.Random(seed).shuffle(pairs)
    samples: list[BenchSample] = []
    for prompt, completion in pairs:
        if len(samples) >= num_requests:
            break
        prompt_len = tokenizer.count(prompt)
        new_output_len = tokenizer.count(completion) if output_len is None else output_len
        if not is_valid_sequence(prompt_len, new_output_len, check_output=output_len is None):
            continue
        samples.append(BenchSample(str(len(samples)), prompt_len, new_output_len, prompt_len))
    return oversample(samples, num_requests, seed, no_oversample=no_oversample)
