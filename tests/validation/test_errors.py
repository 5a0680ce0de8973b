"""kvsched.validation.errors: the relative error and its summary, on values
worked out by hand."""

from __future__ import annotations

import pytest

from kvsched.validation.errors import ErrorStats, rel_err


def test_error_stats() -> None:
    s = ErrorStats.of([0.1, -0.3, 0.2])
    assert s.n == 3
    assert s.mape == pytest.approx(0.2) and s.median_abs == pytest.approx(0.2)
    assert s.bias == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no errors"):
        ErrorStats.of([])


def test_rel_err_is_signed_against_the_measurement() -> None:
    # Negative: the prediction is faster (less time) than the measurement.
    assert rel_err(90.0, 100.0) == pytest.approx(-0.1)
    assert rel_err(150.0, 100.0) == pytest.approx(0.5)
