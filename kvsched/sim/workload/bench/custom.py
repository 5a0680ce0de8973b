"""``vllm bench serve --dataset-name custom``: a JSONL file of
``{"prompt": ..., "output_tokens": ...}``."""

from __future__ import annotations

import random
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.sim.workload.bench.sample import BenchSample, oversample
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.traces.source import Source, json_lines, read_text

# vllm bench serve's --custom-output-len default; -1: each row's output_tokens.
DEFAULT_CUSTOM_OUTPUT_LEN = 256


def read_custom(path: str | Path) -> list[tuple[str, object]]:
    """(prompt, output_tokens or None) of every line, in file order."""
    p, text = read_text(path)
    if not str(p).endswith(".jsonl"):
        raise UserInputError(f"--dataset-path={p}: the custom dataset reads a .jsonl file, as "
                             "vllm bench serve's does (rename it)")
    src = Source(p)
    rows: list[tuple[str, object]] = []
    for line, obj in json_lines(src, text):
        prompt = obj.get("prompt")
        if not isinstance(prompt, str):
            raise src.error(line, f"prompt={show(prompt)}: each line needs a string 'prompt'")
        rows.append((prompt, obj.get("output_tokens")))
    if not rows:
        raise UserInputError(f"{p}: no lines")
    return rows


def sample_custom(path: str | Path, tokenizer: TextTokenizer, num_requests: int, seed: int,
                  output_len: int | None = DEFAULT_CUSTOM_OUTPUT_LEN, skip_chat_template: bool = False,
                  disable_shuffle: bool = False, no_oversample: bool = False) -> list[BenchSample]:
    """vLLM's CustomDataset: lines shuffled by ``random.seed(seed)``; each
    prompt through the chat template (unless ``skip_chat_template``) and
    counted with special tokens; the output length ``output_len``, or the
    line's ``output_tokens`` when it is None or -1; ``num_requests`` <= 0
    takes every line."""
    rows = read_custom(path)
    if not disable_shuffle:
        random.Random(seed).shuffle(rows)
    if num_requests <= 0:
        num_requests = len(rows)
    samples: list[BenchSample] = []
    for i, (prompt, file_output) in enumerate(rows):
        if len(samples) >= num_requests:
            break
        if output_len is None or output_len == -1:
            if file_output is None:
                raise UserInputError(f"--dataset-path={path}: a line has no 'output_tokens'; give "
                                     "--custom-output-len N, or output_tokens on every line")
            try:
                new_output_len = int(file_output)  # type: ignore[call-overload]
            except (TypeError, ValueError):
                raise UserInputError(f"--dataset-path={path}: output_tokens={show(file_output)} must be "
                                     "an integer") from None
        else:
            new_output_len = output_len
        text = prompt if skip_chat_template else tokenizer.chat_prompt(prompt)
        prompt_len = tokenizer.count(text)
        samples.append(BenchSample(str(i), prompt_len, new_output_len, prompt_len))
    return oversample(samples, num_requests, seed, no_oversample=no_oversample)
