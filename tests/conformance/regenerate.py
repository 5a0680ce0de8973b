"""Rewrite the conformance corpus: the random scenarios and every golden trace.

    python tests/conformance/regenerate.py                # random/, random_features/ + all goldens
    python tests/conformance/regenerate.py --only scenarios
    python tests/conformance/regenerate.py --only random_features

The goldens (NAME.vllm.jsonl) come from vLLM 0.33.0's real scheduler, replayed by the
oracle `vllm_replay.py` in the shared reference folder. It runs in its own virtualenv:

    KVSCHED_REFERENCE_PYTHON  python of that env (default ~/.cache/kvsched-reference/venv/bin/python)
    KVSCHED_REFERENCE_DIR     folder holding vllm_replay.py (default ../shared/reference
                              relative to the repo root)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
SCENARIOS_DIR = HERE / "scenarios"
RANDOM_DIR = HERE / "random"
RANDOM_FEATURES_DIR = HERE / "random_features"
TRACE_SUFFIX = ".vllm.jsonl"
DEFAULT_REFERENCE_PYTHON = Path.home() / ".cache/kvsched-reference/venv/bin/python"
DEFAULT_REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"

# Run as a script, this folder is already on sys.path; as a module (-m) it may not be.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import release_goldens  # noqa: E402
from random_features import FEATURE_CORPUS_SEEDS, FILE_PREFIX, write_feature_scenarios  # noqa: E402
from random_scenarios import CORPUS_SEEDS, parse_seeds, write_random_scenarios  # noqa: E402
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402


class ReferenceMissing(Exception):
    pass


def reference_paths() -> tuple[Path, Path]:
    """The reference python and oracle script, or ReferenceMissing with a hint."""
    python = Path(os.environ.get("KVSCHED_REFERENCE_PYTHON", DEFAULT_REFERENCE_PYTHON)).expanduser()
    ref_dir = Path(os.environ.get("KVSCHED_REFERENCE_DIR", DEFAULT_REFERENCE_DIR)).expanduser()
    oracle = ref_dir / "vllm_replay.py"
    missing = [str(p) for p in (python, oracle) if not p.is_file()]
    if missing:
        raise ReferenceMissing(
            "the vLLM reference environment is missing: "
            + ", ".join(missing)
            + "\nBuild it once with:  bash ../shared/reference/setup.sh"
            + "\n(or point KVSCHED_REFERENCE_PYTHON / KVSCHED_REFERENCE_DIR at it)"
        )
    return python, oracle


def reference_paths_of(version: str) -> tuple[Path, Path]:
    """The reference python and oracle script of ``version``: the shared
    reference's (vllm_replay.py) for its release, else this repository's
    drivers for that release (vllm_X_Y/oracle.py, its engine_oracle.py
    beside it); ReferenceMissing with a hint when its venv is not built.
    The one place the live comparers choose an oracle by release."""
    if version == SHARED_REFERENCE_VERSION:
        return reference_paths()
    python = release_goldens.default_python(version)
    drivers = release_goldens.drivers_of(version)
    if not python.is_file():
        raise ReferenceMissing(f"the vLLM {version} reference environment is missing: {python}"
                               f"\nBuild it once with:  bash {drivers.relative_to(HERE.parents[1])}/setup.sh"
                               f"\n(or point {release_goldens.python_env_var(version)} at it)")
    return python, drivers / "oracle.py"


def rewrite_random_scenarios(seeds: list[int]) -> int:
    """Replace random/ with freshly generated scenarios (stale seeds are removed)."""
    RANDOM_DIR.mkdir(parents=True, exist_ok=True)
    for old in RANDOM_DIR.glob("random_*"):
        old.unlink()
    return len(write_random_scenarios(RANDOM_DIR, seeds))


def rewrite_feature_scenarios(seeds: list[int]) -> int:
    """Replace random_features/ with freshly generated scenarios (stale seeds are removed)."""
    RANDOM_FEATURES_DIR.mkdir(parents=True, exist_ok=True)
    for old in RANDOM_FEATURES_DIR.glob(f"{FILE_PREFIX}*"):
        old.unlink()
    return len(write_feature_scenarios(RANDOM_FEATURES_DIR, seeds))


def remove_orphan_traces(folder: Path) -> None:
    """Drop goldens whose scenario file no longer exists."""
    for trace in folder.glob(f"*{TRACE_SUFFIX}"):
        if not trace.with_name(trace.name[: -len(TRACE_SUFFIX)] + ".json").exists():
            trace.unlink()


def run_oracle(python: Path, oracle: Path, folder: Path) -> list[dict[str, Any]]:
    """Replay every FOLDER/NAME.json in one oracle process (its startup is slow)."""
    started = time.monotonic()
    proc = subprocess.run([str(python), str(oracle), str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"the oracle failed on {folder} (exit {proc.returncode})")
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = sum(s["steps"] for s in summaries)
    preemptions = sum(s["preemptions"] for s in summaries)
    print(
        f"{folder.relative_to(REPO_ROOT)}: {len(summaries)} traces, {steps} steps, "
        f"{preemptions} preemptions, {time.monotonic() - started:.0f} s"
    )
    return summaries


def verify_traces(folder: Path, summaries: list[dict[str, Any]]) -> None:
    """Every scenario must have a trace with one line per replayed step."""
    steps = {s["scenario"]: s["steps"] for s in summaries}
    for scenario in sorted(folder.glob("*.json")):
        trace = scenario.with_name(scenario.stem + TRACE_SUFFIX)
        if scenario.name not in steps or not trace.exists():
            raise RuntimeError(f"no golden trace for {scenario.name}")
        with trace.open() as f:
            lines = sum(1 for _ in f)
        if lines != steps[scenario.name]:
            raise RuntimeError(f"{trace.name}: {lines} lines, oracle reported {steps[scenario.name]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the conformance goldens with vLLM.")
    parser.add_argument(
        "--only", choices=["scenarios", "random", "random_features"], help="regenerate just one folder"
    )
    parser.add_argument("--seeds", default=CORPUS_SEEDS, help=f"random seeds (default {CORPUS_SEEDS})")
    parser.add_argument(
        "--feature-seeds",
        default=FEATURE_CORPUS_SEEDS,
        help=f"random_features seeds (default {FEATURE_CORPUS_SEEDS})",
    )
    args = parser.parse_args(argv)
    try:
        python, oracle = reference_paths()
    except ReferenceMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    folders = []
    if args.only in (None, "scenarios"):
        folders.append(SCENARIOS_DIR)
    if args.only in (None, "random"):
        count = rewrite_random_scenarios(parse_seeds(args.seeds))
        print(f"wrote {count} random scenarios to {RANDOM_DIR.relative_to(REPO_ROOT)}")
        folders.append(RANDOM_DIR)
    if args.only in (None, "random_features"):
        count = rewrite_feature_scenarios(parse_seeds(args.feature_seeds))
        print(f"wrote {count} feature scenarios to {RANDOM_FEATURES_DIR.relative_to(REPO_ROOT)}")
        folders.append(RANDOM_FEATURES_DIR)
    # One oracle process at a time: each loads vLLM and the machine is small.
    for folder in folders:
        remove_orphan_traces(folder)
        verify_traces(folder, run_oracle(python, oracle, folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
