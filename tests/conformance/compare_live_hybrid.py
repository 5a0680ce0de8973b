"""Fresh random hybrid-KV-cache scenarios through vLLM's oracle and kvsched, compared live;
also writes the committed corpus hybrid/random/.

    python tests/conformance/compare_live_hybrid.py --seeds 300000-300999
    python tests/conformance/compare_live_hybrid.py --vllm-version 0.33 --seeds 301000-301299
    python tests/conformance/compare_live_hybrid.py --write-corpus   # rewrite hybrid/random/
    python tests/conformance/compare_live_hybrid.py --multimodal --seeds 0-39 --write-corpus

The scenarios are random_hybrid.py's (`--multimodal`: hybrid_multimodal_scenario's,
random multimodal scenarios with a second group; corpus hybrid/multimodal/). Needs
the release's reference environment
(0.34: tests/conformance/vllm_0_34/setup.sh; 0.33: the same oracle.py run on the
0.33 venv). Prints the counts (also per layout) and every difference; exits 1 on
any difference. A scenario vLLM never finishes (NAME.vllm.jsonl.stuck) is compared
up to max_steps and counted apart (kvsched must stop there with the same steps);
one vLLM crashes on counts as different. Only finished ones enter the corpus.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_hybrid import (  # noqa: E402
    HYBRID_CORPUS_SEEDS,
    HYBRID_MM_CORPUS_SEEDS,
    LIVE_SEEDS_FROM,
    hybrid_scenario_path,
    layout_of,
    seed_of,
    write_hybrid_scenarios,
)
from random_kv_connector import STUCK_SUFFIX, compare_with_golden  # noqa: E402
from random_scenarios import parse_seeds  # noqa: E402
from regenerate import ReferenceMissing, reference_paths, reference_paths_of  # noqa: E402

CORPUS = HERE / "hybrid" / "random"
MM_CORPUS = HERE / "hybrid" / "multimodal"
DEFAULT_VERSION = "0.34"
GOLDEN_SUFFIX = {"0.34": ".vllm.jsonl", "0.33": ".vllm033.jsonl"}
# The driver that knows cache.kv_groups, on either release's venv (the shared
# 0.33 vllm_replay.py does not).
ORACLE = HERE / "vllm_0_34" / "oracle.py"


def oracle_python(version: str) -> Path:
    """The reference venv's python of ``version`` (ReferenceMissing if absent)."""
    return (reference_paths() if version == "0.33" else reference_paths_of(version))[0]


def run_hybrid_oracle(folder: Path, version: str) -> bool:
    """vLLM's traces NAME.vllm.jsonl for every scenario in ``folder`` (hash seed
    pinned as for every oracle run); False, with its error printed, on failure."""
    cmd = [str(oracle_python(version)), str(ORACLE), str(folder), "--out", str(folder)]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", help=f"seed range (default {LIVE_SEEDS_FROM}-{LIVE_SEEDS_FROM + 99}; "
                    f"the corpus holds {HYBRID_CORPUS_SEEDS})")
    ap.add_argument("--vllm-version", choices=sorted(GOLDEN_SUFFIX), default=DEFAULT_VERSION)
    ap.add_argument("--multimodal", action="store_true",
                    help="random multimodal scenarios with a second group (hybrid_multimodal_scenario)")
    ap.add_argument("--write-corpus", action="store_true",
                    help=f"write seeds {HYBRID_CORPUS_SEEDS} and their goldens into {CORPUS}")
    args = ap.parse_args(argv)
    version = args.vllm_version
    corpus_seeds = HYBRID_MM_CORPUS_SEEDS if args.multimodal else HYBRID_CORPUS_SEEDS
    corpus = MM_CORPUS if args.multimodal else CORPUS
    seeds = parse_seeds(args.seeds or (corpus_seeds if args.write_corpus
                                       else f"{LIVE_SEEDS_FROM}-{LIVE_SEEDS_FROM + 99}"))
    try:
        oracle_python(version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    counts: Counter[str] = Counter()
    different: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_hybrid_scenarios(folder, seeds, args.multimodal)
        if not run_hybrid_oracle(folder, version):
            print("the oracle failed", file=sys.stderr)
            return 2
        for path in paths:
            seed = seed_of(path)
            layout = layout_of(seed, args.multimodal)
            golden = path.with_name(path.stem + ".vllm.jsonl")
            if not golden.exists() and not golden.with_name(golden.name + STUCK_SUFFIX).exists():
                counts[f"{layout}:crash"] += 1
                different.append(f"{path.name}: vLLM crashed")
                continue
            # A scenario vLLM never finishes is compared up to max_steps.
            stuck, diff = compare_with_golden(path, None, version)
            what = ("identical" if diff is None else "different") + (" up to max_steps" if stuck else "")
            counts[f"{layout}:{what}"] += 1
            if diff is not None:
                different.append(f"{path.name} ({layout}): {diff}")
            elif args.write_corpus and not stuck:
                corpus.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, hybrid_scenario_path(corpus, seed, args.multimodal))
                shutil.copy(golden, corpus / (path.stem + GOLDEN_SUFFIX[version]))
    for line in different:
        print(line)
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")
    identical = sum(n for k, n in counts.items() if k.endswith(":identical"))
    stuck = sum(n for k, n in counts.items() if k.endswith(":identical up to max_steps"))
    print(f"{identical} of {len(paths)} random hybrid scenarios identical to vLLM {version}.0, "
          f"{stuck} identical up to max_steps (vLLM never finishes them), {len(different)} different")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
