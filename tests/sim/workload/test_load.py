"""load_workload: dispatch on a dataset name, and its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.sim.workload import load_workload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def mooncake_line(**fields: object) -> str:
    row: dict[str, object] = {"timestamp": 10, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
    row.update(fields)
    return json.dumps({k: v for k, v in row.items() if v is not None}) + "\n"


def test_load_workload_dispatch(tmp_path: Path) -> None:
    path = write(tmp_path, "w.jsonl", '{"arrival_time": 0, "input_tokens": 3, "output_tokens": 1}\n')
    assert load_workload("jsonl", path, max_concurrency=4).max_concurrency == 4
    w = load_workload("random", num_prompts=3, input_len=5, output_len=2)
    assert [r.num_prompt_tokens for r in w.requests] == [5, 5, 5]
    azure = write(tmp_path, "a.csv", HEADER + OK_ROW)
    assert load_workload("azure", azure).requests[0].output_len == 44
    moon = write(tmp_path, "m.jsonl", mooncake_line())
    assert load_workload("mooncake", str(moon)).requests[0].num_prompt_tokens == 600


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("vision-arena", "x.json"), {}, "unknown dataset name 'vision-arena'"),
    (("sharegpt", "x.json"), {"input_len": 5}, "unknown option"),
    (("azure",), {}, "needs dataset_path"),
    (("random", "x.csv"), {}, "reads no file"),
    (("random",), {"random_input_len": 5}, "unknown option"),
    (("jsonl", "x.jsonl"), {"seed": 1}, "unknown option"),
])
def test_load_workload_errors(args: tuple[str, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_workload(*args, **kwargs)
