"""The progress line ends before anything else is printed."""

from __future__ import annotations

import io

from kvsched.progress import ProgressBar


def test_a_bar_left_short_of_its_total_is_ended_by_close() -> None:
    # tune's total is an estimate: the search may stop with done < total.
    out = io.StringIO()
    bar = ProgressBar("simulations", out)
    bar.draw(3, 10, "best so far: -")
    assert not out.getvalue().endswith("\n")
    bar.close()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_a_complete_bar_is_ended_once() -> None:
    out = io.StringIO()
    bar = ProgressBar("simulations", out)
    bar.draw(10, 10, "")
    bar.close()
    assert out.getvalue().count("\n") == 1
    assert "] 10/10 simulations" in out.getvalue()


def test_closing_a_bar_never_drawn_prints_nothing() -> None:
    out = io.StringIO()
    ProgressBar("simulations", out).close()
    assert out.getvalue() == ""
