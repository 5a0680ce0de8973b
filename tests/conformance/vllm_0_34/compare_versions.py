"""Compare a vLLM release's goldens (tests/conformance/goldens_X_Y/, default 0.34.0's
goldens_0_34/) with the 0.33.0 goldens beside the scenarios, or with another
release's goldens, scenario by scenario. Pure Python: no vLLM needed.

    python tests/conformance/vllm_0_34/compare_versions.py            # summary per folder
    python tests/conformance/vllm_0_34/compare_versions.py --details  # + first difference of each
    python tests/conformance/vllm_0_34/compare_versions.py --write    # rewrite goldens_0_34/comparison.json
    python tests/conformance/vllm_0_34/compare_versions.py --version 0.35 --against 0.34 --details

Layout (tests/conformance/README.md): goldens_X_Y/FOLDER/NAME is release X.Y's trace of
the scenario whose 0.33 golden is FOLDER/NAME (same file name: .vllm.jsonl,
.vllm.jsonl.gz, .vllm.jsonl.stuck[.gz]); goldens_X_Y/shared_examples/ holds the traces
of the shared reference's examples (../shared/reference/examples, their 0.33 traces
there); goldens_X_Y/dp/ the DP router and lockstep goldens (compared case by case).
A release's trace byte-identical to the 0.33 golden is not stored: same_as_0_33.txt
lists it. Folders of release-only scenarios (probes, rules_0_34: no 0.33 golden) are
compared only between two releases (``--against``). Traces compare as
../shared/reference/compare_traces.py compares them (same fields, id lists as sets,
`finished` as a set). This file and regenerate.py serve every release after 0.33;
0.34 is their default.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFORMANCE = HERE.parent
REPO = CONFORMANCE.parents[1]
# The release the corpus's own goldens come from: every other release is stored
# and compared relative to it.
BASE_VERSION = "0.33"
SHARED_EXAMPLES = (
    Path(os.environ.get("KVSCHED_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "examples"
)
# Folders of the 0.33 corpus with a counterpart in every later release, in report order.
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
_VERSION = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True, slots=True)
class Release:
    """Where one release's goldens live: ``version`` is vLLM's major.minor."""

    version: str
    goldens: Path

    @property
    def comparison(self) -> Path:
        return self.goldens / "comparison.json"

    @property
    def same_as_base(self) -> Path:
        # A trace byte-identical to its 0.33 golden is not stored again: this file
        # lists it ("FOLDER/NAME sha256", NAME the 0.33 golden's file name, the hash
        # of its trace text, decompressed), and the 0.33 golden stands for both.
        return self.goldens / "same_as_0_33.txt"

    def extra_folders(self) -> tuple[str, ...]:
        """The release-only folders of goldens (no 0.33 counterpart), sorted."""
        if not self.goldens.is_dir():
            return ()
        known = set(FOLDERS)
        return tuple(sorted(p.name for p in self.goldens.iterdir() if p.is_dir() and p.name not in known))


def release(version: str, goldens: Path | None = None) -> Release:
    """The release ``version`` ("0.35"); its goldens default to goldens_0_35/ beside
    the corpus. A ValueError names a version that is not major.minor."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"version {version!r}: give vLLM's major.minor, e.g. 0.35")
    return Release(version, goldens or CONFORMANCE / f"goldens_{match[1]}_{match[2]}")


RELEASE = release("0.34")
# 0.34's paths, as the tests and counterfactual.py read them.
GOLDENS = RELEASE.goldens
COMPARISON = RELEASE.comparison
SAME_AS_033 = RELEASE.same_as_base
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


def first_difference(old: list[dict], new: list[dict], labels: tuple[str, str] = (BASE_VERSION, "0.34")
                     ) -> dict | None:
    """None when equal, else {"step", "field", OLD, NEW} of the first difference, OLD and
    NEW the two releases' labels."""
    a_label, b_label = labels
    for i, (a, b) in enumerate(zip(old, new)):
        for field in FIELDS + tuple(f for f in OPTIONAL_FIELDS if f in a or f in b):
            x, y = _norm(field, a.get(field)), _norm(field, b.get(field))
            if x != y:
                return {"step": a.get("step", i), "field": field, a_label: x, b_label: y}
    if len(old) != len(new):
        return {"step": min(len(old), len(new)), "field": "steps", a_label: len(old), b_label: len(new)}
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


def same_as_base(rel: Release = RELEASE) -> dict[str, str]:
    """The release's same_as_0_33.txt as {"FOLDER/NAME": sha256}."""
    if not rel.same_as_base.exists():
        return {}
    out = {}
    for line in rel.same_as_base.read_text().splitlines():
        key, digest = line.split()
        out[key] = digest
    return out


def same_as_033() -> dict[str, str]:
    """0.34's SAME_AS_033 as {"FOLDER/NAME": sha256}."""
    return same_as_base(RELEASE)


def old_dir_of(folder: str) -> Path:
    """Where a corpus folder's scenarios and 0.33 goldens are."""
    return SHARED_EXAMPLES if folder == "shared_examples" else CONFORMANCE / folder


def pairs(folder: str, rel: Release = RELEASE) -> list[tuple[str, Path | None, Path | None]]:
    """(scenario name, 0.33 golden, the release's golden) for every scenario of the
    corpus folder; the release's golden is the 0.33 file where its same_as_0_33.txt
    lists it (its hash is checked by test_goldens_0_34.py, so an edited 0.33 golden
    cannot stand for 0.34 unnoticed)."""
    old_dir = old_dir_of(folder)
    new_dir = rel.goldens / folder
    same = same_as_base(rel)
    out = []
    for scenario in sorted(old_dir.glob("*.json")):
        old = golden_of(old_dir, scenario.stem)
        new = golden_of(new_dir, scenario.stem)
        if new is None and old is not None and f"{folder}/{old.name}" in same:
            new = old
        out.append((scenario.name, old, new))
    return out


def _trace_stem(path: Path) -> str:
    name = path.name
    return name[: name.index(".vllm.jsonl")]


def release_pairs(folder: str, rel: Release, against: Release | None
                  ) -> list[tuple[str, Path | None, Path | None]]:
    """(scenario name, ``against``'s golden, ``rel``'s golden) for every scenario of the
    folder; ``against`` None is 0.33 (the corpus's own goldens). A release-only folder
    (``Release.extra_folders``) takes its names from both releases' traces."""
    if folder in FOLDERS:
        new = pairs(folder, rel)
        if against is None:
            return new
        old = {name: trace for name, _base, trace in pairs(folder, against)}
        return [(name, old.get(name), trace) for name, _base, trace in new]
    assert against is not None, "a release-only folder has no 0.33 goldens"
    dirs = (against.goldens / folder, rel.goldens / folder)
    stems = sorted({_trace_stem(p) for d in dirs if d.is_dir()
                    for p in d.iterdir() if ".vllm.jsonl" in p.name})
    return [(stem + ".json", golden_of(dirs[0], stem), golden_of(dirs[1], stem)) for stem in stems]


def compare_dp(rel: Release = RELEASE, against: Release | None = None) -> dict:
    old_label, new_label = (against.version if against else BASE_VERSION), rel.version
    old_dir = against.goldens / "dp" if against else CONFORMANCE / "dp"
    rows = {}
    for name in DP_FILES:
        old_path, new_path = old_dir / name, rel.goldens / "dp" / name
        if not new_path.exists():
            rows[name] = {"status": f"no {new_label} trace"}
            continue
        old, new = json.loads(old_path.read_text())["cases"], json.loads(new_path.read_text())["cases"]
        differing = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        row = {"status": "equal" if not differing and len(old) == len(new) else "differs", "cases": len(old)}
        if row["status"] != "equal":
            row["first_difference"] = {
                "step": None,
                "field": "case",
                old_label: differing[0] if differing else len(old),
                new_label: differing[0] if differing else len(new),
            }
        rows[name] = row
    return rows


def compare_all(rel: Release = RELEASE, against: Release | None = None) -> dict:
    """Every scenario's row ({"status": "equal" | "differs" | "no X trace", ...}) by
    folder: ``rel``'s goldens against 0.33's (``against`` None) or another release's;
    between two releases their common release-only folders too."""
    labels = (against.version if against else BASE_VERSION, rel.version)
    old_label, new_label = labels
    extra = tuple(f for f in rel.extra_folders() if f in against.extra_folders()) if against else ()
    result: dict = {}
    for folder in (*FOLDERS, *extra):
        if folder == "dp":
            result[folder] = compare_dp(rel, against)
            continue
        rows = {}
        for name, old, new in release_pairs(folder, rel, against):
            if new is None:
                rows[name] = {"status": f"no {new_label} trace"}
                continue
            if old is None:
                rows[name] = {"status": f"no {old_label} trace"}
                continue
            diff = first_difference(read_trace(old), read_trace(new), labels)
            row = {"status": "equal" if diff is None else "differs"}
            if ".stuck" in old.name or ".stuck" in new.name:
                row["stuck"] = {old_label: ".stuck" in old.name, new_label: ".stuck" in new.name}
                if row["stuck"][old_label] != row["stuck"][new_label] and diff is None:
                    row["status"] = "differs"
                    diff = {
                        "step": None,
                        "field": "stuck",
                        old_label: row["stuck"][old_label],
                        new_label: row["stuck"][new_label],
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
    ap.add_argument("--version", default=RELEASE.version,
                    help=f"the release whose goldens to compare (default {RELEASE.version})")
    ap.add_argument("--goldens", type=Path,
                    help="its goldens folder (default goldens_X_Y/ beside the corpus)")
    ap.add_argument("--against", help=f"compare with this release's goldens instead of {BASE_VERSION}'s")
    ap.add_argument("--details", action="store_true", help="print each difference")
    ap.add_argument("--write", action="store_true",
                    help="rewrite the release's comparison.json (only against 0.33, what it records)")
    args = ap.parse_args(argv)
    try:
        rel = release(args.version, args.goldens)
        against = release(args.against) if args.against else None
    except ValueError as e:
        ap.error(str(e))
    for r in (rel, against):
        if r is not None and not r.goldens.is_dir():
            ap.error(f"no goldens for {r.version} at {r.goldens}; write them with "
                     f"vllm_0_34/regenerate.py --version {r.version}")
    if args.write and against is not None:
        ap.error("--write records the comparison with 0.33; drop --against")
    result = compare_all(rel, against)
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
        rel.comparison.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
