"""The benchmark datasets of ``vllm bench serve`` (sharegpt, burstgpt,
sonnet, prefix_repetition, custom), each sampled exactly as vLLM's own
``vllm.benchmarks.datasets`` samples it for the same seed, files and flags
(tests/conformance/bench_datasets holds the outputs of vLLM's code they are
checked against). One module per dataset; ``sample`` is what they share,
``load`` the dispatch; ``random_text`` is the random dataset's lengths with a
tokenizer. The datasets with images (``random_mm``, ``custom_image``,
``vision_arena``: hf's VisionArena from a local copy) share ``multimodal``
(prompts as the chat endpoint sends them) and ``images`` (sizes from file
headers); kvsched.sim.workload.load dispatches them, as they need the
model's vision tower."""

from kvsched.sim.workload.bench.load import (
    BENCH_DATASETS,
    FILE_DATASETS,
    BenchDatasetOptions,
    load_bench_dataset,
)
from kvsched.sim.workload.bench.sample import BenchSample

__all__ = ["BENCH_DATASETS", "FILE_DATASETS", "BenchDatasetOptions", "BenchSample", "load_bench_dataset"]
