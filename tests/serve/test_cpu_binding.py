"""Where the engine thread runs: vLLM's CPU-backend variables, read alike."""

from __future__ import annotations

import pytest

from kvsched import cli
from kvsched.errors import UserInputError
from kvsched.serve.cpu_binding import engine_cpus


@pytest.mark.parametrize(("env", "allowed", "expected"), [
    ({}, {0, 1}, [0]),                                   # auto keeps the last CPU for the front end
    ({"VLLM_CPU_OMP_THREADS_BIND": "auto"}, {0, 1, 2, 3}, [0, 1, 2]),
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "2"}, {0, 1, 2, 3}, [0, 1]),
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, {0, 1}, [0, 1]),
    ({}, {3}, [3]),                                      # one CPU: nothing to reserve
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "4"}, {0, 1}, [0, 1]),
    ({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, {0, 1}, None),
    ({"VLLM_CPU_OMP_THREADS_BIND": "1"}, {0, 1}, [1]),
    ({"VLLM_CPU_OMP_THREADS_BIND": "0-2,5"}, set(range(8)), [0, 1, 2, 5]),
])
def test_engine_cpus(env: dict[str, str], allowed: set[int], expected: list[int] | None) -> None:
    assert engine_cpus(env, allowed) == expected


@pytest.mark.parametrize(("env", "words"), [
    ({"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7"}, "one CPU list per tensor-parallel rank"),
    ({"VLLM_CPU_OMP_THREADS_BIND": "x"}, "'x' is not a CPU"),
    ({"VLLM_CPU_OMP_THREADS_BIND": "3-1"}, "'3-1' is not a CPU"),
    ({"VLLM_CPU_OMP_THREADS_BIND": "0,9"}, "CPU 9 is not one this process may run on"),
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "one"}, "VLLM_CPU_NUM_OF_RESERVED_CPU='one'"),
])
def test_bad_values_name_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(UserInputError, match=words.replace("|", r"\|")):
        engine_cpus(env, {0, 1})


def test_the_cli_refuses_a_bad_binding_before_loading(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")
    assert cli.main(["serve", "/nonexistent-checkpoint", "--port", "0"]) == cli.EXIT_BAD_INPUT
    assert "VLLM_CPU_OMP_THREADS_BIND" in capsys.readouterr().err
