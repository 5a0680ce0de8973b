"""The Azure LLM inference trace 2023 loader: the published traces, exact
timestamps, columns in any order, and bad rows named by file, line and field."""

from __future__ import annotations

import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, load_azure

TRACES = next((p for p in (Path(__file__).resolve().parents[4].parent / "shared" / "traces",
                         Path("/work/shared/traces")) if p.is_dir()),
              Path(__file__).resolve().parents[4].parent / "shared" / "traces")
CONV = TRACES / "azure_llm_2023_conv.csv"
CODE = TRACES / "azure_llm_2023_code.csv"

needs_traces = pytest.mark.skipif(not CONV.exists(), reason=f"shared traces not found in {TRACES}")


@pytest.fixture(scope="module")
def conv() -> Workload:
    return load_azure(CONV)


@pytest.fixture(scope="module")
def code() -> Workload:
    return load_azure(CODE)


def first_last_data_lines(path: Path) -> tuple[str, str]:
    lines = path.read_bytes().decode().splitlines()
    return lines[1], lines[-1]


def seconds_between_azure_stamps(a: str, b: str) -> Decimal:
    # A different route from the loader's: datetime on the whole seconds,
    # Decimal on the fraction.
    def split(stamp: str) -> tuple[datetime.datetime, Decimal]:
        whole, fraction = stamp.split(".")
        return datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S"), Decimal("0." + fraction)

    (ta, fa), (tb, fb) = split(a), split(b)
    return Decimal(int((tb - ta).total_seconds())) + fb - fa


@needs_traces
def test_azure_conv_trace(conv: Workload) -> None:
    assert len(conv) == 19_366
    assert conv.name == "azure_llm_2023_conv"
    first, last = first_last_data_lines(CONV)
    assert first == "2023-11-16 18:15:46.6805900,374,44"
    assert last == "2023-11-16 19:14:08.4025270,197,183"
    # By hand: 19:14:08.4025270 - 18:15:46.6805900 = 58 min 21.7219370 s.
    assert seconds_between_azure_stamps(first.split(",")[0], last.split(",")[0]) == Decimal("3501.7219370")
    assert conv.requests[0].arrival_time == 0.0
    assert conv.requests[-1].arrival_time == 3501.721937
    r0, rn = conv.requests[0], conv.requests[-1]
    assert (r0.request_id, r0.prompt_runs, r0.output_len) == ("azure-0", ((UNIQUE_TOKEN_BASE, 374),), 44)
    assert (rn.request_id, rn.num_prompt_tokens, rn.output_len) == ("azure-19365", 197, 183)
    assert conv.total_prompt_tokens == 22_361_870
    assert conv.total_output_tokens == 4_088_665
    assert conv.max_concurrency is None


@needs_traces
def test_azure_code_trace(code: Workload) -> None:
    assert len(code) == 8_819
    first, last = first_last_data_lines(CODE)
    assert seconds_between_azure_stamps(first.split(",")[0], last.split(",")[0]) == Decimal("3435.9480560")
    assert code.requests[-1].arrival_time == 3435.948056
    assert code.total_prompt_tokens == 18_059_974
    assert code.total_output_tokens == 245_896
    arrivals = [r.arrival_time for r in code.requests]
    assert arrivals == sorted(arrivals)


@needs_traces
def test_azure_token_totals_by_another_route(conv: Workload) -> None:
    rows = [line.split(",") for line in CONV.read_text().splitlines()[1:]]
    assert sum(int(r[1]) for r in rows) == conv.total_prompt_tokens
    assert sum(int(r[2]) for r in rows) == conv.total_output_tokens


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_timestamps_parsed_exactly(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                 "2023-11-16 23:59:59.9000001,5,1\r\n"
                 "2023-11-17 00:00:00.1,6,2\r\n"
                 "2023-11-17 00:00:02,7,3\r\n"
                 "\r\n")
    w = load_azure(path)
    # Each arrival is the exact difference rounded once to a float.
    assert [r.arrival_time for r in w.requests] == [0.0, 0.1999999, 2.0999999]
    assert [r.output_len for r in w.requests] == [1, 2, 3]


def test_azure_columns_in_any_order(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "GeneratedTokens,TIMESTAMP,ContextTokens\n9,2023-01-01 00:00:00,4\n")
    r = load_azure(path).requests[0]
    assert (r.num_prompt_tokens, r.output_len) == (4, 9)


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(("text", "line", "field"), [
    ("TIMESTAMP,ContextTokens\n" + OK_ROW, 1, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,abc,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,-5,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,0,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5,0\n", 3, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5,1_0\n", 3, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5\n", 3, "fields"),
    (HEADER + OK_ROW + "yesterday,5,4\n", 3, "TIMESTAMP"),
    (HEADER + OK_ROW + "2023-02-30 18:15:47.0,5,4\n", 3, "TIMESTAMP"),
    (HEADER + OK_ROW + "2023-11-16 18:15:40.0,5,4\n", 3, "TIMESTAMP"),
])
def test_bad_azure_rows_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(ValueError, match=rf"bad\.csv, line {line}: .*{field}"):
        load_azure(path)
