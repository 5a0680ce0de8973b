"""Compare the vLLM 0.34.0 goldens (tests/conformance/goldens_0_34/) with the 0.33.0
goldens beside the scenarios, scenario by scenario. Pure Python: no vLLM needed.

    python tests/conformance/vllm_0_34/compare_versions.py            # summary per folder
    python tests/conformance/vllm_0_34/compare_versions.py --details  # + first difference of each
    python tests/conformance/vllm_0_34/compare_versions.py --write    # rewrite goldens_0_34/comparison.json

Layout (tests/conformance/README.md): goldens_0_34/FOLDER/NAME is the 0.34 trace of the
scenario whose 0.33 golden is FOLDER/NAME (same file name: .vllm.jsonl, .vllm.jsonl.gz,
.vllm.jsonl.stuck[.gz]); goldens_0_34/shared_examples/ holds the traces of the shared
reference's examples (../shared/reference/examples, their 0.33 traces there);
goldens_0_34/dp/ the DP router and lockstep goldens (compared case by case).
Traces compare as ../shared/reference/compare_traces.py compares them (same fields,
id lists as sets, `finished` as a set).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFORMANCE = HERE.parent
REPO = CONFORMANCE.parents[1]
GOLDENS = CONFORMANCE / "goldens_0_34"
COMPARISON = GOLDENS / "comparison.json"
# A 0.34 trace byte-identical to its 0.33 golden is not stored again: this file
# lists it ("FOLDER/NAME sha256", NAME the 0.33 golden's file name, the hash of its
# trace text, decompressed), and the 0.33 golden stands for both versions.
SAME_AS_033 = GOLDENS / "same_as_0_33.txt"
SHARED_EXAMPLES = (
    Path(os.environ.get("KVSCHED_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "examples"
)
# Folders of the 0.33 corpus with a 0.34 counterpart, in report order.
FOLDERS = (
    "scenarios",
    "random",
    "random_features",
    "kv_connector",
    "kv_connector_random",
    "kv_connector_regressions",
    "kv_connector_multi",
    "cadence",
    "pp",
    "dp",
    "shared_examples",
)
# dp/: one JSON file of cases each, compared case by case.
DP_FILES = ("router_goldens.json", "lockstep_goldens.json")
FIELDS = (
    "scheduled",
    "new",
    "resumed",
    "preempted",
    "computed_at_admission",
    "finished",
    "num_free_blocks",
    "num_running",
    "num_waiting",
)
OPTIONAL_FIELDS = (
    "spec",
    "processed",
    "waiting_for_remote_kvs",
    "kv_load",
    "finished_recving",
    "finished_sending",
    "load_failed",
    "delayed_free",
    "offload",
)
SET_FIELDS = (
    "resumed",
    "preempted",
    "waiting_for_remote_kvs",
    "finished_recving",
    "finished_sending",
    "load_failed",
    "delayed_free",
)
TRACE_NAMES = (".vllm.jsonl", ".vllm.jsonl.gz", ".vllm.jsonl.stuck", ".vllm.jsonl.stuck.gz")


def read_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _norm(field: str, value):
    if field == "finished" and value is not None:
        return sorted(map(tuple, value))
    if field in SET_FIELDS and value is not None:
        return sorted(value)
    return value


def first_difference(old: list[dict], new: list[dict]) -> dict | None:
    """None when equal, else {"step", "field", "0.33", "0.34"} of the first difference."""
    for i, (a, b) in enumerate(zip(old, new)):
        for field in FIELDS + tuple(f for f in OPTIONAL_FIELDS if f in a or f in b):
            x, y = _norm(field, a.get(field)), _norm(field, b.get(field))
            if x != y:
                return {"step": a.get("step", i), "field": field, "0.33": x, "0.34": y}
    if len(old) != len(new):
        return {"step": min(len(old), len(new)), "field": "steps", "0.33": len(old), "0.34": len(new)}
    return None


def golden_of(folder: Path, stem: str) -> Path | None:
    for suffix in TRACE_NAMES:
        p = folder / (stem + suffix)
        if p.exists():
            return p
    return None


def trace_text(path: Path) -> bytes:
    """A trace file's text, decompressed when gzipped."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def trace_sha256(path: Path) -> str:
    return hashlib.sha256(trace_text(path)).hexdigest()


def same_as_033() -> dict[str, str]:
    """SAME_AS_033 as {"FOLDER/NAME": sha256}."""
    if not SAME_AS_033.exists():
        return {}
    out = {}
    for line in SAME_AS_033.read_text().splitlines():
        key, digest = line.split()
        out[key] = digest
    return out


def old_dir_of(folder: str) -> Path:
    return SHARED_EXAMPLES if folder == "shared_examples" else CONFORMANCE / folder


def pairs(folder: str) -> list[tuple[str, Path | None, Path | None]]:
    """(scenario name, 0.33 golden, 0.34 golden) for every scenario of the folder; the
    0.34 golden is the 0.33 file where SAME_AS_033 lists it (its hash is checked by
    test_goldens_0_34.py, so an edited 0.33 golden cannot stand for 0.34 unnoticed)."""
    old_dir = old_dir_of(folder)
    new_dir = GOLDENS / folder
    same = same_as_033()
    out = []
    for scenario in sorted(old_dir.glob("*.json")):
        old = golden_of(old_dir, scenario.stem)
        new = golden_of(new_dir, scenario.stem)
        if new is None and old is not None and f"{folder}/{old.name}" in same:
            new = old
        out.append((scenario.name, old, new))
    return out


def compare_dp() -> dict:
    rows = {}
    for name in DP_FILES:
        old_path, new_path = CONFORMANCE / "dp" / name, GOLDENS / "dp" / name
        if not new_path.exists():
            rows[name] = {"status": "no 0.34 trace"}
            continue
        old, new = json.loads(old_path.read_text())["cases"], json.loads(new_path.read_text())["cases"]
        differing = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        row = {"status": "equal" if not differing and len(old) == len(new) else "differs", "cases": len(old)}
        if row["status"] != "equal":
            row["first_difference"] = {
                "step": None,
                "field": "case",
                "0.33": differing[0] if differing else len(old),
                "0.34": differing[0] if differing else len(new),
            }
        rows[name] = row
    return rows


def compare_all() -> dict:
    result: dict = {}
    for folder in FOLDERS:
        if folder == "dp":
            result[folder] = compare_dp()
            continue
        rows = {}
        for name, old, new in pairs(folder):
            if new is None:
                rows[name] = {"status": "no 0.34 trace"}
                continue
            if old is None:
                rows[name] = {"status": "no 0.33 trace"}
                continue
            diff = first_difference(read_trace(old), read_trace(new))
            row = {"status": "equal" if diff is None else "differs"}
            if ".stuck" in old.name or ".stuck" in new.name:
                row["stuck"] = {"0.33": ".stuck" in old.name, "0.34": ".stuck" in new.name}
                if row["stuck"]["0.33"] != row["stuck"]["0.34"] and diff is None:
                    row["status"] = "differs"
                    diff = {
                        "step": None,
                        "field": "stuck",
                        "0.33": row["stuck"]["0.33"],
                        "0.34": row["stuck"]["0.34"],
                    }
            if diff is not None:
                row["first_difference"] = diff
            rows[name] = row
        result[folder] = rows
    return result


def summary(result: dict) -> list[str]:
    lines = []
    for folder, rows in result.items():
        counts: dict[str, int] = {}
        for row in rows.values():
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        lines.append(
            f"{folder}: {len(rows)} scenarios, " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--details", action="store_true", help="print each difference")
    ap.add_argument("--write", action="store_true", help=f"rewrite {COMPARISON.relative_to(REPO)}")
    args = ap.parse_args(argv)
    result = compare_all()
    for line in summary(result):
        print(line)
    if args.details:
        for folder, rows in result.items():
            for name, row in rows.items():
                if row["status"] != "equal":
                    d = row.get("first_difference")
                    print(
                        f"{folder}/{name}: {row['status']}"
                        + (f" at step {d['step']} ({d['field']})" if d else "")
                    )
    if args.write:
        COMPARISON.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
