"""Reading request bodies: vLLM's sampling fields, and a 400 naming each bad one."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched.request import SamplingParams
from kvsched.serve.errors import ApiError
from kvsched.serve.protocol import (
    chat_logprobs,
    check_model,
    check_response_format,
    read_completion_prompt,
    read_n,
    read_stream,
    sampling_params,
)


def params(body: dict[str, Any], defaults: SamplingParams | None = None) -> SamplingParams:
    return sampling_params(body, defaults or SamplingParams(), "max_tokens", None, 100)


def test_fields_map_onto_sampling_params() -> None:
    p = params({"temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 3,
                "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
                "min_tokens": 2, "ignore_eos": True, "max_tokens": 9, "stop": "END",
                "stop_token_ids": [4, 5], "skip_special_tokens": False})
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0, 0.5, 7, 0.1, 3)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.min_tokens, p.ignore_eos, p.max_tokens) == (2, True, 9)
    assert p.stop == ("END",) and p.stop_token_ids == (4, 5) and p.skip_special_tokens is False


def test_left_out_fields_take_the_checkpoints_defaults_and_max_tokens_the_room_left() -> None:
    p = params({}, SamplingParams(temperature=0.6, top_p=0.9))
    assert (p.temperature, p.top_p, p.max_tokens) == (0.6, 0.9, 100)
    # null is "left out", as in OpenAI's API
    assert params({"temperature": None}, SamplingParams(temperature=0.6)).temperature == 0.6


def test_chat_reads_max_completion_tokens_first() -> None:
    body = {"max_completion_tokens": 5, "max_tokens": 9}
    assert sampling_params(body, SamplingParams(), "max_completion_tokens", None, 100).max_tokens == 5
    assert sampling_params({"max_tokens": 9}, SamplingParams(), "max_completion_tokens", None,
                           100).max_tokens == 9


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"temperature": True}, "temperature", "must be a number"),
    ({"top_k": 1.5}, "top_k", "must be an integer"),
    ({"max_tokens": -1}, "max_tokens", "at least 1"),
    ({"best_of": 2}, "best_of", "not supported"),
    ({"stop": [1]}, "stop", "strings"),
    ({"stop_token_ids": [-1]}, "stop_token_ids", "token ids"),
    ({"temperature": -0.5}, None, "temperature"),  # SamplingParams' own rule, its message
    ({"presence_penalty": 3}, None, "presence_penalty"),
])
def test_bad_fields_are_named(body: dict[str, Any], param: str | None, words: str) -> None:
    with pytest.raises(ApiError) as err:
        params(body)
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


def test_n_choices() -> None:
    assert read_n({}) == 1 and read_n({"n": 4}) == 4
    for bad in (0, -2, "3", 2.5):
        with pytest.raises(ApiError) as err:
            read_n({"n": bad})
        assert err.value.param == "n"


@pytest.mark.parametrize(("prompt", "want"), [
    ("hi", "hi"), (["hi"], "hi"), ([1, 2, 3], [1, 2, 3]), ([[1, 2]], [1, 2]),
])
def test_one_prompt_as_text_or_token_ids(prompt: Any, want: Any) -> None:
    assert read_completion_prompt({"prompt": prompt}) == want


@pytest.mark.parametrize("prompt", ["", [], ["a", "b"], [[1], [2]], [1, "a"], [-1], 5, None])
def test_other_prompts_are_refused(prompt: Any) -> None:
    with pytest.raises(ApiError) as err:
        read_completion_prompt({"prompt": prompt})
    assert err.value.param == "prompt"


def test_stream_options_and_model_and_chat_logprobs() -> None:
    assert read_stream({"stream": True, "stream_options": {"include_usage": True}}).include_usage
    assert not read_stream({}).stream
    with pytest.raises(ApiError, match="only allowed with stream=true"):
        read_stream({"stream_options": {"include_usage": True}})
    check_model({"model": "m"}, "m")
    check_model({}, "m")
    with pytest.raises(ApiError) as err:
        check_model({"model": "other"}, "m")
    assert err.value.status == 404
    assert chat_logprobs({}) is None
    assert chat_logprobs({"logprobs": True}) == 0
    assert chat_logprobs({"logprobs": True, "top_logprobs": 4}) == 4
    with pytest.raises(ApiError, match="needs logprobs=true"):
        chat_logprobs({"top_logprobs": 4})


def test_response_format_text_only() -> None:
    check_response_format({"response_format": {"type": "text"}})
    with pytest.raises(ApiError) as err:
        check_response_format({"response_format": {"type": "json_object"}})
    assert err.value.param == "response_format"


def test_error_body_is_openais_shape() -> None:
    body = ApiError("no such thing", 404, "model").body()
    assert body == {"error": {"message": "no such thing", "type": "NotFoundError", "param": "model",
                              "code": 404}}
