"""A vision-language model's image path, as far as serving is concerned:
how many prompt tokens the processor expands one image to, and what the
vision encoder costs to run on it.

:class:`VisionSpec` is read from a ``config.json``'s ``vision_config``
(:func:`vision_spec_from_config`) for the four families kvsched prices:

- ``qwen2_5_vl`` (Qwen2.5-VL) and ``qwen3_vl`` (Qwen3-VL, dense and MoE):
  the image is resized so both sides are multiples of
  ``patch_size * spatial_merge_size`` with its area kept within the
  processor's ``[min_pixels, max_pixels]`` (transformers'
  ``smart_resize``); each ``patch_size`` square is a ViT patch, and every
  ``spatial_merge_size**2`` patches merge into one prompt token, between a
  ``<|vision_start|>`` and a ``<|vision_end|>`` token;
- ``gemma3`` (Gemma 3, pan-and-scan off, vLLM's default): every image is
  resized to ``image_size`` square, SigLIP runs on its patches, and a
  pooling leaves ``mm_tokens_per_image`` (256) embeddings; the prompt holds
  them inside ``"\\n\\n<start_of_image>" ... "<end_of_image>\\n\\n"`` (260
  tokens, of which 256 are embeddings);
- ``llama4`` (Llama 4): the image is fitted to a canvas of ``image_size``
  tiles (at most ``max_patches``; transformers' ``get_best_fit``); each tile
  gives ``(image_size / patch_size)**2 * pixel_shuffle_ratio**2`` tokens
  (144), a second global tile is added when there is more than one, and
  the prompt spells the tiles with separators (``_prompt_split_image``).

The processor settings config.json does not hold (``min_pixels`` /
``max_pixels``, ``max_patches``) are the published ``preprocessor_config.json``
values of each family (:data:`PROCESSOR_DEFAULTS`, sources beside them).

Encoder cost (:func:`encoder_work`): per image, the ViT's FLOPs over its
patches (projections and MLP: 2 FLOPs per weight per patch; attention:
4 FLOPs per query-key pair per channel, over the image's own patches, or a
window's for Qwen2.5-VL's windowed layers, or a tile's for Llama 4), the
patch embedding, and the merger / projector over the merged tokens. Its
weights are read once per step that runs the encoder
(:class:`EncoderPricer`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import show

VISION_KINDS = ("qwen2_5_vl", "qwen3_vl", "gemma3", "llama4")

# The config.json model_type of each vision-language wrapper kvsched reads.
# Qwen3.5's vision tower and processor are Qwen3-VL's (its published
# preprocessor_config.json has the same patch, merge and size values).
VISION_MODEL_TYPES: Mapping[str, str] = MappingProxyType({
    "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl",
    "qwen3_5": "qwen3_vl", "qwen3_5_moe": "qwen3_vl", "gemma3": "gemma3", "llama4": "llama4"})

# The published preprocessor_config.json values config.json does not carry:
# Qwen2.5-VL: "min_pixels": 3136, "max_pixels": 12845056 (Qwen/Qwen2.5-VL-*);
# Qwen3-VL: "size": {"shortest_edge": 65536, "longest_edge": 16777216}
# (Qwen/Qwen3-VL-*); Llama 4: "max_patches": 16, "resize_to_max_canvas":
# false (meta-llama/Llama-4-*). (min_pixels, max_pixels, max_patches).
PROCESSOR_DEFAULTS: Mapping[str, tuple[int, int, int]] = MappingProxyType({
    "qwen2_5_vl": (3136, 12845056, 0),
    "qwen3_vl": (65536, 16777216, 0),
    "gemma3": (0, 0, 0),
    "llama4": (0, 0, 16),
})

# Bounds on the image sizes a workload names (vLLM bench's buckets are a
# few thousand pixels a side; 2**16 keeps the products exact in floats).
MAX_IMAGE_SIDE = 1 << 16
# Qwen's processor refuses aspect ratios beyond this (smart_resize).
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionSpec:
    """A vision tower and its image processor (see the module docstring).

    ``merge_size``: patches merged per side into one token (Qwen's
    ``spatial_merge_size``; Llama 4's ``1 / pixel_shuffle_ratio``; Gemma 3's
    pooling kernel, patches per side over tokens per side).
    ``window_patches``: patches per attention window of Qwen2.5-VL's
    windowed layers (0: every layer attends over the whole image), and
    ``num_full_layers`` the layers that attend over the whole image anyway.
    ``num_deepstack_mergers``: Qwen3-VL's extra mergers (one per
    ``deepstack_visual_indexes`` entry). ``merger_weights``: the weights of
    the merger / adapter / projector matrices each merged token goes
    through to reach the language model (Σ in x out)."""

    kind: str
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    num_channels: int = 3
    temporal_patch_size: int = 1
    merge_size: int = 1
    gated_mlp: bool = False
    window_patches: int = 0
    num_full_layers: int = 0
    num_deepstack_mergers: int = 0
    merger_weights: int = 0
    image_size: int = 0
    min_pixels: int = 0
    max_pixels: int = 0
    max_tiles: int = 0
    tokens_per_image: int = 0

    def __post_init__(self) -> None:
        if self.kind not in VISION_KINDS:
            raise UserInputError(f"VisionSpec kind={show(self.kind)}: must be one of "
                                 f"{', '.join(VISION_KINDS)}")
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "num_channels",
                     "temporal_patch_size", "merge_size", "merger_weights"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserInputError(f"vision_config {name}={show(value)}: must be a positive integer; fix "
                                     "config.json")

    @property
    def tokens_per_tile(self) -> int:
        """Llama 4: prompt tokens (and embeddings) of one tile."""
        side = self.image_size // self.patch_size
        return side * side // (self.merge_size * self.merge_size)

    def params(self) -> int:
        """Weights of the tower, patch embedding, merger(s) and projector
        (biases and norms left out: under 0.1 %)."""
        d, f = self.hidden_size, self.intermediate_size
        patch_in = self.num_channels * self.temporal_patch_size * self.patch_size ** 2
        per_layer = 4 * d * d + (3 if self.gated_mlp else 2) * d * f
        return patch_in * d + self.depth * per_layer + self.merger_weights * (1 + self.num_deepstack_mergers)


@dataclass(frozen=True, slots=True)
class ImagePlaceholder:
    """One image as the server's prompt holds it: ``num_tokens`` prompt
    tokens (vLLM's placeholder range: the tokens the processor put in for
    it), of which ``num_embeds`` are encoder outputs; ``num_patches`` the
    ViT patches the encoder runs over; ``prefix_tokens`` / ``suffix_tokens``
    the model's own marker tokens around the range (Qwen's vision start and
    end), which are prompt tokens but not in the range."""

    num_tokens: int
    num_embeds: int
    num_patches: int
    prefix_tokens: int = 0
    suffix_tokens: int = 0


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL resize: both sides multiples of ``factor``
    (rounded half to even, as Python's ``round``), the area within
    ``[min_pixels, max_pixels]`` at the image's aspect ratio."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise UserInputError(f"image {height}x{width}: aspect ratio above {MAX_ASPECT_RATIO}, which the Qwen "
                             "processor refuses; use a squarer image")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def llama4_canvas(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """(rows, columns) of tiles transformers' Llama 4 processor fits an
    image to (``get_best_fit`` over ``find_supported_resolutions``, without
    resizing to the largest canvas): the least upscale >= 1 if any canvas
    allows upscaling, else the least downscale; among equal scales the
    smallest area."""
    shapes = {(r, c) for n in range(1, max_tiles + 1) for r in range(1, n + 1) if n % r == 0
              for c in (n // r,)}
    # transformers divides int tensors in float32: compare the same floats.
    import numpy as np

    def scale(shape: tuple[int, int]) -> float:
        sh = np.float32(shape[0] * tile) / np.float32(height)
        sw = np.float32(shape[1] * tile) / np.float32(width)
        return float(min(sh, sw))

    scales = {s: scale(s) for s in shapes}
    up = [v for v in scales.values() if v >= 1]
    chosen = min(up) if up else max(scales.values())
    return min((s for s, v in scales.items() if v == chosen), key=lambda s: (s[0] * s[1], s))


def image_placeholder(spec: VisionSpec, height: int, width: int) -> ImagePlaceholder:
    """The prompt tokens and encoder work of one ``height`` x ``width``
    image (see the module docstring for each family's rule)."""
    for name, side in (("height", height), ("width", width)):
        if not isinstance(side, int) or isinstance(side, bool) or not 1 <= side <= MAX_IMAGE_SIDE:
            raise UserInputError(f"image {name}={show(side)}: must be an integer number of pixels in "
                                 f"[1, {MAX_IMAGE_SIDE}]")
    p, m = spec.patch_size, spec.merge_size
    if spec.kind in ("qwen2_5_vl", "qwen3_vl"):
        h, w = smart_resize(height, width, p * m, spec.min_pixels, spec.max_pixels)
        patches = (h // p) * (w // p)
        embeds = patches // (m * m)
        return ImagePlaceholder(embeds, embeds, patches, 1, 1)
    if spec.kind == "gemma3":
        side = spec.image_size // p
        # "\n\n" + <start_of_image> + 256 soft tokens + <end_of_image> + "\n\n".
        return ImagePlaceholder(spec.tokens_per_image + 4, spec.tokens_per_image, side * side)
    rows, cols = llama4_canvas(height, width, spec.image_size, spec.max_tiles)
    tiles = rows * cols
    per_tile = spec.tokens_per_tile
    side = spec.image_size // p
    encoded = tiles + 1 if tiles > 1 else 1
    tokens = 1 + 1 + per_tile + 1  # <|image_start|>, <|image|>, the global tile, <|image_end|>
    if tiles > 1:
        # Every tile, an x separator between tiles of a row, a y separator after each row.
        tokens += tiles * per_tile + rows * (cols - 1) + rows
    return ImagePlaceholder(tokens, encoded * per_tile, encoded * (side * side + 1))


def max_image_embeds(spec: VisionSpec) -> int:
    """Encoder outputs of the largest image the model's processor makes:
    vLLM's profiling image (the most features), here a square image at the
    largest side, which the processor scales down to its pixel cap (Qwen),
    tiles to its tile cap (Llama 4) or always resizes (Gemma 3)."""
    return image_placeholder(spec, MAX_IMAGE_SIDE, MAX_IMAGE_SIDE).num_embeds


@dataclass(frozen=True, slots=True)
class EncoderWork:
    """FLOPs and activation bytes of the encoder on a set of images."""

    flops: float
    activation_bytes: float


def encoder_work(spec: VisionSpec, num_patches: int) -> EncoderWork:
    """The encoder's FLOPs and activation bytes (16-bit) on one image of
    ``num_patches`` ViT patches (:attr:`ImagePlaceholder.num_patches`)."""
    d, f, P = spec.hidden_size, spec.intermediate_size, num_patches
    patch_in = spec.num_channels * spec.temporal_patch_size * spec.patch_size ** 2
    flops = 2.0 * P * patch_in * d
    linear = 4 * d * d + (3 if spec.gated_mlp else 2) * d * f
    flops += 2.0 * P * linear * spec.depth
    # Keys each patch attends to, per layer kind.
    if spec.kind == "llama4":
        side = spec.image_size // spec.patch_size
        keys_full = min(P, side * side + 1)  # one tile (its patches and class token)
    else:
        keys_full = P
    if spec.window_patches:
        windowed = spec.depth - spec.num_full_layers
        flops += 4.0 * P * d * (keys_full * spec.num_full_layers + min(P, spec.window_patches) * windowed)
    else:
        flops += 4.0 * P * d * keys_full * spec.depth
    merged = P / (spec.merge_size * spec.merge_size) if spec.kind != "gemma3" else spec.tokens_per_image
    flops += 2.0 * merged * spec.merger_weights * (1 + spec.num_deepstack_mergers)
    # Each layer reads and writes its activations: the residual stream
    # (norms, attention in and out) and the MLP's hidden width.
    activation_bytes = 2.0 * P * spec.depth * (6 * d + 2 * f)
    return EncoderWork(flops, activation_bytes)


def _int(vc: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = vc.get(key, default)
    if value is None:
        raise UserInputError(f"{source}: vision_config has no {key!r}; an image needs it priced (fix "
                             "config.json)")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserInputError(f"{source}: vision_config {key}={show(value)}: must be a non-negative integer; "
                             "fix config.json")
    return value


def vision_spec_from_config(data: Mapping[str, Any], source: str = "config.json") -> VisionSpec | None:
    """The vision tower of a vision-language ``config.json`` (None for a
    model without images: no model_type of :data:`VISION_MODEL_TYPES`). A
    multimodal model_type whose config lacks ``vision_config`` is refused
    with the fix."""
    model_type = data.get("model_type")
    kind = VISION_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if kind is None:
        return None
    vc = data.get("vision_config")
    if not isinstance(vc, dict):
        raise UserInputError(f"{source}: model_type={model_type!r} takes images but config.json has no "
                             "vision_config object; use the model's published config.json")
    text = data.get("text_config")
    text_hidden = text.get("hidden_size") if isinstance(text, dict) else data.get("hidden_size")
    min_pixels, max_pixels, max_tiles = PROCESSOR_DEFAULTS[kind]
    if kind in ("qwen2_5_vl", "qwen3_vl"):
        d = _int(vc, "hidden_size", source)
        m = _int(vc, "spatial_merge_size", source, 2)
        p = _int(vc, "patch_size", source, 14 if kind == "qwen2_5_vl" else 16)
        window = _int(vc, "window_size", source, 0) if kind == "qwen2_5_vl" else 0
        full = vc.get("fullatt_block_indexes", [])
        deep = vc.get("deepstack_visual_indexes", [])
        if not isinstance(full, list) or not isinstance(deep, list):
            raise UserInputError(f"{source}: vision_config fullatt_block_indexes / deepstack_visual_indexes "
                                 "must be lists; fix config.json")
        out = _int(vc, "out_hidden_size", source, text_hidden if isinstance(text_hidden, int) else None)
        return VisionSpec(
            kind=kind, depth=_int(vc, "depth", source), hidden_size=d,
            intermediate_size=_int(vc, "intermediate_size", source), num_heads=_int(vc, "num_heads", source),
            patch_size=p, num_channels=_int(vc, "in_channels", source, 3),
            temporal_patch_size=_int(vc, "temporal_patch_size", source, 2), merge_size=m,
            # Qwen2.5-VL's ViT MLP is gated (SiLU); Qwen3-VL's is a plain GELU MLP.
            gated_mlp=kind == "qwen2_5_vl",
            window_patches=(window // p) ** 2 if window else 0, num_full_layers=len(full),
            # The merger: LayerNorm, then d*m^2 -> d*m^2 -> the language model's width.
            num_deepstack_mergers=len(deep), merger_weights=(d * m * m) ** 2 + d * m * m * out,
            min_pixels=min_pixels, max_pixels=max_pixels)
    if kind == "gemma3":
        d = _int(vc, "hidden_size", source)
        p = _int(vc, "patch_size", source)
        size = _int(vc, "image_size", source)
        tokens = data.get("mm_tokens_per_image", 256)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1 \
                or math.isqrt(tokens) ** 2 != tokens:
            raise UserInputError(f"{source}: mm_tokens_per_image={show(tokens)}: must be a square number of "
                                 "tokens; fix config.json")
        if not isinstance(text_hidden, int):
            raise UserInputError(f"{source}: text_config has no hidden_size; fix config.json")
        return VisionSpec(
            kind=kind, depth=_int(vc, "num_hidden_layers", source), hidden_size=d,
            intermediate_size=_int(vc, "intermediate_size", source),
            num_heads=_int(vc, "num_attention_heads", source), patch_size=p,
            num_channels=_int(vc, "num_channels", source, 3),
            merge_size=max(1, (size // p) // math.isqrt(tokens)), merger_weights=d * text_hidden,
            image_size=size, tokens_per_image=tokens)
    d = _int(vc, "hidden_size", source)
    ratio = vc.get("pixel_shuffle_ratio", 0.5)
    if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not 0 < ratio <= 1 \
            or (1 / ratio) != round(1 / ratio):
        raise UserInputError(f"{source}: vision_config pixel_shuffle_ratio={show(ratio)}: must be 1/n; fix "
                             "config.json")
    m = round(1 / ratio)
    if not isinstance(text_hidden, int):
        raise UserInputError(f"{source}: text_config has no hidden_size; fix config.json")
    adapter_in = _int(vc, "projector_input_dim", source)
    adapter_out = _int(vc, "projector_output_dim", source)
    # The pixel-shuffle adapter (fc1: d*m^2 -> projector_input_dim, fc2 ->
    # projector_output_dim), then the projector to the language model.
    return VisionSpec(
        kind=kind, depth=_int(vc, "num_hidden_layers", source), hidden_size=d,
        intermediate_size=_int(vc, "intermediate_size", source),
        num_heads=_int(vc, "num_attention_heads", source), patch_size=_int(vc, "patch_size", source),
        num_channels=_int(vc, "num_channels", source, 3), merge_size=m,
        merger_weights=d * m * m * adapter_in + adapter_in * adapter_out + adapter_out * text_hidden,
        image_size=_int(vc, "image_size", source), max_tiles=max_tiles)


@dataclass(frozen=True, slots=True)
class EncoderPricer:
    """Seconds the vision encoder adds to a step: a roofline over the
    step's images (their FLOPs at the 16-bit GEMM rate, the tower's
    weights read once plus the activations at the weight bandwidth), the
    tower split over ``tensor_parallel_size`` GPUs as vLLM shards it by
    default, plus one kernel latency per layer."""

    spec: VisionSpec
    flop_rate: float
    bandwidth: float
    tensor_parallel_size: int = 1
    kernel_latency_s: float = 0.0

    def max_tokens_per_item(self) -> dict[str, int]:
        """The scheduler's ``mm_max_tokens_per_item`` (vLLM sizes the encoder
        budget and cache from it): the embeddings of the largest image the
        processor makes (:func:`max_image_embeds`). Images only: a
        video-capable model's cache in vLLM may be sized by its video."""
        return {"image": max_image_embeds(self.spec)}

    def seconds(self, patches: Sequence[int]) -> float:
        """The encoder's seconds on images of these patch counts (0 if none)."""
        if not patches:
            return 0.0
        flops = activation = 0.0
        for n in patches:
            work = encoder_work(self.spec, n)
            flops += work.flops
            activation += work.activation_bytes
        tp = self.tensor_parallel_size
        weights = 2.0 * self.spec.params()
        compute = flops / tp / self.flop_rate
        memory = (weights + activation) / tp / self.bandwidth
        return max(compute, memory) + self.kernel_latency_s * self.spec.depth
