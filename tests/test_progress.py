"""The shared progress bar."""

from __future__ import annotations

import pytest

from kvsched.progress import draw_progress
from kvsched.sim.simulator import stderr_progress


def test_bar_fills_and_ends_the_line_when_complete(capsys: pytest.CaptureFixture[str]) -> None:
    draw_progress(3, 10, "note")
    err = capsys.readouterr().err
    assert err == "\r[" + "#" * 9 + "." * 21 + "] 3/10 requests  note"
    stderr_progress(10, 10, 12.5)
    err = capsys.readouterr().err
    assert err.startswith("\r[" + "#" * 30 + "] 10/10 requests") and "t=12.5s simulated" in err
    assert err.endswith("\n")
