"""The catalog of named models and the resolver of a ``--model`` value.

:data:`MODELS` holds the architectures kvsched knows by name, with aliases
and fine-tune/quantized variants matched to their base
(:func:`catalog_match`); :func:`get_model` resolves any ``--model`` value (a
catalog name, a local ``config.json``, a Hugging Face id) to a
:class:`~kvsched.perf.models.ModelSpec`, and :func:`checkpoint_format` to the
weight format its checkpoint brings.

The catalog's models, their shared families and their aliases are data,
``data/models.yaml`` (:data:`CATALOG_FILE`), each entry with its sources
(``/work/shared/facts/models.md``'s keys ``[AIC]``, ``[THB]``, ``[BLIS]``,
``[TF]``, ``[DSV3]``, ``[OSS]``; the counts reproduce that file's §4 derived
sizes). Which of them ship a quantized checkpoint is this module's
(:func:`catalog_match`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from kvsched.errors import UserInputError
from kvsched.files import read_text
from kvsched.hf_config import read_config_json
from kvsched.jsonfile import field_mismatch, show
from kvsched.perf.catalog_file import DATA_DIR, FileCatalog
from kvsched.perf.checkpoint_format import CheckpointFormat, config_checkpoint_format, split_format_suffix
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.model_source import find_config, hf_quant_config_beside
from kvsched.perf.models import ModelSpec
from kvsched.perf.vision import VisionSpec, vision_spec_from_config
from kvsched.yamlfile import parse_yaml

# The catalog is data: kvsched/perf/data/models.yaml (its header says how an
# entry is written). It is read and checked on first use, not at import, so
# that importing kvsched.perf does not import PyYAML. Every entry becomes a
# ModelSpec through ModelSpec's own checks, the ones a config.json's model
# goes through, so those rules have one owner; this module checks only what
# the file adds (its layout, families, aliases, one entry per name).
CATALOG_FILE = DATA_DIR / "models.yaml"
# The catalog is a few hundred lines; read_text wants a bound for any file.
_MAX_FILE_BYTES = 2**18

_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec))
_OPTIONAL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSpec)
                             if f.default is not dataclasses.MISSING)
# What a family and an entry may hold beyond ModelSpec's fields (a family has no name).
_FAMILY_KEYS = (*(f for f in _SPEC_FIELDS if f != "name"), "base")
_ENTRY_KEYS = (*_SPEC_FIELDS, "base", "aliases")


@dataclass(frozen=True, slots=True)
class Catalog:
    """The catalog file, read: the models by name in the file's order, and
    every name a model is looked up by (lower case: its name with and
    without the org, each alias with and without the org) to its name."""

    models: Mapping[str, ModelSpec]
    lookup: Mapping[str, str]


def _is_str_mapping(data: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(data, dict) and all(isinstance(k, str) for k in data)


def _check_keys(where: str, data: dict[str, Any], allowed: tuple[str, ...], holds: str) -> None:
    for key, value in data.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserInputError(f"{where}: {key}={show(value)}: unknown field{hint}; {holds}")


def _extend(where: str, data: dict[str, Any], families: Mapping[str, dict[str, Any]],
            used: set[str]) -> dict[str, Any]:
    """``data``'s fields over those of the family its ``base`` names (one
    defined earlier in the file, so no family can reach itself)."""
    fields = dict(data)
    if "base" not in fields:
        return fields
    base = fields.pop("base")
    if not isinstance(base, str) or base not in families:
        raise UserInputError(f"{where}: base={show(base)}: not a family defined above it; families: "
                             f"{', '.join(families) or 'none'}")
    used.add(base)
    return {**families[base], **fields}


def _families(path: Path, data: object, used: set[str]) -> dict[str, dict[str, Any]]:
    """Each family's fields, its base's folded in."""
    if not _is_str_mapping(data):
        raise UserInputError(f"{path}: families: must be a mapping of family names to fields")
    families: dict[str, dict[str, Any]] = {}
    for family, fields in data.items():
        where = f"{path}: family {family!r}"
        if not _is_str_mapping(fields):
            raise UserInputError(f"{where}: must be a mapping of ModelSpec fields to values")
        _check_keys(where, fields, _FAMILY_KEYS, "a family holds ModelSpec's fields "
                    "(kvsched/perf/models.py) but name, and base")
        families[family] = _extend(where, fields, families, used)
    return families


def _aliases(where: str, value: object) -> tuple[str, ...]:
    # Lookup keys are lower case and an alias is also looked up behind its
    # entry's org, so an alias in capitals or with an org would never match.
    if not isinstance(value, list) or not all(
            isinstance(a, str) and a and a == a.strip().lower() and "/" not in a for a in value):
        raise UserInputError(f"{where}: aliases={show(value)}: must be a list of lower-case names "
                             "without the org")
    return tuple(value)


def _entry(where: str, item: object, families: Mapping[str, dict[str, Any]],
           used: set[str]) -> tuple[ModelSpec, tuple[str, ...]]:
    """One catalog model and its aliases from the file's entry ``item``."""
    if not _is_str_mapping(item):
        raise UserInputError(f"{where}: must be a mapping of ModelSpec fields to values")
    name = item.get("name")
    org, _, short = name.partition("/") if isinstance(name, str) else ("", "", "")
    if not org or not short or "/" in short:
        raise UserInputError(f"{where}: name={show(name)}: must be a Hugging Face id, org/name")
    base = item.get("base")
    where = f"{where} (base {base!r})" if base is not None else where
    _check_keys(f"{where}: model {name!r}", item, _ENTRY_KEYS, "an entry holds ModelSpec's fields "
                "(kvsched/perf/models.py), base and aliases")
    fields = _extend(f"{where}: model {name!r}", item, families, used)
    aliases = _aliases(f"{where}: model {name!r}", fields.pop("aliases", []))
    if mismatch := field_mismatch(fields, set(_SPEC_FIELDS), _OPTIONAL_FIELDS):
        raise UserInputError(f"{where}: model {name!r}: {mismatch} (with its base's fields)")
    try:
        return ModelSpec(**fields), aliases
    except UserInputError as err:  # "model 'NAME': FIELD=VALUE: rule"
        raise UserInputError(f"{where}: {err}") from None


@functools.cache
def _catalog() -> Catalog:
    """The catalog file, read and checked once."""
    catalog = read_catalog(CATALOG_FILE)
    # The quantized checkpoints below are keyed by catalog name: one the file
    # lost would otherwise go unpriced without a word.
    for full in (*_NATIVE_FORMATS, *(base for base, _ in _REPACKS.values())):
        if full not in catalog.models:
            raise UserInputError(f"{CATALOG_FILE}: no model {full!r}, which model_catalog.py's "
                                 "checkpoint formats name; restore the entry or drop the format")
    return catalog


def read_catalog(path: Path) -> Catalog:
    """The models and lookup names of a catalog file written as
    ``data/models.yaml`` is; any problem is one UserInputError line naming
    the file, the entry, the field and the value. :data:`MODELS` is this
    of :data:`CATALOG_FILE`, read once (and checked to hold every model
    whose checkpoint format this module names)."""
    where = str(path)
    data = parse_yaml(where, read_text(path, _MAX_FILE_BYTES, "a model catalog (YAML)"))
    if not _is_str_mapping(data) or "models" not in data or data.keys() - {"families", "models"}:
        raise UserInputError(f"{where}: top level must be a mapping of families (optional) and models")
    used: set[str] = set()
    families = _families(path, data.get("families", {}), used)
    if not isinstance(data["models"], list):
        raise UserInputError(f"{where}: models: must be a list of model entries")
    models: dict[str, ModelSpec] = {}
    lookup: dict[str, str] = {}
    for index, item in enumerate(data["models"], 1):
        spec, aliases = _entry(f"{where}: models item {index}", item, families, used)
        org, short = spec.name.lower().split("/")
        for key in (spec.name.lower(), short, *aliases, *(f"{org}/{alias}" for alias in aliases)):
            if key in lookup:
                raise UserInputError(f"{where}: models item {index}: model {spec.name!r}: {key!r} "
                                     f"already names {lookup[key]!r}; give each model one entry and "
                                     "each name one model")
            lookup[key] = spec.name
        models[spec.name] = spec
    if unused := [family for family in families if family not in used]:
        raise UserInputError(f"{where}: family {unused[0]!r}: no entry or family names it as its base; "
                             "remove it")
    return Catalog(MappingProxyType(models), MappingProxyType(lookup))


def _models() -> Mapping[str, ModelSpec]:
    return _catalog().models


MODELS: Mapping[str, ModelSpec] = FileCatalog(_models, CATALOG_FILE, "model catalog")


# Checkpoint names that differ from a catalog entry only by a fine-tune or
# packaging suffix: the same architecture, hence the same cost.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf")


# Catalog models whose published checkpoint is itself quantized (read from
# each config.json's quantization_config, as shipped in aiconfigurator-core's
# model_configs/).
_NATIVE_FORMATS: Mapping[str, CheckpointFormat] = MappingProxyType({
    # quant_method mxfp4; modules_to_not_convert: self_attn, router, embeddings, lm_head
    "openai/gpt-oss-20b": CheckpointFormat("mxfp4", layers="experts"),
    "openai/gpt-oss-120b": CheckpointFormat("mxfp4", layers="experts"),
    # quant_method fp8, weight_block_size 128 x 128; not converted: gate, lm_head
    "MiniMaxAI/MiniMax-M2.5": CheckpointFormat("fp8_block"),
    # DeepSeek's published V3, V3.1 and R1 checkpoints are FP8 themselves
    # (quant_method fp8, fmt e4m3, weight_block_size 128 x 128): every
    # linear layer; the MoE gates, embedding and LM head stay 16-bit
    "deepseek-ai/DeepSeek-V3": CheckpointFormat("fp8_block"),
    "deepseek-ai/DeepSeek-V3.1": CheckpointFormat("fp8_block"),
    "deepseek-ai/DeepSeek-R1": CheckpointFormat("fp8_block"),
    # compressed-tensors int4, group 32, symmetric; ignores self_attn,
    # shared_experts and the dense MLP: the routed experts only
    "moonshotai/Kimi-K2.5": CheckpointFormat("int4", layers="experts"),
})

# Quantized repacks whose exclude lists differ from their publisher's
# default (below), by lower-case name: (catalog base, format).
_REPACKS: Mapping[str, tuple[str, CheckpointFormat]] = MappingProxyType({
    # hf_quant_config: NVFP4, kv FP8; excluded: lm_head, every self_attn and MoE gate
    "nvidia/minimax-m2.5-nvfp4": ("MiniMaxAI/MiniMax-M2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
    # quantization_config (modelopt): NVFP4, kv_cache_scheme 8-bit float;
    # ignored: lm_head and every self_attn (dense MLP and shared experts quantized)
    "nvidia/kimi-k2.5-nvfp4": ("moonshotai/Kimi-K2.5", CheckpointFormat("nvfp4", "fp8", "mlp")),
})


def catalog_match(name: str) -> tuple[str, CheckpointFormat | None] | None:
    """(catalog name, the checkpoint format the name implies) for a catalog
    model or a variant of one (``meta-llama/Llama-3.1-8B-Instruct``,
    ``Qwen/Qwen3-235B-A22B-FP8``, ``nvidia/Llama-3.1-8B-Instruct-FP8``,
    ``nvidia/MiniMax-M2.5-NVFP4``); None if the name matches nothing. A
    catalog model's own name brings its native format (gpt-oss: MXFP4
    experts), None when its checkpoint is 16-bit."""
    key = name.strip().lower()
    repack = _REPACKS.get(key)
    if repack is not None:
        return repack
    lookup = _catalog().lookup
    full = lookup.get(key)
    if full is not None:
        return full, _NATIVE_FORMATS.get(full)
    org, base = key.split("/", 1) if "/" in key else ("", key)
    base, fmt = split_format_suffix(org, base)
    for variant in _VARIANT_SUFFIXES:
        if base.endswith(variant):
            base = base[: -len(variant)]
    full = lookup.get(base)
    if full is None:
        # A variant word before a version (Mixtral-8x7B-Instruct-v0.1 of Mixtral-8x7B-v0.1).
        for variant in _VARIANT_SUFFIXES:
            if full is None and f"{variant}-" in base:
                full = lookup.get(base.replace(f"{variant}-", "-", 1))
    if full is None:
        return None
    return full, fmt if fmt is not None else _NATIVE_FORMATS.get(full)


def checkpoint_format(name_or_path: str) -> CheckpointFormat | None:
    """The format a checkpoint brings without --quantization: a catalog
    name's (:func:`catalog_match`), else its config.json's
    (:func:`config_checkpoint_format`; a Hub id is resolved as
    :func:`get_model` resolves it). The one owner of that rule."""
    match = catalog_match(name_or_path)
    if match is not None:
        return match[1]
    path = Path(name_or_path).expanduser()
    if path.exists():
        config = path / "config.json" if path.is_dir() else path
    else:
        config = find_config(name_or_path, MODELS).path
    quant = hf_quant_config_beside(config)
    return config_checkpoint_format(read_config_json(config),
                                    read_config_json(quant) if quant is not None else None)


def get_vision(name_or_path: str) -> VisionSpec | None:
    """The vision tower and image processor of ``--model`` (None: a model
    that takes no images; the catalog's models are text-only), resolved
    as :func:`get_model` resolves the model."""
    if catalog_match(name_or_path) is not None:
        return None
    path = Path(name_or_path).expanduser()
    if path.exists():
        config = path / "config.json" if path.is_dir() else path
    else:
        config = find_config(name_or_path, MODELS).path
    return vision_spec_from_config(read_config_json(config), str(config))


def get_model(name_or_path: str) -> ModelSpec:
    """A catalog model by HF id (with or without the org, any case; fine-tune
    and quantized variants by their base, see :func:`catalog_match`), a
    model read from disk, or any Hugging Face id whose config.json
    :func:`kvsched.perf.model_source.find_config` finds (the local HF cache,
    aiconfigurator-core's bundled configs, the Hub). The one resolver of a
    ``--model`` value.

    A path may be a Hugging Face model directory (holding ``config.json``) or a
    ``config.json`` file; see :func:`load_model_spec`.
    """
    match = catalog_match(name_or_path)
    if match is not None:
        return MODELS[match[0]]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_model_spec(path)
    # A Hub id: the local HF cache, aiconfigurator-core's bundled configs, the Hub.
    source = find_config(name_or_path, MODELS)
    return load_model_spec(source.path, source.model_id)
