"""--save-result's file as vllm bench serve names and writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.sim.results import ResultFile, parse_metadata, write_result

DATE = "20261127-031500"


def test_vllms_name_for_the_result_file(tmp_path: Path) -> None:
    auto = ResultFile(save_result="")
    assert auto.path("meta-llama/Llama-3.1-8B", 4.0, None, DATE) == (
        "kvsched-simulate-4.0qps-Llama-3.1-8B-20261127-031500.json")
    assert ResultFile(save_result="", label="mine").path("llama-3.1-8b", math.inf, 16, DATE) == (
        "mine-infqps-concurrency16-llama-3.1-8b-20261127-031500.json")
    assert auto.path("m", None, None, DATE) == "kvsched-simulate-traceqps-m-20261127-031500.json"
    named = ResultFile(save_result="", result_filename="r.json", result_dir=str(tmp_path / "out"))
    assert named.path("m", 1.0, None, DATE) == str(tmp_path / "out" / "r.json")
    assert (tmp_path / "out").is_dir()  # made, as vLLM's os.makedirs
    assert ResultFile(save_result="x.json").path("m", 1.0, None, DATE) == "x.json"
    assert not ResultFile().saves and ResultFile(append_result=True).saves


def test_metadata_and_header() -> None:
    pairs = parse_metadata(["version=0.3.3", " tp = 1 ", "note=a=b"])
    assert pairs == (("version", "0.3.3"), ("tp", "1"), ("note", "a=b"))
    assert ResultFile(metadata=pairs).header(DATE, "org/m") == {
        "date": DATE, "endpoint_type": "kvsched-simulate", "label": "kvsched-simulate",
        "tokenizer_id": "org/m",
        "version": "0.3.3", "tp": "1", "note": "a=b"}
    with pytest.raises(UserInputError, match="KEY=VALUE"):
        parse_metadata(["tp1"])


def test_append_writes_one_json_line_per_run(tmp_path: Path) -> None:
    path = str(tmp_path / "r.jsonl")
    write_result(path, {"a": 1, "rate": math.inf}, append=True)
    write_result(path, {"a": 2}, append=True)
    lines = Path(path).read_text().split("\n")
    assert [json.loads(line) for line in lines] == [{"a": 1, "rate": "inf"}, {"a": 2}]
