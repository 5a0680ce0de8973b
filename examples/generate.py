"""Offline generation with kvsched's engine, the way one would with vLLM's LLM.

    kvsched make-tiny-model /tmp/tiny          # or any local Llama/Mistral/Qwen2/Qwen3 checkpoint
    python examples/generate.py /tmp/tiny
"""

from __future__ import annotations

import sys

from kvsched import LLM, SamplingParams


def main(model: str) -> None:
    llm = LLM(model, max_num_seqs=8, enable_prefix_caching=True, kv_cache_memory="256MiB")
    prompts = ["The history of the printing press", "A recipe for bread:", "The history of the telescope"]
    params = [SamplingParams(temperature=0.0, max_tokens=24),                        # greedy
              SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=24),     # seeded sampling
              SamplingParams(temperature=0.0, max_tokens=24, stop=["."], logprobs=1)]
    for out in llm.generate(prompts, params):
        c = out.outputs[0]
        ttft = out.metrics.time_to_first_token or 0.0
        print(f"{out.prompt!r} -> {c.text!r}")
        print(f"    {len(c.token_ids)} tokens, finish_reason={c.finish_reason}, "
              f"cached prompt tokens={out.num_cached_tokens}, TTFT {ttft * 1000:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny")
