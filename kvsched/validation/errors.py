"""Relative errors of a prediction against a measurement, and their summary:
the one definition every validation here reports."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvsched.errors import UserInputError


def rel_err(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: negative = predicts less time than measured."""
    return (predicted - measured) / measured


@dataclass(frozen=True, slots=True)
class ErrorStats:
    n: int
    mape: float          # mean |error|
    median_abs: float    # median |error|
    bias: float          # mean signed error

    @classmethod
    def of(cls, errors: Sequence[float]) -> ErrorStats:
        if not errors:
            raise UserInputError("ErrorStats.of: no errors to summarise")
        absolute = [abs(e) for e in errors]
        return cls(len(errors), statistics.fmean(absolute), statistics.median(absolute),
                   statistics.fmean(errors))
