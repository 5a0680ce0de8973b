"""Fresh random multimodal scenarios through vLLM's oracle and kvsched, compared live.

    python tests/conformance/compare_live_multimodal.py --seeds 400000-400999
    python tests/conformance/compare_live_multimodal.py --vllm-version 0.33 --seeds 400000-400299
    python tests/conformance/compare_live_multimodal.py --seeds 0-39 \
        --write tests/conformance/multimodal_random

Scenarios come from random_multimodal.py; vLLM's traces from
tests/conformance/vllm_0_34/oracle.py (the one driver that knows the encoder
keys; it runs on each release's reference environment). Prints the first
difference of every scenario that differs and how many were identical.
``--write DIR`` keeps the scenarios and the release's goldens in DIR (the
committed corpus) instead of a temporary folder. A scenario kvsched refuses
counts as different, with the refusal as its reason; one vLLM ran to
max_steps on (NAME.vllm.jsonl.stuck: a vLLM livelock) is identical only if
kvsched spins too and its trace up to max_steps is the same; one vLLM crashed
on (NAME.vllm.jsonl.crash) counts as different.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_multimodal import write_multimodal_scenarios  # noqa: E402
from random_scenarios import parse_seeds  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402
from regenerate import ReferenceMissing, reference_paths, reference_paths_of  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import CannotServe  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION, VLLM_VERSIONS  # noqa: E402

ORACLE = HERE / "vllm_0_34" / "oracle.py"
# The golden suffix per release: 0.34's traces are NAME.vllm.jsonl, as in
# every 0.34 corpus; 0.33's NAME.vllm-0.33.jsonl beside them.
SUFFIX = {"0.34": ".vllm.jsonl", "0.33": ".vllm-0.33.jsonl"}


def oracle_python(version: str) -> Path:
    """The reference python of ``version`` (0.33: the shared reference's)."""
    if version == SHARED_REFERENCE_VERSION:
        return reference_paths()[0]
    return reference_paths_of(version)[0]


def run_oracle(folder: Path, version: str) -> str | None:
    """vLLM's traces of every scenario in ``folder`` (PYTHONHASHSEED=0), or
    the oracle's error."""
    cmd = [str(oracle_python(version)), str(ORACLE), str(folder), "--out", str(folder),
           "--suffix", SUFFIX[version]]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    return proc.stderr[-4000:] if proc.returncode else None


def compare(path: Path, version: str) -> str | None:
    """None when kvsched's replay of PATH as ``version`` equals vLLM's trace
    beside it, else the first difference (or why there is nothing to compare)."""
    golden = path.with_name(path.stem + SUFFIX[version])
    crash = golden.with_name(golden.name + ".crash")
    if crash.exists():
        return f"vLLM crashed ({crash.name})"
    # A scenario vLLM spins on to max_steps: kvsched must spin the same way
    # and stop there too (the partial traces are compared).
    stuck = golden.with_name(golden.name + ".stuck")
    if stuck.exists():
        golden = stuck
    expected = [json.loads(x) for x in golden.read_text().splitlines() if x.strip()]
    out = io.StringIO()
    try:
        replay(load_scenario(str(path), version), out)
        if stuck.exists():
            return "vLLM ran to max_steps, kvsched finished"
    except CannotServe as e:
        if not stuck.exists():
            return f"kvsched stopped: {e}"
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return f"kvsched did not replay it: {e}"
    actual = [json.loads(x) for x in out.getvalue().splitlines()]
    return first_difference(expected, actual)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="400000-400099", help="seed range, e.g. 400000-400999")
    ap.add_argument("--vllm-version", choices=VLLM_VERSIONS, default=DEFAULT_VLLM_VERSION)
    ap.add_argument("--write", type=Path, help="keep the scenarios and goldens in this folder")
    args = ap.parse_args(argv)
    try:
        oracle_python(args.vllm_version)
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.write if args.write is not None else Path(tmp)
        paths = write_multimodal_scenarios(folder, parse_seeds(args.seeds))
        if args.write is not None:
            # Only these scenarios: the oracle replays the whole folder.
            work = Path(tmp)
            for p in paths:
                (work / p.name).write_text(p.read_text())
            error = run_oracle(work, args.vllm_version)
            for p in paths:
                for produced in work.glob(p.stem + SUFFIX[args.vllm_version] + "*"):
                    (folder / produced.name).write_text(produced.read_text())
        else:
            error = run_oracle(folder, args.vllm_version)
        if error is not None:
            print(error, file=sys.stderr)
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
    print(f"{identical} of {len(paths)} random multimodal scenarios identical to vLLM "
          f"{args.vllm_version}.0")
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
