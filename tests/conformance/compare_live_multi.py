"""Fresh random MultiConnector (NIXL + CPU offloading) scenarios through
vLLM's oracle and kvsched, compared live; also writes the committed corpus
kv_connector_multi/.

    nice -n 19 python tests/conformance/compare_live_multi.py --seeds 1000-1099
    python tests/conformance/compare_live_multi.py --write-corpus   # rewrite kv_connector_multi/

Each scenario is compare_live_nixl.py's for the seed (one side of a P/D
pair: decode, prefill or mixed; small caches that preempt, prefix caching
two times in three, async scheduling one time in three, n-gram drafts
sometimes) with vLLM's MultiConnector of that NixlConnector and an
OffloadingConnector (a CPU cache of 1 to 64 chunks of 1 to 4 GPU blocks,
LRU or ARC, stores and loads of 1-3 batches, sometimes a store threshold or
a synchronous-load budget), in either order: the first child with a hit
loads. About half the requests start with (part of) an earlier request's
prompt, so that the CPU tier has hits; a few carry ``max_load_tokens`` /
``max_offload_tokens`` next to their NIXL parameters.

The oracle has no MultiConnector key: multi_oracle.py (run in the
reference environment) reuses its replay with vLLM's real MultiConnector
built by vLLM's factory. As for the NIXL and offloading drivers, vLLM frees
the requests of one output in set order (Python's string hash, per
process); a scenario that differs is rerun under PYTHONHASHSEED 1..N-1 and
one that some seed reproduces is counted apart. Needs the reference
environment (``bash ../shared/reference/setup.sh``); prints the counts,
exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_kv import compare, crashed  # noqa: E402
from compare_live_nixl import random_nixl_scenario  # noqa: E402
from random_kv_connector import gzip_trace  # noqa: E402
from random_scenarios import format_scenario, parse_seeds  # noqa: E402
from regenerate import ReferenceMissing, reference_paths  # noqa: E402

CORPUS = HERE / "kv_connector_multi"
FILE_PREFIX = "multi_random_"
# The committed corpus' seeds (those that differ only under another hash
# seed are left out of it: no golden can pin them).
MULTI_CORPUS_SEEDS = "0-29"
ORACLE = HERE / "multi_oracle.py"


def random_multi_scenario(seed: int) -> dict[str, Any]:
    scenario = random_nixl_scenario(seed)
    rng = random.Random(seed * 15485863 + 11)
    nixl = dict(scenario["kv_connector"])
    policy = nixl.pop("load_failure_policy")
    block_size = int(scenario["cache"].get("block_size", 16))
    offload: dict[str, Any] = {
        "type": "offloading", "kv_role": "kv_both",
        "num_cpu_blocks": rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]),
        "block_size_factor": rng.choice([1, 1, 1, 2, 3, 4]),
        "load_steps": rng.randint(1, 3), "store_steps": rng.randint(1, 3),
        "eviction_policy": rng.choice(["lru", "arc"])}
    if rng.random() < 0.2:
        offload["store_threshold"] = rng.choice([2, 3])
    if rng.random() < 0.3:
        offload["sync_load_budget_tokens"] = rng.choice([block_size, 4 * block_size, 64, 256])
    children = [nixl, offload] if rng.random() < 0.5 else [offload, nixl]
    scenario["kv_connector"] = {"type": "multi", "kv_role": rng.choice([nixl["kv_role"], "kv_both"]),
                                "load_failure_policy": policy, "connectors": children}
    requests = scenario["requests"]
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
            params = r.setdefault("kv_transfer_params", {})
            params[key] = rng.choice([0, block_size, 3 * block_size, 100])
    return scenario


def write_multi_scenarios(folder: Path, seeds: list[int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = folder / f"{FILE_PREFIX}{seed}.json"
        path.write_text(format_scenario(random_multi_scenario(seed)))
        paths.append(path)
    return paths


def run_multi_oracle(folder: Path, hash_seed: int = 0) -> bool:
    """vLLM's traces (its real MultiConnector) for every scenario in
    ``folder``; False, with its error printed, if the oracle failed."""
    python, oracle = reference_paths()
    proc = subprocess.run([str(python), str(ORACLE), str(oracle.parent), str(folder)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": str(hash_seed)})
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="1000-1099", help="seed range, e.g. 1000-1099 (default; the "
                    f"corpus is {MULTI_CORPUS_SEEDS})")
    ap.add_argument("--write-corpus", action="store_true",
                    help=f"rewrite {CORPUS.name}/ (seeds {MULTI_CORPUS_SEEDS}, those identical under "
                    "PYTHONHASHSEED=0) with the oracle's traces")
    ap.add_argument("--keep", type=Path, help="write the scenarios and vLLM's traces to this folder")
    ap.add_argument("--hash-seeds", type=int, default=12,
                    help="PYTHONHASHSEED values (0..N-1) to rerun vLLM with on a difference")
    args = ap.parse_args(argv)
    try:
        reference_paths()
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    seeds = parse_seeds(MULTI_CORPUS_SEEDS if args.write_corpus else args.seeds)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = args.keep or Path(tmp_dir)
        paths = write_multi_scenarios(tmp, seeds)
        if not run_multi_oracle(tmp):
            return 2
        counts = {"finished": 0, "stuck": 0}
        crashes = crashed(paths)
        for name in crashes:
            print(f"{name}: vLLM failed an assertion (not compared)")
        identical: list[Path] = []
        different: dict[Path, str] = {}
        for path in paths:
            if path.name in crashes:
                continue
            kind, diff = compare(path)
            if diff is None:
                counts[kind] += 1
                identical.append(path)
            else:
                different[path] = diff
        by_seed: dict[Path, int] = {}
        for hash_seed in range(1, args.hash_seeds if different else 0):
            pending = [p for p in different if p not in by_seed]
            if not pending:
                break
            again = tmp / f"hashseed_{hash_seed}"
            again.mkdir(exist_ok=True)
            for p in pending:
                shutil.copy(p, again / p.name)
            if not run_multi_oracle(again, hash_seed):
                return 2
            for p in pending:
                if compare(again / p.name)[1] is None:
                    by_seed[p] = hash_seed
        for path, diff in different.items():
            if path in by_seed:
                print(f"{path.name}: identical to vLLM under PYTHONHASHSEED={by_seed[path]} "
                      f"(first run: {diff.splitlines()[0]})")
            else:
                print(f"{path.name}: {diff}")
        if args.write_corpus:
            CORPUS.mkdir(parents=True, exist_ok=True)
            for old in CORPUS.glob(f"{FILE_PREFIX}*"):
                old.unlink()
            for path in identical:
                shutil.copy(path, CORPUS / path.name)
                for trace in tmp.glob(f"{path.stem}.vllm.jsonl*"):
                    gzip_trace(trace, CORPUS)
    failures = len(different) - len(by_seed)
    print(f"{len(seeds)} scenarios: {counts['finished']} identical, {counts['stuck']} identical up to "
          f"max_steps (vLLM never finishes them), {len(by_seed)} identical to vLLM under another "
          f"PYTHONHASHSEED (its order of frees in one output), {failures} different, "
          f"{len(crashes)} not compared (vLLM failed an assertion)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
