"""``vllm bench serve --dataset-name hf`` with a vision dataset of
vLLM's ``VisionArenaDataset`` (``lmarena-ai/VisionArena-Chat``,
``lmarena-ai/vision-arena-bench-v0.1``), read from a local copy of its
parquet files (kvsched downloads nothing).

vLLM takes each row's first user turn as the prompt and its first image,
``prompt_len`` the prompt's tokens with the special tokens, ``--hf-output-len``
(default 128) output tokens, rows in order until ``--num-prompts``, then
oversampled. vLLM streams the dataset through the ``datasets`` package and
shuffles it there with a 1000-row buffer seeded by ``--seed``; kvsched does
not reproduce that shuffle, so it takes the rows in file order, which is
what vLLM does with ``--disable-shuffle`` (given without it, it is refused).

The local copy: ``--dataset-path`` a parquet file or a directory of them
(the split's files: those whose name holds ``--hf-split``, default
``train``, in path order, as ``datasets`` orders a local split), and
``--hf-name`` the dataset's Hub name (which of vLLM's parsers applies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.perf.vision import VisionSpec
from kvsched.sim.workload.bench.images import image_size
from kvsched.sim.workload.bench.load import BenchDatasetOptions
from kvsched.sim.workload.bench.multimodal import MMPrompt, chat_template_tokens, mm_workload
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.tokenizer import TextTokenizer

# vLLM's VisionArenaDataset default output length.
DEFAULT_VISION_ARENA_OUTPUT_LEN = 128


def _chat_turn(row: Mapping[str, Any]) -> object:
    return row["conversation"][0][0]["content"]


def _bench_turn(row: Mapping[str, Any]) -> object:
    return row["turns"][0][0]["content"]


# Each supported Hub name and where its rows keep the first user turn.
VISION_ARENA_PARSERS: Mapping[str, Callable[[Mapping[str, Any]], object]] = MappingProxyType({
    "lmarena-ai/VisionArena-Chat": _chat_turn,
    "lmarena-ai/vision-arena-bench-v0.1": _bench_turn,
})


def _split_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserInputError(f"--dataset-path={path}: no such file or directory; give the local copy of the "
                             "dataset's parquet files (kvsched downloads nothing)")
    files = sorted(p for p in path.rglob("*.parquet") if split in p.name)
    if not files:
        raise UserInputError(f"--dataset-path={path}: no parquet file of split {split!r} (a name holding "
                             f"{split!r}); check --hf-split")
    return files


def read_vision_arena(path: str | Path, hf_name: str, split: str) -> list[tuple[str, bytes]]:
    """(prompt, first image's bytes) of every row, in file order."""
    parser = VISION_ARENA_PARSERS.get(hf_name)
    if parser is None:
        raise UserInputError(f"--hf-name={hf_name!r}: kvsched reads the vision datasets "
                             f"{', '.join(VISION_ARENA_PARSERS)} of vllm bench serve's hf datasets; give "
                             "one of them (the Hub name of the local copy)")
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise UserInputError("--dataset-name hf reads parquet files with pyarrow, which is not installed; "
                             "pip install pyarrow") from None
    rows: list[tuple[str, bytes]] = []
    for file in _split_files(Path(path).expanduser(), split):
        for i, row in enumerate(pq.read_table(file).to_pylist()):
            where = f"{file}: row {i}"
            try:
                prompt = parser(row)
                image = row["images"][0]
            except (KeyError, IndexError, TypeError):
                raise UserInputError(f"{where}: not a {hf_name} row (its first turn's content and its "
                                     "images are read); check --hf-name") from None
            data = image.get("bytes") if isinstance(image, dict) else None
            if not isinstance(prompt, str) or not isinstance(data, bytes):
                raise UserInputError(f"{where}: needs a text prompt and an image with its bytes, got "
                                     f"{show(type(prompt).__name__)} and {show(type(data).__name__)}")
            rows.append((prompt, data))
    if not rows:
        raise UserInputError(f"--dataset-path={path}: no rows")
    return rows


def vision_arena_dataset(vision: VisionSpec | None, tokenizer: TextTokenizer, path: str | Path,
                         num_prompts: int, seed: int, request_rate: float, burstiness: float,
                         max_concurrency: int | None, options: BenchDatasetOptions) -> Workload:
    """The workload of ``--dataset-name hf`` over a local VisionArena copy
    (module docstring)."""
    o = options
    if o.hf_name is None:
        raise UserInputError("--dataset-name hf with a local --dataset-path: give --hf-name, the dataset's "
                             f"Hub name ({', '.join(VISION_ARENA_PARSERS)}), as vllm bench serve needs")
    if not o.disable_shuffle:
        raise UserInputError("--dataset-name hf: vLLM shuffles the streamed rows with the datasets package's "
                             "buffer, which kvsched does not reproduce; add --disable-shuffle (the rows in "
                             "file order, as vLLM then takes them)")
    if vision is None:
        raise UserInputError(f"--hf-name={o.hf_name}: its requests carry images, but the model takes none; "
                             "use a vision-language model")
    output_len = DEFAULT_VISION_ARENA_OUTPUT_LEN if o.hf_output_len is None else o.hf_output_len
    rows = read_vision_arena(path, o.hf_name, "train" if o.hf_split is None else o.hf_split)
    n = len(rows) if num_prompts <= 0 else num_prompts
    prompts = []
    for i, (prompt, data) in enumerate(rows[:n]):
        h, w = image_size(data, f"{path}: row {i}'s image")
        prompts.append(MMPrompt((tokenizer.count(prompt, add_special_tokens=False), (h, w)), output_len))
    if len(prompts) < n and not o.no_oversample:
        import random

        # vLLM's maybe_oversample_requests: copies drawn after random.seed(seed).
        rng = random.Random(seed)
        base = len(prompts)
        picks = [rng.choice(range(base)) for _ in range(n - base)]
        prompts = ([MMPrompt(p.parts, p.output_len, i) for i, p in enumerate(prompts)]
                   + [MMPrompt(prompts[k].parts, output_len, k) for k in picks])
    return mm_workload("hf", prompts, vision, chat_template_tokens(tokenizer), request_rate, burstiness, seed,
                       max_concurrency)
