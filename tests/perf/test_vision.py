"""Image token counts against transformers' own processor functions, and
the vision encoder's FLOPs by hand.

This venv's transformers cannot import its Qwen or Llama 4 image-processor
modules (they need torchvision), so the tests take the functions'
definitions out of the installed files with ``ast`` and run those: the
expected values are transformers' code, not kvsched's."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.vision import (
    EncoderPricer,
    VisionSpec,
    encoder_work,
    image_placeholder,
    llama4_canvas,
    smart_resize,
    vision_spec_from_config,
)

SIZES = [(256, 256), (720, 1280), (1280, 720), (32, 32), (2000, 300), (4000, 4000), (1080, 1920),
         (100, 5000), (336, 336), (337, 672), (10, 1000)]


def _transformers_functions(rel: str, names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.skip("transformers is not installed")
    path = Path(spec.origin).parent / "models" / rel
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in wanted} == set(names), f"{path}: functions moved"
    module = ast.Module(body=wanted, type_ignores=[])  # type: ignore[arg-type]
    exec(compile(module, str(path), "exec"), namespace)
    return namespace


def _method(rel: str, cls: str, name: str) -> Any:
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "models" / rel
    tree = ast.parse(path.read_text())
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (fn,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


QWEN25 = {"model_type": "qwen2_5_vl", "hidden_size": 3584, "vision_config": {
    "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": 3584,
    "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31], "in_channels": 3}}
QWEN3 = {"model_type": "qwen3_vl", "text_config": {"hidden_size": 4096}, "vision_config": {
    "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_size": 1152, "in_channels": 3,
    "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16,
    "spatial_merge_size": 2, "temporal_patch_size": 2}}
GEMMA3 = {"model_type": "gemma3", "mm_tokens_per_image": 256, "text_config": {"hidden_size": 5376},
          "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                            "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}}
# meta-llama/Llama-4-Scout-17B-16E-Instruct's published vision_config.
LLAMA4 = {"model_type": "llama4", "text_config": {"hidden_size": 5120}, "vision_config": {
    "hidden_size": 1408, "image_size": 336, "intermediate_size": 5632, "num_attention_heads": 16,
    "num_channels": 3, "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5,
    "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096}}


def _spec(data: dict[str, Any]) -> VisionSpec:
    spec = vision_spec_from_config(data)
    assert spec is not None
    return spec


@pytest.mark.parametrize(("data", "factor", "low", "high"), [(QWEN25, 28, 3136, 12845056),
                                                            (QWEN3, 32, 65536, 16777216)])
def test_qwen_tokens_are_transformers_smart_resize_over_the_merge(data: dict[str, Any], factor: int,
                                                                  low: int, high: int) -> None:
    ns = _transformers_functions("qwen2_vl/image_processing_qwen2_vl.py", ("smart_resize",), {"math": math})
    spec = _spec(data)
    patch = factor // 2
    for h, w in SIZES:
        if max(h, w) / min(h, w) > 200:
            continue
        rh, rw = ns["smart_resize"](h, w, factor=factor, min_pixels=low, max_pixels=high)
        assert smart_resize(h, w, factor, low, high) == (rh, rw)
        got = image_placeholder(spec, h, w)
        patches = (rh // patch) * (rw // patch)
        assert (got.num_patches, got.num_embeds, got.num_tokens) == (patches, patches // 4, patches // 4)
        assert (got.prefix_tokens, got.suffix_tokens) == (1, 1)  # <|vision_start|>, <|vision_end|>


def test_qwen_default_buckets_by_hand() -> None:
    # vllm bench's random-mm buckets: 256x256 -> 252x252 (9x9 merged tokens
    # of 28 px); 720x1280 -> 728x1288 (26 x 46 tokens).
    assert image_placeholder(_spec(QWEN25), 256, 256).num_embeds == 81
    assert image_placeholder(_spec(QWEN25), 720, 1280).num_embeds == 26 * 46
    # Qwen3-VL: 32-px tokens; 256x256 is exactly 8x8; 720x1280 -> 704x1280 (720 / 32 = 22.5
    # rounds half to even: 22 x 40).
    assert image_placeholder(_spec(QWEN3), 256, 256).num_embeds == 64
    assert image_placeholder(_spec(QWEN3), 720, 1280).num_embeds == 22 * 40


def test_llama4_tiles_are_transformers_best_fit() -> None:
    torch = pytest.importorskip("torch")
    ns = _transformers_functions("llama4/image_processing_llama4.py",
                                 ("get_factors", "find_supported_resolutions", "get_best_fit"),
                                 {"torch": torch, "defaultdict": defaultdict, "math": math,
                                  "lru_cache": lru_cache})

    class Size:
        height = width = 336

    resolutions = torch.tensor(ns["find_supported_resolutions"](16, Size()))
    split = _method("llama4/processing_llama4.py", "Llama4Processor", "_prompt_split_image")
    spec = _spec(LLAMA4)
    for h, w in SIZES:
        best = ns["get_best_fit"]((h, w), resolutions, resize_to_max_canvas=False)
        rows, cols = int(best[0]) // 336, int(best[1]) // 336
        assert llama4_canvas(h, w, 336, 16) == (rows, cols), (h, w)
        text = split(None, (rows, cols), 144)
        # Every marker is one token: count them in transformers' prompt string.
        markers = ("<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                   "<|tile_y_separator|>")
        tokens = sum(text.count(m) for m in markers)
        got = image_placeholder(spec, h, w)
        assert got.num_tokens == tokens, (h, w)
        assert got.num_embeds == text.count("<|patch|>"), (h, w)


def test_gemma3_is_256_embeds_in_260_tokens() -> None:
    got = image_placeholder(_spec(GEMMA3), 720, 1280)
    assert (got.num_tokens, got.num_embeds, got.num_patches) == (260, 256, 64 * 64)
    assert image_placeholder(_spec(GEMMA3), 16, 16) == got


def test_encoder_flops_by_hand() -> None:
    g = _spec(GEMMA3)
    P, d, f, L = 4096, 1152, 4304, 27
    expected = (2 * P * 588 * d + 2 * P * (4 * d * d + 2 * d * f) * L + 4 * P * P * d * L
                + 2 * 256 * d * 5376)
    assert encoder_work(g, P).flops == pytest.approx(expected, rel=1e-12)
    q = _spec(QWEN25)
    P = 52 * 92  # 728x1288 in 14-px patches
    d, f = 1280, 3420
    expected = (2 * P * 1176 * d + 2 * P * (4 * d * d + 3 * d * f) * 32
                + 4 * P * d * (P * 4 + 64 * 28) + 2 * (P / 4) * ((4 * d) ** 2 + 4 * d * 3584))
    assert encoder_work(q, P).flops == pytest.approx(expected, rel=1e-12)


def test_pricer_is_a_roofline_over_the_images() -> None:
    g = _spec(GEMMA3)
    pricer = EncoderPricer(g, flop_rate=1e15, bandwidth=1e12)
    one = pricer.seconds([4096])
    assert pricer.seconds([]) == 0.0
    assert pricer.seconds([4096, 4096]) > one
    work = encoder_work(g, 4096)
    assert one == pytest.approx(max(work.flops / 1e15, (2 * g.params() + work.activation_bytes) / 1e12))
    half = EncoderPricer(g, flop_rate=1e15, bandwidth=1e12, tensor_parallel_size=2).seconds([4096])
    assert half == pytest.approx(one / 2)


def test_bad_configs_are_refused_with_the_field() -> None:
    assert vision_spec_from_config({"model_type": "llama"}) is None
    with pytest.raises(UserInputError, match="no vision_config"):
        vision_spec_from_config({"model_type": "llama4", "text_config": {"hidden_size": 5120}})
    bad = {**QWEN3, "vision_config": {**QWEN3["vision_config"], "depth": -1}}
    with pytest.raises(UserInputError, match="depth"):
        vision_spec_from_config(bad)
    with pytest.raises(UserInputError, match="height"):
        image_placeholder(_spec(QWEN3), 0, 10)
    with pytest.raises(UserInputError, match="aspect ratio"):
        image_placeholder(_spec(QWEN3), 1, 1000)


def test_qwen25_vl_language_model_reads_as_qwen2(tmp_path: Path) -> None:
    from kvsched.perf.model_parsers import load_model_spec

    # Qwen/Qwen2.5-VL-7B-Instruct's published config.json: the language
    # model's fields at the top level (Qwen2.5-7B's layers), beside vision_config.
    config = {**QWEN25, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": 3584,
              "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 128000,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model_spec(path, "Qwen/Qwen2.5-VL-7B-Instruct")
    # Qwen2.5-7B's 7.62 B (its model card: 7.61 B); the 0.67 B ViT is apart.
    assert model.num_params() / 1e9 == pytest.approx(7.62, abs=0.01)
    vision = vision_spec_from_config(config)
    assert vision is not None and vision.params() / 1e9 == pytest.approx(0.67, rel=0.05)
