"""The synthetic runs, simulated once for the calibrate tests that fit them."""

from __future__ import annotations

from pathlib import Path

import pytest
from calibrate_runs import make_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("aiconfigurator_core")  # the measured backend's tables
    return make_runs(tmp_path_factory.mktemp("calibrate"))
