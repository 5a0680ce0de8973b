"""``load_workload``: a workload by dataset name, as ``vllm bench serve
--dataset-name`` picks one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.sim.workload.bench.custom_image import custom_image_dataset
from kvsched.sim.workload.bench.load import BENCH_DATASETS, load_bench_dataset
from kvsched.sim.workload.bench.random_mm import random_mm_dataset
from kvsched.sim.workload.bench.vision_arena import vision_arena_dataset
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.random_dataset import random_workload
from kvsched.sim.workload.traces.azure import load_azure
from kvsched.sim.workload.traces.jsonl import load_jsonl
from kvsched.sim.workload.traces.mooncake import load_mooncake

# vllm bench serve's datasets that send images (they need a vision-language model).
MM_DATASETS = ("random-mm", "custom_image", "hf")
# vllm bench serve's datasets, then the traces kvsched replays.
DATASET_NAMES = ("random", "random-mm", *BENCH_DATASETS, "custom_image", "azure", "mooncake", "jsonl")

_RANDOM_KWARGS = ("num_prompts", "input_len", "output_len", "range_ratio", "prefix_len", "request_rate",
                  "burstiness", "max_concurrency", "seed", "tokenizer")
_RANDOM_MM_KWARGS = ("vision", "tokenizer", "num_prompts", "input_len", "output_len", "range_ratio",
                     "prefix_len", "request_rate", "burstiness", "max_concurrency", "seed", "options")
_CUSTOM_IMAGE_KWARGS = ("vision", "tokenizer", "num_prompts", "seed", "request_rate", "burstiness",
                        "max_concurrency", "options")
_BENCH_KWARGS = ("tokenizer", "num_prompts", "seed", "request_rate", "burstiness", "max_concurrency",
                 "options")
_TRACE_LOADERS: dict[str, Callable[..., Workload]] = {
    "azure": load_azure, "mooncake": load_mooncake, "jsonl": load_jsonl}


def load_workload(dataset_name: str, dataset_path: str | Path | None = None, **kwargs: Any) -> Workload:
    """Build a workload by dataset name, as ``vllm bench serve --dataset-name``:
    ``random`` (keyword arguments of :func:`random_workload`, no path), one
    of vllm bench serve's datasets (keyword arguments of
    :func:`~kvsched.sim.workload.bench.load_bench_dataset`) or ``azure`` /
    ``mooncake`` / ``jsonl`` (a path; ``max_concurrency`` optional)."""
    if dataset_name == "random":
        if dataset_path is not None:
            raise UserInputError("dataset 'random' is synthetic and reads no file; "
                             f"got dataset_path={dataset_path!r}")
        _check_kwargs(dataset_name, kwargs, _RANDOM_KWARGS)
        return random_workload(**kwargs)
    if dataset_name == "random-mm":
        if dataset_path is not None:
            raise UserInputError("dataset 'random-mm' is synthetic and reads no file; "
                                 f"got dataset_path={dataset_path!r}")
        _check_kwargs(dataset_name, kwargs, _RANDOM_MM_KWARGS)
        return random_mm_dataset(**kwargs)
    if dataset_name == "custom_image":
        if dataset_path is None or str(dataset_path) == "":
            raise UserInputError("dataset 'custom_image' needs dataset_path, the JSONL of prompts and images")
        _check_kwargs(dataset_name, kwargs, _CUSTOM_IMAGE_KWARGS)
        return custom_image_dataset(path=dataset_path, **kwargs)
    if dataset_name == "hf":
        if dataset_path is None or str(dataset_path) == "":
            raise UserInputError("dataset 'hf' needs dataset_path, the local copy of the dataset's parquet "
                                 "files")
        _check_kwargs(dataset_name, kwargs, _CUSTOM_IMAGE_KWARGS)
        return vision_arena_dataset(path=dataset_path, **kwargs)
    if dataset_name in BENCH_DATASETS:
        _check_kwargs(dataset_name, kwargs, _BENCH_KWARGS)
        return load_bench_dataset(dataset_name, dataset_path, **kwargs)
    loader = _TRACE_LOADERS.get(dataset_name)
    if loader is None:
        raise UserInputError(f"unknown dataset name {dataset_name!r}; "
                             f"choose one of {', '.join(DATASET_NAMES)}")
    if dataset_path is None or str(dataset_path) == "":
        raise UserInputError(f"dataset {dataset_name!r} needs dataset_path, the trace file to read")
    _check_kwargs(dataset_name, kwargs, ("max_concurrency",))
    return loader(dataset_path, **kwargs)


def _check_kwargs(dataset_name: str, kwargs: Mapping[str, object], allowed: Sequence[str]) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise UserInputError(f"dataset {dataset_name!r}: unknown option(s) {', '.join(unknown)}; "
                         f"it takes {', '.join(allowed)}")
