"""Fresh random CPU-offloading scenarios through vLLM's oracle and kvsched,
compared live.

    python tests/conformance/compare_live_offload.py --seeds 0-199
    python tests/conformance/compare_live_offload.py --vllm-version 0.34 --seeds 96000-96499

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

With ``--vllm-version 0.34`` the scenarios go through the 0.34 oracle
(vllm_0_34/oracle.py) and kvsched replays them as 0.34; the generator then
adds what only 0.34 can run or decide differently (:func:`add_034_offload_keys`):
scripted failed transfers (requests' ``offload_load_fail``, the connector's
``store_fail``) under either load-failure policy, and a store threshold more
often (0.34 counts each key once per request). The base scenario of a seed is
the same for both releases.

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
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths_of  # noqa: E402

from kvsched.vllm_versions import VLLM_VERSIONS, rules_for  # noqa: E402

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


def add_034_offload_keys(seed: int, scenario: dict[str, Any], kvc: dict[str, Any]) -> None:
    """What only vLLM 0.34 runs, or decides differently, for the offloading
    connector ``kvc`` (the scenario's or its MultiConnector's child), from
    its own random stream (the rest of the scenario stays the seed's):

    - failed asynchronous loads: a request's ``offload_load_fail`` (every
      load, or only its second one); under the ``fail`` policy one request
      at most, since vLLM finishes a step's failed requests in set order
      (hash order, per process), which would move the free queue;
    - failed stores: ``store_fail``, a few store job ids;
    - a store threshold more often: 0.34 counts a chunk once per request,
      so a request offering it again (no room, or after a preemption) no
      longer reaches the threshold by itself."""
    rng = random.Random(seed * 6151 + 34)
    conf = scenario["kv_connector"]
    if "load_failure_policy" not in conf:
        conf["load_failure_policy"] = rng.choice(["fail", "recompute"])
    policy = conf["load_failure_policy"]
    requests = scenario["requests"]
    # The requests that can hit the CPU tier: their first block repeats an
    # earlier prompt's (share_prompt_prefixes).
    block_size = int(scenario["cache"].get("block_size", 16))
    heads: set[tuple[int, ...]] = set()
    sharing = []
    for r in requests:
        head = tuple(r["prompt_token_ids"][:block_size])
        if len(head) == block_size and head in heads:
            sharing.append(r)
        heads.add(head)
    if sharing and rng.random() < 0.6:
        if policy == "fail":
            chosen = [rng.choice(sharing)]
        else:
            chosen = [r for r in sharing if rng.random() < 0.5]
        for r in chosen:
            r["offload_load_fail"] = True if rng.random() < 0.7 else [False, True]
    if rng.random() < 0.35:
        kvc["store_fail"] = sorted(rng.sample(range(40), rng.randint(1, 4)))
    if "store_threshold" not in kvc and rng.random() < 0.3:
        kvc["store_threshold"] = rng.choice([2, 3])


def random_offload_scenario(seed: int, vllm_version: str = SHARED_REFERENCE_VERSION) -> dict[str, Any]:
    scenario: dict[str, Any] = random_feature_scenario(seed) if seed % 4 == 3 else random_scenario(seed)
    rng = random.Random(seed * 7919 + 5)
    block_size = int(scenario["cache"].get("block_size", 16))
    role = rng.choice(["kv_both", "kv_producer", "kv_consumer"])
    scenario["kv_connector"] = offload_connector(rng, block_size, role)
    if rng.random() < 0.35 and "speculative" not in scenario:
        scenario["async_scheduling"] = True
    share_prompt_prefixes(rng, scenario["requests"], block_size)
    if rules_for(vllm_version).offload_transfer_failures:
        add_034_offload_keys(seed, scenario, scenario["kv_connector"])
    scenario["max_steps"] = MAX_STEPS
    scenario.pop("description", None)
    return scenario


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0-199", help="seed range, e.g. 0-199 (default)")
    ap.add_argument("--keep", help="also write the scenarios and vLLM's traces to this folder")
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=SHARED_REFERENCE_VERSION,
                    help="the release to compare with (0.34: tests/conformance/vllm_0_34/setup.sh's "
                         "environment)")
    args = ap.parse_args(argv)
    version = args.vllm_version
    try:
        reference_paths_of(version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2

    def oracle(folder: Path, hash_seed: int) -> bool:
        return run_oracle(folder, hash_seed, version)

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.keep) if args.keep else Path(tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        paths = write_scenarios(tmp, "offload_random", parse_seeds(args.seeds),
                                lambda seed: random_offload_scenario(seed, version))
        if not oracle(tmp, 0):
            return 2
        outcome = compare_live(tmp, paths, oracle, OTHER_HASH_SEEDS, version)
        if outcome is None:
            return 2
    print(outcome.summary())
    return 1 if outcome.different else 0

if __name__ == "__main__":
    sys.exit(main())
