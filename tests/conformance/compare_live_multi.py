"""Fresh random MultiConnector (NIXL + CPU offloading) scenarios through
vLLM's oracle and kvsched, compared live; also writes the committed corpus
kv_connector_multi/.

    nice -n 19 python tests/conformance/compare_live_multi.py --seeds 1000-1099
    python tests/conformance/compare_live_multi.py --write-corpus   # rewrite kv_connector_multi/
    nice -n 19 python tests/conformance/compare_live_multi.py --vllm-version 0.34 --seeds 96000-96499

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

``--vllm-version 0.34``: the 0.34 oracle (vllm_0_34/oracle.py) has the
MultiConnector key natively; kvsched replays as 0.34 (the MultiConnector's
roles from its children), and the offloading child gets 0.34's scripted
failures and store threshold as compare_live_offload.py gives them
(``add_034_offload_keys``).
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
from compare_live_kv import compare_live, run_oracle  # noqa: E402
from compare_live_nixl import random_nixl_scenario  # noqa: E402
from compare_live_offload import add_034_offload_keys, offload_connector, share_prompt_prefixes  # noqa: E402
from random_kv_connector import gzip_trace  # noqa: E402
from random_scenarios import format_scenario, parse_seeds  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths, reference_paths_of  # noqa: E402

from kvsched.vllm_versions import VLLM_VERSIONS, rules_for  # noqa: E402

CORPUS = HERE / "kv_connector_multi"
FILE_PREFIX = "multi_random_"
# The committed corpus' seeds (those that differ only under another hash
# seed are left out of it: no golden can pin them).
MULTI_CORPUS_SEEDS = "0-29"
ORACLE = HERE / "multi_oracle.py"


def random_multi_scenario(seed: int, vllm_version: str = SHARED_REFERENCE_VERSION) -> dict[str, Any]:
    scenario = random_nixl_scenario(seed)
    rng = random.Random(seed * 15485863 + 11)
    nixl = dict(scenario["kv_connector"])
    policy = nixl.pop("load_failure_policy")
    block_size = int(scenario["cache"].get("block_size", 16))
    offload = offload_connector(rng, block_size, "kv_both")
    children = [nixl, offload] if rng.random() < 0.5 else [offload, nixl]
    scenario["kv_connector"] = {"type": "multi", "kv_role": rng.choice([nixl["kv_role"], "kv_both"]),
                                "load_failure_policy": policy, "connectors": children}
    share_prompt_prefixes(rng, scenario["requests"], block_size)
    if rules_for(vllm_version).offload_transfer_failures:
        add_034_offload_keys(seed, scenario, offload)
    return scenario


def write_multi_scenarios(folder: Path, seeds: list[int],
                          vllm_version: str = SHARED_REFERENCE_VERSION) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = folder / f"{FILE_PREFIX}{seed}.json"
        path.write_text(format_scenario(random_multi_scenario(seed, vllm_version)))
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
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=SHARED_REFERENCE_VERSION,
                    help="the release to compare with (0.34: tests/conformance/vllm_0_34/setup.sh's "
                         "environment)")
    args = ap.parse_args(argv)
    version = args.vllm_version
    if args.write_corpus and version != SHARED_REFERENCE_VERSION:
        print("--write-corpus rewrites the 0.33 corpus; for 0.34 run vllm_0_34/regenerate.py",
              file=sys.stderr)
        return 2
    try:
        reference_paths_of(version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2

    def oracle(folder: Path, hash_seed: int) -> bool:
        if version != SHARED_REFERENCE_VERSION:
            return run_oracle(folder, hash_seed, version)
        return run_multi_oracle(folder, hash_seed)

    seeds = parse_seeds(MULTI_CORPUS_SEEDS if args.write_corpus else args.seeds)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = args.keep or Path(tmp_dir)
        paths = write_multi_scenarios(tmp, seeds, version)
        if not oracle(tmp, 0):
            return 2
        outcome = compare_live(tmp, paths, oracle, range(1, args.hash_seeds), version)
        if outcome is None:
            return 2
        if args.write_corpus:
            CORPUS.mkdir(parents=True, exist_ok=True)
            for old in CORPUS.glob(f"{FILE_PREFIX}*"):
                old.unlink()
            for path in outcome.identical:
                shutil.copy(path, CORPUS / path.name)
                for trace in tmp.glob(f"{path.stem}.vllm.jsonl*"):
                    gzip_trace(trace, CORPUS)
    print(f"{len(seeds)} scenarios: {outcome.summary()}")
    return 1 if outcome.different else 0

if __name__ == "__main__":
    sys.exit(main())
