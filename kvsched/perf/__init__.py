"""Performance-model catalogs: accelerators (:mod:`.hardware`) and model architectures (:mod:`.models`).

Importing this package uses the standard library only (PyYAML is imported
lazily, when a YAML hardware or override file is read).
"""

from __future__ import annotations

from kvsched.perf.hardware import (
    EFFICIENCY_FIELDS,
    HARDWARE,
    Hardware,
    get_hardware,
    load_efficiency_overrides,
    load_hardware_file,
    resolve_hardware_id,
    with_overrides,
)
from kvsched.perf.model_catalog import MODELS, get_model
from kvsched.perf.model_parsers import SUPPORTED_MODEL_TYPES, load_model_spec
from kvsched.perf.models import ModelSpec

__all__ = [
    "EFFICIENCY_FIELDS",
    "HARDWARE",
    "MODELS",
    "SUPPORTED_MODEL_TYPES",
    "Hardware",
    "ModelSpec",
    "get_hardware",
    "get_model",
    "load_efficiency_overrides",
    "load_hardware_file",
    "load_model_spec",
    "resolve_hardware_id",
    "with_overrides",
]
