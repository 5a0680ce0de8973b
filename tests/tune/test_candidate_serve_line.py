"""The `vllm serve` line tune prints for a candidate."""

from __future__ import annotations

import shlex

from kvsched.tune.space import Candidate


def test_the_serve_line_spells_out_every_flag_off_vllms_default() -> None:
    model = "meta-llama/Llama-3.1-8B"
    assert shlex.split(Candidate("h100-sxm", 1).vllm_serve(model)) == [
        "vllm", "serve", model, "--tensor-parallel-size", "1"]
    c = Candidate("h100-sxm", 2, max_num_seqs=64, max_num_batched_tokens=4096, enable_chunked_prefill=False,
                  enable_prefix_caching=False, kv_cache_dtype="fp8", scheduling_policy="priority")
    assert shlex.split(c.vllm_serve(model)) == [
        "vllm", "serve", model, "--tensor-parallel-size", "2", "--max-num-seqs", "64",
        "--max-num-batched-tokens", "4096", "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
        "--kv-cache-dtype", "fp8", "--scheduling-policy", "priority"]
