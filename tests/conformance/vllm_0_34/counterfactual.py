"""Check the causes of the 0.33/0.34 golden differences by counterfactuals: every
scenario whose 0.34 golden differs from its 0.33 one (goldens_0_34/comparison.json)
is edited so that vLLM 0.33.0 would behave as 0.34 does for each 0.34 change it
touches, replayed by the 0.33 oracle (the shared vllm_replay.py; pp_oracle.py for pp/,
multi_oracle.py for kv_connector_multi/), and compared with the 0.34 golden. A
scenario is explained when the traces are then equal.

    python tests/conformance/vllm_0_34/counterfactual.py

The edits (docs/vllm_versions.md):
- `long_prefill_no_chunking`: 0.34 ignores `long_prefill_token_threshold` when chunked
  prefill is off (Scheduler.schedule): the threshold is set to 0;
- `multi_roles_from_children`: 0.34 derives a MultiConnector's producer/consumer roles
  from its children's kv_role (KVTransferConfig.is_kv_producer/is_kv_consumer), 0.33
  from the top-level kv_role: the top-level role is set to the children's union.

Needs the 0.33 reference environment (KVSCHED_REFERENCE_PYTHON, default
~/.cache/kvsched-reference/venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import compare_versions as cv

sys.path.insert(0, str(cv.CONFORMANCE))
from compare_live_kv import run_oracle

REF_PYTHON = Path(
    os.environ.get("KVSCHED_REFERENCE_PYTHON", Path.home() / ".cache/kvsched-reference/venv/bin/python")
)
REF_DIR = cv.SHARED_EXAMPLES.parent


def long_prefill_no_chunking(scenario: dict) -> bool:
    sc = scenario.get("scheduler", {})
    if sc.get("enable_chunked_prefill", True) or not sc.get("long_prefill_token_threshold"):
        return False
    sc["long_prefill_token_threshold"] = 0
    return True


def multi_roles_from_children(scenario: dict) -> bool:
    kvc = scenario.get("kv_connector") or {}
    if kvc.get("type") != "multi":
        return False
    roles = {c.get("kv_role", "kv_both") for c in kvc["connectors"]}
    producer = bool(roles & {"kv_producer", "kv_both"})
    consumer = bool(roles & {"kv_consumer", "kv_both"})
    role = "kv_both" if producer and consumer else "kv_producer" if producer else "kv_consumer"
    if kvc.get("kv_role", "kv_both") == role:
        return False
    kvc["kv_role"] = role
    return True


EDITS = {
    "long_prefill_no_chunking": long_prefill_no_chunking,
    "multi_roles_from_children": multi_roles_from_children,
}


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__)
        return 2
    comparison = json.loads(cv.COMPARISON.read_text())
    explained: dict[str, int] = {}
    unexplained = 0
    with tempfile.TemporaryDirectory() as tmp:
        for folder, rows in comparison.items():
            work = Path(tmp) / folder
            applied: dict[str, list[str]] = {}
            for name, row in rows.items():
                if row["status"] != "differs":
                    continue
                src = (cv.SHARED_EXAMPLES if folder == "shared_examples" else cv.CONFORMANCE / folder) / name
                scenario = json.loads(src.read_text())
                applied[name] = [edit for edit, fn in EDITS.items() if fn(scenario)]
                if not applied[name]:
                    unexplained += 1
                    print(f"{folder}/{name}: no known change applies")
                    continue
                work.mkdir(parents=True, exist_ok=True)
                (work / name).write_text(json.dumps(scenario))
            if not work.exists():
                continue
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            if folder == "pp":
                cmd = [str(REF_PYTHON), str(cv.CONFORMANCE / "pp_oracle.py"), str(work)]
            elif folder == "kv_connector_multi":
                cmd = [str(REF_PYTHON), str(cv.CONFORMANCE / "multi_oracle.py"), str(REF_DIR), str(work)]
            else:
                cmd = []
            if cmd:
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            elif not run_oracle(work, 0, "0.33"):  # the live comparers' 0.33 oracle loop
                raise SystemExit(f"the 0.33 oracle failed on {folder}")
            for name, edits in applied.items():
                if not edits:
                    continue
                stem = name[:-5]
                old = cv.golden_of(work, stem)
                new = cv.golden_of(cv.GOLDENS / folder, stem)
                diff = cv.first_difference(cv.read_trace(old), cv.read_trace(new))
                if diff is None and (".stuck" in old.name) == (".stuck" in new.name):
                    key = " + ".join(edits)
                    explained[key] = explained.get(key, 0) + 1
                    print(f"{folder}/{name}: explained by {key}")
                else:
                    unexplained += 1
                    print(f"{folder}/{name}: still differs after {edits}: {diff}")
    for key, n in sorted(explained.items()):
        print(f"{n} explained by {key}")
    print(f"{unexplained} not explained")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
