"""Goldens of vLLM's ``random-mm`` dataset: runs vLLM's own
``RandomMultiModalDataset.sample`` (as ``vllm bench serve --dataset-name
random-mm`` calls it) with the small tokenizer of tests/data/benchdatasets,
and writes, per case, every request's ``prompt_len``,
``expected_output_len`` and its images' (height, width), read back from the
JPEGs vLLM encodes, plus a fingerprint of the dataset's generator state
after sampling (it shows every pixel draw was made).

Run with a vLLM 0.34 venv (it needs PIL):

    ~/.cache/kvsched-reference/venv-0.34/bin/python tests/conformance/make_random_mm_goldens.py

kvsched's test (tests/sim/workload/test_random_mm.py) compares its own
sampling to these files; it needs no vLLM.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "data" / "benchdatasets" / "tokenizer"
OUT = Path(__file__).resolve().parent / "bench_datasets_mm"

# name -> sample() keyword arguments (vllm bench serve's flags by their dest names).
CASES: dict[str, dict[str, object]] = {
    "random_mm_default": {"num_requests": 10, "input_len": 40, "output_len": 9, "seed": 0},
    "random_mm_ratio": {"num_requests": 16, "input_len": 64, "output_len": 16, "seed": 7,
                        "range_ratio": 0.5, "prefix_len": 6, "base_items_per_request": 2,
                        "num_mm_items_range_ratio": 1.0,
                        "bucket_config": {(64, 96, 1): 0.2, (32, 32, 1): 0.5, (48, 200, 1): 0.3,
                                          (32, 32, 8): 0.0},
                        "limit_mm_per_prompt": {"image": 3, "video": 0}},
}


def main() -> None:
    from PIL import Image
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import RandomMultiModalDataset

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    for name, case in CASES.items():
        kwargs = dict(case)
        seed = int(kwargs.pop("seed"))  # type: ignore[call-overload]
        dataset = RandomMultiModalDataset(random_seed=seed)
        samples = dataset.sample(tokenizer=tokenizer, **kwargs)
        requests = []
        for s in samples:
            sizes = []
            for item in s.multi_modal_data or []:
                url = item["image_url"]["url"]
                image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                sizes.append([image.height, image.width])
            requests.append({"prompt_len": s.prompt_len, "expected_output_len": s.expected_output_len,
                             "images": sizes})
        after = dataset._rng.integers(0, 1 << 62)
        case_out = {k: ([[list(b), p] for b, p in v.items()] if k == "bucket_config" else v)
                    for k, v in case.items()}
        (OUT / f"{name}.json").write_text(json.dumps(
            {"case": case_out, "requests": requests, "next_draw": int(after), "vllm_version": "0.34.0"},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
