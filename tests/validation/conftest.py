"""The rows of aiconfigurator-core's silicon_sample.csv, read once for every
test module here (aiconfigurator-core must be installed: the dev extra has it)."""

from __future__ import annotations

import pytest

from kvsched.validation.silicon_rows import SiliconRow, load_rows


@pytest.fixture(scope="session")
def rows() -> list[SiliconRow]:
    return load_rows()


@pytest.fixture(scope="session")
def by_id(rows: list[SiliconRow]) -> dict[str, SiliconRow]:
    return {r.id: r for r in rows}
