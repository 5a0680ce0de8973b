"""The model catalog is a data file (kvsched/perf/data/models.yaml) read on
first use through ModelSpec's own checks: its families and aliases give
what the Python catalog gave, and a problem in a catalog file is one line
naming the entry, the field and the value (tests/test_package_data.py
checks that the file ships with the package)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kvsched.errors import UserInputError
from kvsched.perf import model_catalog
from kvsched.perf.model_catalog import CATALOG_FILE, MODELS, catalog_match, read_catalog


def test_the_file_is_the_catalog() -> None:
    data = yaml.safe_load(CATALOG_FILE.read_text(encoding="utf-8"))
    assert [item["name"] for item in data["models"]] == list(MODELS)
    assert read_catalog(CATALOG_FILE).models == dict(MODELS)


def test_families_give_their_fields_and_entries_override_them() -> None:
    v3 = MODELS["deepseek-ai/DeepSeek-V3"]
    # V3.1 and R1 are V3's architecture under another name (models.md §3).
    for name in ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-R1"):
        assert MODELS[name] == dataclasses.replace(v3, name=name)
    kimi = MODELS["moonshotai/Kimi-K2.5"]
    assert kimi == dataclasses.replace(v3, name=kimi.name, num_heads=64, num_kv_heads=64, num_experts=384,
                                       first_k_dense_layers=1, vocab_size=163840,
                                       max_position_embeddings=262144, num_mtp_layers=0)
    # qwen3-moe extends qwen3: the per-head q/k norms come through both.
    moe = MODELS["Qwen/Qwen3-30B-A3B"]
    assert (moe.qk_norm, moe.head_dim, moe.num_kv_heads, moe.num_experts) == (True, 128, 4, 128)


@pytest.mark.parametrize(("name", "full"), [
    ("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1"), ("BLOOM-176B", "bigscience/bloom"),
    ("bigscience/bloom-176b", "bigscience/bloom"), ("Llama-2-70b", "meta-llama/Llama-2-70b-hf"),
    ("meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B"),
])
def test_aliases_are_looked_up_with_or_without_the_org(name: str, full: str) -> None:
    assert catalog_match(name) == (full, None)


def test_catalog_is_read_on_first_use() -> None:
    code = ("import sys, kvsched.perf.model_catalog as m; before = 'yaml' in sys.modules; "
            "n = len(m.MODELS); print(before, 'yaml' in sys.modules, n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", str(len(MODELS))]


def test_entries_are_the_same_objects_each_time() -> None:
    assert MODELS["openai/gpt-oss-20b"] is MODELS["openai/gpt-oss-20b"]


_FAMILY = "families:\n  f:\n    num_kv_heads: 8\n    head_dim: 128\n"
_ENTRY = ("  - name: org/m\n    base: f\n    hidden_size: 1024\n    num_layers: 2\n    num_heads: 8\n"
          "    intermediate_size: 4096\n    vocab_size: 1000\n    tie_word_embeddings: false\n"
          "    max_position_embeddings: 2048\n")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_small_catalog_reads(tmp_path: Path) -> None:
    catalog = read_catalog(_write(tmp_path, _FAMILY + "models:\n" + _ENTRY + "    aliases: [m-1]\n"))
    assert catalog.models["org/m"].num_kv_heads == 8
    assert dict(catalog.lookup) == {"org/m": "org/m", "m": "org/m", "m-1": "org/m", "org/m-1": "org/m"}


@pytest.mark.parametrize(("edit", "message"), [
    # An unknown key: the entry, the field, the value and the near name.
    (lambda t: t + "    hiden_size: 7\n",
     "models item 1 (base 'f'): model 'org/m': hiden_size=7: unknown field (did you mean 'hidden_size'?)"),
    # A value ModelSpec refuses, in its words.
    (lambda t: t.replace("num_layers: 2", "num_layers: -2"),
     "models item 1 (base 'f'): model 'org/m': num_layers=-2: must be a non-negative integer"),
    (lambda t: t.replace("num_layers: 2", "num_layers: 2.0"),
     "model 'org/m': num_layers=2.0: must be a non-negative integer"),
    (lambda t: t.replace("tie_word_embeddings: false", "tie_word_embeddings: 0"),
     "model 'org/m': tie_word_embeddings=0: must be true or false"),
    # A bad value a family gives names the entry built from it and the family.
    (lambda t: t.replace("head_dim: 128", "head_dim: 0"),
     "models item 1 (base 'f'): model 'org/m': head_dim=0: must be positive"),
    (lambda t: t.replace("head_dim: 128", "head_dm: 128"),
     "family 'f': head_dm=128: unknown field (did you mean 'head_dim'?)"),
    (lambda t: t.replace("    head_dim: 128\n", "    head_dim: 128\n    name: x/y\n"),
     "family 'f': name='x/y': unknown field"),
    (lambda t: t.replace("base: f", "base: g"), "base='g': not a family defined above it; families: f"),
    (lambda t: t.replace("    head_dim: 128\n", "    head_dim: 128\n    base: f\n"),
     "family 'f': base='f': not a family defined above it"),
    (lambda t: t.replace("    num_layers: 2\n", ""), "model 'org/m': missing num_layers"),
    (lambda t: t.replace("org/m", "m"), "models item 1: name='m': must be a Hugging Face id, org/name"),
    (lambda t: t + "    aliases: [M-1]\n", "model 'org/m': aliases=['M-1']: must be a list of lower-case"),
    (lambda t: t + "    aliases: [m]\n", "model 'org/m': 'm' already names 'org/m'"),
    (lambda t: t + _ENTRY,
     "models item 2: model 'org/m': 'org/m' already names 'org/m'; give each model one entry"),
    (lambda t: t.replace("families:\n  f:", "families:\n  e: {head_dim: 128}\n  f:"),
     "family 'e': no entry or family names it as its base"),
    (lambda t: t.replace("models:", "model:"),
     "top level must be a mapping of families (optional) and models"),
])
def test_a_bad_catalog_names_the_entry_field_and_value(tmp_path: Path, edit: Callable[[str], str],
                                                       message: str) -> None:
    path = _write(tmp_path, edit(_FAMILY + "models:\n" + _ENTRY))
    with pytest.raises(UserInputError) as err:
        read_catalog(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_a_catalog_that_loses_a_quantized_model_is_refused(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkpoint formats model_catalog.py keeps by catalog name need their entries.
    monkeypatch.setattr(model_catalog, "CATALOG_FILE", _write(tmp_path, _FAMILY + "models:\n" + _ENTRY))
    model_catalog._catalog.cache_clear()
    try:
        with pytest.raises(UserInputError, match="no model 'openai/gpt-oss-20b', which model_catalog"):
            len(MODELS)
    finally:
        model_catalog._catalog.cache_clear()
