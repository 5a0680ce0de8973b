"""Load a local Hugging Face checkpoint (config.json + one or sharded
*.safetensors) into ``LlamaForCausalLM``, with no network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from kvsched.errors import UserInputError
from kvsched.model.config import ModelConfig, load_model_config
from kvsched.model.cpu_gemm import use_cpu_gemm
from kvsched.model.gemma3 import Gemma3ForCausalLM
from kvsched.model.llama import PACKED_MODULES, LlamaForCausalLM

# The model class per architecture; every other one is a LlamaForCausalLM.
MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {"Gemma3ForCausalLM": Gemma3ForCausalLM}
# Gemma's two extra norms around the MLP, per layer.
_GEMMA_MLP_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16,
}
INDEX_FILE = "model.safetensors.index.json"


def resolve_dtype(name: str, config: ModelConfig, device: torch.device | str = "cpu") -> torch.dtype:
    """``--dtype``: "auto" is the checkpoint's torch_dtype (float32 if it names
    none), except float16 on CPU becomes float32 (like vLLM: CPU float16 is slow)."""
    if name == "auto":
        checkpoint = DTYPES.get(config.torch_dtype or "float32", torch.float32)
        if checkpoint == torch.float16 and torch.device(device).type == "cpu":
            return torch.float32
        return checkpoint
    if name not in DTYPES:
        raise UserInputError(f"dtype={name!r}: unsupported; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def checkpoint_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a transformers checkpoint of ``config`` holds, with its shape."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if config.architecture in MODEL_CLASSES:
            for norm in _GEMMA_MLP_NORMS:
                shapes[f"{p}{norm}.weight"] = (h,)
        for proj, rows in (("q_proj", config.q_size), ("k_proj", config.kv_size),
                           ("v_proj", config.kv_size)):
            shapes[f"{p}self_attn.{proj}.weight"] = (rows, h)
            if config.attention_bias:
                shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, config.q_size)
        if config.attention_out_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def _ignored(name: str, config: ModelConfig) -> bool:
    # Old checkpoints saved RoPE's inv_freq buffer; tied ones may still carry lm_head.
    return name.endswith(".rotary_emb.inv_freq") or (
        config.tie_word_embeddings and name == "lm_head.weight")


def _list_names(files: list[Path]) -> dict[str, Path]:
    where: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
        except Exception as e:  # safetensors raises its own error types
            raise UserInputError(f"{file}: not a readable safetensors file ({e}); "
                             "re-download or re-save the checkpoint") from e
        for name in names:
            if name in where:
                raise UserInputError(f"{name}: stored twice, in {where[name].name} and {file.name}; "
                                 "the checkpoint's shards overlap, re-save it")
            where[name] = file
    return where


def checkpoint_tensors(root: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it. transformers' order:
    model.safetensors, else the shards of model.safetensors.index.json; then
    (like vLLM) every *.safetensors file in the directory."""
    single = root / "model.safetensors"
    if single.is_file():
        return _list_names([single])
    index = root / INDEX_FILE
    if not index.is_file():
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise UserInputError(f"model={str(root)!r}: no *.safetensors weights in the directory; "
                             "download the checkpoint's safetensors files (pytorch_model.bin is "
                             "not supported)")
        return _list_names(files)
    with open(index, encoding="utf-8") as f:
        try:
            weight_map = json.load(f).get("weight_map")
        except (json.JSONDecodeError, AttributeError) as e:
            raise UserInputError(f"{index}: invalid index ({e}); re-download the file") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserInputError(f"{index}: weight_map must map tensor names to shard files; "
                         "re-download the file")
    files = sorted({root / str(v) for v in weight_map.values()})
    for file in files:
        if not file.is_file():
            raise UserInputError(f"{file.name}: shard listed in {INDEX_FILE} is missing from {root}; "
                             "download every shard")
    where = _list_names(files)
    for name, file in weight_map.items():
        if where.get(name) != root / str(file):
            raise UserInputError(f"{name}: {INDEX_FILE} puts it in {file}, which does not hold it; "
                             "the index and the shards disagree, re-download them")
    return where


def _names_list(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def load_model(path: str | os.PathLike[str], dtype: torch.dtype,
               device: torch.device | str) -> tuple[ModelConfig, LlamaForCausalLM]:
    """Read the checkpoint at ``path`` into a model in ``dtype`` on ``device``,
    in eval mode with gradients off."""
    if dtype not in DTYPES.values():
        raise UserInputError(f"dtype={dtype}: unsupported; use torch.float32, torch.bfloat16 or "
                         "torch.float16")
    config = load_model_config(path)
    root = Path(path)
    where = checkpoint_tensors(root)
    shapes = checkpoint_tensor_shapes(config)
    missing = [n for n in shapes if n not in where]
    if missing:
        raise UserInputError(f"{missing[0]}: missing from the checkpoint in {root} "
                         f"({len(missing)} missing: {_names_list(missing)}); the weights do not match "
                         f"config.json ({config.architecture}) or are incomplete")
    unexpected = sorted(n for n in where if n not in shapes and not _ignored(n, config))
    if unexpected:
        raise UserInputError(f"{unexpected[0]}: unexpected tensor in the checkpoint in {root} "
                         f"({len(unexpected)} unexpected: {_names_list(unexpected)}); the weights do "
                         f"not match config.json ({config.architecture})")

    device = torch.device(device)
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in shapes:
        by_file.setdefault(where[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as f:
            for name in names:
                t = f.get_tensor(name)
                if tuple(t.shape) != shapes[name]:
                    raise UserInputError(f"{name}: shape {list(t.shape)} in {file.name}, but config.json "
                                     f"implies {list(shapes[name])}; the weights do not match the config")
                if not t.is_floating_point():
                    raise UserInputError(f"{name}: dtype {t.dtype} in {file.name}; quantized or integer "
                                     "weights are not supported, use a float checkpoint")
                tensors[name] = t.to(device=device, dtype=dtype)

    state: dict[str, torch.Tensor] = {}
    packed = {part: (fused, parts) for fused, parts in PACKED_MODULES for part in parts}
    for name in shapes:
        module, _, leaf = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if proj not in packed:
            state[name] = tensors[name]
            continue
        fused, parts = packed[proj]
        if proj == parts[0]:  # the first part's name triggers the concatenation
            state[f"{prefix}.{fused}.{leaf}"] = torch.cat(
                [tensors[f"{prefix}.{p}.{leaf}"] for p in parts], dim=0)

    model = MODEL_CLASSES.get(config.architecture, LlamaForCausalLM)(config, dtype=dtype, device="meta")
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    model.eval()
    if use_cpu_gemm(dtype, device):
        model.use_cpu_gemm()
    return config, model
