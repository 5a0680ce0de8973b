"""The KV-capacity plan against figures computed here from the checkpoint's
architecture and the GPU's visible memory."""

from __future__ import annotations

from kvsched.perf import get_hardware, get_model
from kvsched.perf.memory import plan_memory
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig

GIB = 2**30


def test_qwen3_235b_fp8_tp8_on_h200_has_135381_blocks() -> None:
    # Qwen/Qwen3-235B-A22B-FP8's config.json: hidden 4096, 94 layers, 64 query
    # heads, 4 KV heads of 128, 128 experts (top 8) of 1536, vocabulary
    # 151,936, untied embeddings, per-head q/k norms; block-FP8 weights (1
    # byte) over every linear layer, 16 bits for the rest.
    hidden, layers, heads, kv_heads, head_dim = 4096, 94, 64, 4, 128
    experts, top_k, expert_width, vocab = 128, 8, 1536, 151_936
    tp, block_size, batched_tokens, seqs = 8, 16, 8192, 1024
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2   # q, o; k, v
    expert_weights = experts * 3 * hidden * expert_width                           # gate, up, down
    sixteen_bit = (2 * vocab * hidden                                              # embedding, LM head
                   + layers * (hidden * experts + 2 * hidden + 2 * head_dim)       # router, norms
                   + hidden)                                                       # final norm
    weights = (layers * (attention + expert_weights) * 1 + sixteen_bit * 2) / tp
    assert weights == 29_548_546_944
    # Activation peak: residual + normed input + the wider of QKV and the
    # experts' gate/up outputs, 16-bit, per batched token; float32 logits
    # for every sequence.
    qkv = (heads + 2 * kv_heads) * head_dim // tp
    mlp = 2 * expert_width * top_k // tp
    activations = batched_tokens * (2 * hidden + max(qkv, mlp)) * 2 + seqs * vocab * 4
    budget = 0.9 * 143_771 * 2**20                        # H200: 143,771 MiB visible
    kv_bytes = budget - weights - activations - 1 * GIB   # 1 GiB non-torch memory
    # 4 KV heads over 8 ranks: vLLM replicates them, one KV head per rank.
    per_block = block_size * layers * 2 * 1 * head_dim * 2
    assert per_block == 770_048
    expected = int(kv_bytes // per_block)
    assert expected == 135_381

    plan = plan_memory(get_model("Qwen/Qwen3-235B-A22B"), get_hardware("h200"), ParallelConfig(tp),
                       RuntimeConfig(dtype="fp8_block"), block_size, 0.9, batched_tokens, seqs)
    assert plan.bytes_per_block == per_block
    assert plan.num_gpu_blocks == expected
