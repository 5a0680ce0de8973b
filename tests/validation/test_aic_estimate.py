"""kvsched.validation.aic_estimate: AIConfigurator's own estimate of a row,
through aiconfigurator-core alone.

Expected values come from aiconfigurator's own cli_estimate, run separately.
aiconfigurator-core must be installed (the dev extra has it): nothing here
skips without it. The rows come from conftest.py's ``by_id`` fixture.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvsched.validation.aic_estimate import AicEstimate, AicEstimator
from kvsched.validation.silicon_rows import (
    Refusal,
    SiliconRow,
)

QWEN32_C8 = "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"
QWEN235_TP1 = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_epnone_2"


@pytest.fixture(scope="module")
def aic() -> AicEstimator:
    return AicEstimator()


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[measured\]"'):
        AicEstimator()


def test_aic_estimate_of_a_known_row(by_id: dict[str, SiliconRow], aic: AicEstimator) -> None:
    estimate = aic.estimate(by_id[QWEN32_C8])
    assert isinstance(estimate, AicEstimate), estimate
    # aiconfigurator's cli_estimate gave 161.9 / 17.25 ms for this row (survey of
    # aiconfigurator-core 0.12.0, run separately with the upper aiconfigurator package).
    assert estimate.ttft_ms == pytest.approx(161.9, abs=0.05)
    assert estimate.tpot_ms == pytest.approx(17.25, abs=0.005)
    assert estimate.database_version == "0.24.0"


def test_aic_refusals_are_reasons(by_id: dict[str, SiliconRow], aic: AicEstimator) -> None:
    refusal = aic.estimate(by_id[QWEN235_TP1])    # moe_tp 2 with tp 1
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "AIC: parallelism columns disagree (tp x dp != moe_tp x moe_ep)"
