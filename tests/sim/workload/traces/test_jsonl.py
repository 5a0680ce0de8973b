"""The plain JSON-lines loader: sorted stably, ids in file order, bad lines named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.sim.workload import UNIQUE_TOKEN_BASE, load_jsonl


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_sorted_stably_and_ids_in_file_order(tmp_path: Path) -> None:
    lines = [{"arrival_time": 2.5, "input_tokens": 3, "output_tokens": 1},
             {"arrival_time": 0, "input_tokens": 4, "output_tokens": 2},
             {"arrival_time": 2.5, "input_tokens": 5, "output_tokens": 3}]
    path = write(tmp_path, "w.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    w = load_jsonl(path)
    assert [r.request_id for r in w.requests] == ["jsonl-1", "jsonl-0", "jsonl-2"]
    assert [r.arrival_time for r in w.requests] == [0.0, 2.5, 2.5]
    assert w.requests[0].prompt_token_ids() == [UNIQUE_TOKEN_BASE + 1] * 4


@pytest.mark.parametrize(("bad", "field"), [
    ('{"arrival_time": -1, "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": NaN, "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": "0", "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": 1, "input_tokens": 3}', "output_tokens"),
    ('{"arrival_time": 1, "input_tokens": 3, "output_tokens": 0}', "output_tokens"),
    ('{"arrival_time": 1, "input_tokens": 0, "output_tokens": 1}', "input_tokens"),
    ('{"arrival_time": 1, "input_tokens": 3, "output_token": 1}', "output_token"),
])
def test_bad_jsonl_lines(tmp_path: Path, bad: str, field: str) -> None:
    path = write(tmp_path, "bad.jsonl", '{"arrival_time": 0, "input_tokens": 3, "output_tokens": 1}\n' + bad)
    with pytest.raises(ValueError, match=rf"bad\.jsonl, line 2: .*{field}"):
        load_jsonl(path)
