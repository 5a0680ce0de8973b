"""Prompts with images as ``vllm bench serve``'s chat backend sends them,
and as the server sees them: the chat template's opening, the message's
parts in order (text, and each image as its model's processor expands it),
the template's closing. Shared by the multimodal datasets (random-mm,
custom_image)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvsched.errors import UserInputError
from kvsched.perf.vision import VisionSpec, image_placeholder
from kvsched.sim.workload.arrivals import arrival_times_of_rate
from kvsched.sim.workload.model import MMItem, Workload, WorkloadRequest
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.tokens import MAX_SHARED_TEXTS, SHARED_TEXT_TOKEN_BASE, UNIQUE_TOKEN_BASE

# The chat template's text is split around this (a string no template writes).
_CONTENT_MARK = "\x00kvsched-content\x00"


@dataclass(slots=True, frozen=True)
class MMPrompt:
    """One request's message: its parts in order, each a number of text
    tokens (an int) or an image's (height, width); and its output length.
    ``source``: the prompt it copies (oversampling), else -1; ``image_keys``:
    per image, what makes it the same image as another prompt's (its file),
    or None for an image of its own; ``shared_prefix``: how many of its first
    text tokens every prompt of the workload starts with (random-mm's
    ``--random-prefix-len``)."""

    parts: tuple[int | tuple[int, int], ...]
    output_len: int
    source: int = -1
    image_keys: tuple[str | None, ...] = ()
    shared_prefix: int = 0


def chat_template_tokens(tokenizer: TextTokenizer) -> tuple[int, int]:
    """Tokens the chat template puts before and after one user message's
    content (with the generation prompt)."""
    rendered = tokenizer.chat_prompt(_CONTENT_MARK)
    before, found, after = rendered.partition(_CONTENT_MARK)
    if not found:
        raise UserInputError(f"tokenizer {tokenizer.name}: its chat template does not write the message "
                             "content; a multimodal dataset needs the template vLLM's chat endpoint applies")
    return (tokenizer.count(before, add_special_tokens=False) if before else 0,
            tokenizer.count(after, add_special_tokens=False) if after else 0)


def mm_workload(name: str, prompts: Sequence[MMPrompt], vision: VisionSpec, template: tuple[int, int],
                request_rate: float, burstiness: float, seed: int, max_concurrency: int | None) -> Workload:
    """The requests of ``prompts`` as the server sees them (module
    docstring), sent at vllm bench serve's arrivals for ``request_rate``.
    Request ``i`` is ``{name}-{i}``; the template's opening is shared by
    all, the rest is the request's own but for a prompt oversampling
    repeated, which its copies share whole; each image is an
    :class:`MMItem` (identified by its key, else by the request or the
    prompt it copies, and its place)."""
    before, after = template
    times = arrival_times_of_rate(len(prompts), request_rate, burstiness, seed)
    copies = Counter(p.source for p in prompts if p.source >= 0)
    if copies and max(copies) + 1 >= MAX_SHARED_TEXTS:
        raise UserInputError(f"{name}: more than {MAX_SHARED_TEXTS:,} distinct prompts repeated; sample "
                             "fewer")
    requests = []
    for i, p in enumerate(prompts):
        rid = f"{name}-{i}"
        at = before
        items = []
        k = 0
        for part in p.parts:
            if isinstance(part, int):
                at += part
                continue
            h, w = part
            place = image_placeholder(vision, h, w)
            at += place.prefix_tokens
            key = p.image_keys[k] if k < len(p.image_keys) else None
            identifier = f"{name}-image:{key}" if key is not None else (
                f"{name}-{p.source}-image-{k}" if p.source >= 0 else f"{rid}-image-{k}")
            items.append(MMItem(identifier, "image", at, place.num_tokens, place.num_embeds,
                                place.num_patches, h, w))
            at += place.num_tokens + place.suffix_tokens
            k += 1
        total = at + after
        if p.source >= 0 and copies[p.source] > 1:
            # Text id 0 is the template's; prompt k shared whole is text k + 1.
            runs = [(SHARED_TEXT_TOKEN_BASE + 1 + p.source, total)]
        else:
            # The template's opening and the common text prefix: the same tokens in every prompt.
            shared = before + p.shared_prefix
            runs = [(SHARED_TEXT_TOKEN_BASE, shared)] if shared else []
            if total > shared:
                runs.append((UNIQUE_TOKEN_BASE + i, total - shared))
        requests.append(WorkloadRequest(rid, times[i], tuple(runs), p.output_len, mm_items=tuple(items)))
    return Workload(name, tuple(requests), max_concurrency)
