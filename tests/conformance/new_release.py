"""The mechanical steps of adding a vLLM release to kvsched (docs/adding_a_vllm_release.md).

    python tests/conformance/new_release.py venv    0.35.0 vllm_0_35   # (a) the reference venv
    python tests/conformance/new_release.py diff    0.35.0 vllm_0_35   # (b) scheduler-path source diff
    python tests/conformance/new_release.py goldens 0.35.0 vllm_0_35   # (c) the corpus's goldens

VERSION is vLLM's full version (pip's ``vllm==VERSION``); FOLDER the release's driver
folder under tests/conformance (vllm_0_35 for 0.35).

(a) ``venv`` refuses unless ``vllm==VERSION`` is on the package index; scaffolds FOLDER
    from the previous release's (``--from``, default vllm_0_34): its requirements.txt
    and oracle drivers (oracle.py, oracle_connectors.py, engine_oracle.py,
    dp_goldens.py) with their own release's version strings replaced, unless FOLDER
    exists; then builds ~/.cache/kvsched-reference/venv-MAJOR.MINOR with
    vllm_0_34/setup.sh (``--venv`` elsewhere). The scaffolded drivers are a start, not
    an oracle: the source diff says what to change in them.
(b) ``diff`` compares the scheduler-path files (SCHEDULER_PATH) of two installed
    releases (``--against``, default 0.34.0) and writes FOLDER/source_diff_MAJ_MIN.md
    (the summary: each file changed, unchanged, added or removed, with line counts)
    and FOLDER/source_diff_MAJ_MIN.diff (the unified diff, not committed).
(c) ``goldens`` replays the whole corpus through FOLDER's oracles (release_goldens.py,
    vllm_0_34/regenerate.py's work, with the release's version, venv, drivers) into goldens_MAJ_MIN/, with the
    release-only folders of every release's driver folder (0.34's probes/, rules_0_34/),
    writes its comparison.json (against 0.33), and prints the comparison with
    ``--against`` (default 0.34) too.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVERS_034 = HERE / "vllm_0_34"
for folder in (str(HERE), str(DRIVERS_034)):
    if folder not in sys.path:
        sys.path.insert(0, folder)

import compare_versions as cv  # noqa: E402
import release_goldens as regen  # noqa: E402

SETUP = DRIVERS_034 / "setup.sh"
# The files a release's drivers folder starts from; each names its own release in
# version strings that scaffold() rewrites.
DRIVER_FILES = ("requirements.txt", "oracle.py", "oracle_connectors.py", "engine_oracle.py", "dp_goldens.py")
# The files of vllm/ that decide or feed a scheduling decision kvsched models (the list
# docs/vllm_versions.md "Sources compared" went through for 0.34), as globs.
SCHEDULER_PATH = (
    "v1/core/sched/*.py",
    "v1/core/kv_cache_manager.py",
    "v1/core/block_pool.py",
    "v1/core/kv_cache_coordinator.py",
    "v1/core/single_type_kv_cache_manager.py",
    "v1/core/kv_cache_utils.py",
    "v1/core/encoder_cache_manager.py",
    "v1/request.py",
    "sampling_params.py",
    "v1/outputs.py",
    "v1/structured_output/__init__.py",
    "config/scheduler.py",
    "config/cache.py",
    "config/kv_transfer.py",
    "config/parallel.py",
    "config/speculative.py",
    "config/vllm.py",
    "engine/arg_utils.py",
    "v1/engine/core.py",
    "v1/engine/core_client.py",
    "platforms/interface.py",
    "platforms/cpu.py",
    "distributed/kv_transfer/kv_connector/v1/base.py",
    "distributed/kv_transfer/kv_connector/v1/multi_connector.py",
    "distributed/kv_transfer/kv_connector/v1/nixl/**/*.py",
    "distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
    "distributed/kv_transfer/kv_connector/v1/offloading/**/*.py",
    "v1/kv_offload/**/*.py",
)
_FULL_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_FOLDER = re.compile(r"^[A-Za-z0-9_]+$")


class ReleaseError(Exception):
    """A step cannot run: the message says what is missing and how to fix it."""


# ---------------------------------------------------------------- arguments


def check_version(version: str) -> str:
    """vLLM's major.minor of a full version ("0.35.0" -> "0.35"); ReleaseError otherwise."""
    match = _FULL_VERSION.match(version)
    if match is None:
        raise ReleaseError(f"version {version!r}: give vLLM's full release version, e.g. 0.35.0")
    return f"{int(match[1])}.{int(match[2])}"


def check_folder(name: str) -> Path:
    """tests/conformance/NAME for a plain folder name; ReleaseError otherwise."""
    if not _FOLDER.match(name):
        raise ReleaseError(f"folder {name!r}: give a folder name under tests/conformance "
                           "(letters, digits, _), e.g. vllm_0_35")
    path = HERE / name
    if path.exists() and not path.is_dir():
        raise ReleaseError(f"folder {name!r}: {path} exists and is not a folder; pick another name")
    return path


def default_venv(minor_version: str) -> Path:
    """The reference venv of a release: 0.33's is the shared one (KVSCHED_REFERENCE_PYTHON),
    later ones ~/.cache/kvsched-reference/venv-X.Y (or release_goldens.py's variable)."""
    if minor_version == cv.BASE_VERSION:
        given = os.environ.get("KVSCHED_REFERENCE_PYTHON")
        shared = Path.home() / ".cache/kvsched-reference/venv/bin/python"
        python = Path(given).expanduser() if given else shared
    else:
        python = regen.default_python(minor_version)
    return python.parent.parent


# ---------------------------------------------------------------- (a) the venv


def listed_versions(pip_index_output: str) -> tuple[str, ...]:
    """The versions in ``pip index versions vllm``'s output ("Available versions: a, b")."""
    for line in pip_index_output.splitlines():
        if line.startswith("Available versions:"):
            return tuple(v.strip() for v in line.split(":", 1)[1].split(",") if v.strip())
    return ()


def check_on_index(version: str, listed: Sequence[str]) -> None:
    """ReleaseError unless ``version`` is among the index's vLLM versions."""
    if version in listed:
        return
    newest = f"the newest there is {listed[0]}" if listed else "the index lists no vllm at all"
    raise ReleaseError(f"vllm {version} is not on the package index ({newest}); wait for the release's "
                       "wheel, or point pip at an index that has it")


def index_versions() -> tuple[str, ...]:
    """Ask the package index which vLLM releases it has (one query)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise ReleaseError(f"pip index versions vllm failed: {proc.stderr.strip()[-500:]}")
    return listed_versions(proc.stdout)


def scaffold_replacements(old: str, new: str) -> tuple[tuple[str, str], ...]:
    """The version strings a drivers folder names its release by (old, new: major.minor),
    as (text, replacement): the full version, the folder names, the venv and cache names."""
    o, n = old.replace(".", "_"), new.replace(".", "_")
    return ((f'"{old}.0"', f'"{new}.0"'), (f"vllm_{o}", f"vllm_{n}"), (f"goldens_{o}", f"goldens_{n}"),
            (f"venv-{old}", f"venv-{new}"), (f"vllm-{old}-cache", f"vllm-{new}-cache"))


def scaffold(src: Path, dst: Path, old: str, new: str) -> list[str]:
    """Copy DRIVER_FILES from ``src`` into a new ``dst``, their release's version strings
    rewritten; returns the files written. ReleaseError if ``dst`` exists or ``src`` lacks one."""
    if dst.exists():
        raise ReleaseError(f"{dst} exists; scaffold only creates a new drivers folder")
    missing = [f for f in DRIVER_FILES if not (src / f).is_file()]
    if missing:
        raise ReleaseError(f"{src} has no {missing[0]}; give --from the previous release's drivers folder")
    dst.mkdir(parents=True)
    for name in DRIVER_FILES:
        text = (src / name).read_text()
        for a, b in scaffold_replacements(old, new):
            text = text.replace(a, b)
        (dst / name).write_text(text)
    return list(DRIVER_FILES)


def build_venv(version: str, venv: Path, requirements: Path) -> None:
    proc = subprocess.run(["bash", str(SETUP), str(venv), version, str(requirements)])
    if proc.returncode:
        raise ReleaseError(f"setup.sh failed (exit {proc.returncode}); its output above says why")


# ---------------------------------------------------------------- (b) the source diff


@dataclass(frozen=True, slots=True)
class FileDiff:
    """One scheduler-path file between two releases."""

    path: str                 # relative to vllm/
    status: str               # "changed", "unchanged", "added", "removed"
    old_lines: int
    new_lines: int
    added: int                # lines only in the new release's file
    removed: int              # lines only in the old release's file
    diff: str                 # the unified diff ("" when unchanged)


@dataclass(frozen=True, slots=True)
class SourceDiff:
    old_version: str
    new_version: str
    files: tuple[FileDiff, ...]

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    def markdown(self) -> str:
        """The summary: counts, then one row per file (changed ones first)."""
        order = {"changed": 0, "added": 1, "removed": 2, "unchanged": 3}
        rows = sorted(self.files, key=lambda f: (order[f.status], f.path))
        added, removed = sum(f.added for f in self.files), sum(f.removed for f in self.files)
        lines = [
            f"# vLLM {self.old_version} -> {self.new_version}: scheduler-path sources",
            "",
            f"Written by tests/conformance/new_release.py diff. {len(self.files)} files: "
            f"{self.count('changed')} changed, {self.count('unchanged')} unchanged, "
            f"{self.count('added')} added, {self.count('removed')} removed; "
            f"+{added} / -{removed} lines.",
            "",
            f"| file (vllm/) | status | lines {self.old_version} | lines {self.new_version} | + | - |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [f"| {f.path} | {f.status} | {f.old_lines} | {f.new_lines} | {f.added} | {f.removed} |"
                  for f in rows]
        return "\n".join(lines) + "\n"

    def unified(self) -> str:
        return "".join(f.diff for f in sorted(self.files, key=lambda f: f.path))


def matching_files(root: Path, patterns: Iterable[str]) -> set[str]:
    """The files under ``root`` matching any pattern, relative to it (posix)."""
    found: set[str] = set()
    for pattern in patterns:
        found.update(p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file())
    return found


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def diff_sources(old_root: Path, new_root: Path, old_version: str, new_version: str,
                 patterns: Iterable[str] = SCHEDULER_PATH) -> SourceDiff:
    """Every file matching ``patterns`` in either vllm/ tree, compared line by line."""
    patterns = tuple(patterns)
    for root in (old_root, new_root):
        if not root.is_dir():
            raise ReleaseError(f"{root} is not a folder: give an installed vllm package (site-packages/vllm)")
    files = []
    for rel in sorted(matching_files(old_root, patterns) | matching_files(new_root, patterns)):
        old_path, new_path = old_root / rel, new_root / rel
        old = _read_lines(old_path) if old_path.is_file() else []
        new = _read_lines(new_path) if new_path.is_file() else []
        text = "".join(difflib.unified_diff(old, new, f"{old_version}/vllm/{rel}",
                                            f"{new_version}/vllm/{rel}"))
        if text and not text.endswith("\n"):
            text += "\n"
        plus = sum(1 for line in text.splitlines() if line.startswith("+") and not line.startswith("+++"))
        minus = sum(1 for line in text.splitlines() if line.startswith("-") and not line.startswith("---"))
        status = ("added" if not old_path.is_file() else "removed" if not new_path.is_file()
                  else "changed" if text else "unchanged")
        files.append(FileDiff(rel, status, len(old), len(new), plus, minus, text))
    return SourceDiff(old_version, new_version, tuple(files))


def vllm_package(venv: Path) -> Path:
    """site-packages/vllm of a venv; ReleaseError naming the venv when there is none."""
    found = sorted(venv.glob("lib/python*/site-packages/vllm"))
    if len(found) != 1:
        raise ReleaseError(f"no vllm package in {venv} (found {len(found)}); build it with "
                           "new_release.py venv VERSION FOLDER, or give --old-venv / --new-venv")
    return found[0]


def installed_version(package: Path) -> str:
    """The version in the vllm-*.dist-info beside ``package``."""
    infos = sorted(package.parent.glob("vllm-*.dist-info"))
    if len(infos) != 1:
        raise ReleaseError(f"{package.parent}: expected one vllm-*.dist-info, found {len(infos)}")
    return infos[0].name[len("vllm-"):-len(".dist-info")]


# ---------------------------------------------------------------- (c) the goldens


_DRIVERS = re.compile(r"^vllm_(\d+)_(\d+)$")


def release_only_folders(minor_version: str, drivers: Path, conformance: Path = HERE) -> list[Path]:
    """The scenario subfolders of ``drivers`` and of every earlier release's drivers
    folder (vllm_X_Y/), oldest release first: a release replays the scenarios written
    for the releases before it too."""
    target = tuple(int(x) for x in minor_version.split("."))
    chosen = {drivers.resolve()}
    for path in conformance.glob("vllm_*"):
        match = _DRIVERS.match(path.name)
        if match and path.is_dir() and (int(match[1]), int(match[2])) < target:
            chosen.add(path.resolve())
    folders: list[Path] = []
    for path in sorted(chosen, key=lambda p: _release_key(p.name)):
        folders.extend(regen.scenario_folders(path))
    return folders


def _release_key(name: str) -> tuple[int, int, str]:
    match = _DRIVERS.match(name)
    return (int(match[1]), int(match[2]), name) if match else (10**9, 0, name)


# ---------------------------------------------------------------- the commands


def cmd_venv(args: argparse.Namespace, minor: str, folder: Path) -> int:
    check_on_index(args.version, index_versions())
    if not folder.exists():
        source = check_folder(args.from_folder)
        previous = source.name.removeprefix("vllm_").replace("_", ".")
        check_version(previous + ".0")
        written = scaffold(source, folder, previous, minor)
        print(f"scaffolded {folder.relative_to(cv.REPO)}: {', '.join(written)} (from {source.name})")
    venv = args.venv or default_venv(minor)
    build_venv(args.version, venv, folder / "requirements.txt")
    print(f"next: python tests/conformance/new_release.py diff {args.version} {folder.name}")
    return 0


def cmd_diff(args: argparse.Namespace, minor: str, folder: Path) -> int:
    against = check_version(args.against)
    old_pkg = vllm_package(args.old_venv or default_venv(against))
    new_pkg = vllm_package(args.new_venv or default_venv(minor))
    versions = (installed_version(old_pkg), installed_version(new_pkg))
    if versions != (args.against, args.version):
        raise ReleaseError(f"the venvs hold vllm {versions[0]} and {versions[1]}, not {args.against} and "
                           f"{args.version}; give --old-venv / --new-venv")
    report = diff_sources(old_pkg, new_pkg, args.against, args.version)
    out = args.out or folder
    out.mkdir(parents=True, exist_ok=True)
    stem = "source_diff_" + against.replace(".", "_")
    (out / f"{stem}.md").write_text(report.markdown())
    (out / f"{stem}.diff").write_text(report.unified())
    print(report.markdown().splitlines()[2])
    print(f"wrote {out / (stem + '.md')} and {stem}.diff")
    return 0


def cmd_goldens(args: argparse.Namespace, minor: str, folder: Path) -> int:
    try:
        plan = regen.make_plan(minor, python=args.venv / "bin" / "python" if args.venv else None,
                               drivers=folder, extra=release_only_folders(minor, folder))
    except ValueError as e:
        raise ReleaseError(str(e)) from None
    if not plan.python.is_file():
        raise ReleaseError(f"no vLLM {minor} environment at {plan.python}; run new_release.py venv first")
    for script in ("oracle.py", "engine_oracle.py", "dp_goldens.py"):
        if not (folder / script).is_file():
            raise ReleaseError(f"no {script} in {folder}; run new_release.py venv first (it scaffolds it)")
    unknown = [f for f in args.only or () if f not in plan.folders]
    if unknown:
        raise ReleaseError(f"--only {unknown[0]!r}: use one of {', '.join(plan.folders)}")
    for line in cv.summary(regen.regenerate(plan, args.only)):
        print(f"against {cv.BASE_VERSION}: {line}")
    against = cv.release(check_version(args.against))
    if against.goldens.is_dir() and against.version != minor:
        for line in cv.summary(cv.compare_all(plan.release, against)):
            print(f"against {against.version}: {line}")
    return 0


COMMANDS = {"venv": cmd_venv, "diff": cmd_diff, "goldens": cmd_goldens}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        p = sub.add_parser(name)
        p.add_argument("version", help="vLLM's full version, e.g. 0.35.0")
        p.add_argument("folder", help="the release's drivers folder under tests/conformance, e.g. vllm_0_35")
        p.add_argument("--venv", type=Path, help="the release's reference venv (default "
                       "~/.cache/kvsched-reference/venv-X.Y)")
        if name == "venv":
            p.add_argument("--from", dest="from_folder", default=DRIVERS_034.name,
                           help="the drivers folder to scaffold from (default vllm_0_34)")
        if name in ("diff", "goldens"):
            p.add_argument("--against", default="0.34.0", help="the release to compare with (default 0.34.0)")
        if name == "diff":
            p.add_argument("--old-venv", type=Path, help="--against's venv (default its reference venv)")
            p.add_argument("--new-venv", type=Path, help="the release's venv (default --venv's)")
            p.add_argument("--out", type=Path, help="where the report goes (default FOLDER)")
        if name == "goldens":
            p.add_argument("--only", action="append", help="just these corpus folders (repeat)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        minor = check_version(args.version)
        folder = check_folder(args.folder)
        if args.command == "diff" and args.new_venv is None:
            args.new_venv = args.venv
        return COMMANDS[args.command](args, minor, folder)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
