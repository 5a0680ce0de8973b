"""What the trace parsers share: reading a file as text, the file-and-line
of an error, and checked fields (integers, times, JSON lines and keys)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvsched import files
from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import json_problem, show, strict_loads
from kvsched.sim.workload.limits import MAX_ARRIVAL_TIME, MAX_REQUEST_TOKENS, TOKENS_WHY
from kvsched.sim.workload.model import Workload, WorkloadRequest
from kvsched.sim.workload.tokens import UNIQUE_TOKEN_BASE, PromptRuns


class Source:
    """Where a value came from, for error messages: file and line."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, line: int, message: str) -> UserInputError:
        return UserInputError(f"{self.path}, line {line}: {message}")


# A trace file is read whole: 2 GiB at most (the largest public traces are
# a few hundred MB; more would not fit the simulator's memory anyway).
MAX_TRACE_BYTES = 2**31


def read_text(path: str | Path) -> tuple[Path, str]:
    """The file's text (kvsched's one bounded reader), or an error naming it.
    utf-8-sig: a byte-order mark (common in CSVs saved by spreadsheets) is
    not data."""
    p = Path(path)
    return p, files.read_text(p, MAX_TRACE_BYTES, "a workload trace", encoding="utf-8-sig",
                              fix="cut the trace into shorter files")


_INT_TEXT = re.compile(r"\s*[-+]?[0-9]+\s*")


def text_int(src: Source, line: int, column: str, text: str, minimum: int, why: str) -> int:
    # int() alone would also take '1_000'; a trace column holds plain digits.
    if not _INT_TEXT.fullmatch(text):
        raise src.error(line, f"{column}={show(text)} is not an integer")
    if len(text.strip().lstrip("+-").lstrip("0")) > 20:  # before int(): it refuses 4,300 digits
        raise src.error(line, f"{column}={show(text.strip())} must be at most 2**40 ({TOKENS_WHY})")
    value = int(text)
    return bounded_int(src, line, column, value, minimum, why)


def bounded_int(src: Source, line: int, key: str, value: int, minimum: int, why: str) -> int:
    if value < minimum:
        raise src.error(line, f"{key}={show(value)} must be >= {minimum} ({why})")
    if value > MAX_REQUEST_TOKENS:
        raise src.error(line, f"{key}={show(value)} must be at most 2**40 ({TOKENS_WHY})")
    return value


def json_int(src: Source, line: int, key: str, value: object, minimum: int, why: str) -> int:
    if not is_int(value):
        raise src.error(line, f"{key}={show(value)} must be an integer")
    return bounded_int(src, line, key, value, minimum, why)


def json_time(src: Source, line: int, key: str, value: object, maximum: float, unit: str) -> float | int:
    # json.loads accepts NaN and Infinity; neither is a time. Compared, not
    # converted: a 400-digit integer is out of range, not an OverflowError.
    if not is_number(value) or not 0 <= value <= maximum:
        raise src.error(line, f"{key}={show(value)} must be a number in [0, {maximum:.4g}] {unit}")
    return value


class ArrivalClock:
    """The one owner of a trace's timestamp rules: rows in time order, none
    further from the first than the simulator's time span. ``per_second``
    is the trace's units in a second (Azure: ns, Mooncake: ms)."""

    __slots__ = ("per_second", "what", "t0", "prev", "prev_line")

    def __init__(self, per_second: float, what: str) -> None:
        self.per_second = per_second
        self.what = what          # "row" or "line": how the message names the previous one
        self.t0: float | None = None
        self.prev: float = 0
        self.prev_line = 0

    def seconds(self, src: Source, line: int, key: str, t: float) -> float:
        """``t`` (shown as ``key``) in seconds after the first row's."""
        if self.t0 is None:
            self.t0 = self.prev = t
        elif t < self.prev:
            raise src.error(line, f"{key} is earlier than the previous {self.what}'s "
                            f"(line {self.prev_line}); the trace must be in time order")
        seconds = (t - self.t0) / self.per_second
        if seconds > MAX_ARRIVAL_TIME:
            raise src.error(line, f"{key} is {seconds:.4g} s after the first request's, beyond the "
                            f"simulator's time span of {MAX_ARRIVAL_TIME:.0e} s (float64 times lose "
                            "step-time precision further out); split the trace")
        self.prev, self.prev_line = t, line
        return seconds


PROMPT_WHY = "a request needs at least one prompt token"
OUTPUT_WHY = "a request generates at least one token; vLLM has no zero-token generation"


def unique_prompt(index: int, num_tokens: int) -> PromptRuns:
    return ((UNIQUE_TOKEN_BASE + index, num_tokens),)


def build_request(src: Source, line: int, request_id: str, arrival: float, runs: PromptRuns,
                  output_len: int) -> WorkloadRequest:
    try:
        return WorkloadRequest(request_id, arrival, runs, output_len)
    except ValueError as e:  # the loaders check fields first; this is a backstop with the line
        raise src.error(line, str(e)) from None


def json_lines(src: Source, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue  # blank line (e.g. the trailing newline): holds no request
        try:
            obj = strict_loads(raw)
        except ValueError as e:
            raise src.error(line, json_problem(e)) from None
        if not isinstance(obj, dict):
            raise src.error(line, f"expected a JSON object, got {type(obj).__name__}")
        yield line, obj


def check_keys(src: Source, line: int, obj: dict[str, Any], keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise src.error(line, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(obj) - set(keys))
    if unknown:
        raise src.error(line, f"unknown field(s) {show(', '.join(unknown), 200)}; the fields are "
                        f"{', '.join(keys)}")


# One JSON-lines trace row as read: (arrival seconds, prompt runs, output tokens).
Row = tuple[float, PromptRuns, int]


def load_json_lines(path: str | Path, keys: tuple[str, ...], prefix: str,
                    read_row: Callable[[Source, int, dict[str, Any], int], Row],
                    max_concurrency: int | None) -> Workload:
    """A JSON-lines trace: every non-blank line an object with exactly
    ``keys``, read by ``read_row`` (source, line number, object, 0-based
    request index). Request ``i`` is ``{prefix}-{i}``; a file with no lines
    is refused."""
    p, text = read_text(path)
    src = Source(p)
    requests: list[WorkloadRequest] = []
    for line, obj in json_lines(src, text):
        check_keys(src, line, obj, keys)
        i = len(requests)
        arrival, runs, output_tokens = read_row(src, line, obj, i)
        requests.append(build_request(src, line, f"{prefix}-{i}", arrival, runs, output_tokens))
    if not requests:
        raise UserInputError(f"{p}: no requests (the file has no JSON lines)")
    return Workload(p.stem, tuple(requests), max_concurrency)
