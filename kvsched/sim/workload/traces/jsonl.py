"""Plain JSON-lines traces: ``{"arrival_time", "input_tokens", "output_tokens"}``."""

from __future__ import annotations

from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.sim.workload.limits import MAX_ARRIVAL_TIME
from kvsched.sim.workload.model import Workload, WorkloadRequest
from kvsched.sim.workload.traces.source import (
    OUTPUT_WHY,
    PROMPT_WHY,
    Source,
    build_request,
    check_keys,
    json_int,
    json_lines,
    json_time,
    read_text,
    unique_prompt,
)

_JSONL_KEYS = ("arrival_time", "input_tokens", "output_tokens")


def load_jsonl(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """Plain JSON lines ``{"arrival_time" (s), "input_tokens", "output_tokens"}``.

    Lines may come in any time order: the workload sorts them (stably).
    Request ``i`` (0-based data line, file order) is ``jsonl-{i}``; every
    prompt is private to its request.
    """
    p, text = read_text(path)
    src = Source(p)
    requests: list[WorkloadRequest] = []
    for line, obj in json_lines(src, text):
        check_keys(src, line, obj, _JSONL_KEYS)
        arrival = float(json_time(src, line, "arrival_time", obj["arrival_time"], MAX_ARRIVAL_TIME,
                                   "seconds (the simulator's time span)"))
        input_tokens = json_int(src, line, "input_tokens", obj["input_tokens"], 1, PROMPT_WHY)
        output_tokens = json_int(src, line, "output_tokens", obj["output_tokens"], 1, OUTPUT_WHY)
        i = len(requests)
        runs = unique_prompt(i, input_tokens)
        requests.append(build_request(src, line, f"jsonl-{i}", arrival, runs, output_tokens))
    if not requests:
        raise UserInputError(f"{p}: no requests (the file has no JSON lines)")
    return Workload(p.stem, tuple(requests), max_concurrency)
