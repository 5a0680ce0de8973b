"""The Azure LLM inference trace 2023 (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``)."""

from __future__ import annotations

import csv
import datetime
import io
import re
from collections.abc import Iterator
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.sim.workload.model import Workload, WorkloadRequest
from kvsched.sim.workload.traces.source import (
    OUTPUT_WHY,
    PROMPT_WHY,
    ArrivalClock,
    Source,
    build_request,
    read_text,
    text_int,
    unique_prompt,
)

# Azure: "2023-11-16 18:15:46.6805900" (7 fractional digits: more than %f takes).
_AZURE_TIME = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _azure_time_ns(src: Source, line: int, text: str) -> int:
    """Nanoseconds since 0001-01-01 as an exact integer (no float rounding)."""
    m = _AZURE_TIME.fullmatch(text)
    if m is None:
        raise src.error(line, f"TIMESTAMP={show(text)} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        days = datetime.date(year, month, day).toordinal()
    except ValueError as e:
        raise src.error(line, f"TIMESTAMP={text!r}: {e}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise src.error(line, f"TIMESTAMP={text!r}: time of day out of range")
    fraction = (m.group(7) or "").ljust(9, "0")
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second
    return seconds * 1_000_000_000 + int(fraction)


def _csv_rows(src: Source, text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # a NUL byte, a field over csv's size limit, a stray quote
            raise src.error(reader.line_num, f"not valid CSV: {e}") from None
        if row:  # csv yields [] for an empty line: no row there to drop
            yield reader.line_num, row


def _azure_header(src: Source, header: list[str]) -> tuple[int, int, int]:
    names = [h.strip() for h in header]
    for column in _AZURE_COLUMNS:
        if names.count(column) > 1:
            raise src.error(1, f"column {column!r} appears twice in the header")
    missing = [c for c in _AZURE_COLUMNS if c not in names]
    if missing:
        raise src.error(1, f"missing column(s) {', '.join(missing)}; the header has "
                        f"{show(', '.join(names), 200)} (expected {', '.join(_AZURE_COLUMNS)})")
    unknown = [n for n in names if n not in _AZURE_COLUMNS]
    if unknown:  # their values would be dropped unread
        raise src.error(1, f"unknown column(s) {show(', '.join(unknown), 200)}; the columns are "
                        f"{', '.join(_AZURE_COLUMNS)} (remove the others)")
    ts, ctx, gen = (names.index(c) for c in _AZURE_COLUMNS)
    return ts, ctx, gen


def load_azure(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """The Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    ``arrival_time`` = TIMESTAMP minus the first row's TIMESTAMP, computed
    exactly from the text (all fractional digits, up to nanoseconds) and then
    rounded once to a float. Timestamps must not go backwards (the published
    traces are sorted; an unsorted file is not the trace its first row
    dates). Request ``i`` (0-based data row) is ``azure-{i}``.
    """
    p, text = read_text(path)
    src = Source(p)
    rows = _csv_rows(src, text)
    first = next(rows, None)
    if first is None:
        raise UserInputError(f"{p}: empty file; expected the header {','.join(_AZURE_COLUMNS)}")
    header = first[1]
    ts_col, ctx_col, gen_col = _azure_header(src, header)
    requests: list[WorkloadRequest] = []
    clock = ArrivalClock(1e9, "row")
    for line, row in rows:
        if len(row) != len(header):
            raise src.error(line, f"{len(row)} fields, the header has {len(header)}")
        t = _azure_time_ns(src, line, row[ts_col])
        arrival = clock.seconds(src, line, f"TIMESTAMP={row[ts_col].strip()!r}", t)
        ctx = text_int(src, line, "ContextTokens", row[ctx_col], 1, PROMPT_WHY)
        gen = text_int(src, line, "GeneratedTokens", row[gen_col], 1, OUTPUT_WHY)
        i = len(requests)
        requests.append(build_request(src, line, f"azure-{i}", arrival, unique_prompt(i, ctx), gen))
    if not requests:
        raise UserInputError(f"{p}: no data rows after the header")
    return Workload(p.stem, tuple(requests), max_concurrency)
