"""``vllm bench serve --dataset-name random-mm``: the random dataset's text
plus synthetic images, sampled as vLLM's ``RandomMultiModalDataset`` samples
them, and sent as its ``openai-chat`` backend sends them (the text, then the
images, in one user message through the chat template).

Sampling, per request and in vLLM's order from one
``numpy.random.default_rng(seed)``: the random dataset's input lengths,
output lengths and vocabulary offsets for all requests, the shared prefix,
then for each request its text (re-encoded, drawing any padding tokens),
its number of items (uniform over ``[floor(n(1-r)), ceil(n(1+r))]``, the
top clamped to the sum of the per-modality limits), and each item's bucket
(``(height, width, num_frames)`` drawn with the bucket probabilities, a
modality's buckets dropped once it reaches its limit) followed by the
image's random pixels (``height * width * 3`` bytes), whose draws are
skipped here without being made.

Each image then becomes its model's placeholder tokens
(:func:`kvsched.perf.vision.image_placeholder`): the prompt the server sees
is the chat template's opening, the text, every image (its markers and
placeholder tokens), and the template's closing; each image is one
:class:`~kvsched.sim.workload.model.MMItem` at its offset. Random pixels
make every image distinct, so every item has its own identifier.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.perf.vision import MAX_IMAGE_SIDE, VisionSpec
from kvsched.sim.workload.bench.load import BenchDatasetOptions
from kvsched.sim.workload.bench.multimodal import MMPrompt, chat_template_tokens, mm_workload
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.tokenizer import TextTokenizer

# vLLM's RandomMultiModalDataset defaults.
DEFAULT_BASE_ITEMS_PER_REQUEST = 1
DEFAULT_NUM_MM_ITEMS_RANGE_RATIO = 0.0
DEFAULT_LIMIT_MM_PER_PROMPT: Mapping[str, int] = {"image": 255, "video": 1}
DEFAULT_BUCKET_CONFIG: Mapping[tuple[int, int, int], float] = {
    (256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}


@dataclass(slots=True, frozen=True)
class RandomMMSample:
    """One request as vLLM samples it: ``prompt_len`` (vLLM's: the text's
    tokens, prefix included), ``output_len``, and its items as
    ``(height, width, num_frames)`` in order; ``prefix_len``: its first
    tokens, the prefix every request shares (``--random-prefix-len``)."""

    prompt_len: int
    output_len: int
    items: tuple[tuple[int, int, int], ...]
    prefix_len: int = 0


def parse_limit_mm_per_prompt(value: str | Mapping[str, int] | None) -> dict[str, int]:
    """``--random-mm-limit-mm-per-prompt``: a JSON object of modality ->
    most items per prompt (None: vLLM's default)."""
    if value is None:
        return dict(DEFAULT_LIMIT_MM_PER_PROMPT)
    parsed: object = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError as e:
            raise UserInputError(f"--random-mm-limit-mm-per-prompt={value!r}: not JSON ({e}); give an "
                                 'object such as \'{"image": 3, "video": 0}\'') from None
    if not isinstance(parsed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in parsed.items()):
        raise UserInputError(f"--random-mm-limit-mm-per-prompt={show(value)}: must map each modality to an "
                             'integer >= 0, e.g. \'{"image": 3, "video": 0}\'')
    return dict(parsed)


def parse_bucket_config(value: str | Mapping[Any, float] | None) -> dict[tuple[int, int, int], float]:
    """``--random-mm-bucket-config``: a Python dict literal of
    ``(height, width, num_frames)`` -> probability, as vLLM parses it (keys
    may be tuples or their string spellings; None: vLLM's default)."""
    if value is None:
        return dict(DEFAULT_BUCKET_CONFIG)
    flag = "--random-mm-bucket-config"
    parsed: object = value
    if isinstance(value, str):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError) as e:
            raise UserInputError(f"{flag}={value!r}: not a Python dict literal ({e}); give e.g. "
                                 "'{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}'") from None
    if not isinstance(parsed, Mapping):
        raise UserInputError(f"{flag}={show(value)}: must be a dict of (height, width, num_frames) -> "
                             "probability")
    out: dict[tuple[int, int, int], float] = {}
    for key, prob in parsed.items():
        k = key
        if isinstance(k, str):
            with contextlib.suppress(ValueError, SyntaxError):
                k = ast.literal_eval(k)
        if not (isinstance(k, tuple) and len(k) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in k)):
            raise UserInputError(f"{flag}: key {key!r}: must be a (height, width, num_frames) tuple of "
                                 "integers")
        if not isinstance(prob, int | float) or isinstance(prob, bool) or not math.isfinite(prob):
            raise UserInputError(f"{flag}: {key!r}: probability={show(prob)}: must be a number")
        h, w, t = k
        if not (1 <= h <= MAX_IMAGE_SIDE and 1 <= w <= MAX_IMAGE_SIDE) or t < 1:
            raise UserInputError(f"{flag}: key {key!r}: height and width must be in [1, {MAX_IMAGE_SIDE}] "
                                 "pixels and num_frames >= 1")
        out[(h, w, t)] = float(prob)
    return out


def _modality(bucket: tuple[int, int, int]) -> str:
    return "image" if bucket[2] == 1 else "video"


def _normalized(buckets: Mapping[tuple[int, int, int], float]) -> dict[tuple[int, int, int], float]:
    """vLLM's ``normalize_bucket_config``: zero entries dropped, the rest
    summing to 1."""
    if any(v < 0 for v in buckets.values()):
        raise UserInputError("--random-mm-bucket-config: probabilities must be >= 0")
    kept = {k: v for k, v in buckets.items() if v > 0}
    if not kept:
        raise UserInputError("--random-mm-bucket-config: every probability is 0; give a bucket a positive "
                             "one")
    total = sum(kept.values())
    return {k: v / total for k, v in kept.items()}


def item_count_range(base_items: int, ratio: float, limits: Mapping[str, int],
                     buckets: Mapping[tuple[int, int, int], float]
                     ) -> tuple[int, int, dict[str, int], dict[tuple[int, int, int], float]]:
    """vLLM's ``get_mm_item_sampling_params``: (least items, most items, the
    limits of the modalities the buckets draw, the normalized buckets)."""
    if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not 0.0 <= ratio <= 1.0:
        raise UserInputError(f"--random-mm-num-mm-items-range-ratio={show(ratio)}: must be in [0, 1]")
    if not isinstance(base_items, int) or isinstance(base_items, bool) or base_items < 0:
        raise UserInputError(f"--random-mm-base-items-per-request={show(base_items)}: must be an integer "
                             ">= 0")
    for bucket in buckets:
        if _modality(bucket) not in limits:
            raise UserInputError(f"--random-mm-bucket-config: bucket {bucket} is a {_modality(bucket)}, "
                                 f"which --random-mm-limit-mm-per-prompt ({dict(limits)}) does not name; "
                                 "add it")
    normalized = _normalized(buckets)
    drawn = {_modality(b) for b in normalized}
    if "video" in drawn:
        raise UserInputError("--random-mm-bucket-config: a bucket with num_frames > 1 (video) has a positive "
                             "probability; kvsched prices images only: give video buckets probability 0")
    kept_limits = {k: v for k, v in limits.items() if k in drawn}
    most = min(sum(kept_limits.values()), math.ceil(base_items * (1 + ratio)))
    least = max(0, math.floor(base_items * (1 - ratio)))
    if least > most:
        raise UserInputError(f"random-mm: at least {least} items per request "
                             f"(--random-mm-base-items-per-request x (1 - ratio)) but at most {most} (the "
                             "per-modality limits); raise "
                             "--random-mm-limit-mm-per-prompt or lower the base")
    return least, most, kept_limits, normalized


def skip_byte_draws(rng: Any, n: int) -> None:
    """Advance ``rng`` (a numpy Generator on PCG64) past
    ``rng.integers(0, 256, n, dtype=uint8)`` without making the bytes: a
    full-range uint8 draw takes one 32-bit output per 4 bytes, two of which
    come from each 64-bit step (a pending half is used first)."""
    import numpy as np

    words = -(-n // 4)
    if not words:
        return
    if rng.bit_generator.state["has_uint32"]:
        rng.integers(0, 1 << 32, dtype=np.uint32)
        words -= 1
    pairs, odd = divmod(words, 2)
    if pairs:
        rng.bit_generator.advance(pairs)
    if odd:
        rng.integers(0, 1 << 32, dtype=np.uint32)


def sample_random_mm(tokenizer: TextTokenizer, num_requests: int, seed: int, input_len: int, output_len: int,
                     range_ratio: tuple[float, float], prefix_len: int, base_items: int, items_ratio: float,
                     limits: Mapping[str, int], buckets: Mapping[tuple[int, int, int], float]
                     ) -> list[RandomMMSample]:
    """vLLM's ``RandomMultiModalDataset.sample`` (see the module docstring)
    for ``seed``: each request's text length, output length and items."""
    import numpy as np

    return draw_random_mm(np.random.default_rng(seed), tokenizer, num_requests, input_len, output_len,
                          range_ratio, prefix_len, base_items, items_ratio, limits, buckets)


def draw_random_mm(rng: Any, tokenizer: TextTokenizer, num_requests: int, input_len: int, output_len: int,
                   range_ratio: tuple[float, float], prefix_len: int, base_items: int, items_ratio: float,
                   limits: Mapping[str, int], buckets: Mapping[tuple[int, int, int], float]
                   ) -> list[RandomMMSample]:
    """:func:`sample_random_mm` drawing from ``rng`` (vLLM's dataset
    generator), left where vLLM leaves it."""
    import numpy as np

    least, most, limits, buckets = item_count_range(base_items, items_ratio, limits, buckets)
    input_ratio, output_ratio = range_ratio
    real_input = max(0, input_len - tokenizer.num_special_tokens_to_add)
    input_lens = rng.integers(math.floor(real_input * (1 - input_ratio)),
                              math.ceil(real_input * (1 + input_ratio)) + 1, size=num_requests).tolist()
    output_lens = rng.integers(max(1, math.floor(output_len * (1 - output_ratio))),
                               max(1, math.ceil(output_len * (1 + output_ratio))) + 1,
                               size=num_requests).tolist()
    vocab = tokenizer.vocab_size
    offsets = rng.integers(0, vocab, size=num_requests).tolist()
    allowed = np.array(sorted(set(range(vocab)) - set(tokenizer.all_special_ids)))

    def pad(n: int) -> list[int]:
        ids: list[int] = rng.integers(0, vocab, size=n).tolist()
        return ids

    prefix: list[int] = []
    if prefix_len > 0:
        prefix = tokenizer.settle(allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist(),
                                  prefix_len, pad)
    samples = []
    for i in range(num_requests):
        seq = prefix + allowed[(offsets[i] + i + np.arange(input_lens[i])) % len(allowed)].tolist()
        text = tokenizer.settle(seq, prefix_len + input_lens[i], pad)
        count = int(rng.integers(least, most + 1))
        items: list[tuple[int, int, int]] = []
        if count:
            used = {_modality(b): 0 for b in buckets}
            live = dict(buckets)
            while sum(used.values()) < count:
                keys = list(live)
                bucket = keys[int(rng.choice(len(keys), p=list(live.values())))]
                modality = _modality(bucket)
                if used[modality] < limits[modality]:
                    used[modality] += 1
                    items.append(bucket)
                    skip_byte_draws(rng, bucket[0] * bucket[1] * 3 * bucket[2])
                else:
                    live = {k: (0.0 if _modality(k) == modality else v) for k, v in live.items()}
                    if all(v == 0 for v in live.values()):
                        break
                    live = _normalized(live)
        samples.append(RandomMMSample(len(text), int(output_lens[i]), tuple(items),
                                      min(len(prefix), len(text))))
    return samples


def random_mm_workload(samples: list[RandomMMSample], vision: VisionSpec, template: tuple[int, int],
                       request_rate: float, burstiness: float, seed: int,
                       max_concurrency: int | None) -> Workload:
    """The requests of ``samples`` as the server sees them: the text, then
    the images (vllm bench serve's chat backend puts them last), each image
    its own (random pixels)."""
    prompts = [MMPrompt((s.prompt_len, *((h, w) for h, w, _ in s.items)), s.output_len,
                        shared_prefix=s.prefix_len) for s in samples]
    return mm_workload("random-mm", prompts, vision, template, request_rate, burstiness, seed,
                       max_concurrency)


def random_mm_dataset(vision: VisionSpec | None, tokenizer: TextTokenizer, num_prompts: int, input_len: int,
                      output_len: int, range_ratio: tuple[float, float], prefix_len: int,
                      request_rate: float, burstiness: float, max_concurrency: int | None, seed: int,
                      options: BenchDatasetOptions) -> Workload:
    """``vllm bench serve --dataset-name random-mm`` for a model whose
    images ``vision`` describes (None: a text-only model, refused)."""
    if vision is None:
        raise UserInputError("--dataset-name random-mm sends images, but the model takes none (its "
                             "config.json has no vision tower kvsched reads: Qwen2.5-VL, Qwen3-VL, Gemma 3, "
                             "Llama 4); use a vision-language model or --dataset-name random")
    o = options
    samples = sample_random_mm(
        tokenizer, num_prompts, seed, input_len, output_len, range_ratio, prefix_len,
        DEFAULT_BASE_ITEMS_PER_REQUEST if o.random_mm_base_items_per_request is None
        else o.random_mm_base_items_per_request,
        DEFAULT_NUM_MM_ITEMS_RANGE_RATIO if o.random_mm_num_mm_items_range_ratio is None
        else o.random_mm_num_mm_items_range_ratio,
        parse_limit_mm_per_prompt(o.random_mm_limit_mm_per_prompt),
        parse_bucket_config(o.random_mm_bucket_config))
    return random_mm_workload(samples, vision, chat_template_tokens(tokenizer), request_rate, burstiness,
                              seed, max_concurrency)
