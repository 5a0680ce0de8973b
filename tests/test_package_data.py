"""Every data file the package reads ships with it: each file in a
``kvsched/<package>/data/`` folder matches a pattern of pyproject.toml's
``[tool.setuptools.package-data]`` for that package (a file that matched
none would be missing from an installed wheel and fail only there)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_data_file_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_data: dict[str, list[str]] = pyproject["tool"]["setuptools"]["package-data"]
    files = [p for p in (ROOT / "kvsched").glob("**/data/*") if p.is_file()]
    names = {p.relative_to(ROOT).as_posix() for p in files}
    # The catalogs this was written for; the check covers any data file.
    assert {"kvsched/perf/data/hardware.yaml", "kvsched/perf/data/models.yaml",
            "kvsched/validation/data/gpustack_runs.yaml"} <= names
    for path in files:
        data_dir = path.parent
        package = ".".join(data_dir.parent.relative_to(ROOT).parts)
        relative = path.relative_to(data_dir.parent).as_posix()
        patterns = package_data.get(package, [])
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), (relative, package, patterns)
