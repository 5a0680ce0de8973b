"""Workloads for the serving simulator: who sends what, and when.

A :class:`Workload` is a tuple of :class:`WorkloadRequest` sorted by arrival
time (``model``). Sources, one module each:

* :func:`random_workload` (``random_dataset``) - the synthetic dataset of
  ``vllm bench serve --dataset-name random``, with its arrival process
  (``arrivals``);
* :func:`load_azure` (``traces.azure``) - the Azure LLM inference traces 2023 (CSV);
* :func:`load_mooncake` (``traces.mooncake``) - the Mooncake traces (JSONL with ``hash_ids``);
* :func:`load_jsonl` (``traces.jsonl``) - plain ``{"arrival_time", "input_tokens",
  "output_tokens"}`` lines;
* :func:`load_bench_dataset` (``bench``) - vllm bench serve's sharegpt,
  burstgpt, sonnet, prefix_repetition and custom datasets, sampled as
  vLLM samples them, token counts from the model's tokenizer
  (``tokenizer``);
* ``random-mm``, ``custom_image`` and hf's VisionArena (``bench.random_mm``,
  ``bench.custom_image``, ``bench.vision_arena``) - vllm bench serve's
  datasets with images, each image a typed item of its request
  (:class:`MMItem`), its placeholder tokens the model's;
* :func:`load_workload` (``load``) - dispatch on a dataset name, as ``--dataset-name``;
* :func:`repaced` (``model``) - any workload sent at vllm bench serve's
  ``--request-rate`` arrivals instead of its own.

How prompts are token ids that share exactly what their source says they
share is ``tokens``; the bounds on every number a workload takes, ``limits``.
This package reads files and draws numbers; it never runs the simulator.
The names below are re-exported so callers import them from here.
"""

from kvsched.sim.workload.arrivals import arrival_times_from_state, arrival_times_of_rate
from kvsched.sim.workload.bench import BENCH_DATASETS, FILE_DATASETS, BenchDatasetOptions, load_bench_dataset
from kvsched.sim.workload.limits import (
    MAX_ARRIVAL_TIME,
    MAX_BURSTINESS,
    MAX_NUM_PROMPTS,
    MAX_REQUEST_TOKENS,
    MAX_SEED,
    MAX_TIMESTAMP_MS,
    MIN_BURSTINESS,
)
from kvsched.sim.workload.load import DATASET_NAMES, load_workload
from kvsched.sim.workload.model import (
    MMItem,
    RandomRequests,
    Workload,
    WorkloadRequest,
    prompt_shares_nothing,
    repaced,
)
from kvsched.sim.workload.random_dataset import (
    DEFAULT_INPUT_LEN,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_OUTPUT_LEN,
    random_workload,
)
from kvsched.sim.workload.tokenizer import ApproximateTokenizer, TextTokenizer, load_tokenizer
from kvsched.sim.workload.tokens import (
    HASH_BLOCK_TOKEN_BASE,
    MAX_HASH_ID,
    MAX_RANDOM_PROMPTS,
    MOONCAKE_BLOCK_TOKENS,
    OUTPUT_TOKEN_BASE,
    RANDOM_PREFIX_TOKEN,
    UNIQUE_TOKEN_BASE,
    PromptRuns,
)
from kvsched.sim.workload.traces.azure import load_azure
from kvsched.sim.workload.traces.jsonl import load_jsonl
from kvsched.sim.workload.traces.mooncake import load_mooncake

__all__ = [
    "BENCH_DATASETS",
    "DATASET_NAMES",
    "DEFAULT_INPUT_LEN",
    "DEFAULT_NUM_PROMPTS",
    "DEFAULT_OUTPUT_LEN",
    "FILE_DATASETS",
    "HASH_BLOCK_TOKEN_BASE",
    "MAX_ARRIVAL_TIME",
    "MAX_BURSTINESS",
    "MAX_HASH_ID",
    "MAX_NUM_PROMPTS",
    "MAX_RANDOM_PROMPTS",
    "MAX_REQUEST_TOKENS",
    "MAX_SEED",
    "MAX_TIMESTAMP_MS",
    "MIN_BURSTINESS",
    "MOONCAKE_BLOCK_TOKENS",
    "OUTPUT_TOKEN_BASE",
    "RANDOM_PREFIX_TOKEN",
    "UNIQUE_TOKEN_BASE",
    "ApproximateTokenizer",
    "BenchDatasetOptions",
    "MMItem",
    "PromptRuns",
    "RandomRequests",
    "TextTokenizer",
    "Workload",
    "WorkloadRequest",
    "arrival_times_from_state",
    "arrival_times_of_rate",
    "load_azure",
    "load_bench_dataset",
    "load_jsonl",
    "load_mooncake",
    "load_tokenizer",
    "load_workload",
    "prompt_shares_nothing",
    "random_workload",
    "repaced",
]
