"""SamplingParams: vLLM's defaults, normalisation, and what it refuses to build."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvsched import SamplingParams


def test_defaults_are_vllms() -> None:
    p = SamplingParams()
    assert (p.max_tokens, p.min_tokens, p.ignore_eos, p.eos_token_id, p.stop_token_ids) == (
        16, 0, False, None, ())
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.logprobs, p.stop, p.include_stop_str_in_output, p.skip_special_tokens) == (
        None, (), False, True)
    assert not p.greedy
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy


def test_the_scheduler_fields_come_first_for_existing_callers() -> None:
    names = [f.name for f in dataclasses.fields(SamplingParams)]
    assert names[:5] == ["max_tokens", "min_tokens", "ignore_eos", "eos_token_id", "stop_token_ids"]
    assert SamplingParams(8, 2, True, 5, (6,)) == SamplingParams(
        max_tokens=8, min_tokens=2, ignore_eos=True, eos_token_id=5, stop_token_ids=(6,))


def test_frozen_slotted_and_hashable() -> None:
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[3, 4])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert not hasattr(p, "__dict__")
    assert hash(p) == hash(SamplingParams(stop=("a", "b"), stop_token_ids=(3, 4)))


@pytest.mark.parametrize("given, expected", [("END", ("END",)), (["a", "b"], ("a", "b")),
                                             (("x",), ("x",)), ([], ())])
def test_stop_is_normalised_to_a_tuple(given: Any, expected: tuple[str, ...]) -> None:
    assert SamplingParams(stop=given).stop == expected


def test_stop_token_ids_list_becomes_a_tuple() -> None:
    assert SamplingParams(stop_token_ids=[1, 2]).stop_token_ids == (1, 2)


def test_in_range_edge_values_are_accepted() -> None:
    SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, min_p=1.0, repetition_penalty=0.01,
                   presence_penalty=-2.0, frequency_penalty=2.0, logprobs=0, seed=0)
    SamplingParams(top_p=1e-9, top_k=1, min_p=0.0, seed=-5, presence_penalty=2, frequency_penalty=-2)
    # max_tokens / min_tokens stay unchecked here: Request.validate reports them with the request id.
    SamplingParams(max_tokens=0, min_tokens=-1)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"temperature": -0.1}, "temperature=-0.1: must be >= 0"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"temperature": "hot"}, "temperature='hot': must be a number"),
    ({"top_p": 0.0}, r"top_p=0.0: must be in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"top_k": -2}, "top_k=-2: must be >= -1; use 0 or -1"),
    ({"top_k": 2.0}, "top_k=2.0: must be an integer"),
    ({"top_k": True}, "top_k=True: must be an integer"),
    ({"min_p": -0.1}, r"min_p=-0.1: must be in \[0, 1\]"),
    ({"min_p": 1.1}, "min_p=1.1"),
    ({"repetition_penalty": 0.0}, "repetition_penalty=0.0: must be > 0"),
    ({"presence_penalty": 2.5}, r"presence_penalty=2.5: must be in \[-2, 2\]"),
    ({"frequency_penalty": -3}, r"frequency_penalty=-3: must be in \[-2, 2\]"),
    ({"logprobs": -1}, "logprobs=-1: must be >= 0"),
    ({"seed": 1.5}, "seed=1.5: must be an integer"),
    ({"stop": ["ok", ""]}, "stop=.*non-empty str"),
    ({"stop": [3]}, "stop=.*non-empty str"),
    ({"stop_token_ids": [-1]}, "stop_token_ids=-1"),
    ({"eos_token_id": -3}, "eos_token_id=-3"),
]


@pytest.mark.parametrize("kwargs, message", BAD,
                         ids=[f"{k}={v!r}" for kwargs, _ in BAD for k, v in kwargs.items()])
def test_out_of_range_values_cannot_be_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(**kwargs)
    # "field=value: what is wrong; how to fix"
    assert ";" in str(info.value)
