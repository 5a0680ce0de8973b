"""Shared fixtures: tiny checkpoints (made once per session) and transformers as the
engine's reference. Only tests that ask for them import torch."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The reference must never reach for the network: everything here is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium, which renders the HTML pages in the screenshot
    tests. Where it is missing those tests skip, except in CI
    (``KVSCHED_CI=1``, set by .ci/run, which installs it): there a missing
    Chromium fails them instead of skipping them silently."""
    path = shutil.which("chromium")
    if path is None:
        why = "needs Chromium for the screenshot: apt-get install -y chromium"
        if os.environ.get("KVSCHED_CI") == "1":
            pytest.fail(f"{why} (KVSCHED_CI=1: the screenshot tests must run in CI)")
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """tiny(**make_tiny_model kwargs) -> checkpoint dir, made once per distinct kwargs."""
    pytest.importorskip("torch")
    from kvsched.model.tiny import make_tiny_model

    made: dict[tuple[tuple[str, Any], ...], Path] = {}

    def make(**kwargs: Any) -> Path:
        key = tuple(sorted(kwargs.items()))
        if key not in made:
            made[key] = make_tiny_model(tmp_path_factory.mktemp("tiny"), **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def hf_model() -> Callable[[Path], Any]:
    """hf_model(dir) -> transformers' AutoModelForCausalLM in float32, eval mode."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    def load(path: Path) -> Any:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model.eval()

    return load


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """Tiny models run fastest on one thread; with 2 OpenMP threads and a busy
    machine each small matmul can take milliseconds of spin-waiting."""
    torch = sys.modules.get("torch")  # never import torch for the core's tests
    if torch is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
