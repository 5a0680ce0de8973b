"""Published P/D, routing and KV-offloading results beside kvsched's simulation of the same set-up.

Each section rebuilds one published experiment as closely as kvsched's
catalogs and flags allow, runs `kvsched simulate` through the run spec, and
prints the published figure next to kvsched's. docs/published_pd.md records
the sources, the set-ups, what differs and the table this script printed.

    PYTHONPATH=. python benchmarks/published_pd.py \
        [--sections distserve splitwise vllm-docs llmd offload-ttft offload-tput]

Sections (about 1 minute of CPU in all):
  distserve     DistServe (OSDI'24) Figure 1: a 13B model on one A100, 512-token prompts, 64-token
                outputs; per-GPU goodput (90 % of requests within TTFT <= 0.4 s and TPOT <= 0.04 s)
                colocated vs 2P1D.
  splitwise     Splitwise (ISCA'24) section VI-A: the KV-cache transfer's share of the prompt time and of
                E2E, coding trace, one request at a time, two H100 machines.
  vllm-docs     vLLM's disaggregated-prefill docs: P/D does not raise throughput, it controls tail ITL
                (Llama-3.1-70B, 8 H100s, 8k-token prompts: colocated DP2 x TP4 vs 1P1D TP4).
  llmd          llm-d-kv-cache-manager benchmark "37-capacity": 4 vLLM pods of Llama-3.1-70B, 83 shared
                8k-token prefixes, precise prefix-cache routing vs random / load routing.
  offload-ttft  vLLM blog "KV offloading connector" (2026-01-08) Figure 1: one request's TTFT when its KV
                is loaded from CPU memory vs computed (Llama-3.1-8B, H100).
  offload-tput  the same blog's Figure 2: throughput of 512-token prefill requests by CPU hit rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvsched.perf.hardware import get_hardware
from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
HOST_TERMS = ROOT / "kvsched" / "perf" / "data" / "host_terms_vllm-0.24_nvidia.json"


def simulate(flags: Sequence[str]) -> dict[str, Any]:
    """One `kvsched simulate` run (no progress bar); its vLLM-bench metrics."""
    return dict(run(parse_spec([*flags, "--no-progress"])).metrics)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
    print()


# --- DistServe, Figure 1 ------------------------------------------------------------------------------

# OPT-13B (facebook/opt-13b config.json: 40 layers, hidden 5120, 40 heads, FFN 20480, vocab 50272,
# 2048 positions, tied embeddings) written as a Llama-family config, the family kvsched reads: every head
# its own KV head (OPT is multi-head), and the two-matrix GELU FFN of 20480 as a gated FFN of 13653
# (3 x 13653 ~ 2 x 20480 weights, so the same FLOPs and bytes per token).
OPT_13B_AS_LLAMA = {
    "model_type": "llama", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
    "num_key_value_heads": 40, "intermediate_size": 13653, "vocab_size": 50272,
    "max_position_embeddings": 2048, "tie_word_embeddings": True,
}


def goodput_at(rates: Sequence[float], attainment: Sequence[float], target: float) -> float | None:
    """The rate where the attainment curve first crosses the target, linearly interpolated between the
    two measured rates around it (DistServe's own reading of its curves, its _plot.py)."""
    for (x0, y0), (x1, y1) in zip(zip(rates, attainment), zip(rates[1:], attainment[1:])):
        if (y0 >= target) != (y1 >= target):
            return x0 + (target - y0) * (x1 - x0) / (y1 - y0)
    return None


def distserve(num_prompts: int) -> None:
    print("## DistServe (OSDI'24) Figure 1: 13B model, A100-80GB, 512 in / 64 out, Poisson\n")
    ttft_slo_ms, tpot_slo_ms, target = 400, 40, 0.9
    per_gpu_rates = [1.0, 2.0, 4.0, 6.0, 8.0, 9.0, 10.0, 11.0, 12.0, 14.0, 16.0]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(OPT_13B_AS_LLAMA))
        common = ["--model", d, "--hardware", "a100-80gb", "-tp", "1", "--dataset-name", "random",
                  "--random-input-len", "512", "--random-output-len", "64", "--num-prompts", str(num_prompts),
                  "--seed", "1", "--goodput", f"ttft:{ttft_slo_ms}", f"tpot:{tpot_slo_ms}"]
        deployments: list[tuple[str, int, list[str]]] = [
            ("colocated, 1 GPU (vLLM v1 defaults: chunked prefill)", 1, []),
            ("colocated, 1 GPU, --no-enable-chunked-prefill", 1, ["--no-enable-chunked-prefill"]),
            ("2P1D, TP1 each (3 GPUs, NVLink)", 3, ["--disaggregation", "2P1D"]),
            ("1P1D, TP1 each (2 GPUs, NVLink)", 2, ["--disaggregation", "1P1D"]),
        ]
        rows = []
        goodputs: dict[str, float | None] = {}
        for name, gpus, extra in deployments:
            att: list[float] = []
            p90: list[str] = []
            for r in per_gpu_rates:
                m = simulate([*common, *extra, "--request-rate", repr(r * gpus)])
                att.append(m["request_goodput"] / m["request_throughput"])
                p90.append(f"{m['p90_ttft_ms']:.0f}/{m['p90_tpot_ms']:.0f}")
            g = goodput_at(per_gpu_rates, att, target)
            goodputs[name] = g
            rows.append([name, *(f"{a:.0%} ({q})" for a, q in zip(att, p90)),
                         f"{g:.2f}" if g is not None else f"> {per_gpu_rates[-1]}"])
        table(["deployment", *(f"{r:g}/GPU" for r in per_gpu_rates), "goodput req/s/GPU"], rows)
        print("cells: share of requests within both SLOs (P90 TTFT / P90 TPOT, ms).\n")
        colo, nochunk, pd, pd11 = (goodputs[n] for n, _, _ in deployments)
        published = [("colocated goodput per GPU", "1.6 req/s", colo),
                     ("2P1D goodput per GPU", "3.3 req/s", pd)]
        rows = [[what, pub, f"{ks:.2f} req/s" if ks is not None else "-"] for what, pub, ks in published]
        if colo and pd:
            rows.append(["2P1D / colocated", "2.1x", f"{pd / colo:.2f}x"])
        if nochunk and pd:
            rows.append(["2P1D / colocated without chunked prefill", "(2.1x)", f"{pd / nochunk:.2f}x"])
        if colo and pd11:
            rows.append(["1P1D / colocated", "-", f"{pd11 / colo:.2f}x"])
        table(["DistServe Figure 1", "published", "kvsched"], rows)


# --- Splitwise, section VI-A --------------------------------------------------------------------------

def splitwise(num_prompts: int) -> None:
    print("## Splitwise (ISCA'24) VI-A: KV transfer overhead, coding trace, no batching, 2 x DGX-H100\n")
    common = ["--model", "meta-llama/Llama-2-70b-hf", "--hardware", "h100-sxm", "-tp", "8",
              "--dataset-name", "azure", "--dataset-path", str(TRACES / "azure_llm_2023_code.csv"),
              "--num-prompts", str(num_prompts), "--max-concurrency", "1"]
    base = simulate(common)
    pd = simulate([*common, "--disaggregation", "1P1D"])
    kv, split = pd["kv_transfer"], pd["ttft_split_ms"]
    read_ms = kv["mean_ms"]
    rows = [
        ["requests / mean prompt tokens", "(coding trace)",
         f"{pd['completed']} ({pd['failed']} refused: over Llama-2's 4,096 context) / "
         f"{pd['total_input_tokens'] / pd['completed']:.0f}"],
        ["KV read mean / p99 (ms)", "serialized: grows with the prompt; per-layer: ~5 ms not overlapped",
         f"{read_ms:.2f} / {kv['p99_ms']:.2f} ({', '.join(kv['paths'])})"],
        ["KV transfer / prompt computation", "< 7 %", f"{read_ms / split['prefill_leg_ms']:.1%}"],
        ["serialized transfer / E2E", "up to 3 % (large prompts)",
         f"{read_ms / pd['mean_e2el_ms']:.1%} (mean)"],
        ["P/D E2E over colocated E2E, all costs", "-",
         f"+{pd['mean_e2el_ms'] / base['mean_e2el_ms'] - 1:.1%} "
         f"(hop {split['hop_ms']:.1f} ms, read {split['kv_wait_and_read_ms']:.1f} ms)"],
    ]
    # Splitwise's "large prompts": 4,000 tokens (Llama-2-70B's context is 4,096), 13 output tokens (the
    # coding trace's median).
    long = ["--model", "meta-llama/Llama-2-70b-hf", "--hardware", "h100-sxm", "-tp", "8",
            "--dataset-name", "random", "--random-input-len", "4000", "--random-output-len", "13",
            "--num-prompts", "20", "--max-concurrency", "1"]
    long_base = simulate(long)
    long_pd = simulate([*long, "--disaggregation", "1P1D"])
    long_read = long_pd["kv_transfer"]["mean_ms"]
    rows += [
        ["4K-token prompt: KV read (ms)", "-", f"{long_read:.2f}"],
        ["4K-token prompt: serialized transfer / E2E", "up to 3 %",
         f"{long_read / long_pd['mean_e2el_ms']:.1%}"],
        ["4K-token prompt: P/D E2E over colocated, all costs", "-",
         f"+{long_pd['mean_e2el_ms'] / long_base['mean_e2el_ms'] - 1:.1%}"],
    ]
    table(["Splitwise VI-A", "published", "kvsched (vLLM NixlConnector: serialized pull)"], rows)


# --- vLLM docs: disaggregated prefilling --------------------------------------------------------------

def vllm_docs(num_prompts: int) -> None:
    print("## vLLM docs: P/D does not improve throughput; it controls tail ITL "
          "(benchmarks/pd_shape.py's set-up)\n")
    common = ["--model", "meta-llama/Llama-3.1-70B", "--hardware", "h100-sxm", "-tp", "4",
              "--dataset-name", "random", "--random-input-len", "8000", "--random-output-len", "256",
              "--random-range-ratio", "0.2", "--seed", "1", "--num-prompts", str(num_prompts)]
    rows = []
    for rate in (0.5, 1.0, 1.5):
        for name, extra in (("colocated DP2 x TP4", ["-dp", "2"]),
                            ("1P1D, TP4 each", ["--disaggregation", "1P1D"])):
            m = simulate([*common, *extra, "--request-rate", repr(rate)])
            rows.append([f"{rate:g}", name, f"{m['output_throughput_per_gpu']:.1f}",
                         f"{m['mean_tpot_ms']:.1f}", f"{m['p99_tpot_ms']:.1f}", f"{m['p99_itl_ms']:.1f}",
                         f"{m['mean_ttft_ms']:.0f}"])
    table(["req/s", "8 H100s as", "output tok/s per GPU", "mean TPOT (ms)", "p99 TPOT (ms)", "p99 ITL (ms)",
           "mean TTFT (ms)"], rows)


# --- llm-d precise prefix-cache routing ---------------------------------------------------------------

def shared_prefix_trace(path: Path, qps: float, n: int, *, seed: int = 0, groups: int = 83,
                        per_group: int = 3) -> None:
    """inference-perf's shared_prefix data as a Mooncake trace: each request one of `groups` x
    `per_group` prompts drawn at random, a group's 16 shared 512-token blocks (8,192 tokens, for
    the benchmark's 8,000) then its own question (808 tokens, for 1,000; 9,000 in all), 1,000
    output tokens, Poisson arrivals at `qps`."""
    rng = random.Random(seed)
    t = 0.0
    lines = []
    for _ in range(n):
        g, p = rng.randrange(groups), rng.randrange(per_group)
        question = groups * 16 + (g * per_group + p) * 2
        ids = [g * 16 + j for j in range(16)] + [question, question + 1]
        lines.append(json.dumps({"timestamp": round(t * 1000, 3), "input_length": 9000,
                                 "output_length": 1000, "hash_ids": ids}))
        t += rng.expovariate(qps)
    path.write_text("\n".join(lines) + "\n")


# Published: llm-d-kv-cache-manager benchmarking/37-capacity/README.md, per-QPS tables
# (output tok/s, TTFT p90 s, TTFT mean s) for precise-prefix-cache_load, random, load.
LLMD_37 = {
    3.0: {"precise": (2590.0, 0.400, 0.246), "random": (2505.7, 2.000, 1.102),
          "load": (2545.4, 3.299, 1.548)},
    5.0: {"precise": (3916.7, 0.400, 0.270), "random": (2898.2, 30.994, 11.988),
          "load": (2943.6, 31.501, 11.329)},
    10.0: {"precise": (6264.0, 0.400, 0.242), "random": (3117.3, 88.089, 46.359),
           "load": (2620.3, 129.421, 47.727)},
    20.0: {"precise": (8003.9, 0.400, 0.250), "random": (3241.0, 197.010, 93.345),
           "load": (2334.5, 208.052, 86.643)},
}
# The benchmark's stage lengths (s) at those rates, so each simulated stage has as many requests.
LLMD_37_STAGE_S = {3.0: 210, 5.0: 120, 10.0: 70, 20.0: 50}


def llmd() -> None:
    print("## llm-d precise prefix-cache routing (llm-d-kv-cache-manager benchmarking/37-capacity)\n")
    routers = (("precise", "prefix-aware"), ("random", "round-robin"), ("load", "least-loaded"))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "shared_prefix.jsonl"
        for qps, published in LLMD_37.items():
            shared_prefix_trace(trace, qps, int(qps * LLMD_37_STAGE_S[qps]))
            for theirs, ours in routers:
                m = simulate(["--model", "meta-llama/Llama-3.1-70B", "--hardware", "h100-sxm", "-tp", "4",
                              "-dp", "4", "--dp-routing", ours, "--dataset-name", "mooncake",
                              "--dataset-path", str(trace)])
                tput, p90, mean = published[theirs]
                rows.append([f"{qps:g}", f"{theirs} / {ours}", f"{tput:.0f} / {m['output_throughput']:.0f}",
                             f"{p90:.2f} / {m['p90_ttft_ms'] / 1000:.2f}",
                             f"{mean:.2f} / {m['mean_ttft_ms'] / 1000:.2f}",
                             f"{m['prefix_cache_hit_rate']:.0%}", m["num_preemptions"]])
    table(["QPS", "llm-d router / kvsched --dp-routing", "output tok/s pub / kvsched",
           "TTFT p90 s pub / kvsched", "TTFT mean s pub / kvsched", "kvsched prefix hit",
           "kvsched preemptions"], rows)


# --- vLLM blog: KV offloading connector ---------------------------------------------------------------

def no_api_server_terms(d: Path) -> Path:
    """kvsched's default host terms without the API server's (arrival, per prompt token): the blog's
    benchmark ran with de/tokenization disabled."""
    terms = json.loads(HOST_TERMS.read_text())
    terms.update(arrival_s=0.0, per_prompt_token_s=0.0)
    path = d / "host_terms_no_api_server.json"
    path.write_text(json.dumps(terms))
    return path


def h100_host_link(d: Path, bw: float) -> Path:
    """The catalog's H100 SXM with another host-link rate (same id, so the same measured kernels)."""
    fields = {k: v for k, v in dataclasses.asdict(get_hardware("h100-sxm")).items() if v is not None}
    fields["host_link_bw"] = bw
    path = d / f"h100-sxm-host-{bw / 1e9:g}GBps.json"
    path.write_text(json.dumps(fields))
    return path


# The host links the offloading sections price: the catalog's PCIe Gen5 x16 peak, and the one-direction
# DMA rate the blog measured on its H100 (Figures 3-4: about 50 GB/s).
HOST_LINKS = (("64 GB/s (catalog)", 64e9), ("50 GB/s (blog's DMA)", 50e9))


def offload_ttft() -> None:
    print("## vLLM blog, KV offloading connector, Figure 1: one request's TTFT, CPU load vs compute\n")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cal = no_api_server_terms(Path(d))
        links = [(name, h100_host_link(Path(d), bw)) for name, bw in HOST_LINKS]
        for tokens in (512, 2048, 8192, 32768, 100000):
            cells: list[str] = []
            for _, hw in links:
                def mean_ttft(n: int, tokens: int = tokens, hw: Path = hw) -> float:
                    # n identical prompts one after another: the first computes and stores its KV, the
                    # second finds it in CPU memory (GPU prefix caching off, as in the blog).
                    return float(simulate(["--model", "meta-llama/Llama-3.1-8B", "--hardware", str(hw),
                                           "--dataset-name", "random", "--random-prefix-len", str(tokens),
                                           "--random-input-len", "1", "--random-output-len", "1",
                                           "--num-prompts", str(n), "--max-concurrency", "1",
                                           "--no-enable-prefix-caching", "--kv-offloading-size", "64",
                                           "--calibration", str(cal)])["mean_ttft_ms"])
                cold = mean_ttft(1)
                warm = 2 * mean_ttft(2) - cold
                cells.append(f"{cold:.1f} / {warm:.1f} = {cold / warm:.1f}x")
            pub = "2x" if tokens == 512 else "(2x-22x over the blog's prompt sizes)"
            rows.append([tokens + 1, pub, *cells])
    table(["prompt tokens", "published speed-up",
           *(f"kvsched TTFT computed / loaded (ms), host link {name}" for name, _ in HOST_LINKS)], rows)


def offload_tput(n: int) -> None:
    print("## vLLM blog, KV offloading connector, Figure 2: 512-token prefill requests by CPU hit rate\n")
    t0_ms = 1_000_000.0  # the measured phase starts long after the warm-up phase has finished
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cal = no_api_server_terms(Path(d))
        trace = Path(d) / "prefills.jsonl"
        for link, bw in HOST_LINKS:
            hw = h100_host_link(Path(d), bw)
            base: float | None = None
            for hit in (0.0, 0.5, 1.0):
                # Warm-up: n unique one-block prompts (their KV stored to CPU); then, at t0, n prompts of
                # which the first `hit` share repeat warm-up prompts. Throughput is the second phase's.
                lines = [{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [i]}
                         for i in range(n)]
                lines += [{"timestamp": t0_ms, "input_length": 512, "output_length": 1,
                           "hash_ids": [i if i < hit * n else n + i]} for i in range(n)]
                trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
                # CPU cache sized to hold both phases (2n x 64 MiB) so no CPU eviction interferes.
                m = simulate(["--model", "meta-llama/Llama-3.1-8B", "--hardware", str(hw),
                              "--dataset-name", "mooncake", "--dataset-path", str(trace),
                              "--no-enable-prefix-caching", "--kv-offloading-size",
                              str(-(-2 * n * 64 // 1024) + 8), "--calibration", str(cal)])
                tput = n * 512 / (m["duration"] - t0_ms / 1000)
                base = base or tput
                rows.append([link, f"{hit:.0%}", f"{tput:,.0f}", f"{tput / base:.1f}x",
                             "up to 9x" if hit == 1.0 else ("1x" if hit == 0 else "-")])
    table(["host link", "CPU hit rate", "kvsched prompt tok/s", "kvsched vs 0 %", "published vs 0 %"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sections: dict[str, Callable[[argparse.Namespace], None]] = {
        "distserve": lambda a: distserve(a.num_prompts),
        "splitwise": lambda a: splitwise(a.num_prompts),
        "vllm-docs": lambda a: vllm_docs(150),
        "llmd": lambda a: llmd(),
        "offload-ttft": lambda a: offload_ttft(),
        "offload-tput": lambda a: offload_tput(a.offload_requests),
    }
    p.add_argument("--sections", nargs="+", choices=list(sections), default=list(sections))
    p.add_argument("--num-prompts", type=int, default=300,
                   help="requests per DistServe rate point and for the Splitwise runs")
    p.add_argument("--offload-requests", type=int, default=2000,
                   help="prefill requests per phase of offload-tput (the blog used 10,000)")
    args = p.parse_args()
    for name in args.sections:
        sections[name](args)


if __name__ == "__main__":
    main()
