"""Where a model id's ``config.json`` comes from, for ids the catalog lacks.

``kvsched.perf.model_catalog.get_model`` asks :func:`find_config` for any name that
is neither a catalog model nor an existing path. The sources, in order:

1. the local Hugging Face hub cache (``huggingface_hub.try_to_load_from_cache``;
   ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``);
2. the real configs aiconfigurator-core bundles (``model_configs/``, the
   ``[measured]`` extra), offline;
3. the Hugging Face Hub itself (``hf_hub_download``, config.json only), unless
   ``HF_HUB_OFFLINE`` is set.

Otherwise one line says what was tried, suggests close names (catalog and
bundled ids) and the fix: ``huggingface-cli download ORG/NAME config.json``
or a local directory. The environment is read at call time (not at import,
as huggingface_hub's own constants are), so one process can change it.
huggingface_hub is imported lazily: the core and the simulator import this
module without it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError

# A Hub repo id: ORG/NAME, each part letters, digits, '-', '_', '.'.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_BUNDLED_SUFFIX = "_config.json"
# huggingface_hub's truthy spellings of a boolean environment variable.
_TRUE = frozenset({"1", "on", "yes", "true"})


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """A resolved config.json: its path, the model id it belongs to, and
    where it was found (``hf-cache``, ``bundled`` or ``hub``)."""

    path: Path
    model_id: str
    origin: str


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (1/ON/YES/TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else
    ``HF_HOME``/hub, else ``XDG_CACHE_HOME``/huggingface/hub, else
    ``~/.cache/huggingface/hub``."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "huggingface" / "hub"


def bundled_config_dir() -> Path | None:
    """aiconfigurator-core's ``model_configs/`` directory, found without
    importing the package (it pulls pyarrow); None when not installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        folder = Path(root) / "model_configs"
        if folder.is_dir():
            return folder
    return None


def bundled_model_ids() -> dict[str, Path]:
    """Model id -> config.json of every config aiconfigurator-core bundles
    (file names ``ORG--NAME_config.json``); empty when it is not installed."""
    folder = bundled_config_dir()
    if folder is None:
        return {}
    found: dict[str, Path] = {}
    for path in sorted(folder.glob(f"*{_BUNDLED_SUFFIX}")):
        stem = path.name[: -len(_BUNDLED_SUFFIX)]
        if "--" in stem and not stem.endswith("_hf_quant"):
            org, name = stem.split("--", 1)
            found[f"{org}/{name}"] = path
    return found


def hf_quant_config_beside(config_path: Path) -> Path | None:
    """The ModelOpt ``hf_quant_config.json`` shipped beside a config.json
    (``ORG--NAME_hf_quant_config.json`` beside a bundled
    ``ORG--NAME_config.json``), which vLLM reads when config.json has no
    ``quantization_config``; None when there is none."""
    name = config_path.name
    if name == "config.json":
        sibling = config_path.with_name("hf_quant_config.json")
    elif name.endswith(_BUNDLED_SUFFIX):
        sibling = config_path.with_name(name[: -len(_BUNDLED_SUFFIX)] + "_hf_quant" + _BUNDLED_SUFFIX)
    else:
        return None
    return sibling if sibling.is_file() else None


def _hub() -> Any:
    """huggingface_hub, imported on first use; None when not installed."""
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError:
        return None


def _from_cache(hub: Any, repo_id: str, cache: Path) -> Path | None:
    hit = hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache))
    return Path(hit) if isinstance(hit, str) else None  # None or a "known missing" marker: not cached


def _download(hub: Any, repo_id: str, cache: Path) -> Path:
    return Path(hub.hf_hub_download(repo_id, "config.json", cache_dir=str(cache)))


def _likeness(probe: str, candidate: str) -> float:
    """How alike two lower-case names are; a variant (``qwen3-8b-instruct``)
    scores its base (``qwen3-8b``) by the prefix of the same length."""
    whole = difflib.SequenceMatcher(None, probe, candidate).ratio()
    prefix = difflib.SequenceMatcher(None, probe[: len(candidate)], candidate).ratio()
    return max(whole, prefix)


def suggestions(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` close names for ``name`` among ``known`` (whole ids and
    their NAME part, any case), closest first: the did-you-mean of an
    unknown model."""
    key = name.strip().lower()
    probes = dict.fromkeys((key, key.rsplit("/", 1)[-1]))
    scored: dict[str, float] = {}
    for full in dict.fromkeys(known):
        for candidate in dict.fromkeys((full.lower(), full.rsplit("/", 1)[-1].lower())):
            score = max(_likeness(probe, candidate) for probe in probes)
            scored[full] = max(scored.get(full, 0.0), score)
    ranked = sorted((item for item in scored.items() if item[1] >= 0.75), key=lambda item: -item[1])
    return [full for full, _ in ranked[:n]]


def find_config(name: str, catalog: Iterable[str]) -> ConfigSource:
    """The config.json of model ``name`` (a Hub id ``ORG/NAME``), from the
    hub cache, aiconfigurator-core's bundled configs or the Hub (see the
    module doc). ``catalog``: the built-in models' names, for the
    did-you-mean (or, with nothing close, the list of them). Raises
    UserInputError naming the model and the fix."""
    bundled = bundled_model_ids()
    names = tuple(catalog)
    close = suggestions(name, [*names, *bundled])
    hint = (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close
            else f" (built in: {', '.join(names)})")
    repo_id = name.strip()
    if not _REPO_ID.fullmatch(repo_id):
        raise UserInputError(
            f"unknown model {name!r}: not in the catalog, not a Hugging Face id (ORG/NAME) and no such "
            f"file or directory{hint}. Pass a catalog name, a Hugging Face id, or a local directory "
            "holding config.json")
    hub = _hub()
    cache = hub_cache_dir()
    if hub is not None:
        cached = _from_cache(hub, repo_id, cache)
        if cached is not None:
            return ConfigSource(cached, repo_id, "hf-cache")
    by_lower = {k.lower(): k for k in bundled}
    if repo_id.lower() in by_lower:
        full = by_lower[repo_id.lower()]
        return ConfigSource(bundled[full], full, "bundled")
    fix = (f"fetch it with `huggingface-cli download {repo_id} config.json` (or `hf download`), or pass "
           "a local directory holding its config.json")
    if hub is None:
        raise UserInputError(
            f"model {repo_id!r}: not in the catalog nor in aiconfigurator-core's bundled configs, and "
            f"huggingface_hub is not installed to look it up{hint}. Install it (pip install "
            f"'kvsched[hub]') or {fix}")
    if hub_offline():
        raise UserInputError(
            f"model {repo_id!r}: not in the catalog, the Hugging Face cache ({cache}) nor "
            f"aiconfigurator-core's bundled configs, and HF_HUB_OFFLINE is set{hint}. Unset HF_HUB_OFFLINE "
            f"or {fix}")
    try:
        path = _download(hub, repo_id, cache)
    except Exception as err:  # any failure online (no network, 404, gated) has the same fix
        raise UserInputError(
            f"model {repo_id!r}: not in the catalog, the Hugging Face cache ({cache}) nor "
            f"aiconfigurator-core's bundled configs, and the Hub lookup failed ({type(err).__name__}: "
            f"unreachable, unknown or gated){hint}. Check the id or {fix}") from None
    return ConfigSource(path, repo_id, "hub")
