"""kvsched.scenario: scenario validation, the scripted fake model, the step loop."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.errors import CannotServe
from kvsched.scenario import (
    DEFAULT_TOKEN,
    load_scenario,
    next_token,
    parse_scenario,
    replay,
)
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION


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
    with pytest.raises(CannotServe, match="max_steps"):
        replay(parse_scenario(_scenario(max_steps=2)))


# -- the file's schema and bounds (issue 11) ------------------------------------------


def _file(tmp_path: Path, scenario: Any, name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(scenario))
    return str(path)


def _file_rejects(tmp_path: Path, scenario: Any, *substrings: str,
                  vllm_version: str = DEFAULT_VLLM_VERSION) -> str:
    path = _file(tmp_path, scenario)
    with pytest.raises(ValueError) as info:
        load_scenario(path, vllm_version)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for text in substrings:
        assert text in message, message
    return message


def test_a_request_without_prompt_token_ids_names_the_file_and_key(tmp_path: Path) -> None:
    scenario = _scenario()
    del scenario["requests"][1]["prompt_token_ids"]
    _file_rejects(tmp_path, scenario, "requests[1].prompt_token_ids: missing", "list of integers")


@pytest.mark.parametrize(("key", "suggestion"), [("max_token", "max_tokens"), ("prioirty", "priority")])
def test_misspelled_request_keys_suggest_the_valid_one(tmp_path: Path, key: str, suggestion: str) -> None:
    scenario = _scenario()
    scenario["requests"][1][key] = 3
    _file_rejects(tmp_path, scenario, f"requests[1].{key}: unknown key", f"did you mean {suggestion!r}")


@pytest.mark.parametrize(("where", "key", "suggestion"), [
    (None, "max_step", "max_steps"), ("scheduler", "max_num_seq", "max_num_seqs"),
    ("cache", "num_gpu_block", "num_gpu_blocks")])
def test_misspelled_keys_elsewhere(tmp_path: Path, where: str | None, key: str, suggestion: str) -> None:
    scenario = _scenario()
    (scenario if where is None else scenario[where])[key] = 4
    path = f"{where}.{key}" if where else key
    _file_rejects(tmp_path, scenario, f"{path}: unknown key", f"did you mean {suggestion!r}")


def test_unknown_abort_key(tmp_path: Path) -> None:
    _file_rejects(tmp_path, _scenario(aborts=[{"step": 1, "request_id": ["a"]}]),
                  "aborts[0].request_id: unknown key", "'request_ids'")


@pytest.mark.parametrize(("text", "path"), [
    ('"max_steps": 5, "max_steps": 6', "max_steps"),
    ('"cache": {"num_gpu_blocks": 16, "num_gpu_blocks": 8}', "cache.num_gpu_blocks"),
])
def test_duplicate_keys_are_an_error(tmp_path: Path, text: str, path: str) -> None:
    scenario = _scenario()
    del scenario["cache"]
    body = json.dumps(scenario)
    file = tmp_path / "dup.json"
    file.write_text(body[:-1] + ", " + text + ("" if "cache" in text else ', "cache": {"num_gpu_blocks": 16}')
                    + "}")
    with pytest.raises(ValueError, match=rf"dup\.json: {path}: the key appears twice"):
        load_scenario(str(file))


def test_a_duplicate_key_inside_a_request(tmp_path: Path) -> None:
    file = tmp_path / "dup.json"
    file.write_text(json.dumps(_scenario()).replace('"max_tokens": 2', '"max_tokens": 2, "max_tokens": 9'))
    with pytest.raises(ValueError, match=r"requests\[1\]\.max_tokens: the key appears twice .*2 and 9"):
        load_scenario(str(file))


def test_num_gpu_blocks_is_bounded_before_anything_is_allocated(tmp_path: Path) -> None:
    # 10**9 blocks was a MemoryError traceback.
    _file_rejects(tmp_path, _scenario(cache={"num_gpu_blocks": 10**9}),
                  "cache.num_gpu_blocks=1000000000", "<= 2**21", "give an integer in [2, 2**21]")


def test_a_far_arrival_step_cannot_hang_the_replay(tmp_path: Path) -> None:
    # arrival_step 1e12 with max_steps 1e13 looped for ever.
    scenario = _with_request_field("arrival_step", 10**12)
    scenario["max_steps"] = 10**13
    _file_rejects(tmp_path, scenario, "max_steps=10000000000000", "<= 10**7")
    scenario["max_steps"] = 10**7
    _file_rejects(tmp_path, scenario, "requests[0].arrival_step=1000000000000", "max_steps=10000000")
    scenario["requests"][0]["arrival_step"] = 10**7  # the replay would stop at max_steps first
    _file_rejects(tmp_path, scenario, "requests[0].arrival_step", "below max_steps")
    scenario["aborts"] = [{"step": 10**7, "request_ids": ["a"]}]
    scenario["requests"][0]["arrival_step"] = 0
    _file_rejects(tmp_path, scenario, "aborts[0].step", "below max_steps")


def test_an_idle_stretch_is_skipped_without_a_trace() -> None:
    scenario = parse_scenario(_scenario(max_steps=10**7, requests=[
        {"request_id": "a", "prompt_token_ids": [1, 2], "max_tokens": 2, "arrival_step": 10**7 - 3}]))
    result = replay(scenario)
    assert result.steps == 10**7 - 1
    # Stepping through all of them took minutes: one idle step, then the
    # request's own steps.
    assert result.steps_scheduled <= 5


def _trace(scenario: dict[str, Any], skip_idle: bool) -> tuple[int, str]:
    out = io.StringIO()
    result = replay(parse_scenario(copy.deepcopy(scenario)), out, skip_idle=skip_idle)
    return result.steps, out.getvalue()


@pytest.mark.parametrize("interval", [1, 3])
def test_skipping_idle_steps_writes_the_same_trace(interval: int) -> None:
    scenario = _scenario(
        requests=[
            {"request_id": "a", "prompt_token_ids": [1, 2, 3, 4, 5], "max_tokens": 3},
            {"request_id": "b", "prompt_token_ids": [5, 6], "max_tokens": 4, "arrival_step": 40},
            {"request_id": "c", "prompt_token_ids": [7, 8, 9], "max_tokens": 2, "arrival_step": 41},
            {"request_id": "d", "prompt_token_ids": [1, 2, 3, 4, 5, 6], "max_tokens": 2,
             "arrival_step": 5000}],
        aborts=[{"step": 20, "request_ids": ["zz"]}, {"step": 41, "request_ids": ["b"]},
                {"step": 6000, "request_ids": []}],
        prefill_schedule_interval=interval)
    steps, skipped = _trace(scenario, True)
    assert (steps, skipped) == _trace(scenario, False)
    assert steps == 6001 and len(skipped.splitlines()) == 6001


def test_invalid_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(_scenario()).encode().replace(b'"a"', b'"\xe9"'))
    with pytest.raises(ValueError,
                       match=r"latin1\.json: not UTF-8 text \(byte 0xe9 at offset \d+\); save it as UTF-8"):
        load_scenario(str(path))


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1" * 5000])
def test_non_json_numbers_name_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "n.json"
    path.write_text(json.dumps(_scenario()).replace('"max_tokens": 3', f'"max_tokens": {text}'))
    with pytest.raises(ValueError, match=r"n\.json: not valid JSON"):
        load_scenario(str(path))


def test_deep_nesting_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match=r"deep\.json: .*nested too deeply"):
        load_scenario(str(path))


WRONG_VALUES: list[tuple[str, str, Any, str]] = [
    # (object, key, value, expected text)
    ("request", "max_tokens", True, "requests[0].max_tokens=true: must be an integer, not a boolean"),
    ("request", "max_tokens", "8", "requests[0].max_tokens='8': must be an integer, not a string"),
    ("request", "max_tokens", 8.0, "requests[0].max_tokens=8.0: must be an integer"),
    ("request", "max_tokens", None, "requests[0].max_tokens=null"),
    ("request", "max_tokens", 0, "requests[0].max_tokens=0: must be >= 1"),
    ("request", "max_tokens", 2**31, "requests[0].max_tokens=2147483648: must be <= 2**31 - 1"),
    ("request", "min_tokens", -1, "requests[0].min_tokens=-1: must be >= 0"),
    ("request", "min_tokens", 4, "requests[0].min_tokens=4: exceeds max_tokens=3"),
    ("request", "priority", 10**30, "requests[0].priority=an integer of 31 digits: must be <= 2**31 - 1"),
    ("request", "arrival_step", -2, "requests[0].arrival_step=-2: must be >= 0"),
    ("request", "arrival_time", -5, "requests[0].arrival_time=-5: is out of range"),
    ("request", "arrival_time", 1e300, "requests[0].arrival_time=1e+300: is out of range"),
    ("request", "arrival_time", 10**400, "requests[0].arrival_time=an integer of 401 digits"),
    ("request", "prompt_token_ids", [], "requests[0].prompt_token_ids=[]: is empty"),
    ("request", "prompt_token_ids", "abc", "requests[0].prompt_token_ids='abc': must be a list"),
    ("request", "prompt_token_ids", [1, -3], "requests[0].prompt_token_ids[1]=-3: is out of range"),
    ("request", "prompt_token_ids", [2**31], "requests[0].prompt_token_ids[0]=2147483648: is out of range"),
    ("request", "prompt_token_ids", [1, None], "requests[0].prompt_token_ids[1]=null: must be an integer"),
    ("request", "prompt_token_ids", [1, True], "requests[0].prompt_token_ids[1]=true: must be an integer"),
    ("request", "prompt_token_ids", [1, 2.0], "requests[0].prompt_token_ids[1]=2.0: must be an integer"),
    ("request", "sampled_token_ids", [-1], "requests[0].sampled_token_ids[0]=-1: is out of range"),
    ("request", "stop_token_ids", [10**12], "requests[0].stop_token_ids[0]=1000000000000: is out of range"),
    ("request", "eos_token_id", -1, "requests[0].eos_token_id=-1: must be a token id"),
    ("request", "ignore_eos", 0, "requests[0].ignore_eos=0: must be true or false"),
    ("request", "request_id", "", "requests[0].request_id='': must be a non-empty string"),
    ("scheduler", "max_num_seqs", -4, "scheduler.max_num_seqs=-4: must be >= 1"),
    # The bound kvsched simulate's --max-num-seqs shares (kvsched.config.MAX_STEP_LIMIT).
    ("scheduler", "max_num_seqs", 2**24 + 1, "scheduler.max_num_seqs=16777217: must be <= 2**24"),
    ("scheduler", "max_model_len", 2**40, "scheduler.max_model_len=1099511627776: must be <= 2**24"),
    ("scheduler", "max_num_batched_tokens", None, "scheduler.max_num_batched_tokens=null"),
    ("scheduler", "long_prefill_token_threshold", -1, "scheduler.long_prefill_token_threshold=-1"),
    ("scheduler", "policy", None, "scheduler.policy=null: unknown scheduling policy"),
    ("cache", "block_size", 0, "cache.block_size=0: must be >= 1"),
    ("cache", "block_size", 2**20, "cache.block_size=1048576: must be <= 2**12"),
    ("cache", "num_gpu_blocks", -16, "cache.num_gpu_blocks=-16: must be >= 2"),
    ("cache", "num_gpu_blocks", 1e9, "cache.num_gpu_blocks=1000000000.0: must be an integer"),
    ("top", "max_steps", 0, "max_steps=0: must be >= 1"),
    ("top", "max_steps", 1e6, "max_steps=1000000.0: must be an integer"),
    ("top", "requests", None, "requests=null: must be a list"),
    ("top", "cache", [], "cache=[]: must be a JSON object"),
    ("top", "description", 5, "description=5: must be a string"),
    ("top", "prefill_schedule_interval", 0, "prefill_schedule_interval=0: must be >= 1"),
]


@pytest.mark.parametrize(("where", "key", "value", "expected"), WRONG_VALUES,
                         ids=[f"{w}.{k}={v!r:.20}" for w, k, v, _ in WRONG_VALUES])
def test_wrong_values_are_one_clear_error(tmp_path: Path, where: str, key: str, value: Any,
                                          expected: str) -> None:
    scenario = _scenario()
    target = {"request": scenario["requests"][0], "top": scenario}.get(where) or scenario[where]
    target[key] = value
    _file_rejects(tmp_path, scenario, expected, "; ")


def test_a_missing_cache_or_requests_is_named(tmp_path: Path) -> None:
    scenario = _scenario()
    del scenario["cache"]
    _file_rejects(tmp_path, scenario, "cache: missing")
    scenario = _scenario()
    del scenario["requests"]
    _file_rejects(tmp_path, scenario, "requests: missing")


def test_the_features_switched_off_are_accepted() -> None:
    scenario = _scenario(async_scheduling=False, speculative=None)
    scenario["requests"][0].update(accepted_drafts=[], proposed_drafts=[], lora_id=0)
    scenario["requests"][1]["lora_id"] = None
    assert _replay(scenario)[1] == _replay(_scenario())[1]


def test_feature_traces_carry_spec_and_processed() -> None:
    records = _replay(_scenario(async_scheduling=True,
                                speculative={"num_speculative_tokens": 2}))[1]
    assert all("spec" in r and "processed" in r for r in records)
    assert not any("spec" in r or "processed" in r for r in _replay(_scenario())[1])
    # The async method defaults to ngram_gpu (vLLM 0.33 refuses ngram there).
    assert parse_scenario(_scenario(async_scheduling=True, speculative={
        "num_speculative_tokens": 2})).speculative_config.method == "ngram_gpu"  # type: ignore[union-attr]


def test_bad_feature_settings_are_named(tmp_path: Path) -> None:
    _file_rejects(tmp_path, _scenario(async_scheduling="yes"), "async_scheduling='yes'",
                  "true or false")
    _file_rejects(tmp_path, _scenario(speculative={"num_speculative_tokens": 0}),
                  "speculative.num_speculative_tokens=0")
    _file_rejects(tmp_path, _scenario(speculative={"num_speculative_tokens": 2, "methd": "x"}),
                  "speculative.methd: unknown key", "'method'")
    _file_rejects(tmp_path, _scenario(speculative={"num_speculative_tokens": 2, "method": "mtp"}),
                  "speculative.method='mtp'", "ngram")
    _file_rejects(tmp_path, _scenario(max_loras="2"), "max_loras='2'")
    _file_rejects(tmp_path, _scenario(max_loras=0), "max_loras=0")
    # vLLM 0.33 refuses the CPU n-gram proposer under async scheduling (0.34 runs it).
    _file_rejects(tmp_path, _scenario(async_scheduling=True, speculative={
        "num_speculative_tokens": 2, "method": "ngram"}), "method='ngram'", "ngram_gpu", vllm_version="0.33")
    scenario = _scenario()
    scenario["requests"][0]["lora_id"] = 3
    _file_rejects(tmp_path, scenario, "requests[0].lora_id=3", "max_loras")
    scenario = _scenario()
    scenario["requests"][0]["accepted_drafts"] = [1, "2"]
    _file_rejects(tmp_path, scenario, "requests[0].accepted_drafts")


def test_settings_vllm_cannot_run_with_drafts_are_refused(tmp_path: Path) -> None:
    # A budget below 1 + K never admits a padded request (vLLM spins), and a
    # threshold below 1 + K cuts the padding (vLLM fails an assertion).
    spec = {"num_speculative_tokens": 4}
    scenario = _scenario(speculative=spec)
    scenario["scheduler"].update(max_num_batched_tokens=4, max_num_seqs=4)
    path = _file(tmp_path, scenario)
    with pytest.raises(ValueError) as info:
        replay(load_scenario(str(path)))
    assert str(info.value).startswith(str(path)) and "max_num_batched_tokens=4" in str(info.value)
    scenario = _scenario(speculative=spec)
    scenario["scheduler"]["long_prefill_token_threshold"] = 3
    with pytest.raises(ValueError, match="long_prefill_token_threshold=3"):
        replay(parse_scenario(scenario))


def test_data_parallel_scenarios_parse_but_replay_refuses_them() -> None:
    scenario = _scenario(data_parallel_size=2, dp_sync_interval=4)
    scenario["requests"][0]["rank"] = 1
    parsed = parse_scenario(scenario)  # tests/conformance/test_dp_lockstep.py runs these
    assert parsed.data_parallel_size == 2
    with pytest.raises(ValueError, match="data_parallel_size=2: kvsched replay runs one scheduler"):
        replay(parsed)
    scenario["requests"][0]["rank"] = 2
    _rejects(scenario, "requests[0].rank=2", "data_parallel_size=2")
    one_rank = _scenario()
    one_rank["requests"][0]["rank"] = 1
    _rejects(one_rank, "requests[0].rank=1")


def test_the_cli_prints_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import main
    from kvsched.scenario import REQUEST_KEYS

    scenario = _scenario()
    scenario["requests"][1]["prioirty"] = 1
    path = _file(tmp_path, scenario)
    assert main(["replay", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"kvsched: error: {path}: requests[1].prioirty: unknown key; did you mean "
                            "'priority'? (the keys of a request: " + ", ".join(REQUEST_KEYS) + ")\n")


def test_a_refused_request_names_the_file_and_index(tmp_path: Path) -> None:
    scenario = _scenario(cache={"block_size": 4, "num_gpu_blocks": 4})
    scenario["requests"][1]["prompt_token_ids"] = list(range(40))
    path = _file(tmp_path, scenario)
    with pytest.raises(ValueError, match=rf"^{path}: requests\[1\]: "):
        replay(load_scenario(path))


# -- kv_connector ------------------------------------------------------------------


def _kv_scenario(connector: Any, **request_fields: Any) -> dict[str, Any]:
    scenario = _scenario()
    scenario["kv_connector"] = connector
    scenario["requests"][0].update(request_fields)
    return scenario


def test_scripted_connector_scenario_traces_its_keys() -> None:
    scenario = _kv_scenario({"type": "scripted"}, external_hit_tokens=[16], load_async=True)
    scenario["requests"] = scenario["requests"][:1]
    scenario["requests"][0]["prompt_token_ids"] = list(range(1, 21))
    scenario["cache"]["block_size"] = 16
    out = io.StringIO()
    replay(parse_scenario(scenario), out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["kv_load"] == {"a": [16, True]}
    assert lines[0]["waiting_for_remote_kvs"] == ["a"] and lines[0]["scheduled"] == []
    assert lines[0]["finished_recving"] == ["a"]
    assert lines[1]["scheduled"] == [["a", 4]]
    assert lines[1]["computed_at_admission"] == {"a": 16}


@pytest.mark.parametrize(("connector", "fields", "words"), [
    ({"type": "offloading"}, {}, ("kv_connector.num_cpu_blocks", "missing")),
    ({"type": "offloading", "num_cpu_blocks": 0}, {}, ("kv_connector.num_cpu_blocks",)),
    ({"type": "offloading", "num_cpu_blocks": 8, "eviction_policy": "fifo"}, {},
     ("kv_connector.eviction_policy", "unknown policy", "arc")),
    ({"type": "offloading", "num_cpu_blocks": 8, "store_steps": 0}, {}, ("kv_connector.store_steps",)),
    ({"type": "offloading", "num_cpu_blocks": 8}, {"external_hit_tokens": 16},
     ("external_hit_tokens", "scripted connector's")),
    ({"type": "offloading", "num_cpu_blocks": 8}, {"kv_transfer_params": 3},
     ("kv_transfer_params", "must be an object")),
    ({"type": "nixl", "pending_block_frees": True}, {}, ("pending_block_frees", "unknown key")),
    ({"type": "nixl"}, {"external_hit_tokens": 16}, ("external_hit_tokens", "scripted connector's")),
    ({"type": "nixl"}, {"load_async": True}, ("load_async", "scripted connector's")),
    ({"type": "nixl"}, {"load_fail": "request"}, ("load_fail", "true or false")),
    ({"type": "nixl"}, {"load_steps": [1, 2]}, ("load_steps",)),
    ({"type": "nixl"}, {"send_steps": 0}, ("send_steps", ">= 1")),
    ({"type": "nixl"}, {"kv_transfer_params": [True]}, ("kv_transfer_params", "must be an object")),
    ({"type": "magic"}, {}, ("kv_connector.type", "unknown connector type")),
    ({"type": "scripted", "kv_role": "kv_sideways"}, {}, ("kv_connector.kv_role", "unknown role")),
    ({"type": "scripted", "load_failure_policy": "retry"}, {}, ("load_failure_policy",)),
    ({"type": "scripted", "num_cpu_blocks": 4}, {}, ("num_cpu_blocks", "unknown key")),
    ({"type": "scripted"}, {"load_steps": 0}, ("load_steps", "an integer >= 1")),
    ({"type": "scripted"}, {"load_fail": "block"}, ("load_fail", "\"request\"")),
    ({"type": "scripted"}, {"external_hit_tokens": [16, -1]}, ("external_hit_tokens[1]", ">= 0")),
    ({"type": "scripted"}, {"send_steps": 0}, ("send_steps", ">= 1")),
    ({"type": "scripted"}, {"kv_transfer_params": {}}, ("kv_transfer_params", "nixl")),
])
def test_bad_kv_connector_settings_are_named(connector: dict[str, Any], fields: dict[str, Any],
                                             words: tuple[str, ...]) -> None:
    _rejects(_kv_scenario(connector, **fields), *words)


def test_connector_request_keys_need_a_connector() -> None:
    _rejects(_with_request_field("external_hit_tokens", 16), "external_hit_tokens",
             "needs a KV connector")
