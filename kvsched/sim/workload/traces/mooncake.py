"""The Mooncake traces: JSON lines ``{"timestamp", "input_length",
"output_length", "hash_ids"}``, prompts made of shared 512-token blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsched.jsonfile import show
from kvsched.sim.workload.limits import MAX_TIMESTAMP_MS
from kvsched.sim.workload.model import Workload
from kvsched.sim.workload.tokens import HASH_BLOCK_TOKEN_BASE, MAX_HASH_ID, MOONCAKE_BLOCK_TOKENS, PromptRuns
from kvsched.sim.workload.traces.source import (
    OUTPUT_WHY,
    PROMPT_WHY,
    ArrivalClock,
    Row,
    Source,
    json_int,
    json_time,
    load_json_lines,
)

_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _mooncake_runs(src: Source, line: int, hash_ids: object, input_length: int) -> PromptRuns:
    if not isinstance(hash_ids, list):
        raise src.error(line, f"hash_ids={show(hash_ids)} must be a list of integers")
    expected = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise src.error(line, f"hash_ids has {len(hash_ids)} ids; input_length={input_length} is "
                        f"{expected} blocks of {MOONCAKE_BLOCK_TOKENS} tokens")
    if not all(type(h) is int and 0 <= h <= MAX_HASH_ID for h in hash_ids):
        j, h = next((j, h) for j, h in enumerate(hash_ids)
                    if not (type(h) is int and 0 <= h <= MAX_HASH_ID))
        raise src.error(line, f"hash_ids[{j}]={show(h)} must be an integer in [0, {MAX_HASH_ID}]")
    runs = [(HASH_BLOCK_TOKEN_BASE + h, MOONCAKE_BLOCK_TOKENS) for h in hash_ids]
    # The last block holds what remains of the prompt (1..512 tokens).
    last = input_length - (len(runs) - 1) * MOONCAKE_BLOCK_TOKENS
    runs[-1] = (runs[-1][0], last)
    return tuple(runs)


def load_mooncake(path: str | Path, *, max_concurrency: int | None = None) -> Workload:
    """A Mooncake trace: JSON lines ``{"timestamp" (ms), "input_length",
    "output_length", "hash_ids"}``.

    ``arrival_time`` = (timestamp - first timestamp) / 1000. ``hash_ids`` must
    name exactly ceil(input_length / 512) blocks (true of every row of the
    published conversation trace); the prompt is those blocks, the last one
    cut short (see the module docstring). Timestamps must not go backwards.
    Request ``i`` (0-based data line) is ``mooncake-{i}``.
    """
    clock = ArrivalClock(1000, "line")

    def row(src: Source, line: int, obj: dict[str, Any], i: int) -> Row:
        # Integer milliseconds: the clock subtracts exactly, then rounds once.
        t = json_time(src, line, "timestamp", obj["timestamp"], MAX_TIMESTAMP_MS,
                      "milliseconds (2**53: exact in a float)")
        arrival = clock.seconds(src, line, f"timestamp={t}", t)
        input_length = json_int(src, line, "input_length", obj["input_length"], 1, PROMPT_WHY)
        output_length = json_int(src, line, "output_length", obj["output_length"], 1, OUTPUT_WHY)
        return arrival, _mooncake_runs(src, line, obj["hash_ids"], input_length), output_length

    return load_json_lines(path, _MOONCAKE_KEYS, "mooncake", row, max_concurrency)
