"""Rewrite a vLLM release's goldens (default 0.34.0: tests/conformance/goldens_0_34/, from
the reference environment built by vllm_0_34/setup.sh) and its comparison.json. Run as
vllm_0_34/regenerate.py (below) or through new_release.py goldens.

    python tests/conformance/vllm_0_34/regenerate.py            # everything (~3 min)
    python tests/conformance/vllm_0_34/regenerate.py --only pp  # one folder
    python tests/conformance/vllm_0_34/regenerate.py --version 0.35 \\
        --drivers tests/conformance/vllm_0_35 --python ~/.cache/kvsched-reference/venv-0.35/bin/python

Each folder of the 0.33 corpus is replayed by the release's oracle that corresponds to
the 0.33 one that wrote its goldens: the drivers folder's oracle.py (scenarios, random,
random_features, kv_connector*, cadence, the shared examples), engine_oracle.py (any
folder with a pipeline-parallel scenario, i.e. pp: vLLM's own EngineCore loop, as
pp_oracle.py), dp_goldens.py (dp). Then the release-only folders (``--extra``;
default: the drivers folder's subfolders holding scenarios, 0.34's probes/ and
rules_0_34/), each into goldens/NAME. Traces keep the 0.33 file names (gzipped where
the 0.33 ones are: kv_connector_random, kv_connector_regressions, kv_connector_multi;
`.stuck` for a scenario that reaches max_steps). The oracle runs with
PYTHONHASHSEED=0, as compare_live_kv.py runs the 0.33 one.

The environment: ``--python``, else KVSCHED_REFERENCE_<MAJOR><MINOR>_PYTHON (0.34:
KVSCHED_REFERENCE_034_PYTHON), else ~/.cache/kvsched-reference/venv-<version>/bin/python.
tests/conformance/new_release.py drives this for a new release.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE / "vllm_0_34") not in sys.path:
    sys.path.insert(0, str(HERE / "vllm_0_34"))  # compare_versions serves every release

import compare_versions as cv  # noqa: E402

# admission_random: 0.34-only random scenarios with its admission knobs, kept
# gzipped as the connector corpus they are drawn from.
GZIPPED = {"kv_connector_random", "kv_connector_regressions", "kv_connector_multi", "admission_random"}
# Every corpus folder compare_versions knows but dp (its own driver).
CORPUS_FOLDERS = tuple(f for f in cv.FOLDERS if f != "dp")


def python_env_var(version: str) -> str:
    """The variable naming a release's reference python: 0.34 -> KVSCHED_REFERENCE_034_PYTHON."""
    major, minor = cv.release(version).version.split(".")
    return f"KVSCHED_REFERENCE_{major}{minor}_PYTHON"


def default_python(version: str) -> Path:
    """The release's reference python (see the module's docstring)."""
    given = os.environ.get(python_env_var(version))
    if given:
        return Path(given).expanduser()
    return Path.home() / f".cache/kvsched-reference/venv-{version}/bin/python"


def drivers_of(version: str) -> Path:
    """tests/conformance/vllm_X_Y: where release X.Y's oracle drivers live."""
    return cv.CONFORMANCE / ("vllm_" + cv.release(version).version.replace(".", "_"))


def scenario_folders(root: Path) -> tuple[Path, ...]:
    """The subfolders of ``root`` that hold scenarios (*.json), sorted by name."""
    if not root.is_dir():
        return ()
    return tuple(sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.json"))))


def needs_engine_loop(folder: Path) -> bool:
    """A folder with a pipeline-parallel scenario is traced by engine_oracle.py: only
    vLLM's own EngineCore loop decides the PP queue depth (oracle.py transcribes the
    loops without PP)."""
    for path in folder.glob("*.json"):
        if int(json.loads(path.read_text()).get("pipeline_parallel_size", 1)) > 1:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Plan:
    """What one regeneration replays, through which environment, into which goldens."""

    release: cv.Release
    python: Path
    drivers: Path
    # name -> scenarios folder; the corpus folders first, then the release-only ones.
    sources: dict[str, Path]

    @property
    def folders(self) -> tuple[str, ...]:
        return (*self.sources, "dp")


def make_plan(version: str, python: Path | None = None, drivers: Path | None = None,
              goldens: Path | None = None, extra: Sequence[Path] | None = None) -> Plan:
    """The plan for ``version`` with the defaults filled in (ValueError on a bad
    version or a release-only folder named like a corpus folder or another one)."""
    rel = cv.release(version, goldens)
    drivers = drivers or drivers_of(rel.version)
    sources: dict[str, Path] = {f: cv.old_dir_of(f) for f in CORPUS_FOLDERS}
    for folder in scenario_folders(drivers) if extra is None else tuple(extra):
        if folder.name in sources or folder.name == "dp":
            raise ValueError(f"release-only folder {folder}: its name {folder.name!r} is taken by "
                             f"{sources.get(folder.name, 'dp')}; rename it")
        sources[folder.name] = folder
    return Plan(rel, python or default_python(rel.version), drivers, sources)


def run(plan: Plan, script: str, *args: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run([str(plan.python), str(plan.drivers / script), *args], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{script} {' '.join(args)} failed")


def install(plan: Plan, folder: str, traces: Path, same: dict[str, str]) -> int:
    """Write the folder's traces; one byte-identical to its 0.33 golden (same name,
    same text) goes into ``same`` instead of being stored twice. Returns the traces
    replayed."""
    dst = plan.release.goldens / folder
    if dst.exists():
        shutil.rmtree(dst)
    for key in [k for k in same if k.startswith(folder + "/")]:
        del same[key]
    # Release-only folders have no 0.33 goldens: every trace is stored.
    old_dir = cv.old_dir_of(folder) if folder in CORPUS_FOLDERS else None
    count = 0
    for f in sorted(traces.iterdir()):
        count += 1
        name = f.name + ".gz" if folder in GZIPPED else f.name
        text = f.read_bytes()
        old = old_dir / name if old_dir is not None else None
        if old is not None and old.exists() and cv.trace_text(old) == text:
            same[f"{folder}/{name}"] = hashlib.sha256(text).hexdigest()
            continue
        dst.mkdir(parents=True, exist_ok=True)
        if folder in GZIPPED:
            (dst / name).write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        else:
            shutil.copyfile(f, dst / name)
    return count


def regenerate(plan: Plan, only: Sequence[str] | None = None) -> dict[str, dict[str, dict[str, object]]]:
    """Replay the plan's folders (or ``only`` these), rewrite same_as_0_33.txt and
    comparison.json; returns the comparison."""
    rel = plan.release
    rel.goldens.mkdir(parents=True, exist_ok=True)
    same = cv.same_as_base(rel)
    for folder in only or plan.folders:
        if folder == "dp":
            run(plan, "dp_goldens.py", "--out", str(rel.goldens / "dp"))
            print("dp: router_goldens.json, lockstep_goldens.json", flush=True)
            continue
        source = plan.sources[folder]
        script = "engine_oracle.py" if needs_engine_loop(source) else "oracle.py"
        with tempfile.TemporaryDirectory() as tmp:
            run(plan, script, str(source), "--out", tmp)
            print(f"{folder}: {install(plan, folder, Path(tmp), same)} traces", flush=True)
    rel.same_as_base.write_text("".join(f"{k} {v}\n" for k, v in sorted(same.items())))
    result = cv.compare_all(rel)
    rel.comparison.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--version", default=cv.RELEASE.version, help="vLLM's major.minor (default 0.34)")
    ap.add_argument("--python", type=Path, help="the release's reference python")
    ap.add_argument("--drivers", type=Path, help="its oracle drivers (default tests/conformance/vllm_X_Y)")
    ap.add_argument("--goldens", type=Path,
                    help="where its goldens go (default tests/conformance/goldens_X_Y)")
    ap.add_argument("--extra", type=Path, action="append",
                    help="a release-only scenario folder (default: the drivers folder's subfolders)")
    ap.add_argument("--only", action="append", help="just these folders (repeat)")
    args = ap.parse_args(argv)
    try:
        plan = make_plan(args.version, args.python, args.drivers, args.goldens, args.extra)
    except ValueError as e:
        ap.error(str(e))
    unknown = [f for f in args.only or () if f not in plan.folders]
    if unknown:
        ap.error(f"--only {unknown[0]!r}: not a folder of this run; use one of {', '.join(plan.folders)}")
    if not plan.python.is_file():
        print(f"error: no vLLM {plan.release.version} environment at {plan.python}; build it with "
              f"python tests/conformance/new_release.py venv {plan.release.version}.0 "
              f"{plan.drivers.name} (0.34: bash tests/conformance/vllm_0_34/setup.sh)", file=sys.stderr)
        return 2
    for script in ("oracle.py", "engine_oracle.py", "dp_goldens.py"):
        if not (plan.drivers / script).is_file():
            print(f"error: no {script} in {plan.drivers}; docs/adding_a_vllm_release.md says how to "
                  "write the release's oracle drivers", file=sys.stderr)
            return 2
    for line in cv.summary(regenerate(plan, args.only)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
