"""``--dataset-name random-mm`` against vLLM's own RandomMultiModalDataset
(tests/conformance/make_random_mm_goldens.py ran it on vLLM 0.34 with the
small tokenizer of tests/data/benchdatasets), the skipped pixel draws
against numpy's, and the requests as the server sees them by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsched.errors import UserInputError
from kvsched.perf.vision import vision_spec_from_config
from kvsched.request import SamplingParams
from kvsched.sim.workload.bench.random_mm import (
    RandomMMSample,
    draw_random_mm,
    item_count_range,
    parse_bucket_config,
    parse_limit_mm_per_prompt,
    random_mm_workload,
    skip_byte_draws,
)
from kvsched.sim.workload.model import MMItem, WorkloadRequest
from kvsched.sim.workload.tokenizer import read_tokenizer
from kvsched.sim.workload.tokens import SHARED_TEXT_TOKEN_BASE, UNIQUE_TOKEN_BASE

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = ROOT / "tests" / "data" / "benchdatasets" / "tokenizer" / "tokenizer.json"
GOLDENS = sorted((ROOT / "tests" / "conformance" / "bench_datasets_mm").glob("random_mm_*.json"))


@pytest.mark.parametrize("shape", [(256, 256, 3), (720, 1280, 3), (5, 7, 3), (1, 1, 3), (3, 3, 3), (2, 2, 2)])
@pytest.mark.parametrize("pending", [False, True])
def test_skipped_pixels_leave_numpy_where_drawing_them_does(shape: tuple[int, int, int],
                                                            pending: bool) -> None:
    drawn, skipped = np.random.default_rng(5), np.random.default_rng(5)
    if pending:  # a 32-bit half waiting in the generator
        drawn.integers(0, 1 << 32, dtype=np.uint32)
        skipped.integers(0, 1 << 32, dtype=np.uint32)
    drawn.integers(0, 256, shape, dtype=np.uint8)
    skip_byte_draws(skipped, int(np.prod(shape)))
    assert drawn.integers(0, 1 << 62, size=4).tolist() == skipped.integers(0, 1 << 62, size=4).tolist()


@pytest.mark.parametrize("golden", GOLDENS, ids=[g.stem for g in GOLDENS])
def test_sampling_is_vllms(golden: Path) -> None:
    pytest.importorskip("tokenizers")
    data = json.loads(golden.read_text())
    case = data["case"]
    tokenizer = read_tokenizer(TOKENIZER)
    ratio = float(case.get("range_ratio", 0.0))
    buckets = ({tuple(k): v for k, v in case["bucket_config"]} if "bucket_config" in case
               else parse_bucket_config(None))
    rng = np.random.default_rng(case["seed"])
    samples = draw_random_mm(rng, tokenizer, case["num_requests"], case["input_len"], case["output_len"],
                             (ratio, ratio), int(case.get("prefix_len", 0)),
                             int(case.get("base_items_per_request", 1)),
                             float(case.get("num_mm_items_range_ratio", 0.0)),
                             case.get("limit_mm_per_prompt", parse_limit_mm_per_prompt(None)), buckets)
    got = [{"prompt_len": s.prompt_len, "expected_output_len": s.output_len,
            "images": [[h, w] for h, w, _ in s.items]} for s in samples]
    assert got == data["requests"]
    assert int(rng.integers(0, 1 << 62)) == data["next_draw"]


def test_flag_values_parse_and_refuse_as_vllm() -> None:
    assert parse_bucket_config("{(256, 256, 1): 0.5, '(720, 1280, 1)': 1}") == {
        (256, 256, 1): 0.5, (720, 1280, 1): 1.0}
    assert parse_limit_mm_per_prompt('{"image": 3}') == {"image": 3}
    with pytest.raises(UserInputError, match="random-mm-bucket-config"):
        parse_bucket_config("{(256, 256): 1}")
    with pytest.raises(UserInputError, match="limit-mm-per-prompt"):
        parse_limit_mm_per_prompt('{"image": -1}')
    # vLLM: [floor(n(1-r)), ceil(n(1+r))], the top clamped to the limits' sum.
    assert item_count_range(3, 0.5, {"image": 4}, {(8, 8, 1): 1.0})[:2] == (1, 4)
    with pytest.raises(UserInputError, match="video"):
        item_count_range(1, 0.0, {"image": 1, "video": 1}, {(8, 8, 4): 1.0})
    with pytest.raises(UserInputError, match="does not name"):
        item_count_range(1, 0.0, {"image": 1}, {(8, 8, 1): 1.0, (8, 8, 4): 0.0})
    with pytest.raises(UserInputError, match="range-ratio"):
        item_count_range(1, 1.5, {"image": 1}, {(8, 8, 1): 1.0})


QWEN3 = {"model_type": "qwen3_vl", "text_config": {"hidden_size": 4096}, "vision_config": {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}}


def test_the_server_prompt_holds_the_text_then_each_image_with_its_markers() -> None:
    vision = vision_spec_from_config(QWEN3)
    assert vision is not None
    samples = [RandomMMSample(100, 7, ((256, 256, 1), (720, 1280, 1))), RandomMMSample(50, 3, ())]
    workload = random_mm_workload(samples, vision, (12, 5), float("inf"), 1.0, 0, None)
    first, second = workload.requests
    # 12 template tokens, 100 of text; image 1: <|vision_start|>, 64 tokens
    # (8 x 8 of 32 px), <|vision_end|>; image 2: start, 880 (22 x 40), end; 5 closing.
    assert [(i.offset, i.length, i.num_embeds) for i in first.mm_items] == [(113, 64, 64), (179, 880, 880)]
    assert first.num_prompt_tokens == 12 + 100 + 66 + 882 + 5
    assert first.prompt_runs == ((SHARED_TEXT_TOKEN_BASE, 12), (UNIQUE_TOKEN_BASE, 100 + 66 + 882 + 5))
    assert first.mm_items[0].identifier != first.mm_items[1].identifier
    assert second.mm_items == () and second.num_prompt_tokens == 12 + 50 + 5
    # --random-prefix-len: the template and the common prefix are one shared run.
    shared = random_mm_workload([RandomMMSample(100, 7, (), 30)], vision, (12, 5), float("inf"), 1.0, 0, None)
    assert shared.requests[0].prompt_runs == ((SHARED_TEXT_TOKEN_BASE, 42), (UNIQUE_TOKEN_BASE, 75))


def test_the_scheduler_request_carries_the_items_with_an_encoder_only() -> None:
    items = (MMItem("a", "image", 10, 64, 64, 256, 256, 256),
             MMItem("b", "image", 80, 260, 256, 4096, 896, 896))
    request = WorkloadRequest("r", 0.0, ((SHARED_TEXT_TOKEN_BASE, 400),), 5, mm_items=items)
    params = SamplingParams(max_tokens=5)
    assert request.to_request(params, 0.0).mm_features == ()
    features = request.to_request(params, 0.0, with_mm=True).mm_features
    assert [(f.identifier, f.offset, f.length, f.num_embeds) for f in features] == [
        ("a", 10, 64, 64), ("b", 80, 260, 256)]
    assert features[0].is_embed is None
    # Gemma 3's markers: two tokens each side of the 256 embeddings.
    assert features[1].is_embed == (False,) * 2 + (True,) * 256 + (False,) * 2


def test_items_must_lie_inside_the_prompt_apart() -> None:
    item = MMItem("a", "image", 10, 64, 64, 256, 256, 256)
    with pytest.raises(UserInputError, match="beyond the prompt"):
        WorkloadRequest("r", 0.0, ((UNIQUE_TOKEN_BASE, 70),), 4, mm_items=(item,))
    with pytest.raises(UserInputError, match="overlaps"):
        WorkloadRequest("r", 0.0, ((UNIQUE_TOKEN_BASE, 200),), 4,
                        mm_items=(item, MMItem("b", "image", 20, 5, 5, 5, 5, 5)))
    with pytest.raises(UserInputError, match="num_embeds"):
        MMItem("a", "image", 0, 4, 5, 5, 5, 5)
