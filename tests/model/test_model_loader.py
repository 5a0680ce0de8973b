"""Checkpoint loading: shards, dtypes, tied embeddings, and clear errors for bad input."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from kvsched.model.attention import CausalAttention  # noqa: E402
from kvsched.model.config import load_model_config  # noqa: E402
from kvsched.model.loader import checkpoint_tensor_shapes, load_model, resolve_dtype  # noqa: E402


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _logits(path: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    _, model = load_model(path, dtype, "cpu")
    ids = torch.randint(4, 512, (20,), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(20), CausalAttention()))


def test_sharded_checkpoint_loads_like_single_file(tiny: Callable[..., Path]) -> None:
    single, sharded = tiny(arch="qwen3"), tiny(arch="qwen3", shards=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    assert not (sharded / "model.safetensors").exists()
    _, a = load_model(single, torch.float32, "cpu")
    _, b = load_model(sharded, torch.float32, "cpu")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(_logits(single), _logits(sharded))


def test_loaded_parameters_are_the_checkpoint_tensors(tiny: Callable[..., Path]) -> None:
    """q/k/v and gate/up are packed in transformers' order; nothing is left on meta."""
    path = tiny(arch="qwen2")
    _, model = load_model(path, torch.float32, "cpu")
    raw = safetensors_torch.load_file(str(path / "model.safetensors"))
    attn = model.model.layers[1].self_attn
    p = "model.layers.1."
    assert torch.equal(attn.qkv_proj.weight, torch.cat(
        [raw[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]))
    assert torch.equal(attn.qkv_proj.bias, torch.cat(
        [raw[p + f"self_attn.{x}_proj.bias"] for x in "qkv"]))
    assert torch.equal(model.model.layers[1].mlp.gate_up_proj.weight, torch.cat(
        [raw[p + "mlp.gate_proj.weight"], raw[p + "mlp.up_proj.weight"]]))
    assert all(t.device.type == "cpu" and not t.requires_grad for t in model.parameters())
    assert not model.training


def test_bfloat16_and_float16_load(tiny: Callable[..., Path]) -> None:
    path = tiny(arch="llama")
    ref = _logits(path)
    for dtype in (torch.bfloat16, torch.float16):
        _, model = load_model(path, dtype, "cpu")
        assert {p.dtype for p in model.parameters()} == {dtype}
        logits = _logits(path, dtype)
        assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
        # Same model, coarser numbers: close to float32 and mostly the same argmax.
        assert (logits - ref).abs().max() < 0.1 * ref.abs().max()
        assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


def test_bfloat16_checkpoint_and_resolve_dtype(tiny: Callable[..., Path]) -> None:
    path = tiny(arch="llama", dtype="bfloat16")
    config = load_model_config(path)
    assert config.torch_dtype == "bfloat16"
    raw = safetensors_torch.load_file(str(path / "model.safetensors"))
    assert {t.dtype for t in raw.values()} == {torch.bfloat16}
    assert resolve_dtype("auto", config) == torch.bfloat16
    _, model = load_model(path, torch.float32, "cpu")  # upcast on load
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    fp16 = load_model_config(tiny(arch="llama", dtype="float16"))
    assert resolve_dtype("auto", fp16) == torch.float32  # CPU: float16 -> float32, like vLLM
    assert resolve_dtype("auto", fp16, device="cuda") == torch.float16
    assert resolve_dtype("half", config) == torch.float16
    assert resolve_dtype("float", config) == torch.float32
    with pytest.raises(ValueError, match=r"dtype='int8': unsupported; use one of auto"):
        resolve_dtype("int8", config)


def test_tied_checkpoint_ignores_a_stray_lm_head_and_old_inv_freq(tiny: Callable[..., Path],
                                                                 tmp_path: Path) -> None:
    base = tiny(arch="qwen3", tie_word_embeddings=True)
    assert "lm_head.weight" not in checkpoint_tensor_shapes(load_model_config(base))
    path = _copy(base, tmp_path / "extra")
    raw = safetensors_torch.load_file(str(path / "model.safetensors"))
    raw["lm_head.weight"] = torch.zeros_like(raw["model.embed_tokens.weight"])
    raw["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
    safetensors_torch.save_file(raw, str(path / "model.safetensors"))
    _, model = load_model(path, torch.float32, "cpu")
    assert model.lm_head is None
    assert torch.equal(_logits(path), _logits(base))


def _drop_tensor(path: Path, name: str) -> None:
    raw = safetensors_torch.load_file(str(path / "model.safetensors"))
    del raw[name]
    safetensors_torch.save_file(raw, str(path / "model.safetensors"))


def test_bad_checkpoints_raise_clear_value_errors(tiny: Callable[..., Path], tmp_path: Path) -> None:
    base = tiny(arch="llama")
    with pytest.raises(ValueError, match=r"model='.*nowhere': not a directory; pass a local"):
        load_model(tmp_path / "nowhere", torch.float32, "cpu")

    no_config = _copy(base, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    with pytest.raises(ValueError, match=r"no config\.json in the directory"):
        load_model(no_config, torch.float32, "cpu")

    no_weights = _copy(base, tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights in the directory"):
        load_model(no_weights, torch.float32, "cpu")

    gpt2 = _copy(base, tmp_path / "gpt2")
    cfg = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"architectures=\['GPT2LMHeadModel'\]: unsupported "
                                         r"architecture; use a checkpoint of one of LlamaForCausalLM"):
        load_model(gpt2, torch.float32, "cpu")

    missing = _copy(base, tmp_path / "missing")
    _drop_tensor(missing, "model.layers.1.self_attn.k_proj.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight: missing from "
                                         r"the checkpoint"):
        load_model(missing, torch.float32, "cpu")

    unexpected = _copy(base, tmp_path / "unexpected")
    raw = safetensors_torch.load_file(str(unexpected / "model.safetensors"))
    raw["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    safetensors_torch.save_file(raw, str(unexpected / "model.safetensors"))
    with pytest.raises(ValueError, match=r"o_proj\.bias: unexpected tensor in the checkpoint"):
        load_model(unexpected, torch.float32, "cpu")

    shape = _copy(base, tmp_path / "shape")
    cfg = json.loads((shape / "config.json").read_text())
    (shape / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight: shape \[128, 64\] in "
                                         r"model\.safetensors, but config\.json implies \[96, 64\]"):
        load_model(shape, torch.float32, "cpu")

    with pytest.raises(ValueError, match=r"dtype=torch\.int8: unsupported"):
        load_model(base, torch.int8, "cpu")


def test_bad_sharded_checkpoints(tiny: Callable[..., Path], tmp_path: Path) -> None:
    base = tiny(arch="llama", shards=2)
    lost = _copy(base, tmp_path / "lost")
    (lost / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model-00002-of-00002\.safetensors: shard listed in "
                                         r"model\.safetensors\.index\.json is missing"):
        load_model(lost, torch.float32, "cpu")

    wrong = _copy(base, tmp_path / "wrong")
    index_file = wrong / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    index_file.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"lm_head\.weight: model\.safetensors\.index\.json puts it "
                                         r"in model-00001-of-00002\.safetensors, which does not hold it"):
        load_model(wrong, torch.float32, "cpu")
