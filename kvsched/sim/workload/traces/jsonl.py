"""Plain JSON-lines traces: ``{"arrival_time", "input_tokens", "output_tokens"}``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsched.sim.workload.limits import MAX_ARRIVAL_TIME
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.traces.source import (
    OUTPUT_WHY,
    PROMPT_WHY,
    Row,
    Source,
    json_int,
    json_time,
    load_json_lines,
    unique_prompt,
)

_JSONL_KEYS = ("arrival_time", "input_tokens", "output_tokens")


def load_jsonl(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """Plain JSON lines ``{"arrival_time" (s), "input_tokens", "output_tokens"}``.

    Lines may come in any time order: the workload sorts them (stably).
    Request ``i`` (0-based data line, file order) is ``jsonl-{i}``; every
    prompt is private to its request.
    """
    return load_json_lines(path, _JSONL_KEYS, "jsonl", _jsonl_row, max_concurrency)


def _jsonl_row(src: Source, line: int, obj: dict[str, Any], i: int) -> Row:
    arrival = float(json_time(src, line, "arrival_time", obj["arrival_time"], MAX_ARRIVAL_TIME,
                              "seconds (the simulator's time span)"))
    input_tokens = json_int(src, line, "input_tokens", obj["input_tokens"], 1, PROMPT_WHY)
    output_tokens = json_int(src, line, "output_tokens", obj["output_tokens"], 1, OUTPUT_WHY)
    return arrival, unique_prompt(i, input_tokens), output_tokens
