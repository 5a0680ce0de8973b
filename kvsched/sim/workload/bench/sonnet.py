"""``vllm bench serve --dataset-name sonnet`` (vLLM up to 0.1x; later
releases dropped it): prompts made of poem lines, the first lines shared by
every prompt."""

from __future__ import annotations

import random
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.sim.workload.bench.prefix_repetition import common_prefix
from kvsched.sim.workload.bench.sample import BenchSample
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.traces.source import read_text

# vllm bench serve's defaults for the sonnet dataset.
DEFAULT_SONNET_INPUT_LEN = 550
DEFAULT_SONNET_OUTPUT_LEN = 150
DEFAULT_SONNET_PREFIX_LEN = 200
BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"
# Draws per requested prompt before giving up (vLLM loops forever when no
# draw fits input_len).
MAX_DRAWS_PER_PROMPT = 1000


def sample_sonnet(path: str | Path, tokenizer: TextTokenizer, num_requests: int, seed: int,
                  input_len: int = DEFAULT_SONNET_INPUT_LEN, output_len: int = DEFAULT_SONNET_OUTPUT_LEN,
                  prefix_len: int = DEFAULT_SONNET_PREFIX_LEN) -> list[BenchSample]:
    """vLLM's SonnetDataset as ``vllm bench serve`` ran it on the
    completions endpoint: a line's average token count (special tokens
    included) sets how many lines fill ``input_len`` and ``prefix_len`` past
    the chat-formatted base prompt; each prompt is the base prompt, the
    file's first prefix lines, then lines drawn by ``random.choices`` from
    Python's global state (vllm bench serve seeds it with ``--seed``); a
    draw whose formatted prompt exceeds ``input_len`` tokens is thrown away.
    The formatted prompt is what is sent and counted."""
    p, text = read_text(path)
    lines = text.splitlines(keepends=True)
    if not lines:
        raise UserInputError(f"--dataset-path={p}: no lines; the sonnet dataset draws prompt lines from it")
    avg_len = sum(tokenizer.count(line) for line in lines) / len(lines)
    base_offset = tokenizer.count(tokenizer.chat_prompt(BASE_PROMPT))
    if input_len <= base_offset:
        raise UserInputError(f"--sonnet-input-len={input_len} must be above the base prompt's length "
                             f"({base_offset} tokens with the chat template)")
    num_input_lines = round((input_len - base_offset) / avg_len)
    num_prefix_lines = max(round((prefix_len - base_offset) / avg_len), 0)
    prefix_lines = lines[:num_prefix_lines]
    prefix_ids = tokenizer.encode(tokenizer.chat_prompt(BASE_PROMPT + "".join(prefix_lines)))
    rng = random.Random(seed)
    samples: list[BenchSample] = []
    draws = 0
    while len(samples) < num_requests:
        draws += 1
        if draws > MAX_DRAWS_PER_PROMPT * num_requests:
            raise UserInputError(f"sonnet: {draws - 1} draws of {num_input_lines} lines and none fit "
                                 f"--sonnet-input-len={input_len} tokens; raise it")
        extra = rng.choices(lines, k=num_input_lines - num_prefix_lines)
        formatted = tokenizer.chat_prompt(BASE_PROMPT + "".join(prefix_lines + extra))
        ids = tokenizer.encode(formatted)
        if len(ids) <= input_len:
            shared = common_prefix(ids, prefix_ids) if tokenizer.exact else len(prefix_ids)
            samples.append(BenchSample(str(len(samples)), len(ids), output_len, len(ids), (0, shared)))
    return samples
