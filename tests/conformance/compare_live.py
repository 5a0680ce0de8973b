"""Fresh random scenarios through vLLM's oracle and kvsched, compared live.

    python tests/conformance/compare_live.py --seeds 300-1299

Needs the reference environment (``bash ../shared/reference/setup.sh``). The
committed corpus covers seeds 0-299; this checks any other range without
touching it, and prints how many traces were identical.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_scenarios import parse_seeds, write_random_scenarios  # noqa: E402
from regenerate import ReferenceMissing, reference_paths  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.replay import load_scenario, replay  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="300-1299", help="seed range, e.g. 300-1299")
    args = ap.parse_args(argv)
    try:
        python, oracle = reference_paths()
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_random_scenarios(Path(tmp), parse_seeds(args.seeds))
        subprocess.run([str(python), str(oracle), tmp], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        identical, different = 0, []
        for path in paths:
            golden = path.with_name(path.stem + ".vllm.jsonl")
            expected = [json.loads(x) for x in golden.read_text().splitlines() if x.strip()]
            out = io.StringIO()
            replay(load_scenario(str(path)), out)
            actual = [json.loads(x) for x in out.getvalue().splitlines()]
            diff = first_difference(expected, actual)
            if diff is None:
                identical += 1
            else:
                different.append(f"{path.name}: {diff}")
    for line in different:
        print(line)
    print(f"{identical} of {len(paths)} random scenarios identical to vLLM 0.33.0")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
