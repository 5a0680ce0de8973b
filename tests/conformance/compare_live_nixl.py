"""Fresh random prefill/decode (NixlConnector) scenarios through vLLM's oracle
and kvsched, compared live.

    nice -n 19 python tests/conformance/compare_live_nixl.py --seeds 0-199
    nice -n 19 python tests/conformance/compare_live_nixl.py --vllm-version 0.34 --seeds 96000-96499

Each scenario is random_scenarios.py's scenario for the seed (small caches
that preempt, chunked prefill, priorities, aborts) with vLLM's NixlConnector
on one side of a P/D pair, prefix caching on two times in three, async
scheduling one time in three, n-gram drafts one time in six:

- decode side (``kv_consumer``, sometimes ``kv_both``): most requests carry
  ``do_remote_prefill`` (reads of 1-4 batches, some failing, under either
  load-failure policy), some are plain; a copy of an earlier prompt with a
  longer tail gives local prefix hits that shorten the read;
- prefill side (``kv_producer``, sometimes ``kv_both``): most requests carry
  ``do_remote_decode``, usually with ``max_tokens`` 1 as a P/D proxy sends
  them, their blocks held for 1-4 batches after they finish;
- mixed (``kv_both``): requests of both kinds in one instance.

vLLM frees the requests of one output's ``finished_sending`` /
``finished_recving`` in set order (Python's string hash, random per
process); with prefix caching that order decides which cached blocks are
evicted first, so vLLM's own trace can change from run to run. kvsched frees
them in sorted order. A scenario that differs is rerun through vLLM under
``PYTHONHASHSEED`` 0..N-1 (``--hash-seeds``); one that some seed reproduces
is counted apart. Needs the reference environment (``bash ../shared/reference/setup.sh``);
prints the counts, exits 1 on any difference.

``--vllm-version 0.34`` runs the same scenarios through the 0.34 oracle
(vllm_0_34/oracle.py) and replays them as 0.34. 0.34's NIXL changes need
nothing new here: its P-side prompt truncation (now also of the block
hashes) happens only with a prefill backoff (Mamba, or a drafter reading
hidden states), and its skip check reads ``skip_reading_external_kv``
(prompt logprobs); scenarios have neither (docs/vllm_versions.md, §25).
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
from random_kv_connector import MAX_STEPS  # noqa: E402
from random_scenarios import parse_seeds, random_scenario  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths_of  # noqa: E402

from kvsched.vllm_versions import VLLM_VERSIONS  # noqa: E402


def _decode_request(rng: random.Random, r: dict[str, Any]) -> None:
    r["kv_transfer_params"] = {"do_remote_prefill": True}
    if rng.random() < 0.6:
        r["load_steps"] = rng.randint(1, 4)
    if rng.random() < 0.15:
        r["load_fail"] = True


def _prefill_request(rng: random.Random, r: dict[str, Any]) -> None:
    r["kv_transfer_params"] = {"do_remote_decode": True}
    if rng.random() < 0.7:
        r["max_tokens"] = 1
        r.pop("min_tokens", None)
    if rng.random() < 0.7:
        r["send_steps"] = rng.randint(1, 4)


def random_nixl_scenario(seed: int) -> dict[str, Any]:
    scenario: dict[str, Any] = random_scenario(seed)
    rng = random.Random(seed * 104729 + 7)
    side = rng.choice(["decode", "decode", "prefill", "prefill", "mixed"])
    if side == "decode":
        role = "kv_both" if rng.random() < 0.2 else "kv_consumer"
    elif side == "prefill":
        role = "kv_both" if rng.random() < 0.2 else "kv_producer"
    else:
        role = "kv_both"
    scenario["kv_connector"] = {"type": "nixl", "kv_role": role,
                                "load_failure_policy": rng.choice(["fail", "recompute"])}
    scenario["cache"]["enable_prefix_caching"] = rng.random() < 0.67
    if rng.random() < 0.35:
        scenario["async_scheduling"] = True
    elif rng.random() < 0.2:
        k = rng.randint(1, 3)
        threshold = scenario["scheduler"].get("long_prefill_token_threshold", 0)
        # A threshold below 1 + k fails vLLM 0.33's assertion on a padded
        # admission; a budget below it never admits a one-token request
        # (kvsched refuses both scenarios).
        if not 0 < threshold < 1 + k and scenario["scheduler"]["max_num_batched_tokens"] > k:
            scenario["speculative"] = {"num_speculative_tokens": k}
    requests = scenario["requests"]
    max_len = scenario["scheduler"]["max_model_len"]
    # A later request repeating an earlier prompt with a longer tail: a
    # local prefix hit (with prefix caching) next to the remote read.
    if len(requests) >= 2 and rng.random() < 0.5:
        src, dst = rng.sample(range(len(requests)), 2)
        prompt = list(requests[src]["prompt_token_ids"])
        prompt += [7 + i for i in range(rng.randint(1, 20))]
        # Only where the request still fits the cache as the longest did.
        longest = max(len(r["prompt_token_ids"]) + r["max_tokens"] for r in requests)
        if len(prompt) < max_len and len(prompt) + requests[dst]["max_tokens"] <= longest:
            requests[dst]["prompt_token_ids"] = prompt
    for r in requests:
        if rng.random() < 0.2:
            continue  # a plain request
        if side == "decode" or (side == "mixed" and rng.random() < 0.5):
            _decode_request(rng, r)
        else:
            _prefill_request(rng, r)
    scenario["max_steps"] = MAX_STEPS
    scenario.pop("description", None)
    return scenario


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0-99", help="seed range, e.g. 0-99 (default)")
    ap.add_argument("--keep", help="write the scenarios and vLLM's traces to this folder")
    ap.add_argument("--hash-seeds", type=int, default=8,
                    help="PYTHONHASHSEED values (0..N-1) to rerun vLLM with on a difference")
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
        paths = write_scenarios(tmp, "nixl_random", parse_seeds(args.seeds), random_nixl_scenario)
        if not oracle(tmp, 0):
            return 2
        outcome = compare_live(tmp, paths, oracle, range(args.hash_seeds), version)
        if outcome is None:
            return 2
    print(outcome.summary())
    return 1 if outcome.different else 0

if __name__ == "__main__":
    sys.exit(main())
