"""Our Llama-family model against transformers on tiny random checkpoints:
full-sequence logits (float32) and greedy decoding."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvsched.model.attention import CausalAttention  # noqa: E402
from kvsched.model.llama import LlamaForCausalLM  # noqa: E402
from kvsched.model.loader import load_model  # noqa: E402

ATOL = 1e-4


def _ids(n: int, seed: int = 0, vocab: int = 512) -> Any:
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _ours(model: LlamaForCausalLM, ids: Any) -> Any:
    with torch.inference_mode():
        hidden = model(ids, torch.arange(len(ids)), CausalAttention())
        return model.compute_logits(hidden)


def _theirs(hf: Any, ids: Any) -> Any:
    with torch.inference_mode():
        return hf(ids[None]).logits[0].float()


def _edit_config(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of checkpoint ``src`` whose config.json has ``changes`` applied."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("kwargs", [
    pytest.param({"arch": "llama"}, id="llama"),
    pytest.param({"arch": "llama", "num_kv_heads": 4, "tie_word_embeddings": True},
                 id="llama-mha-tied"),
    pytest.param({"arch": "mistral", "num_kv_heads": 1}, id="mistral-mqa"),
    pytest.param({"arch": "qwen2"}, id="qwen2-qkv-bias"),
    pytest.param({"arch": "qwen3", "head_dim": 32}, id="qwen3-head-dim-32"),
    pytest.param({"arch": "qwen3", "tie_word_embeddings": True}, id="qwen3-tied"),
])
def test_logits_match_transformers(tiny: Callable[..., Path], hf_model: Callable[[Path], Any],
                                   kwargs: dict[str, Any]) -> None:
    path = tiny(**kwargs)
    config, model = load_model(path, torch.float32, "cpu")
    ids = _ids(48)
    ours, ref = _ours(model, ids), _theirs(hf_model(path), ids)
    assert ours.dtype == torch.float32 and ours.shape == (48, config.vocab_size)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    # Well separated: every position's greedy token is the reference's.
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_qwen2_bias_and_qwen3_norm_weights_matter(tiny: Callable[..., Path]) -> None:
    """The parity above would not notice a dropped bias or q/k norm if they were no-ops."""
    ids = _ids(16)
    for arch, module in (("qwen2", "qkv_proj"), ("qwen3", "q_norm")):
        _, model = load_model(tiny(arch=arch), torch.float32, "cpu")
        base = _ours(model, ids)
        attn = model.model.layers[0].self_attn
        with torch.no_grad():
            param = attn.qkv_proj.bias if module == "qkv_proj" else attn.q_norm.weight
            param.fill_(0.0 if module == "qkv_proj" else 1.0)
        assert (base - _ours(model, ids)).abs().max() > 1e-2


@pytest.mark.parametrize("rope_scaling", [
    pytest.param({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, id="llama3"),
    pytest.param({"type": "linear", "factor": 2.5}, id="linear-legacy-key"),
])
def test_rope_scaling_matches_transformers(tiny: Callable[..., Path],
                                           hf_model: Callable[[Path], Any], tmp_path: Path,
                                           rope_scaling: dict[str, Any]) -> None:
    # head_dim 16: wavelengths 6.3 .. 2e4 straddle 16/4 and 16/1, so llama3's three
    # regimes (kept, blended, divided) all occur; positions run well past 16.
    base = tiny(arch="llama")
    path = _edit_config(base, tmp_path / "scaled", rope_scaling=rope_scaling, rope_theta=10000.0)
    config, model = load_model(path, torch.float32, "cpu")
    assert config.rope_scaling is not None
    ids = _ids(96, seed=3)
    ours = _ours(model, ids)
    torch.testing.assert_close(ours, _theirs(hf_model(path), ids), atol=ATOL, rtol=0)
    _, unscaled = load_model(base, torch.float32, "cpu")
    assert (ours - _ours(unscaled, ids)).abs().max() > 1e-2  # the scaling is not a no-op


def test_rope_parameters_format_matches_legacy(tiny: Callable[..., Path],
                                               hf_model: Callable[[Path], Any],
                                               tmp_path: Path) -> None:
    """transformers 5 writes ``rope_parameters`` (theta inside); older checkpoints
    ``rope_theta`` + ``rope_scaling``. Both load the same model."""
    base = tiny(arch="qwen3")
    params = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
              "high_freq_factor": 2.0, "original_max_position_embeddings": 32}
    new = _edit_config(base, tmp_path / "new", rope_parameters=params)
    legacy = _edit_config(base, tmp_path / "legacy", rope_theta=500.0,
                          rope_scaling={k: v for k, v in params.items() if k != "rope_theta"})
    cfg_new, model_new = load_model(new, torch.float32, "cpu")
    cfg_legacy, model_legacy = load_model(legacy, torch.float32, "cpu")
    assert cfg_new == cfg_legacy and cfg_new.rope_theta == 500.0
    ids = _ids(80, seed=4)
    ours = _ours(model_new, ids)
    assert torch.equal(ours, _ours(model_legacy, ids))
    torch.testing.assert_close(ours, _theirs(hf_model(new), ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_decoding_matches_transformers_generate(tiny: Callable[..., Path],
                                                       hf_model: Callable[[Path], Any],
                                                       arch: str) -> None:
    path = tiny(arch=arch)
    _, model = load_model(path, torch.float32, "cpu")
    hf = hf_model(path)
    for seed in range(3):
        prompt = _ids(7, seed=10 + seed)
        with torch.inference_mode():
            ref = hf.generate(prompt[None], max_new_tokens=24, do_sample=False)[0, 7:].tolist()
        ids = prompt.tolist()
        for _ in range(24):  # whole-sequence recompute: the simplest correct decoder
            token = int(_ours(model, torch.tensor(ids))[-1].argmax())
            ids.append(token)
            if token == 2:  # EOS stops generate too
                break
        assert ids[7:] == ref


class _SegmentedAttention:
    """Causal attention inside each of several sequences flattened back to back."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __call__(self, layer_idx: int, q: Any, k: Any, v: Any) -> Any:
        parts = zip(q.split(self.lengths), k.split(self.lengths), v.split(self.lengths))
        return torch.cat([CausalAttention()(layer_idx, *p) for p in parts])


class _CachedAttention:
    """A toy KV cache: keys/values of earlier calls stay; new queries see them all."""

    def __init__(self) -> None:
        self.k: dict[int, Any] = {}
        self.v: dict[int, Any] = {}

    def __call__(self, layer_idx: int, q: Any, k: Any, v: Any) -> Any:
        self.k[layer_idx] = torch.cat([self.k[layer_idx], k]) if layer_idx in self.k else k
        self.v[layer_idx] = torch.cat([self.v[layer_idx], v]) if layer_idx in self.v else v
        keys, values = self.k[layer_idx], self.v[layer_idx]
        t, past = q.shape[0], keys.shape[0] - q.shape[0]
        group = q.shape[1] // k.shape[1]
        mask = torch.ones(t, keys.shape[0], dtype=torch.bool).tril(past)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), keys.repeat_interleave(group, 1).transpose(0, 1),
            values.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask,
            scale=q.shape[-1] ** -0.5)
        return out.transpose(0, 1)


def test_flattened_sequences_and_cached_decoding(tiny: Callable[..., Path]) -> None:
    """The engine's contract: many sequences flattened with their own positions,
    and k/v handed to attention after rotary so a cache can keep them."""
    _, model = load_model(tiny(arch="qwen3", head_dim=32), torch.float32, "cpu")
    a, b = _ids(11, seed=20), _ids(6, seed=21)
    with torch.inference_mode():
        both = model.compute_logits(model(torch.cat([a, b]), torch.cat(
            [torch.arange(11), torch.arange(6)]), _SegmentedAttention([11, 6])))
    torch.testing.assert_close(both, torch.cat([_ours(model, a), _ours(model, b)]),
                               atol=1e-5, rtol=0)

    full = _ours(model, a)
    cache = _CachedAttention()
    with torch.inference_mode():
        steps = [model.compute_logits(model(a[:7], torch.arange(7), cache))]
        steps += [model.compute_logits(model(a[i:i + 1], torch.tensor([i]), cache))
                  for i in range(7, 11)]
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=0)
