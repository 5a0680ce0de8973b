"""kvsched.replay: scenario validation, the scripted fake model, the step loop."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.replay import (
    DEFAULT_TOKEN,
    load_scenario,
    next_token,
    parse_scenario,
    replay,
)


def _scenario(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64},
        "cache": {"block_size": 4, "num_gpu_blocks": 16},
        "requests": [
            {"request_id": "a", "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 3},
            {"request_id": "b", "prompt_token_ids": [5, 6], "max_tokens": 2},
        ],
    }
    base.update(overrides)
    return base


def _with_request_field(key: str, value: Any) -> dict[str, Any]:
    scenario = _scenario()
    scenario["requests"][0][key] = value
    return scenario


def _rejects(scenario: Any, *substrings: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_scenario(scenario)
    for text in substrings:
        assert text in str(info.value), str(info.value)


# -- parse_scenario --------------------------------------------------------------


def test_a_valid_scenario_parses_with_the_oracles_defaults() -> None:
    parsed = parse_scenario({"scheduler": {"max_num_seqs": 4}, "cache": {"num_gpu_blocks": 8},
                             "requests": []})
    sc, cc = parsed.scheduler_config, parsed.cache_config
    assert sc.max_num_seqs == 4
    assert sc.max_num_batched_tokens == 8192
    assert sc.enable_chunked_prefill is True
    assert sc.policy == "fcfs"
    assert sc.scheduler_reserve_full_isl is True
    assert (cc.num_gpu_blocks, cc.block_size, cc.enable_prefix_caching) == (8, 16, False)
    assert parsed.requests == [] and parsed.aborts == {}


def test_missing_num_gpu_blocks() -> None:
    _rejects(_scenario(cache={"block_size": 4}), "num_gpu_blocks")


@pytest.mark.parametrize("value", ["3", 2.5, None, True, [3]])
def test_non_integer_max_tokens(value: Any) -> None:
    _rejects(_with_request_field("max_tokens", value), "requests[0]", "max_tokens")


def test_missing_max_tokens() -> None:
    scenario = _scenario()
    del scenario["requests"][1]["max_tokens"]
    _rejects(scenario, "requests[1]", "max_tokens")


def test_duplicate_request_ids() -> None:
    scenario = _scenario()
    scenario["requests"][1]["request_id"] = "a"
    _rejects(scenario, "requests[1]", "request_id", "'a'", "duplicate")


@pytest.mark.parametrize("policy", ["lifo", 3])
def test_bad_policy(policy: Any) -> None:
    _rejects(_scenario(scheduler={"max_num_seqs": 4, "policy": policy}), "policy", str(policy))


BAD_FIELDS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "not an object": ([], ("scenario",)),
    "requests not a list": (_scenario(requests={"a": 1}), ("requests",)),
    "scheduler not an object": (_scenario(scheduler=[]), ("scheduler",)),
    "string max_num_seqs": (_scenario(scheduler={"max_num_seqs": "4"}), ("scheduler.max_num_seqs",)),
    "string chunked prefill": (_scenario(scheduler={"max_num_seqs": 4, "enable_chunked_prefill": "no"}),
                               ("enable_chunked_prefill",)),
    "one block": (_scenario(cache={"num_gpu_blocks": 1}), ("num_gpu_blocks", "1")),
    "int prefix caching": (_scenario(cache={"num_gpu_blocks": 8, "enable_prefix_caching": 1}),
                           ("enable_prefix_caching",)),
    "int request id": (_with_request_field("request_id", 7), ("requests[0].request_id",)),
    "string in prompt": (_with_request_field("prompt_token_ids", [1, "2"]),
                         ("requests[0].prompt_token_ids",)),
    "int stop ids": (_with_request_field("stop_token_ids", 6), ("requests[0].stop_token_ids",)),
    "float in script": (_with_request_field("sampled_token_ids", [1.5]),
                        ("requests[0].sampled_token_ids",)),
    "negative arrival step": (_with_request_field("arrival_step", -1), ("requests[0].arrival_step",)),
    "float priority": (_with_request_field("priority", 0.5), ("requests[0].priority",)),
    "string eos": (_with_request_field("eos_token_id", "2"), ("requests[0].eos_token_id",)),
    "string arrival time": (_with_request_field("arrival_time", "soon"),
                            ("requests[0].arrival_time",)),
    "aborts not a list": (_scenario(aborts={"step": 1}), ("aborts",)),
    "abort without ids": (_scenario(aborts=[{"step": 1}]), ("aborts[0]",)),
    "string abort step": (_scenario(aborts=[{"step": "1", "request_ids": ["a"]}]), ("aborts[0].step",)),
    "string max_steps": (_scenario(max_steps="10"), ("max_steps",)),
}


@pytest.mark.parametrize("name", list(BAD_FIELDS))
def test_other_bad_fields_are_named(name: str) -> None:
    scenario, substrings = BAD_FIELDS[name]
    _rejects(copy.deepcopy(scenario), *substrings)


def test_non_boolean_ignore_eos_is_rejected() -> None:
    _rejects(_with_request_field("ignore_eos", "false"), "requests[0].ignore_eos")


def test_non_string_abort_ids_are_rejected() -> None:
    scenario = _scenario(aborts=[{"step": 0, "request_ids": [["a"]]}])
    with pytest.raises(ValueError, match=r"aborts\[0\]"):
        replay(parse_scenario(scenario))


def test_load_scenario_names_the_file_on_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"scheduler": ')
    with pytest.raises(ValueError, match=r"broken\.json"):
        load_scenario(str(path))


# -- next_token -----------------------------------------------------------------------


def test_next_token_follows_the_script_then_defaults() -> None:
    spec = {"sampled_token_ids": [7, 8]}
    assert [next_token(spec, i) for i in range(4)] == [7, 8, DEFAULT_TOKEN, DEFAULT_TOKEN]
    assert DEFAULT_TOKEN == 100
    assert next_token({}, 0) == 100


def test_next_token_masks_eos_below_min_tokens() -> None:
    spec = {"sampled_token_ids": [7, 7, 7, 3], "eos_token_id": 7, "min_tokens": 2}
    assert [next_token(spec, i) for i in range(4)] == [100, 100, 7, 3]


def test_next_token_masks_stop_ids_below_min_tokens() -> None:
    spec = {"sampled_token_ids": [9, 4, 9], "stop_token_ids": [9], "min_tokens": 2}
    # Only stop tokens are masked; 4 passes through.
    assert [next_token(spec, i) for i in range(3)] == [100, 4, 9]


def test_next_token_does_not_mask_an_ignored_eos() -> None:
    spec = {"sampled_token_ids": [7, 9], "eos_token_id": 7, "ignore_eos": True,
            "stop_token_ids": [9], "min_tokens": 2}
    assert [next_token(spec, i) for i in range(2)] == [7, 100]


# -- replay ------------------------------------------------------------------------------


def _replay(scenario: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = io.StringIO()
    result = replay(parse_scenario(copy.deepcopy(scenario)), out)
    return result.summary(), [json.loads(line) for line in out.getvalue().splitlines()]


def test_replay_summary_and_trace() -> None:
    summary, trace = _replay(_scenario())
    assert set(summary) == {"engine", "steps", "preemptions", "scheduler_seconds"}
    assert summary["engine"] == "kvsched"
    # a: prefill + 1st token, then 2 decodes; b finishes a step earlier.
    assert summary["steps"] == 3
    assert summary["preemptions"] == 0
    assert isinstance(summary["scheduler_seconds"], float) and summary["scheduler_seconds"] >= 0
    assert [r["step"] for r in trace] == [0, 1, 2]
    assert trace[0]["scheduled"] == [["a", 4], ["b", 2]]
    assert trace[1]["finished"] == [["b", "length"]]
    assert trace[2]["finished"] == [["a", "length"]]
    assert trace[2]["num_free_blocks"] == 15


def test_replay_runs_idle_steps_until_the_last_arrival_and_abort() -> None:
    scenario = _scenario(requests=[{"request_id": "a", "prompt_token_ids": [1, 2, 3, 4],
                                    "max_tokens": 3, "arrival_step": 5}])
    summary, trace = _replay(scenario)
    assert summary["steps"] == 8  # steps 0-4 idle, then 5, 6, 7
    assert [r["scheduled"] for r in trace[:5]] == [[]] * 5
    scenario["aborts"] = [{"step": 10, "request_ids": ["a", "never-existed"]}]
    summary, trace = _replay(scenario)
    assert summary["steps"] == 11  # a finished at 7; the (ignored) abort is at step 10
    assert all(r["finished"] == [] for r in trace[8:])


def test_replay_counts_preemptions() -> None:
    # 3 usable blocks of 4. a (4 tokens), b (2) and c (4) take one each; a's
    # 5th token preempts c (step 1); a finishes and c resumes (step 2); b's 5th
    # token preempts c again (step 3); b finishes at step 7, c at step 13.
    scenario = _scenario(
        cache={"block_size": 4, "num_gpu_blocks": 4},
        requests=[
            {"request_id": "a", "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 2},
            {"request_id": "b", "prompt_token_ids": [5, 6], "max_tokens": 8},
            {"request_id": "c", "prompt_token_ids": [7, 8, 9, 10], "max_tokens": 8},
        ])
    summary, trace = _replay(scenario)
    assert (summary["steps"], summary["preemptions"]) == (14, 2)
    assert [r["step"] for r in trace if r["preempted"]] == [1, 3]
    assert [r["step"] for r in trace if r["resumed"]] == [2, 8]
    assert trace[-1]["finished"] == [["c", "length"]]


def test_replay_applies_aborts_before_scheduling() -> None:
    scenario = _scenario(aborts=[{"step": 1, "request_ids": ["a"]}])
    _summary, trace = _replay(scenario)
    assert ["a", "abort"] in trace[1]["finished"]
    assert "a" not in [rid for rid, _ in trace[1]["scheduled"]]


def test_replay_refuses_a_bad_request_before_the_first_step() -> None:
    scenario = _with_request_field("prompt_token_ids", list(range(64)))  # == max_model_len
    out = io.StringIO()
    with pytest.raises(ValueError, match="max_model_len"):
        replay(parse_scenario(scenario), out)
    assert out.getvalue() == ""


def test_replay_stops_at_max_steps() -> None:
    with pytest.raises(RuntimeError, match="max_steps"):
        replay(parse_scenario(_scenario(max_steps=2)))
