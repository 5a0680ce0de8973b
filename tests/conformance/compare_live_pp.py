"""Fresh pipeline-parallel scenarios through vLLM's engine loop and kvsched, compared live.

    python tests/conformance/compare_live_pp.py --seeds 1000-1119
    python tests/conformance/compare_live_pp.py --features --seeds 1000-1099
    python tests/conformance/compare_live_pp.py --vllm-version 0.34 --seeds 95000-95499

Needs the reference environment (``bash ../shared/reference/setup.sh``; for 0.34
``bash tests/conformance/vllm_0_34/setup.sh``). Each seed's scenario (PP 2 or 4, async
scheduling on or off; pp_scenarios.py) goes through vLLM's own
``EngineCore.step_with_batch_queue``: on 0.33 pp_oracle.py (run in that environment)
writes the scenario and the trace, on 0.34 kvsched's side writes the scenario and
vllm_0_34/engine_oracle.py traces it (0.34's EngineCore, AsyncScheduler with its
decode stagger). kvsched replays the scenario as that release and the two traces
must be identical. ``--features``
takes random_features.py's scenarios without drafts (async scheduling, the LoRA cap)
instead of plain ones. The committed corpus (pp/) holds seeds PP_CORPUS_SEEDS and
feature seeds PP_FEATURE_CORPUS_SEEDS; this checks any other range and prints how many
traces were identical, per PP size and scheduling mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live import compare  # noqa: E402
from pp_scenarios import (  # noqa: E402
    FEATURE_PREFIX,
    FILE_PREFIX,
    PP_SIZES,
    parse_pp_sizes,
    pp_feature_scenario,
    pp_scenario,
)
from random_scenarios import format_scenario, parse_seeds  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths, reference_paths_of  # noqa: E402

from kvsched.vllm_versions import VLLM_VERSIONS  # noqa: E402

# The seeds whose scenarios and goldens are committed under pp/.
PP_CORPUS_SEEDS = "0-39"
PP_FEATURE_CORPUS_SEEDS = "0-19"
DEFAULT_SEEDS = "1000-1119"


def run_pp_oracle(folder: Path, seeds: str, features: bool, vllm_version: str,
                  pp_sizes: tuple[int, ...] = PP_SIZES) -> bool:
    """Write each seed's scenario into ``folder`` with vLLM's trace beside it
    (NAME.vllm.jsonl); False, with the oracle's error printed, if it failed.
    0.33: pp_oracle.py draws the scenarios itself. 0.34: they are drawn here
    (the same text, pp_scenarios.py) and 0.34's engine oracle traces them,
    under PYTHONHASHSEED=0 as every oracle run of the live comparers."""
    if vllm_version != SHARED_REFERENCE_VERSION:
        python, oracle = reference_paths_of(vllm_version)
        make, prefix = (pp_feature_scenario, FEATURE_PREFIX) if features else (pp_scenario, FILE_PREFIX)
        for seed in parse_seeds(seeds):
            (folder / f"{prefix}{seed}.json").write_text(format_scenario(make(seed, pp_sizes)))
        cmd = [str(python), str(oracle.parent / "engine_oracle.py"), str(folder), "--out", str(folder)]
    else:
        python, _ = reference_paths()
        cmd = [str(python), str(HERE / "pp_oracle.py"), str(folder), "--seeds", seeds,
               "--pp-sizes", ",".join(map(str, pp_sizes)), *(["--features"] if features else [])]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        print(f"the oracle failed (exit {proc.returncode})", file=sys.stderr)
    return proc.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default=DEFAULT_SEEDS,
                    help=f"seed range (default {DEFAULT_SEEDS}; the corpus holds {PP_CORPUS_SEEDS})")
    ap.add_argument("--features", action="store_true",
                    help="random_features.py scenarios without drafts (async, the LoRA cap)")
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=SHARED_REFERENCE_VERSION,
                    help="the release to compare with (0.34: tests/conformance/vllm_0_34/setup.sh's "
                         "environment)")
    ap.add_argument("--pp-sizes", type=parse_pp_sizes, default=PP_SIZES,
                    help="the pipeline sizes a seed draws from, e.g. 3,8 (default 2,4, the corpus's)")
    args = ap.parse_args(argv)
    try:
        parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(f"--seeds {args.seeds!r}: {e}")
    try:
        reference_paths_of(args.vllm_version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if not run_pp_oracle(Path(tmp), args.seeds, args.features, args.vllm_version, args.pp_sizes):
            return 2
        paths = sorted(Path(tmp).glob("*.json"))
        kinds: Counter[str] = Counter()
        same: Counter[str] = Counter()
        different = []
        for path in paths:
            scenario = json.loads(path.read_text())
            kind = (f"PP{scenario['pipeline_parallel_size']} "
                    f"{'async' if scenario.get('async_scheduling') else 'sync'}"
                    f"{' LoRA' if 'max_loras' in scenario else ''}")
            kinds[kind] += 1
            diff = compare(path, args.vllm_version)
            if diff is None:
                same[kind] += 1
            else:
                different.append(f"{path.name} ({kind}): {diff}")
    for line in different:
        print(line)
    for kind in sorted(kinds):
        print(f"{kind}: {same[kind]} of {kinds[kind]} identical")
    print(f"{sum(same.values())} of {len(paths)} pipeline-parallel scenarios identical to "
          f"vLLM {args.vllm_version}.0")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
