"""Write tests/conformance/kv_connector_0_34/: generated offloading and MultiConnector
scenarios that show vLLM 0.34's offloading changes (docs/vllm_versions.md §17, §21),
with the 0.34 oracle's traces, gzipped.

    python tests/conformance/make_kv_connector_0_34.py   # needs vllm_0_34/setup.sh's venv

The scenarios are the live comparers' 0.34 draws (compare_live_offload.py and
compare_live_multi.py with ``--vllm-version 0.34``) for the seeds of CORPUS below,
picked from a live run (seeds 96000-96599) for what each one's trace shows. Only
0.34 can replay those with scripted failures (0.33's offloading worker asserts that
every transfer succeeds); test_kv_connector_0_34.py checks the files against the
generators, kvsched's 0.34 replay against the traces (the ``offload`` key too) and
that each trace still shows its feature. The oracle runs with PYTHONHASHSEED=0.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_kv import run_oracle  # noqa: E402
from compare_live_multi import random_multi_scenario  # noqa: E402
from compare_live_offload import random_offload_scenario  # noqa: E402
from random_kv_connector import gzip_trace  # noqa: E402
from random_scenarios import format_scenario  # noqa: E402
from regenerate import ReferenceMissing, reference_paths_of  # noqa: E402

CORPUS_DIR = HERE / "kv_connector_0_34"
VERSION = "0.34"
# What each seed's 0.34 trace shows (test_kv_connector_0_34.py checks it):
# load_fail (a failed offloading load, the request in load_failed: under `fail`
# it finishes with an error, under `recompute` it is recomputed and never looked up
# on the CPU again), store_fail (a failed store job: its chunks dropped) and
# threshold_once (kvsched replaying it with 0.33's store-threshold count gives
# another trace: found by that replay when the seeds were picked).
CORPUS: dict[str, dict[int, tuple[str, ...]]] = {
    "offload_random": {
        96050: ("load_fail",), 96483: ("load_fail",), 96535: ("load_fail",), 96235: ("load_fail",),
        96501: ("store_fail",), 96349: ("store_fail",), 96252: ("load_fail", "store_fail"),
        96003: ("threshold_once",), 96088: ("threshold_once",), 96154: ("threshold_once",),
    },
    "multi_random": {
        96331: ("load_fail",), 96212: ("load_fail",), 96596: ("load_fail",), 96181: ("store_fail",),
        96186: ("load_fail", "store_fail"), 96319: ("load_fail", "store_fail"),
    },
}
GENERATORS: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "offload_random": random_offload_scenario,
    "multi_random": random_multi_scenario,
}


def scenario_text(prefix: str, seed: int) -> str:
    """The scenario file of ``prefix``'s seed, as the corpus holds it."""
    return format_scenario(GENERATORS[prefix](seed, VERSION))


def main() -> int:
    try:
        reference_paths_of("0.34")
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for prefix, seeds in CORPUS.items():
            for seed in seeds:
                (tmp / f"{prefix}_{seed}.json").write_text(scenario_text(prefix, seed))
        if not run_oracle(tmp, 0, VERSION):
            return 2
        crashes = sorted(p.name for p in tmp.glob("*.crash"))
        if crashes:
            print(f"vLLM failed an assertion on {crashes}", file=sys.stderr)
            return 1
        if CORPUS_DIR.exists():
            shutil.rmtree(CORPUS_DIR)
        CORPUS_DIR.mkdir()
        for path in sorted(tmp.glob("*.json")):
            shutil.copy(path, CORPUS_DIR / path.name)
        for trace in sorted(tmp.glob("*.vllm.jsonl*")):
            gzip_trace(trace, CORPUS_DIR)
    print(f"wrote {sum(map(len, CORPUS.values()))} scenarios and their 0.34 traces to {CORPUS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
