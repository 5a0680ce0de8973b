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


def test_both_traces_refuse_a_row_out_of_time_order_and_keep_the_first_as_zero(tmp_path: Path) -> None:
    # One rule (traces/source.py ArrivalClock) for both formats: arrivals
    # count from the first row, a row earlier than the one before is named
    # with both lines.
    azure = write(tmp_path, "a.csv", HEADER + "2023-11-16 18:15:46.600000,10,5\n"
                  "2023-11-16 18:15:47.100000,10,5\n2023-11-16 18:15:46.900000,10,5\n")
    with pytest.raises(ValueError, match=r"a\.csv.*line 4.*TIMESTAMP='2023-11-16 18:15:46.900000' is "
                                         r"earlier than the previous row's \(line 3\)"):
        load_azure(azure)
    ok = write(tmp_path, "b.csv",
               HEADER + "2023-11-16 18:15:46.600000,10,5\n2023-11-16 18:15:47.100000,10,5\n")
    assert [r.arrival_time for r in load_azure(ok).requests] == [0.0, 0.5]
    line = '{{"timestamp": {t}, "input_length": 10, "output_length": 5, "hash_ids": [1]}}\n'
    moon = write(tmp_path, "m.jsonl", line.format(t=1000) + line.format(t=3000) + line.format(t=2000))
    with pytest.raises(ValueError, match=r"m\.jsonl.*line 3.*timestamp=2000 is earlier than the previous "
                                         r"line's \(line 2\)"):
        load_mooncake(moon)
    good = write(tmp_path, "n.jsonl", line.format(t=1000) + line.format(t=3000))
    assert [r.arrival_time for r in load_mooncake(good).requests] == [0.0, 2.0]
