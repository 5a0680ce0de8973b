"""One simulate validates its engine arguments once and reads each of its
files once (issue 35): ``--max-num-batched-tokens`` followed from the CLI to
the scheduler meets ``validate_engine_options`` once, and the calibration
and step-profile files are parsed once, however many layers pass the spec
on. Counted with a profiler hook on the functions' code objects, nothing
patched."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from kvsched.cli import main
from kvsched.perf.host import HostTerms, load_calibration, save_host_terms
from kvsched.perf.step_profile import load_profile
from kvsched.sim.deployment import validate_engine_options
from kvsched.sim.spec import WorkloadSpec

DATA = Path(__file__).parents[1] / "perf" / "data"
WATCHED = {validate_engine_options.__code__: "validate", load_calibration.__code__: "calibration",
           load_profile.__code__: "profile", WorkloadSpec.check.__code__: "workload"}


@contextmanager
def counting() -> Iterator[collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        code: CodeType = frame.f_code
        if event == "call" and code in WATCHED:
            counts[WATCHED[code]] += 1

    sys.setprofile(hook)
    try:
        yield counts
    finally:
        sys.setprofile(None)


def test_a_calibrated_simulate_validates_once_and_reads_the_file_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cal.json"
    save_host_terms(HostTerms(0.1e-3, "0.24", "h100-lab", "test"), path)
    with counting() as counts:
        rc = main(["simulate", "--num-prompts", "5", "--max-num-batched-tokens", "4096",
                   "--calibration", str(path), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert counts == {"validate": 1, "calibration": 1, "workload": 1}


def test_a_profiled_simulate_reads_the_profile_once(capsys: pytest.CaptureFixture[str]) -> None:
    with counting() as counts:
        rc = main(["simulate", "--model", str(DATA / "tiny_llama"), "--step-time-profile",
                   str(DATA / "tiny_llama_profile.json"), "--no-async-scheduling", "--max-model-len", "4096",
                   "--max-num-batched-tokens", "512", "--max-num-seqs", "64", "--num-prompts", "5",
                   "--random-input-len", "100", "--random-output-len", "10", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert counts == {"validate": 1, "profile": 1, "workload": 1}


def test_a_bad_calibration_is_still_refused_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert main(["simulate", "--num-prompts", "5", "--calibration", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "is not JSON" in err and "Traceback" not in err
