"""``--dataset-name custom_image`` against vLLM's own CustomImageDataset
(tests/conformance/make_custom_image_goldens.py ran it on vLLM 0.34 over
the files of tests/data/benchdatasets/custom_image, PIL reading the image
sizes), and image headers by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.vision import vision_spec_from_config
from kvsched.sim.workload.bench.custom_image import sample_custom_image
from kvsched.sim.workload.bench.images import image_reference_size, image_size
from kvsched.sim.workload.bench.multimodal import MMPrompt, mm_workload
from kvsched.sim.workload.tokenizer import read_tokenizer
from kvsched.sim.workload.tokens import SHARED_TEXT_TOKEN_BASE

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "benchdatasets"
FILES = DATA / "custom_image"
GOLDENS = sorted((ROOT / "tests" / "conformance" / "bench_datasets_mm").glob("custom_image*.json"))


@pytest.mark.parametrize("golden", GOLDENS, ids=[g.stem for g in GOLDENS])
def test_sampling_and_image_sizes_are_vllms(golden: Path) -> None:
    pytest.importorskip("tokenizers")
    data = json.loads(golden.read_text())
    case = data["case"]
    tokenizer = read_tokenizer(DATA / "tokenizer" / "tokenizer.json")
    sampled = sample_custom_image(FILES / "prompts.jsonl", tokenizer, case["num_requests"], case["seed"],
                                  bool(case.get("disable_shuffle", False)))
    got = [{"prompt_len": s.prompt_len, "expected_output_len": case["output_len"],
            "images": [list(image_reference_size(ref, FILES)) for kind, ref in s.parts if kind == "image"]}
           for s, _ in sampled]
    assert got == data["requests"]


def _png(width: int, height: int) -> bytes:
    header = struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height)
    return b"\x89PNG\r\n\x1a\n" + header + bytes(5)


def test_headers_by_hand() -> None:
    assert image_size(_png(640, 480), "x") == (480, 640)
    assert image_size(b"GIF89a" + struct.pack("<HH", 5, 9), "x") == (9, 5)
    assert image_size(b"BM" + bytes(16) + struct.pack("<ii", 12, -34), "x") == (34, 12)  # top-down
    # A JPEG with an APP1 (EXIF) segment and a fill byte before its baseline frame header.
    jpeg = (b"\xff\xd8" + b"\xff\xe1" + struct.pack(">H", 6) + b"Exif" + b"\xff"
            + b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 720, 1280) + bytes(12))
    assert image_size(jpeg, "x") == (720, 1280)
    # WebP: extended (24-bit sizes minus one) and lossless (14-bit fields minus one).
    vp8x = b"RIFF" + bytes(4) + b"WEBP" + b"VP8X" + bytes(8) + (1919).to_bytes(3, "little") + \
        (1079).to_bytes(3, "little")
    assert image_size(vp8x, "x") == (1080, 1920)
    w, h = 300 - 1, 7 - 1
    bits = w | h << 14
    vp8l = b"RIFF" + bytes(4) + b"WEBP" + b"VP8L" + bytes(4) + b"\x2f" + bits.to_bytes(4, "little") + bytes(5)
    assert image_size(vp8l, "x") == (7, 300)
    with pytest.raises(UserInputError, match="not a PNG"):
        image_size(b"hello world", "x")


def test_references_read_locally_only(tmp_path: Path) -> None:
    (tmp_path / "i.png").write_bytes(_png(3, 4))
    assert image_reference_size("i.png", tmp_path) == (4, 3)
    assert image_reference_size(f"file://{tmp_path}/i.png", Path("/")) == (4, 3)
    with pytest.raises(UserInputError, match="downloads nothing"):
        image_reference_size("https://example.com/a.png", tmp_path)
    with pytest.raises(UserInputError, match="cannot read"):
        image_reference_size("missing.png", tmp_path)


def test_copies_share_their_prompt_and_images_their_identifier() -> None:
    vision = vision_spec_from_config({"model_type": "gemma3", "mm_tokens_per_image": 256,
                                      "text_config": {"hidden_size": 5376},
                                      "vision_config": {"hidden_size": 1152, "image_size": 896,
                                                        "intermediate_size": 4304, "num_attention_heads": 16,
                                                        "num_hidden_layers": 27, "patch_size": 14}})
    assert vision is not None
    prompts = [MMPrompt((5, (10, 10), 3), 4, 0, ("a.png",)), MMPrompt((7,), 4, 1, ()),
               MMPrompt((5, (10, 10), 3), 4, 0, ("a.png",))]
    first, other, copy = mm_workload("custom_image", prompts, vision, (2, 1), float("inf"), 1.0, 0,
                                     None).requests
    # Gemma 3: 260 tokens per image; template 2 + 5 text + 260 + 3 text + 1.
    assert first.num_prompt_tokens == copy.num_prompt_tokens == 271
    assert first.prompt_runs == copy.prompt_runs == ((SHARED_TEXT_TOKEN_BASE + 1, 271),)
    assert first.mm_items[0].offset == 7 and first.mm_items[0].identifier == copy.mm_items[0].identifier
    assert other.prompt_runs[0] == (SHARED_TEXT_TOKEN_BASE, 2)  # only the template shared
