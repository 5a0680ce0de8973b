"""Random scenarios with hybrid KV cache groups (cache.kv_groups).

`random_hybrid_scenario(seed)` builds one scenario deterministically from its seed:
the scheduler, requests (shared prefixes, identical prompts, stops), arrivals and
aborts of random_scenarios.py's building blocks, with a KV cache of several groups
sharing one pool, the layout chosen by `seed % len(LAYOUTS)`:

    swa                one sliding-window group (vLLM's unitary coordinator)
    chunked            one chunked-local-attention group
    full_swa           full attention + sliding window (the "simple hybrid")
    full_swa_swa       full + two sliding-window groups of one spec (one lookup bucket)
    full_swa2          full + two sliding windows of different sizes (the fixed point)
    full_chunked       full attention + chunked local attention
    swa_chunked        sliding window + chunked local, no full attention
    full_swa_sizes     full and sliding window of different block sizes
    full_mamba         full attention + Mamba state (prefix caching on: mode "align",
                       with its block-aligned prefill split; off: mode "none")
    mamba              Mamba state alone
    full_swa_mamba     full attention + sliding window + Mamba state

plus prefix_cache_retention_interval (vLLM's default 0, dense null, or a multiple of
the scheduler block), the pool size (tight to roomy), async scheduling (40%),
without a Mamba group ngram speculative decoding with scripted drafts (30%), and
with one a prefill checkpoint block on the Mamba groups (CHECKPOINT_SHARE; vLLM's
MambaMixer2 alignment 1, FlashInfer GDN's the block size, or a divisor of it), each
drawn from a stream of its own.

Usage:
    python tests/conformance/random_hybrid.py OUTDIR --seeds 0-39

`hybrid_multimodal_scenario(seed)` is random_multimodal.py's scenario with a
second group beside its full attention (the encoder path and the groups together).

The checked-in corpora (tests/conformance/hybrid/random/, seeds
HYBRID_CORPUS_SEEDS; hybrid/multimodal/, the finished ones of
HYBRID_MM_CORPUS_SEEDS) have vLLM 0.34's and 0.33's goldens (compare_live_hybrid.py
--write-corpus [--multimodal] rewrites them); live checks use seeds from
LIVE_SEEDS_FROM.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_features import _fit_budget_and_threshold, _script_drafts  # noqa: E402
from random_scenarios import (  # noqa: E402
    Request,
    Scenario,
    _break_priority_ties,
    _random_aborts,
    _random_requests,
    _random_scheduler,
    format_scenario,
    parse_seeds,
)

HYBRID_CORPUS_SEEDS = "0-39"
LIVE_SEEDS_FROM = 300000
HYBRID_MAX_STEPS = 5000
FILE_PREFIX = "random_hybrid_"
MM_FILE_PREFIX = "random_hybrid_mm_"
# hybrid_multimodal_scenario's corpus (hybrid/multimodal/): the seeds whose
# base scenario has no KV connector and that vLLM finishes.
HYBRID_MM_CORPUS_SEEDS = "0-39"
LAYOUTS = ("swa", "chunked", "full_swa", "full_swa_swa", "full_swa2", "full_chunked",
           "swa_chunked", "full_swa_sizes", "full_mamba", "mamba", "full_swa_mamba")
BLOCK_SIZES = [1, 2, 4, 8, 16]
ASYNC_SHARE = 0.4
SPEC_SHARE = 0.3
# Mamba layouts whose Mamba groups keep a prefill checkpoint block (vLLM's
# MambaMixer2 and FlashInfer GDN layers do).
CHECKPOINT_SHARE = 0.5
# Models' context lengths this small keep the traces short.
MAX_MODEL_LENS = [64, 128, 256, 512]


def layout_of(seed: int, multimodal: bool = False) -> str:
    if multimodal:
        scenario = hybrid_multimodal_scenario(seed)
        return "mm_" + (scenario["cache"]["kv_groups"][1]["kind"] if scenario else "none")
    return LAYOUTS[seed % len(LAYOUTS)]


def hybrid_scenario_path(outdir: Path, seed: int, multimodal: bool = False) -> Path:
    return outdir / f"{MM_FILE_PREFIX if multimodal else FILE_PREFIX}{seed}.json"


def _window(rng: random.Random, block_size: int) -> int:
    return rng.choice([2, 3, block_size, block_size + 1, 2 * block_size, 3 * block_size - 1,
                       4 * block_size, rng.randint(2, 64)])


def _chunk(rng: random.Random, block_size: int) -> int:
    return rng.choice([block_size, 2 * block_size, 4 * block_size, 8 * block_size,
                       rng.randint(1, 64)])


def _groups(rng: random.Random, layout: str, bs: int) -> list[dict[str, Any]]:
    full = {"kind": "full_attention", "block_size": bs}

    def swa(size: int = bs) -> dict[str, Any]:
        return {"kind": "sliding_window", "block_size": size, "sliding_window": _window(rng, size)}

    def chunked() -> dict[str, Any]:
        return {"kind": "chunked_local_attention", "block_size": bs,
                "attention_chunk_size": _chunk(rng, bs)}

    mamba = {"kind": "mamba", "block_size": bs}
    if layout == "swa":
        return [swa()]
    if layout == "chunked":
        return [chunked()]
    if layout == "full_swa":
        groups = [full, swa()]
        return groups if rng.random() < 0.7 else groups[::-1]
    if layout == "full_swa_swa":
        one = swa()
        return [full, one, dict(one)]
    if layout == "full_swa2":
        return [full, swa(), swa()]
    if layout == "full_chunked":
        return [full, chunked()]
    if layout == "swa_chunked":
        return [swa(), chunked()]
    if layout == "full_swa_sizes":
        if rng.random() < 0.5:
            return [{"kind": "full_attention", "block_size": 2 * bs}, swa()]
        return [full, swa(2 * bs)]
    if layout == "full_mamba":
        return [full, mamba] if rng.random() < 0.7 else [mamba, full]
    if layout == "full_swa_mamba":
        return [full, swa(), mamba]
    assert layout == "mamba", layout
    return [mamba]


def _draw_checkpoint(rng: random.Random, groups: list[dict[str, Any]]) -> None:
    """Give the Mamba groups vLLM's prefill checkpoint block (CHECKPOINT_SHARE
    of the draws): alignment 1 (MambaMixer2), the block size (FlashInfer
    GDN's prefix grid) or a divisor of it (the backend's own stride, which
    vLLM's planning keeps the block a multiple of)."""
    if rng.random() >= CHECKPOINT_SHARE:
        return
    for g in groups:
        if g["kind"] != "mamba":
            continue
        bs = g["block_size"]
        divisors = [d for d in range(2, bs) if bs % d == 0]
        g["num_prefill_checkpoint_blocks"] = 1
        g["prefill_checkpoint_alignment"] = rng.choice([1, bs, bs, *divisors[-2:]])


def _blocks_needed(req: Request, max_model_len: int, groups: list[dict[str, Any]],
                   in_flight: int | None = None, lookahead: int = 0) -> int:
    """A whole table in every group: what one request can hold at most; with
    ``in_flight`` (the token budget) windowed groups count only their
    admission cap (the least that still admits the request alone)."""
    # ``lookahead``: draft slots a request may hold past its last output.
    tokens = min(len(req["prompt_token_ids"]) + int(req["max_tokens"]) + lookahead, max_model_len)
    total = 0
    for g in groups:
        bs = g["block_size"]
        need = math.ceil(tokens / bs)
        if in_flight is not None and g["kind"] == "sliding_window":
            need = min(need, math.ceil(min(g["sliding_window"] - 1 + in_flight, max_model_len) / bs) + 1)
        elif in_flight is not None and g["kind"] == "chunked_local_attention":
            need = min(need, math.ceil(min(g["attention_chunk_size"] + in_flight, max_model_len) / bs))
        total += need
    return total


def random_hybrid_scenario(seed: int) -> Scenario:
    rng = random.Random(f"random_hybrid:{seed}")
    layout = layout_of(seed)
    scheduler = _random_scheduler(rng)
    scheduler["max_model_len"] = rng.choice(MAX_MODEL_LENS)
    if not scheduler["enable_chunked_prefill"]:
        scheduler["max_num_batched_tokens"] = max(scheduler["max_num_batched_tokens"],
                                                  scheduler["max_model_len"])
    bs = rng.choice(BLOCK_SIZES)
    groups = _groups(rng, layout, bs)
    scheduler_block = math.lcm(*(g["block_size"] for g in groups))
    requests = _random_requests(rng, scheduler, scheduler_block)
    # Mamba with prefix caching is vLLM's "align" mode (block-aligned chunks).
    caching = rng.random() < 0.8
    if not caching and "mamba" in layout and random.Random(f"random_hybrid:mamba:{seed}").random() < 0.5:
        # vLLM's Mamba block without prefix caching: one state block of
        # max_model_len tokens per request; the scheduler block is the LCM.
        for g in groups:
            if g["kind"] == "mamba":
                g["block_size"] = scheduler["max_model_len"]
        scheduler_block = math.lcm(*(g["block_size"] for g in groups))
    if "mamba" in layout:
        _draw_checkpoint(random.Random(f"random_hybrid:checkpoint:{seed}"), groups)
    # vLLM's async scheduling (its engine's default), from a stream of its
    # own so that a seed's scenario is otherwise the same with and without.
    use_async = random.Random(f"random_hybrid:async:{seed}").random() < ASYNC_SHARE
    # ngram speculative decoding (no drafter model: no lookahead slots), from
    # a stream of its own; not beside Mamba (its speculative state blocks).
    spec_rng = random.Random(f"random_hybrid:spec:{seed}")
    spec_k = spec_rng.randint(1, 4) if "mamba" not in layout and spec_rng.random() < SPEC_SHARE else 0
    if spec_k:
        _fit_budget_and_threshold(spec_rng, scheduler, spec_k)
        for req in requests:
            _script_drafts(spec_rng, req, spec_k, use_async)
    lookahead = spec_k * (2 if use_async else 1)
    needs = [_blocks_needed(r, scheduler["max_model_len"], groups, lookahead=lookahead) for r in requests]
    # vLLM's max_in_flight_tokens: a token budget per batch in flight.
    in_flight = scheduler["max_num_batched_tokens"] * (2 if use_async else 1)
    kind = rng.choices(["tighter", "tight", "medium", "roomy"], [3, 3, 2, 2])[0]
    if kind == "tighter" and "mamba" not in layout:
        capped = [_blocks_needed(r, scheduler["max_model_len"], groups, in_flight, lookahead)
                  for r in requests]
        num_blocks = max(capped) + 1 + rng.randint(0, 2)
    elif kind in ("tight", "tighter"):
        num_blocks = max(needs) + 1 + rng.randint(0, 2)
    elif kind == "medium":
        num_blocks = max(needs) + 1 + rng.randint(0, max(1, sum(needs) // 2))
    else:
        num_blocks = sum(needs) + 1 + rng.randint(0, 32)
    if scheduler["policy"] == "priority" and sum(needs) > num_blocks - 1:
        _break_priority_ties(requests)
    cache: dict[str, Any] = {"block_size": scheduler_block, "num_gpu_blocks": num_blocks,
                             "enable_prefix_caching": caching, "kv_groups": groups}
    if any(g["kind"] in ("sliding_window", "mamba") for g in groups):
        draw = rng.random()
        if draw < 0.25:
            cache["prefix_cache_retention_interval"] = None
        elif draw < 0.4:
            cache["prefix_cache_retention_interval"] = scheduler_block * rng.randint(1, 4)
    scenario: Scenario = {
        "description": f"Random hybrid KV cache scenario from seed {seed}, layout {layout} "
                       "(tests/conformance/random_hybrid.py).",
        "scheduler": scheduler,
        "cache": cache,
        "requests": requests,
    }
    aborts = _random_aborts(rng, requests)
    if aborts:
        scenario["aborts"] = aborts
    if use_async:
        scenario["async_scheduling"] = True
    if spec_k:
        scenario["speculative"] = {"num_speculative_tokens": spec_k,
                                   "method": "ngram_gpu" if use_async else "ngram"}
    scenario["max_steps"] = HYBRID_MAX_STEPS
    return scenario


def hybrid_multimodal_scenario(seed: int) -> Scenario | None:
    """random_multimodal.py's scenario for ``seed`` with a second KV cache group
    beside its full attention (sliding window, chunked local attention or
    Mamba, of its block size) and twice its blocks; None for a seed whose
    scenario has a KV connector (refused with kv_groups). Mamba is not drawn
    beside speculative decoding (refused too)."""
    from random_multimodal import random_multimodal_scenario

    scenario = random_multimodal_scenario(seed)
    if "kv_connector" in scenario:
        return None
    rng = random.Random(f"random_hybrid:mm:{seed}")
    cache = scenario["cache"]
    bs = cache.get("block_size", 16)
    kinds = ["sliding_window", "chunked_local_attention"]
    if "speculative" not in scenario:
        kinds.append("mamba")
    kind = rng.choice(kinds)
    second: dict[str, Any] = {"kind": kind, "block_size": bs}
    if kind == "sliding_window":
        second["sliding_window"] = _window(rng, bs)
    elif kind == "chunked_local_attention":
        second["attention_chunk_size"] = _chunk(rng, bs)
    cache["kv_groups"] = [{"kind": "full_attention", "block_size": bs}, second]
    cache["num_gpu_blocks"] *= 2
    scenario["description"] = (f"random_multimodal.py's seed {seed} with a {kind} group beside full "
                               "attention (tests/conformance/random_hybrid.py).")
    return scenario


def write_hybrid_scenarios(outdir: Path, seeds: list[int], multimodal: bool = False) -> list[Path]:
    """The scenarios of ``seeds`` as OUTDIR/PREFIX_SEED.json (multimodal: those
    hybrid_multimodal_scenario gives, as MM_FILE_PREFIX_SEED.json)."""
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        scenario = hybrid_multimodal_scenario(seed) if multimodal else random_hybrid_scenario(seed)
        if scenario is None:
            continue
        path = hybrid_scenario_path(outdir, seed, multimodal)
        path.write_text(format_scenario(scenario))
        paths.append(path)
    return paths


def seed_of(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--seeds", default=HYBRID_CORPUS_SEEDS)
    args = ap.parse_args(argv)
    paths = write_hybrid_scenarios(Path(args.outdir), parse_seeds(args.seeds))
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
