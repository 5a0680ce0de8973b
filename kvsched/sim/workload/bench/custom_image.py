"""``vllm bench serve --dataset-name custom_image``: a JSONL file of
prompts with images, read from local files, sampled as vLLM's
``CustomImageDataset`` samples it.

Each line is ``{"prompt": text, "image_files": [image, ...]}`` (sent as
the text, then the images) or ``{"content": [part, ...]}`` with parts
``{"type": "text", "text": ...}``, ``{"type": "image", "image": ...}`` or
``{"type": "image_url", "image_url": {"url": ...}}`` (or the URL as a
string), sent in that order. An image is a local path (relative to the
JSONL file's directory), a ``file://`` URL or a base64 ``data:`` URL; its
size is read from its header (:mod:`.images`). The lines are shuffled by
``random.seed(seed); random.shuffle`` unless ``--disable-shuffle``; vLLM's
``prompt_len`` is the text's tokens with the special tokens, and each
request asks for ``--custom-output-len`` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.perf.vision import VisionSpec
from kvsched.sim.workload.bench.custom import DEFAULT_CUSTOM_OUTPUT_LEN
from kvsched.sim.workload.bench.images import image_reference_size
from kvsched.sim.workload.bench.load import BenchDatasetOptions
from kvsched.sim.workload.bench.multimodal import MMPrompt, chat_template_tokens, mm_workload
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.traces.source import Source, json_lines, read_text


@dataclass(slots=True, frozen=True)
class CustomImageSample:
    """One line as vLLM samples it: ``prompt_len`` (vLLM's), and the message
    as text and image references in order."""

    prompt_len: int
    parts: tuple[tuple[str, str], ...]  # ("text", text) or ("image", reference)


def _image_ref(src: Source, line: int, part: dict[str, Any]) -> str:
    if part.get("type") == "image":
        ref = part.get("image")
    else:
        url = part.get("image_url")
        ref = url.get("url") if isinstance(url, dict) else url
    if not isinstance(ref, str) or not ref:
        raise src.error(line, f"{show(part)}: an image part needs its path or URL as a string")
    return ref


def read_custom_image(path: str | Path) -> list[tuple[int, tuple[tuple[str, str], ...]]]:
    """(line number, the message's parts) of every line, in file order."""
    p, text = read_text(path)
    if not str(p).endswith(".jsonl"):
        raise UserInputError(f"--dataset-path={p}: custom_image reads a .jsonl file, as vllm bench serve's "
                             "does (rename it)")
    src = Source(p)
    rows = []
    for line, obj in json_lines(src, text):
        if "content" in obj:
            content = obj["content"]
            if not isinstance(content, list) or not content:
                raise src.error(line, "'content' must be a non-empty list of text and image parts")
            parts: list[tuple[str, str]] = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    if not isinstance(part.get("text"), str):
                        raise src.error(line, "a text part needs a string 'text'")
                    parts.append(("text", part["text"]))
                elif kind in ("image", "image_url"):
                    parts.append(("image", _image_ref(src, line, part)))
                else:
                    raise src.error(line, f"part {show(part)}: its type must be text, image or image_url")
        elif "prompt" in obj and "image_files" in obj:
            prompt, files = obj["prompt"], obj["image_files"]
            if not isinstance(prompt, str):
                raise src.error(line, "'prompt' must be a string")
            if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
                raise src.error(line, "'image_files' must be a non-empty list of image paths")
            parts = [("text", prompt), *(("image", f) for f in files)]
        else:
            raise src.error(line, "each line needs 'prompt' and 'image_files', or 'content'")
        rows.append((line, tuple(parts)))
    if not rows:
        raise UserInputError(f"{p}: no lines")
    return rows


def sample_custom_image(path: str | Path, tokenizer: TextTokenizer, num_requests: int, seed: int,
                        disable_shuffle: bool = False, no_oversample: bool = False
                        ) -> list[tuple[CustomImageSample, int]]:
    """vLLM's ``CustomImageDataset.sample``: the lines (shuffled unless
    ``disable_shuffle``) in order until ``num_requests`` (<= 0: all), then
    topped up with copies as ``maybe_oversample_requests`` draws them.
    Each sample comes with the index of the line it copies (-1: none)."""
    rows = [parts for _, parts in read_custom_image(path)]
    if not disable_shuffle:
        random.Random(seed).shuffle(rows)
    if num_requests <= 0:
        num_requests = len(rows)
    samples = []
    for parts in rows[:num_requests]:
        text = "".join(t for kind, t in parts if kind == "text")
        samples.append((CustomImageSample(tokenizer.count(text), parts), -1))
    if no_oversample or len(samples) >= num_requests:
        return samples
    rng = random.Random(seed)
    base = len(samples)
    picks = [rng.choice(range(base)) for _ in range(num_requests - base)]
    return [(s, i) for i, (s, _) in enumerate(samples)] + [(samples[k][0], k) for k in picks]


def custom_image_dataset(vision: VisionSpec | None, tokenizer: TextTokenizer, path: str | Path,
                         num_prompts: int, seed: int, request_rate: float, burstiness: float,
                         max_concurrency: int | None, options: BenchDatasetOptions) -> Workload:
    """``vllm bench serve --dataset-name custom_image`` for a model whose
    images ``vision`` describes (None: refused)."""
    if vision is None:
        raise UserInputError("--dataset-name custom_image sends images, but the model takes none (its "
                             "config.json has no vision tower kvsched reads: Qwen2.5-VL, Qwen3-VL, Gemma 3, "
                             "Llama 4); use a vision-language model")
    output_len = DEFAULT_CUSTOM_OUTPUT_LEN if options.custom_output_len is None else options.custom_output_len
    if output_len < 1:
        raise UserInputError(f"--custom-output-len={output_len}: custom_image asks every request for that "
                             "many tokens (vLLM takes no per-line output length here); give a number >= 1")
    base = Path(path).expanduser().parent
    sampled = sample_custom_image(path, tokenizer, num_prompts, seed, options.disable_shuffle,
                                  options.no_oversample)
    sizes: dict[str, tuple[int, int]] = {}
    prompts = []
    for sample, source in sampled:
        parts: list[int | tuple[int, int]] = []
        keys: list[str | None] = []
        for kind, value in sample.parts:
            if kind == "text":
                parts.append(tokenizer.count(value, add_special_tokens=False))
            else:
                size = sizes.get(value)
                if size is None:
                    size = sizes[value] = image_reference_size(value, base)
                parts.append(size)
                keys.append(value)
        prompts.append(MMPrompt(tuple(parts), output_len, source, tuple(keys)))
    return mm_workload("custom_image", prompts, vision, chat_template_tokens(tokenizer), request_rate,
                       burstiness, seed, max_concurrency)
