"""Rewrite tests/conformance/goldens_0_34/ from vLLM 0.34.0 (the reference environment
built by setup.sh beside this file) and its comparison.json.

    python tests/conformance/vllm_0_34/regenerate.py            # everything (~3 min)
    python tests/conformance/vllm_0_34/regenerate.py --only pp  # one folder

Each folder of the 0.33 corpus is replayed by the 0.34 oracle that corresponds to the
0.33 one that wrote its goldens: oracle.py (scenarios, random, random_features,
kv_connector*, cadence, the shared examples, probes, admission_random), engine_oracle.py (pp: vLLM's own
EngineCore loop, as pp_oracle.py), dp_goldens.py (dp). Traces keep the 0.33 file
names (gzipped where the 0.33 ones are: kv_connector_random, kv_connector_regressions,
kv_connector_multi; `.stuck` for a scenario that reaches max_steps). The oracle runs
with PYTHONHASHSEED=0, as compare_live_kv.py runs the 0.33 one.

KVSCHED_REFERENCE_034_PYTHON (default ~/.cache/kvsched-reference/venv-0.34/bin/python)
points at another environment.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import compare_versions as cv

HERE = Path(__file__).resolve().parent
PYTHON = Path(
    os.environ.get(
        "KVSCHED_REFERENCE_034_PYTHON", Path.home() / ".cache/kvsched-reference/venv-0.34/bin/python"
    )
)
GZIPPED = {"kv_connector_random", "kv_connector_regressions", "kv_connector_multi", "admission_random"}
# 0.34-only scenarios, kept beside this file (their goldens in goldens_0_34/ under the
# same name): the probes of 0.34's new knobs, and random scenarios that set them
# (random_kv_connector.py / random_scenarios.py for 0.34, picked from a live run).
OWN_FOLDERS = ("probes", "admission_random")
# Every folder compare_versions knows but pp and dp (their own oracles), then ours.
ORACLE_FOLDERS = (*(f for f in cv.FOLDERS if f not in ("pp", "dp")), *OWN_FOLDERS)
ALL = (*ORACLE_FOLDERS, "pp", "dp")


def source(folder: str) -> Path:
    if folder == "shared_examples":
        return cv.SHARED_EXAMPLES
    if folder in OWN_FOLDERS:
        return HERE / folder
    return cv.CONFORMANCE / folder


def run(script: str, *args: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run([str(PYTHON), str(HERE / script), *args], env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{script} {' '.join(args)} failed")


def install(folder: str, traces: Path, same: dict[str, str]) -> int:
    """Write the folder's 0.34 traces; one byte-identical to its 0.33 golden (same
    name, same text) goes into ``same`` instead of being stored twice. Returns the
    traces replayed."""
    dst = cv.GOLDENS / folder
    if dst.exists():
        shutil.rmtree(dst)
    for key in [k for k in same if k.startswith(folder + "/")]:
        del same[key]
    old_dir = cv.old_dir_of(folder)
    count = 0
    for f in sorted(traces.iterdir()):
        count += 1
        name = f.name + ".gz" if folder in GZIPPED else f.name
        old = old_dir / name
        text = f.read_bytes()
        if old.exists() and cv.trace_text(old) == text:
            same[f"{folder}/{name}"] = cv.hashlib.sha256(text).hexdigest()
            continue
        dst.mkdir(parents=True, exist_ok=True)
        if folder in GZIPPED:
            (dst / name).write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        else:
            shutil.copyfile(f, dst / name)
    return count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=ALL, action="append", help="just these folders")
    args = ap.parse_args(argv)
    if not PYTHON.is_file():
        print(
            f"error: no vLLM 0.34 environment at {PYTHON}; build it with "
            "bash tests/conformance/vllm_0_34/setup.sh",
            file=sys.stderr,
        )
        return 2
    same = cv.same_as_033()
    for folder in args.only or ALL:
        if folder == "dp":
            run("dp_goldens.py")
            print("dp: router_goldens.json, lockstep_goldens.json", flush=True)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            if folder == "pp":
                run("engine_oracle.py", str(source(folder)), "--out", tmp)
            else:
                run("oracle.py", str(source(folder)), "--out", tmp)
            print(f"{folder}: {install(folder, Path(tmp), same)} traces", flush=True)
    cv.SAME_AS_033.write_text("".join(f"{k} {v}\n" for k, v in sorted(same.items())))
    cv.COMPARISON.write_text(cv.json.dumps(cv.compare_all(), indent=1, sort_keys=True) + "\n")
    for line in cv.summary(cv.compare_all()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
