"""Random scripted-KV-connector scenarios through vLLM's oracle and kvsched,
compared live; also writes the committed corpus kv_connector_random/.

    python tests/conformance/compare_live_kv.py --seeds 100000-100999
    python tests/conformance/compare_live_kv.py --write-corpus   # rewrite kv_connector_random/

The scenarios are random_kv_connector.py's (a plain, async, speculative or LoRA
base scenario plus a scripted connector and per-request load, failure and
delayed-free scripts). Some never finish in vLLM (a load scripted to fail every
time under the recompute policy is retried for ever): their oracle trace stops at
``max_steps`` and is kept as NAME.vllm.jsonl.stuck; kvsched must stop there too
with the same steps. Needs the reference environment
(``bash ../shared/reference/setup.sh``); prints the counts (also per base
scenario kind), exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_kv_connector import (  # noqa: E402
    BASES,
    FILE_PREFIX,
    KV_CORPUS_SEEDS,
    LIVE_SEEDS_FROM,
    base_of,
    compare_with_golden,
    gzip_trace,
    kv_scenario_path,
    write_kv_scenarios,
)
from random_scenarios import parse_seeds  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths, reference_paths_of  # noqa: E402

from kvsched.vllm_versions import VLLM_VERSIONS  # noqa: E402

CORPUS = HERE / "kv_connector_random"
# Run in the reference environment: every scenario of a folder through the
# oracle in one process (vLLM takes ~20 s to start); a scenario that hits
# max_steps keeps its partial trace as NAME.vllm.jsonl.stuck, one on which
# vLLM itself fails an assertion leaves NAME.vllm.crash with the error.
_ORACLE_LOOP = """
import glob, json, os, sys, traceback
sys.path.insert(0, sys.argv[1])
import vllm_replay
for path in sorted(glob.glob(sys.argv[2] + "/*.json")):
    out = path[:-5] + ".vllm.jsonl"
    try:
        with open(out, "w") as f:
            vllm_replay.replay(json.load(open(path)), f)
    except RuntimeError as e:
        if "did not finish" not in str(e):
            raise
        os.rename(out, out + ".stuck")
    except AssertionError:
        os.remove(out)
        with open(path[:-5] + ".vllm.crash", "w") as f:
            f.write(traceback.format_exc())
"""


def run_oracle(folder: Path, hash_seed: int = 0, vllm_version: str = SHARED_REFERENCE_VERSION) -> bool:
    """vLLM's traces for every scenario in ``folder``, its Python hash seed
    pinned (vLLM frees some sets in hash order); False, with its error
    printed, if the oracle failed. The one oracle runner of the live
    drivers (compare_live.py, compare_live_nixl.py, compare_live_offload.py):
    0.33 is the shared reference's, 0.34 this repository's (vllm_0_34/)."""
    if vllm_version != SHARED_REFERENCE_VERSION:
        python, oracle = reference_paths_of(vllm_version)
        cmd = [str(python), str(oracle), str(folder), "--out", str(folder)]
    else:
        python, oracle = reference_paths()
        cmd = [str(python), "-c", _ORACLE_LOOP, str(oracle.parent), str(folder)]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": str(hash_seed)})
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode == 0


def compare(path: Path, vllm_version: str = SHARED_REFERENCE_VERSION) -> tuple[str, str | None]:
    """("finished" | "stuck", None when kvsched's replay of the scenario at
    ``path`` equals vLLM's trace beside it, else the first difference): the
    live drivers' view of ``compare_with_golden``."""
    stuck, diff = compare_with_golden(path, None, vllm_version)
    return ("stuck" if stuck else "finished"), diff


def write_scenarios(folder: Path, prefix: str, seeds: list[int],
                    make: Callable[[int], dict[str, Any]]) -> list[Path]:
    """``make(seed)`` as ``folder/PREFIX_SEED.json`` for every seed, in order."""
    paths = []
    for seed in seeds:
        path = folder / f"{prefix}_{seed}.json"
        path.write_text(json.dumps(make(seed)))
        paths.append(path)
    return paths


def crashed(paths: list[Path]) -> list[str]:
    """The scenarios on which vLLM failed an assertion (nothing to compare):
    NAME.vllm.crash from the 0.33 loop, NAME.vllm.jsonl.crash from 0.34's oracle."""
    return [p.name for p in paths
            if p.with_suffix(".vllm.crash").exists() or p.with_suffix(".vllm.jsonl.crash").exists()]


@dataclasses.dataclass
class LiveOutcome:
    """A live run's verdicts (see :func:`compare_live`)."""

    counts: dict[str, int]                 # "finished" / "stuck": identical
    identical: list[Path]                  # identical under PYTHONHASHSEED=0
    different: dict[Path, str]             # not identical under any hash seed tried
    by_seed: dict[Path, int]               # identical only under this other hash seed
    crashes: list[str]                     # vLLM failed an assertion: not compared

    def summary(self) -> str:
        return (f"{self.counts['finished']} identical, {self.counts['stuck']} identical up to max_steps "
                f"(vLLM never finishes them), {len(self.by_seed)} identical to vLLM under another "
                f"PYTHONHASHSEED (its order of frees in one output), {len(self.different)} different, "
                f"{len(self.crashes)} not compared (vLLM failed an assertion)")


def compare_live(folder: Path, paths: list[Path], oracle: Callable[[Path, int], bool],
                 hash_seeds: Iterable[int],
                 vllm_version: str = SHARED_REFERENCE_VERSION) -> LiveOutcome | None:
    """Compare every scenario of ``paths`` (their vLLM traces written beside
    them by ``oracle(folder, 0)``) with kvsched's replay; rerun those that
    differ through ``oracle`` under each of ``hash_seeds`` in turn (vLLM
    frees the requests of one output in set order, which follows Python's
    string hash: with prefix caching or a CPU cache the order decides which
    blocks go first; kvsched frees them in sorted order), counting apart
    those some seed reproduces. kvsched replays them as ``vllm_version``
    (the oracle's release). Prints each crash and difference; None if the
    oracle failed."""
    outcome = LiveOutcome({"finished": 0, "stuck": 0}, [], {}, {}, crashed(paths))
    for name in outcome.crashes:
        print(f"{name}: vLLM failed an assertion (not compared)")
    first: dict[Path, str] = {}
    for path in paths:
        if path.name in outcome.crashes:
            continue
        kind, diff = compare(path, vllm_version)
        if diff is None:
            outcome.counts[kind] += 1
            outcome.identical.append(path)
        else:
            first[path] = diff
    pending = dict(first)
    for hash_seed in hash_seeds:
        if not pending:
            break
        again = folder / f"hashseed_{hash_seed}"
        shutil.rmtree(again, ignore_errors=True)
        again.mkdir()
        copies = {path: Path(shutil.copy(path, again)) for path in pending}
        if not oracle(again, hash_seed):
            return None
        for path, copy in copies.items():
            if compare(copy, vllm_version)[1] is None:
                outcome.by_seed[path] = hash_seed
                del pending[path]
    outcome.different = pending
    for path, diff in first.items():
        if path in outcome.by_seed:
            print(f"{path.name}: identical to vLLM under PYTHONHASHSEED={outcome.by_seed[path]} "
                  f"(first run: {diff.splitlines()[0]})")
        else:
            print(f"{path.name}: {diff}")
    return outcome


def compare_folder(folder: Path, seeds: list[int], vllm_version: str = SHARED_REFERENCE_VERSION) -> int:
    """Print the counts; the number of scenarios that differ."""
    counts = {base: [0, 0] for base in BASES}
    failures = 0
    for seed in seeds:
        path = kv_scenario_path(folder, seed)
        stuck, diff = compare_with_golden(path, None, vllm_version)
        if diff is None:
            counts[base_of(seed)][int(stuck)] += 1
        else:
            failures += 1
            print(f"{path.name}: {diff}")
    finished = sum(c[0] for c in counts.values())
    stuck_total = sum(c[1] for c in counts.values())
    print("per base (identical / identical up to max_steps): "
          + ", ".join(f"{b} {c[0]}/{c[1]}" for b, c in counts.items()))
    print(f"{len(seeds)} scenarios: {finished} identical, {stuck_total} identical up to max_steps "
          f"(vLLM never finishes them), {failures} different")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default=f"{LIVE_SEEDS_FROM}-{LIVE_SEEDS_FROM + 99}",
                    help=f"seed range, e.g. {LIVE_SEEDS_FROM}-{LIVE_SEEDS_FROM + 999} (fresh seeds "
                    f"start at {LIVE_SEEDS_FROM}; the corpus is {KV_CORPUS_SEEDS})")
    ap.add_argument("--write-corpus", action="store_true",
                    help=f"rewrite {CORPUS.name}/ (seeds {KV_CORPUS_SEEDS}) with the oracle's traces")
    ap.add_argument("--keep", type=Path, help="keep the scenarios and (gzipped) traces in this folder")
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=SHARED_REFERENCE_VERSION,
                    help="the release to compare with (0.34: tests/conformance/vllm_0_34/setup.sh's "
                         "environment)")
    args = ap.parse_args(argv)
    if args.write_corpus and args.vllm_version != SHARED_REFERENCE_VERSION:
        print("--write-corpus rewrites the 0.33 corpus; for 0.34 run vllm_0_34/regenerate.py",
              file=sys.stderr)
        return 2
    try:
        reference_paths_of(args.vllm_version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    seeds = parse_seeds(KV_CORPUS_SEEDS if args.write_corpus else args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_kv_scenarios(folder, seeds, args.vllm_version)
        if not run_oracle(folder, 0, args.vllm_version):
            return 2
        failures = compare_folder(folder, seeds, args.vllm_version)
        keep = CORPUS if args.write_corpus else args.keep
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for old in keep.glob(f"{FILE_PREFIX}*"):
                old.unlink()
            for f in folder.glob(f"{FILE_PREFIX}*"):
                if f.suffix == ".json":
                    shutil.copy(f, keep / f.name)
                else:
                    gzip_trace(f, keep)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
