"""Fresh random scenarios through vLLM's oracle and kvsched, compared live.

    python tests/conformance/compare_live.py --seeds 300-1299
    python tests/conformance/compare_live.py --features --seeds 400-1399

Needs the reference environment (``bash ../shared/reference/setup.sh``). The
committed corpus covers seeds 0-299 of random_scenarios.py (random/) and 0-399 of
random_features.py (random_features/, with ``--features``: async scheduling,
speculative decoding, the LoRA cap); this checks any other range without touching
it, and prints how many traces were identical. A scenario kvsched refuses to
replay (an unsupported key) counts as different, with the refusal as its reason.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_kv import run_oracle  # noqa: E402
from random_features import FEATURE_CORPUS_SEEDS, write_feature_scenarios  # noqa: E402
from random_scenarios import CORPUS_SEEDS, parse_seeds, write_random_scenarios  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths_of  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402
from kvsched.vllm_versions import VLLM_VERSIONS  # noqa: E402

# Default seed ranges: the next thousand after each committed corpus.
DEFAULT_SEEDS = "300-1299"
DEFAULT_FEATURE_SEEDS = "400-1399"


def compare(path: Path, vllm_version: str = SHARED_REFERENCE_VERSION) -> str | None:
    """kvsched's trace of PATH against the oracle's PATH.vllm.jsonl: None when
    identical, else the first difference (or why kvsched could not replay it)."""
    golden = path.with_name(path.stem + ".vllm.jsonl")
    expected = [json.loads(x) for x in golden.read_text().splitlines() if x.strip()]
    out = io.StringIO()
    try:
        replay(load_scenario(str(path), vllm_version), out)
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return f"kvsched did not replay it: {e}"
    actual = [json.loads(x) for x in out.getvalue().splitlines()]
    return first_difference(expected, actual)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--features", action="store_true",
                    help="generate feature scenarios (random_features.py) instead of plain ones")
    ap.add_argument("--seeds", help=f"seed range, e.g. 300-1299 (default {DEFAULT_SEEDS}, "
                    f"with --features {DEFAULT_FEATURE_SEEDS}; the corpus holds {CORPUS_SEEDS} "
                    f"and {FEATURE_CORPUS_SEEDS})")
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=SHARED_REFERENCE_VERSION,
                    help="the release to compare with (0.34: tests/conformance/vllm_0_34/setup.sh's "
                         "environment)")
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds or (DEFAULT_FEATURE_SEEDS if args.features else DEFAULT_SEEDS))
    write = write_feature_scenarios if args.features else write_random_scenarios
    kind = "random feature" if args.features else "random"
    try:
        reference_paths_of(args.vllm_version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        # Plain scenarios for 0.34 also draw cache-aware admission (random_scenarios.py).
        paths = (write_random_scenarios(Path(tmp), seeds, args.vllm_version) if not args.features
                 else write(Path(tmp), seeds))
        if not run_oracle(Path(tmp), 0, args.vllm_version):
            print("the oracle failed", file=sys.stderr)
            return 2
        identical, different = 0, []
        for path in paths:
            diff = compare(path, args.vllm_version)
            if diff is None:
                identical += 1
            else:
                different.append(f"{path.name}: {diff}")
    for line in different:
        print(line)
    print(f"{identical} of {len(paths)} {kind} scenarios identical to vLLM {args.vllm_version}.0")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
