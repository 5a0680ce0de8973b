"""What the trace loaders share: a missing, empty or header-only file is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsched.sim.workload import load_azure, load_mooncake

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.csv: no such file \(expected a workload trace\)"):
        load_azure(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match=r"empty\.csv: empty file"):
        load_azure(write(tmp_path, "empty.csv", ""))
    with pytest.raises(ValueError, match=r"header\.csv: no data rows"):
        load_azure(write(tmp_path, "header.csv", HEADER))
    with pytest.raises(ValueError, match=r"blank\.jsonl: no requests"):
        load_mooncake(write(tmp_path, "blank.jsonl", "\n\n"))
