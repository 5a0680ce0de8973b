"""Goldens of vLLM's ``custom_image`` dataset: writes a few small images
(PNG, JPEG, GIF, WebP, BMP) and a JSONL naming them into
tests/data/benchdatasets/custom_image/, then runs vLLM's own
``CustomImageDataset.sample`` (as ``vllm bench serve --dataset-name
custom_image`` calls it) with the small tokenizer there, and writes per
case every request's ``prompt_len``, ``expected_output_len`` and the
(height, width) of each of its images as PIL opens them.

Run with a vLLM 0.34 venv (it has PIL):

    ~/.cache/kvsched-reference/venv-0.34/bin/python tests/conformance/make_custom_image_goldens.py
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "benchdatasets"
FILES = DATA / "custom_image"
OUT = Path(__file__).resolve().parent / "bench_datasets_mm"

# (file, format, width, height)
IMAGES = [("a.png", "PNG", 40, 30), ("b.jpg", "JPEG", 64, 48), ("c.gif", "GIF", 17, 90),
          ("d.webp", "WEBP", 33, 20), ("e.bmp", "BMP", 300, 7), ("f.png", "PNG", 1280, 720)]
CASES = {
    "custom_image": {"num_requests": 6, "seed": 0, "output_len": 32},
    "custom_image_oversample": {"num_requests": 14, "seed": 5, "output_len": 7},
    "custom_image_no_shuffle": {"num_requests": 4, "seed": 0, "output_len": 9, "disable_shuffle": True},
}


def write_files() -> None:
    from PIL import Image

    FILES.mkdir(parents=True, exist_ok=True)
    for name, fmt, w, h in IMAGES:
        Image.new("RGB", (w, h), (w % 256, h % 256, 90)).save(FILES / name, format=fmt)
    buf = io.BytesIO()
    Image.new("RGB", (21, 13), (1, 2, 3)).save(buf, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    lines = [
        {"prompt": "Describe this picture in detail.", "image_files": ["a.png"]},
        {"prompt": "Compare the two.", "image_files": ["b.jpg", "c.gif"]},
        {"content": [{"type": "text", "text": "First this: "}, {"type": "image", "image": "d.webp"},
                     {"type": "text", "text": " then that: "},
                     {"type": "image_url", "image_url": {"url": "e.bmp"}}]},
        {"prompt": "What colour is it?", "image_files": ["f.png"]},
        {"content": [{"type": "image_url", "image_url": data_url}, {"type": "text", "text": "Read it."}]},
        {"prompt": "Again the first one, with a longer question about its corners and edges.",
         "image_files": ["a.png", "a.png"]},
    ]
    (FILES / "prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def main() -> None:
    import os

    from PIL import Image
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import CustomImageDataset

    write_files()
    tokenizer = AutoTokenizer.from_pretrained(str(DATA / "tokenizer"))
    os.chdir(FILES)  # vLLM's file references are relative to the working directory
    for name, case in CASES.items():
        dataset = CustomImageDataset(dataset_path="prompts.jsonl", random_seed=case["seed"],
                                     disable_shuffle=bool(case.get("disable_shuffle", False)))
        samples = dataset.sample(tokenizer=tokenizer, num_requests=case["num_requests"],
                                 output_len=case["output_len"])
        requests = []
        for s in samples:
            images = []
            parts = s.prompt if isinstance(s.prompt, list) else []
            mm = s.multi_modal_data or []
            for part in [*parts, *(mm if isinstance(mm, list) else [mm])]:
                if part.get("type") != "image_url":
                    continue
                url = part["image_url"]["url"]
                if url.startswith("data:"):
                    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                else:
                    image = Image.open(url.removeprefix("file://"))
                images.append([image.height, image.width])
            requests.append({"prompt_len": s.prompt_len, "expected_output_len": s.expected_output_len,
                             "images": images})
        (OUT / f"{name}.json").write_text(json.dumps({"case": case, "requests": requests,
                                                      "vllm_version": "0.34.0"}, indent=1) + "\n")


if __name__ == "__main__":
    main()
