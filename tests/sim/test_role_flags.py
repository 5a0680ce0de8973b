"""Per-role scheduler flags of a disaggregated deployment
(``--prefill-max-num-batched-tokens``, ``--decode-max-num-seqs``, ...): each
role is its own ``vllm serve`` in vLLM, with its own flags."""

from __future__ import annotations

import pytest

from kvsched.errors import UserInputError
from kvsched.sim.flags import parse_spec, spec_argv

BASE = ["--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--disaggregation", "2P1D"]


def roles(argv: list[str]) -> tuple[dict[str, object], dict[str, object]]:
    spec = parse_spec([*BASE, *argv])
    prefill, decode = spec.deployment.groups
    assert (prefill.role, decode.role) == ("prefill", "decode")
    keys = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")
    return ({k: getattr(prefill.engine, k) for k in keys}, {k: getattr(decode.engine, k) for k in keys})


def test_each_role_takes_its_own_flags_and_the_shared_ones() -> None:
    prefill, decode = roles(["--max-num-seqs", "128", "--prefill-max-num-batched-tokens", "16384",
                             "--decode-max-num-seqs", "32", "--decode-long-prefill-token-threshold", "64"])
    assert prefill == {"max_num_seqs": 128, "max_num_batched_tokens": 16384,
                       "long_prefill_token_threshold": 0}
    assert decode == {"max_num_seqs": 32, "max_num_batched_tokens": None,
                      "long_prefill_token_threshold": 64}


@pytest.mark.parametrize("argv", [
    ["--decode-max-num-seqs", "64"],
    ["--prefill-max-num-seqs", "8", "--decode-max-num-seqs", "64", "--max-num-batched-tokens", "4096"],
    ["--prefill-max-num-batched-tokens", "16384", "--prefill-tensor-parallel-size", "2"],
    [],
])
def test_the_flags_of_a_spec_give_it_back(argv: list[str]) -> None:
    spec = parse_spec([*BASE, *argv])
    again = parse_spec(["--model", "meta-llama/Llama-3.1-8B", *spec_argv(spec)])
    assert again.deployment == spec.deployment


def test_role_flags_without_roles_are_refused() -> None:
    with pytest.raises(UserInputError, match="--decode-max-num-seqs=64: only with --disaggregation"):
        parse_spec(["--model", "meta-llama/Llama-3.1-8B", "--decode-max-num-seqs", "64"])


def test_a_bad_role_value_names_the_field() -> None:
    with pytest.raises(UserInputError, match="--prefill-max-num-seqs=0: must be an integer >= 1"):
        parse_spec([*BASE, "--prefill-max-num-seqs", "0"])
    with pytest.raises(UserInputError,
                       match="--decode-long-prefill-token-threshold=-1: must be an integer >= 0"):
        parse_spec([*BASE, "--decode-long-prefill-token-threshold", "-1"])
