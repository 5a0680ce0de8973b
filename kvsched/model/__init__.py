"""The Llama-family model in plain PyTorch, its checkpoint loader and tiny test
checkpoints.

Submodules: ``config`` (torch-free; fields read by ``kvsched.hf_config``),
``attention``, ``llama``, ``loader``, ``tiny`` (torch imported lazily, so the
CLI can register ``make-tiny-model`` without it). Only the torch-free config is
re-exported here, so importing this package never imports torch."""

from __future__ import annotations

from kvsched.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, load_model_config

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "load_model_config"]
