"""``load_bench_dataset``: one of ``vllm bench serve``'s datasets by name,
sampled as vLLM samples it, sent as vLLM sends it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.engine_flags import flag
from kvsched.errors import UserInputError
from kvsched.sim.workload.arrivals import arrival_times_from_state
from kvsched.sim.workload.bench.burstgpt import burstgpt_timed, sample_burstgpt
from kvsched.sim.workload.bench.custom import DEFAULT_CUSTOM_OUTPUT_LEN, sample_custom
from kvsched.sim.workload.bench.prefix_repetition import (
    DEFAULT_NUM_PREFIXES,
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PREFIX_LEN,
    DEFAULT_SUFFIX_LEN,
    sample_prefix_repetition,
)
from kvsched.sim.workload.bench.sample import BenchSample, samples_workload
from kvsched.sim.workload.bench.sharegpt import sample_sharegpt
from kvsched.sim.workload.bench.sonnet import (
    DEFAULT_SONNET_INPUT_LEN,
    DEFAULT_SONNET_OUTPUT_LEN,
    DEFAULT_SONNET_PREFIX_LEN,
    sample_sonnet,
)
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.tokenizer import TextTokenizer

# The datasets of vllm bench serve this package samples (random is
# kvsched.sim.workload.random_dataset's; hf needs the datasets package).
BENCH_DATASETS = ("sharegpt", "burstgpt", "sonnet", "prefix_repetition", "custom", "hf")
# Those that read a file (--dataset-path).
FILE_DATASETS = ("sharegpt", "burstgpt", "sonnet", "custom", "hf")


@dataclass(slots=True, frozen=True)
class BenchDatasetOptions:
    """The dataset flags of vllm bench serve (None: vLLM's default), each
    declared with its flag's help (kvsched.engine_flags.add_declared_flags
    adds them to simulate's parser)."""

    sharegpt_output_len: int | None = flag(
        None, "sharegpt: every request's output length (default: the conversation's reply)")
    custom_output_len: int | None = flag(
        None, "custom: every request's output length; -1: each line's output_tokens "
              f"(default {DEFAULT_CUSTOM_OUTPUT_LEN})")
    skip_chat_template: bool = flag(
        False, "custom: count the prompt as written, not through the chat template")
    sonnet_input_len: int | None = flag(
        None, f"sonnet: prompt tokens at most (default {DEFAULT_SONNET_INPUT_LEN})")
    sonnet_output_len: int | None = flag(
        None, f"sonnet: output tokens (default {DEFAULT_SONNET_OUTPUT_LEN})")
    sonnet_prefix_len: int | None = flag(
        None, f"sonnet: tokens of the prefix every prompt shares (default {DEFAULT_SONNET_PREFIX_LEN})")
    prefix_repetition_prefix_len: int | None = flag(
        None, f"prefix_repetition: tokens of each shared prefix (default {DEFAULT_PREFIX_LEN})")
    prefix_repetition_suffix_len: int | None = flag(
        None, f"prefix_repetition: tokens of each prompt's own suffix (default {DEFAULT_SUFFIX_LEN})")
    prefix_repetition_num_prefixes: int | None = flag(
        None, "prefix_repetition: prefixes, each shared by num_prompts // num_prefixes prompts "
              f"(default {DEFAULT_NUM_PREFIXES})")
    prefix_repetition_output_len: int | None = flag(
        None, f"prefix_repetition: output tokens (default {DEFAULT_OUTPUT_LEN})")
    disable_shuffle: bool = flag(
        False, "sharegpt, custom, prefix_repetition: keep the file's (generation's) order")
    no_oversample: bool = flag(
        False, "sharegpt, custom: send only the rows there are, not --num-prompts")
    random_mm_base_items_per_request: int | None = flag(
        None, "random-mm: base number of images per request, drawn within +-ratio of it (default 1)")
    random_mm_num_mm_items_range_ratio: float | None = flag(
        None, "random-mm: items per request drawn uniformly from [floor(n(1-r)), ceil(n(1+r))], r in [0, 1] "
              "(default 0)")
    random_mm_limit_mm_per_prompt: str | None = flag(
        None, 'random-mm: most items per modality, a JSON object such as {"image": 3, "video": 0} '
              '(default {"image": 255, "video": 1})')
    random_mm_bucket_config: str | None = flag(
        None, "random-mm: (height, width, num_frames) -> probability, a Python dict such as "
              "'{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}' (default that, plus (720, 1280, 16): 0; "
              "kvsched prices images only)")
    hf_name: str | None = flag(
        None, "hf: the dataset's Hub name when --dataset-path is a local copy (kvsched reads "
              "lmarena-ai/VisionArena-Chat and lmarena-ai/vision-arena-bench-v0.1 from local parquet files)")
    hf_split: str | None = flag(None, "hf: the split whose parquet files are read (default train)")
    hf_output_len: int | None = flag(None, "hf: every request's output length (default 128 for VisionArena)")
    # kvsched's: replay BurstGPT at its own timestamps instead of sampling it.
    burstgpt_timestamps: bool = flag(
        False, "burstgpt (kvsched's): replay the GPT-4 rows in file order at their own Timestamp "
               "instead of sampling them as vLLM does")


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def load_bench_dataset(name: str, path: str | Path | None, tokenizer: TextTokenizer, *, num_prompts: int,
                       seed: int, request_rate: float | None, burstiness: float,
                       max_concurrency: int | None, options: BenchDatasetOptions) -> Workload:
    """The workload ``vllm bench serve --dataset-name name`` sends: the
    dataset's samples in vLLM's order, sent at ``request_rate`` (None or
    inf: all at once) with vLLM's gamma gaps from numpy's global state as
    vLLM leaves it (``--seed``, advanced by the datasets that draw from it).
    With ``options.burstgpt_timestamps`` and no rate, BurstGPT rows come at
    their own timestamps."""
    import numpy as np

    if name not in BENCH_DATASETS:
        raise UserInputError(f"unknown benchmark dataset {name!r}; one of {', '.join(BENCH_DATASETS)}")
    if name in FILE_DATASETS and not path:
        raise UserInputError(f"--dataset-name {name}: needs --dataset-path, the file to sample from")
    if name == "prefix_repetition" and path:
        raise UserInputError(f"--dataset-name prefix_repetition is synthetic and reads no file; drop "
                             f"--dataset-path={path}")
    state: Any = np.random.RandomState(seed)
    o = options
    samples: list[BenchSample]
    if name == "hf":
        raise UserInputError(
            "--dataset-name hf: kvsched reads the vision datasets (VisionArena) of vllm bench serve's hf "
            "datasets, which need the model's vision tower: load them with "
            "kvsched.sim.workload.load_workload('hf', path, vision=...); other hf datasets: export the "
            'prompts to a JSONL of {"prompt", "output_tokens"} and use --dataset-name custom')
    if name == "burstgpt" and o.burstgpt_timestamps:
        samples, times = burstgpt_timed(str(path), tokenizer, num_prompts if num_prompts > 0 else None)
        if request_rate is None:
            return samples_workload(name, samples, times, max_concurrency)
    elif name == "sharegpt":
        samples = sample_sharegpt(str(path), tokenizer, num_prompts, seed, o.sharegpt_output_len,
                                  o.disable_shuffle, o.no_oversample)
    elif name == "burstgpt":
        samples = sample_burstgpt(str(path), tokenizer, num_prompts, seed)
    elif name == "custom":
        samples = sample_custom(str(path), tokenizer, num_prompts, seed,
                                _or(o.custom_output_len, DEFAULT_CUSTOM_OUTPUT_LEN), o.skip_chat_template,
                                o.disable_shuffle, o.no_oversample)
    elif name == "sonnet":
        samples = sample_sonnet(str(path), tokenizer, num_prompts, seed,
                                _or(o.sonnet_input_len, DEFAULT_SONNET_INPUT_LEN),
                                _or(o.sonnet_output_len, DEFAULT_SONNET_OUTPUT_LEN),
                                _or(o.sonnet_prefix_len, DEFAULT_SONNET_PREFIX_LEN))
    else:
        samples, state = sample_prefix_repetition(
            tokenizer, num_prompts, seed, _or(o.prefix_repetition_prefix_len, DEFAULT_PREFIX_LEN),
            _or(o.prefix_repetition_suffix_len, DEFAULT_SUFFIX_LEN),
            _or(o.prefix_repetition_num_prefixes, DEFAULT_NUM_PREFIXES),
            _or(o.prefix_repetition_output_len, DEFAULT_OUTPUT_LEN), o.disable_shuffle)
    rate = math.inf if request_rate is None else request_rate
    times = arrival_times_from_state(len(samples), rate, burstiness, state)
    return samples_workload(name, samples, times, max_concurrency)
