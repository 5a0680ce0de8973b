"""Sliding-window models on the paged KV cache: greedy outputs of
kvsched.LLM on tiny random checkpoints equal transformers' generate, token
for token.

Gemma 3 text: 6 layers, every third global (sliding_window_pattern 3), a
window of 12 tokens, far below the prompts (20-150 tokens), so the local
layers forget most of every prompt. vLLM's planner gives it three KV cache
groups (two sliding-window groups of two layers, one full-attention group of
two); each layer reads its group's block table. Mistral: the same window on
every layer, one sliding-window group. A copy of each checkpoint whose
window covers everything shows the window matters: its outputs differ from
transformers' on the windowed model."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvsched.engine.llm import LLM  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402

VOCAB = 512
WINDOW = 12
# Untied embeddings: tied ones make the tiny random Gemma repeat its input.
GEMMA3 = {"arch": "gemma3", "num_layers": 6, "sliding_window": WINDOW,
          "sliding_window_pattern": 3, "max_position_embeddings": 1024}
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "gemma3": GEMMA3,
    "mistral": {"arch": "mistral", "num_layers": 2, "sliding_window": WINDOW,
                "max_position_embeddings": 1024},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "sync": {},
    "async": {"async_scheduling": True},
    "ngram-k3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 3}},
}


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def ckpt(request: pytest.FixtureRequest, tiny: Callable[..., Path]) -> Path:
    return tiny(**CHECKPOINTS[request.param])


@pytest.fixture(scope="module")
def reference(ckpt: Path, hf_model: Callable[[Path], Any]) -> Callable[[list[int], int], list[int]]:
    """transformers' greedy generate, one prompt at a time, memoised."""
    model = hf_model(ckpt)
    assert model.config.sliding_window == WINDOW
    if type(model).__name__ == "Gemma3ForCausalLM":
        assert model.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"] * 2
    else:
        assert type(model).__name__ == "MistralForCausalLM"
    memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in memo:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=model.generation_config.eos_token_id)
            memo[key] = out[0, len(prompt):].tolist()
        return memo[key]

    return generate


def _prompts(seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    """Random prompts; some repeat a short unit so the n-gram proposer finds drafts."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        if rng.random() < 0.5:
            prompts.append([rng.randrange(4, VOCAB) for _ in range(length)])
        else:
            unit = [rng.randrange(4, VOCAB) for _ in range(rng.randint(2, 6))]
            prompts.append((unit * (length // len(unit) + 1))[:length])
    return prompts


def _generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert not llm.has_unfinished_requests()
    llm.engine.scheduler.check_invariants()
    llm.engine.runner.check_invariants()
    return [o.outputs[0].token_ids for o in outs]


def test_kv_cache_groups(tiny: Callable[..., Path]) -> None:
    llm = LLM(str(tiny(**GEMMA3)), block_size=4, kv_cache_memory="4MiB")
    groups = llm.engine.runner.kv_groups
    assert [(g.kind, g.sliding_window, g.num_layers) for g in groups.groups] == [
        ("sliding_window", WINDOW, 2), ("sliding_window", WINDOW, 2), ("full_attention", None, 2)]
    assert groups.layers == ((0, 3), (1, 4), (2, 5))
    assert llm.engine.cache_config.kv_groups == groups.groups
    mistral = LLM(str(tiny(**CHECKPOINTS["mistral"])), block_size=4, kv_cache_memory="4MiB")
    assert [(g.kind, g.sliding_window, g.num_layers) for g in mistral.engine.cache_config.kv_groups] == [
        ("sliding_window", WINDOW, 2)]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("budget", [16, 37])
def test_chunked_prefill_and_concurrency(ckpt: Path, reference: Any, variant: str, budget: int) -> None:
    """Prompts of 20-150 tokens in chunks of at most ``budget`` tokens, up
    to 8 requests at once, 4-token blocks (a window spans 3-4 blocks)."""
    prompts = _prompts(2, 12, 20, 150)
    llm = LLM(str(ckpt), max_num_seqs=8, max_num_batched_tokens=budget, block_size=4,
              enable_prefix_caching=False, kv_cache_memory="16MiB", **VARIANTS[variant])
    outs = _generate(llm, prompts, 16)
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        assert out == reference(prompt, 16), f"prompt {i} ({len(prompt)} tokens)"


# Pools small enough to preempt: Mistral's one windowed group frees what its
# window passes, so it needs far fewer blocks than Gemma 3's three groups.
POOL_BLOCKS = {"gemma3": 120, "mistral": 24}
# Whether the shared prefix is hit. vLLM's default prefix_cache_retention_interval
# (0) keeps a sliding-window group's blocks reachable only at replay and
# shared-prefix junctions, so requests running together get no hit on a model
# whose every layer slides (Mistral); Gemma 3's full-attention group finds
# the prefix and its windowed groups the window before it.
PREFIX_HIT = {"gemma3": True, "mistral": False}


def test_many_prompts_prefix_caching_and_preemption(ckpt: Path, reference: Any,
                                                    request: pytest.FixtureRequest) -> None:
    """One run of 24 prompts sharing prefixes, in a cache small enough to preempt."""
    name = request.node.callspec.params["ckpt"]
    rng = random.Random(3)
    prefix = [rng.randrange(4, VOCAB) for _ in range(40)]
    prompts = [prefix + p for p in _prompts(4, 12, 1, 60)] + _prompts(5, 12, 20, 120)
    llm = LLM(str(ckpt), max_num_seqs=16, max_num_batched_tokens=64, block_size=4,
              num_gpu_blocks_override=POOL_BLOCKS[name])
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False)
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        assert out.outputs[0].token_ids == reference(prompt, 20), f"prompt {i} ({len(prompt)} tokens)"
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert (sum(o.num_cached_tokens for o in outs) > 0) == PREFIX_HIT[name]


def test_outputs_without_the_window_differ(ckpt: Path, reference: Any, tmp_path: Path) -> None:
    """The same weights with a window covering every position (full
    attention everywhere) give other tokens than transformers gives with
    the window: the parity above depends on the window being honoured."""
    wide = tmp_path / "wide"
    shutil.copytree(ckpt, wide)
    config = json.loads((wide / "config.json").read_text())
    config["sliding_window"] = 1024
    (wide / "config.json").write_text(json.dumps(config))
    prompts = _prompts(2, 12, 20, 150)
    outs = _generate(LLM(str(wide), max_num_seqs=8, max_num_batched_tokens=37, block_size=4,
                         kv_cache_memory="16MiB"), prompts, 16)
    differ = sum(out != reference(p, 16) for p, out in zip(prompts, outs))
    assert differ >= len(prompts) // 2, differ
