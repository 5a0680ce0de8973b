"""Fresh random CPU-offloading scenarios through vLLM's oracle and kvsched,
compared live.

    python tests/conformance/compare_live_offload.py --seeds 0-199

Each scenario is random_scenarios.py's scenario for the seed (one seed in
four: random_features.py's, with async scheduling, n-gram speculative
decoding or the LoRA cap) plus vLLM's
OffloadingConnector (SCENARIO_FORMAT.md, "`offloading`"): a CPU cache of 1
to 64 chunks of 1 to 4 GPU blocks, LRU or ARC eviction, stores and
asynchronous loads of 1-3 batches, sometimes a store threshold or a
synchronous-load budget, async scheduling one time in three. To make CPU
hits likely, about half the requests start with (part of) an earlier
request's prompt; a few carry ``max_load_tokens`` / ``max_offload_tokens``.
Scenarios vLLM never finishes are compared up to ``max_steps`` (both must
stop there).

vLLM walks the requests that finished in a step in its set's hash order,
which Python draws per process (``PYTHONHASHSEED``), and the order moves the
CPU cache's recency (which chunk is evicted later); kvsched takes them in
sorted order. The oracle runs with ``PYTHONHASHSEED=0``; a scenario that
differs is rerun under hash seeds 1 to 4 and counted apart when one of
those traces is identical. Needs the reference environment (``bash
../shared/reference/setup.sh``); prints the counts, exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_kv import compare_live, run_oracle, write_scenarios  # noqa: E402
from random_features import random_feature_scenario  # noqa: E402
from random_kv_connector import MAX_STEPS  # noqa: E402
from random_scenarios import parse_seeds, random_scenario  # noqa: E402
from regenerate import ReferenceMissing, reference_paths  # noqa: E402

# The hash seeds a differing scenario is rerun under.
OTHER_HASH_SEEDS = range(1, 5)


def offload_connector(rng: random.Random, block_size: int, kv_role: str) -> dict[str, Any]:
    """A random OffloadingConnector (the scenario's ``kv_connector`` or a
    MultiConnector's child)."""
    kvc: dict[str, Any] = {
        "type": "offloading", "kv_role": kv_role,
        "num_cpu_blocks": rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]),
        "block_size_factor": rng.choice([1, 1, 1, 2, 3, 4]),
        "load_steps": rng.randint(1, 3), "store_steps": rng.randint(1, 3),
        "eviction_policy": rng.choice(["lru", "arc"])}
    if rng.random() < 0.2:
        kvc["store_threshold"] = rng.choice([2, 3])
    if rng.random() < 0.3:
        kvc["sync_load_budget_tokens"] = rng.choice([block_size, 4 * block_size, 64, 256])
    return kvc


def share_prompt_prefixes(rng: random.Random, requests: list[dict[str, Any]], block_size: int) -> None:
    """About half the requests start with (part of) an earlier one's prompt,
    so that the CPU cache has hits; a few carry ``max_load_tokens`` /
    ``max_offload_tokens`` (beside any transfer parameters they have)."""
    for i, r in enumerate(requests):
        prompt = r["prompt_token_ids"]
        if i and rng.random() < 0.5:
            donor = requests[rng.randrange(i)]["prompt_token_ids"]
            k = min(len(prompt), len(donor))
            if rng.random() < 0.5:
                k = rng.randint(0, k)
            prompt[:k] = donor[:k]
        if rng.random() < 0.1:
            key = rng.choice(["max_load_tokens", "max_offload_tokens"])
            r.setdefault("kv_transfer_params", {})[key] = rng.choice([0, block_size, 3 * block_size, 100])


def random_offload_scenario(seed: int) -> dict[str, Any]:
    scenario: dict[str, Any] = random_feature_scenario(seed) if seed % 4 == 3 else random_scenario(seed)
    rng = random.Random(seed * 7919 + 5)
    block_size = int(scenario["cache"].get("block_size", 16))
    role = rng.choice(["kv_both", "kv_producer", "kv_consumer"])
    scenario["kv_connector"] = offload_connector(rng, block_size, role)
    if rng.random() < 0.35 and "speculative" not in scenario:
        scenario["async_scheduling"] = True
    share_prompt_prefixes(rng, scenario["requests"], block_size)
    scenario["max_steps"] = MAX_STEPS
    scenario.pop("description", None)
    return scenario


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0-199", help="seed range, e.g. 0-199 (default)")
    ap.add_argument("--keep", help="also write the scenarios and vLLM's traces to this folder")
    args = ap.parse_args(argv)
    try:
        reference_paths()
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.keep) if args.keep else Path(tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        paths = write_scenarios(tmp, "offload_random", parse_seeds(args.seeds), random_offload_scenario)
        if not run_oracle(tmp):
            return 2
        outcome = compare_live(tmp, paths, run_oracle, OTHER_HASH_SEEDS)
        if outcome is None:
            return 2
    print(outcome.summary())
    return 1 if outcome.different else 0

if __name__ == "__main__":
    sys.exit(main())
