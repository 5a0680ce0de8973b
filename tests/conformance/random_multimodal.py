"""Random multimodal scenarios: requests with images, for the encoder path.

`random_multimodal_scenario(seed)` builds one scenario deterministically from
its seed. Each request's prompt is text with 0 to 4 images of 16 to 600
placeholder tokens at random offsets. Images come from a small pool per
scenario, so identifiers repeat across requests (one encoder output shared,
prefix-cache blocks shared when the prompts match up to there) and within a
request (a duplicate); some prompts copy another's prefix with its images. All
images use the one placeholder token id, as real models do: only the
identifiers in the block hashes keep two images' blocks apart. Some images
have an `is_embed` mask (break tokens without an embedding). The scheduler
draws small to large token budgets, encoder budgets and encoder cache sizes
(`scheduler.max_num_encoder_input_tokens`, `scheduler.encoder_cache_size`;
vLLM raises each to the largest item), `disable_chunked_mm_input`, chunked
prefill on or off, long-prefill thresholds, fcfs or priority, prefix caching
on or off, tight to roomy KV caches (preemptions), async scheduling and
n-gram speculative decoding, arrivals and aborts; and in about a third of
them the scripted KV connector (external hits loaded synchronously or
asynchronously, failures, delayed frees: random_kv_connector.py's scripts).

Usage:
    python tests/conformance/random_multimodal.py OUTDIR --seeds 0-39

The committed corpus (tests/conformance/multimodal_random/) is seeds
MM_CORPUS_SEEDS with their 0.34 (and 0.33) goldens; changing this generator
changes those scenarios, so regenerate the goldens with it
(tests/conformance/compare_live_multimodal.py --write).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_kv_connector import POLICIES, ROLES, _fit_drafts_alone, _script_loads  # noqa: E402
from random_scenarios import parse_seeds  # noqa: E402

MM_CORPUS_SEEDS = "0-39"
MM_MAX_STEPS = 5000
FILE_PREFIX = "random_mm_"
# The placeholder token of every image (a real model's image token id).
IMAGE_TOKEN = 7
MAX_MODEL_LEN = 4096
BLOCK_SIZES = [4, 8, 16, 32]
BUDGETS = [64, 128, 256, 512, 1024, 2048]
# Scenarios with the scripted KV connector (drawn from a generator of their
# own, so the others are as they were before connectors were added).
KV_CONNECTOR_SHARE = 0.3
ENCODER_SIZES = [None, None, 16, 64, 128, 300, 600, 1200]


def _image_pool(rng: random.Random, max_len: int) -> list[dict[str, Any]]:
    """The scenario's images: identifier, placeholder length, maybe a mask."""
    pool = []
    for i in range(rng.randint(1, 6)):
        length = rng.randint(16, max_len)
        image: dict[str, Any] = {"identifier": f"img{i}", "length": length}
        if rng.random() < 0.2:
            # Break tokens: no embedding at the first position and every so often.
            every = rng.randint(3, 12)
            image["is_embed"] = [j % every != 0 for j in range(length)]
        pool.append(image)
    return pool


def _num_embeds(item: dict[str, Any]) -> int:
    mask = item.get("is_embed")
    return item["length"] if mask is None else sum(mask)


def _text(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(10, 14) for _ in range(n)]


def _prompt(rng: random.Random, pool: list[dict[str, Any]], limit: int
            ) -> tuple[list[int], list[dict[str, Any]]]:
    """A prompt of at most ``limit`` tokens: text with 0 to 4 images."""
    # Sometimes an image first: a waiting request whose first item cannot
    # be encoded then has nothing to schedule and is passed over.
    tokens: list[int] = _text(rng, rng.choice([0, rng.randint(1, 40)]))
    items: list[dict[str, Any]] = []
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4])):
        image = rng.choice(pool)
        if len(tokens) + image["length"] + 1 > limit:
            break
        item = {"identifier": image["identifier"], "offset": len(tokens), "length": image["length"]}
        if "is_embed" in image:
            item["is_embed"] = image["is_embed"]
        items.append(item)
        tokens += [IMAGE_TOKEN] * image["length"]
        if rng.random() < 0.8:
            tokens += _text(rng, rng.randint(1, 30))
    if not tokens or (len(tokens) < limit and rng.random() < 0.7):
        tokens += _text(rng, rng.randint(1, min(60, limit - len(tokens))))
    return tokens, items


def _copy_prefix(rng: random.Random, base: dict[str, Any]) -> tuple[list[int], list[dict[str, Any]]]:
    """Another request's prompt up to a random point (its images there
    included, one cut in the middle kept as cut), then new text."""
    prompt = base["prompt_token_ids"]
    cut = rng.randint(1, len(prompt))
    items = [dict(item) for item in base.get("mm_items", ()) if item["offset"] + item["length"] <= cut]
    tokens = prompt[:cut]
    if rng.random() < 0.7:
        tokens = tokens + _text(rng, rng.randint(1, 30))
    return tokens, items


def random_multimodal_scenario(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    budget = rng.choice(BUDGETS)
    chunked = rng.random() < 0.85
    max_model_len = MAX_MODEL_LEN if chunked else budget
    disable_chunked_mm = rng.random() < 0.3
    # An item must fit one step when chunked mm input is off (vLLM refuses
    # to start otherwise), and a prompt the model length.
    max_image = min(600, max_model_len // 2)
    if disable_chunked_mm:
        max_image = min(max_image, budget)
    block_size = rng.choice(BLOCK_SIZES)
    use_async = rng.random() < 0.3
    scheduler: dict[str, Any] = {
        "max_num_batched_tokens": budget,
        "max_num_seqs": rng.choice([1, 2, 3, 4, 6, 8, 16]),
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "policy": rng.choice(["fcfs", "fcfs", "priority"]),
    }
    pool = _image_pool(rng, max_image)
    if chunked and rng.random() < 0.25:
        threshold = rng.choice([16, 32, 100, 300])
        # With chunked mm input off, a threshold below an item would hold
        # that item back for ever (a vLLM livelock, not a useful scenario).
        if not disable_chunked_mm or threshold >= max(image["length"] for image in pool):
            scheduler["long_prefill_token_threshold"] = threshold
    largest = max(image["length"] for image in pool)
    for key in ("max_num_encoder_input_tokens", "encoder_cache_size"):
        # Mostly near the largest item (vLLM's floor): one or two items per
        # step or in the cache, so the budget and the cache both bind.
        size = rng.choice(ENCODER_SIZES + [int(largest * f) for f in (1, 1, 1.3, 1.7, 2.2, 3)])
        if size is not None:
            scheduler[key] = size
    if disable_chunked_mm:
        scheduler["disable_chunked_mm_input"] = True
    requests: list[dict[str, Any]] = []
    max_tokens_cap = rng.choice([4, 16, 40])
    for i in range(rng.randint(1, 8)):
        limit = max_model_len - max_tokens_cap - 1
        if requests and rng.random() < 0.35:
            tokens, items = _copy_prefix(rng, rng.choice(requests))
        else:
            tokens, items = _prompt(rng, pool, limit)
        tokens = tokens[:limit]
        items = [it for it in items if it["offset"] + it["length"] <= len(tokens)]
        req: dict[str, Any] = {
            "request_id": f"r{i}",
            "prompt_token_ids": tokens,
            "max_tokens": rng.randint(1, max_tokens_cap),
            "arrival_step": rng.choice([0, 0, 0, rng.randint(0, 30)]),
        }
        if items:
            req["mm_items"] = items
        if scheduler["policy"] == "priority":
            req["priority"] = rng.randint(0, 3)
            req["arrival_time"] = req["arrival_step"] + i * 1e-3
        if rng.random() < 0.2:
            req["eos_token_id"] = 2
            req["sampled_token_ids"] = [rng.choice([100, 100, 100, 2]) for _ in range(req["max_tokens"])]
        requests.append(req)
    if not chunked:
        # A prompt goes in whole: the encoder must take all its items in one
        # step, or vLLM 0.34 passes the request over for ever.
        most = max(sum({m["identifier"]: _num_embeds(m) for m in r.get("mm_items", ())}.values())
                   for r in requests)
        for key in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            if key in scheduler:
                scheduler[key] = max(scheduler[key], most)
    need = max(-(-(len(r["prompt_token_ids"]) + r["max_tokens"]) // block_size) for r in requests)
    total = sum(-(-(len(r["prompt_token_ids"]) + r["max_tokens"]) // block_size) for r in requests)
    # Tight (preemptions) to roomy; every request fits alone.
    num_blocks = rng.choice([need + 1, need + 2, (need + total) // 2 + 1, total + 2])
    scenario: dict[str, Any] = {
        "description": f"random multimodal scenario, seed {seed}",
        "scheduler": scheduler,
        "cache": {"block_size": block_size, "num_gpu_blocks": num_blocks,
                  "enable_prefix_caching": rng.random() < 0.7},
        "requests": requests,
        "max_steps": MM_MAX_STEPS,
    }
    if use_async:
        scenario["async_scheduling"] = True
    if rng.random() < 0.15:
        scenario["speculative"] = {"num_speculative_tokens": rng.randint(1, 3),
                                   "method": "ngram_gpu" if use_async else "ngram"}
    if rng.random() < 0.25:
        victim = rng.choice(requests)
        scenario["aborts"] = [{"step": victim["arrival_step"] + rng.randint(0, 6),
                               "request_ids": [victim["request_id"]]}]
    _add_kv_connector(random.Random(f"random_multimodal:kv:{seed}"), scenario)
    return scenario


def _add_kv_connector(rng: random.Random, scenario: dict[str, Any]) -> None:
    """Sometimes the scripted KV connector (random_kv_connector.py's scripts:
    every role, both failure policies, sync and async loads, failures,
    delayed frees), with the same one-request limits for the failures under
    `fail` and for delayed frees (its HASH_ORDER_NOTE)."""
    if rng.random() >= KV_CONNECTOR_SHARE:
        return
    block_size = scenario["cache"]["block_size"]
    _fit_drafts_alone(scenario, block_size)
    policy = rng.choice(POLICIES)
    scenario["kv_connector"] = {"type": "scripted", "kv_role": rng.choice(ROLES),
                                "load_failure_policy": policy,
                                "pending_block_frees": rng.random() < 0.3}
    failing = None
    for r in scenario["requests"]:
        n = len(r["prompt_token_ids"])
        if n >= 2 and rng.random() < 0.6:
            may_fail = policy == "recompute" or failing in (None, r["request_id"])
            _script_loads(rng, r, n, block_size, 0.3 if may_fail else 0.0)
            if isinstance(r.get("load_fail"), list) and any(f is not None for f in r["load_fail"]):
                failing = r["request_id"]
        if rng.random() < 0.3 and not any("send_steps" in q for q in scenario["requests"]):
            r["send_steps"] = rng.randint(1, 3)


def scenario_path(outdir: Path, seed: int) -> Path:
    return outdir / f"{FILE_PREFIX}{seed}.json"


def write_multimodal_scenarios(outdir: Path, seeds: list[int]) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = scenario_path(outdir, seed)
        path.write_text(json.dumps(random_multimodal_scenario(seed), separators=(",", ":")) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Write {FILE_PREFIX}SEED.json scenarios.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--seeds", default=MM_CORPUS_SEEDS, help=f"e.g. 0-39 (default {MM_CORPUS_SEEDS})")
    args = parser.parse_args(argv)
    paths = write_multimodal_scenarios(args.outdir, parse_seeds(args.seeds))
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
