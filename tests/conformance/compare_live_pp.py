"""Fresh pipeline-parallel scenarios through vLLM's engine loop and kvsched, compared live.

    python tests/conformance/compare_live_pp.py --seeds 1000-1119
    python tests/conformance/compare_live_pp.py --features --seeds 1000-1099

Needs the reference environment (``bash ../shared/reference/setup.sh``).
pp_oracle.py (run in that environment) writes each seed's scenario (PP 2 or 4,
async scheduling on or off) and vLLM's trace from ``EngineCore.step_with_batch_queue``;
kvsched replays the scenario and the two traces must be identical. ``--features``
takes random_features.py's scenarios without drafts (async scheduling, the LoRA cap)
instead of plain ones. The committed corpus (pp/) holds seeds PP_CORPUS_SEEDS and
feature seeds PP_FEATURE_CORPUS_SEEDS; this checks any other range and prints how many
traces were identical, per PP size and scheduling mode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live import compare  # noqa: E402
from regenerate import ReferenceMissing, reference_paths  # noqa: E402

# The seeds whose scenarios and goldens are committed under pp/.
PP_CORPUS_SEEDS = "0-39"
PP_FEATURE_CORPUS_SEEDS = "0-19"
DEFAULT_SEEDS = "1000-1119"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default=DEFAULT_SEEDS,
                    help=f"seed range (default {DEFAULT_SEEDS}; the corpus holds {PP_CORPUS_SEEDS})")
    ap.add_argument("--features", action="store_true",
                    help="random_features.py scenarios without drafts (async, the LoRA cap)")
    args = ap.parse_args(argv)
    try:
        python, _ = reference_paths()
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([str(python), str(HERE / "pp_oracle.py"), tmp, "--seeds", args.seeds,
                               *(["--features"] if args.features else [])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            print(f"the oracle failed (exit {proc.returncode})", file=sys.stderr)
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
            diff = compare(path)
            if diff is None:
                same[kind] += 1
            else:
                different.append(f"{path.name} ({kind}): {diff}")
    for line in different:
        print(line)
    for kind in sorted(kinds):
        print(f"{kind}: {same[kind]} of {kinds[kind]} identical")
    print(f"{sum(same.values())} of {len(paths)} pipeline-parallel scenarios identical to vLLM 0.33.0")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
