"""Pipeline parallelism beside tensor parallelism: Llama-3.1-70B on H100 SXM (issue 23).

For TP4, TP8 and PP 2 / 4 on the same GPU counts (TP2 x PP2, TP1 x PP4,
TP4 x PP2, TP2 x PP4), kvsched's figures:

1. the memory plan per GPU (``kvsched.perf.memory.plan_memory``: weights, KV
   room, KV blocks and the tokens they hold; with PP the stage with the least
   room);
2. the step price (the deployment's step backend, split over the stages by
   ``kvsched.perf.pipeline``): a 4,096-token prefill, and a decode batch of B
   requests at 2,048 tokens of context. TP-only runs the batch in one step;
   PP runs it as PP microbatches of B / PP (what vLLM's PP engine does in a
   steady decode: PP batches in flight, each request in one of them). The
   table gives the time per generated token of a request (the step, or a
   microbatch's round trip through the pipeline) and the batch's tokens per
   second;
3. a simulated run (``kvsched simulate``): random prompts of 1,024 tokens,
   256-token outputs, Poisson arrivals at ``--rate``.

    PYTHONPATH=. python benchmarks/pipeline_parallel.py [--rate 8] [--num-prompts 400]
"""

from __future__ import annotations

import argparse

from kvsched.perf.memory import GIB
from kvsched.perf.step_time import BatchShape
from kvsched.sim.deployment import Deployment, EngineOptions, build_deployment
from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

MODEL = "meta-llama/Llama-3.1-70B"
HARDWARE = "h100-sxm"
# (TP, PP): TP-only and PP on 4 and 8 GPUs.
LAYOUTS = [(4, 1), (2, 2), (1, 4), (8, 1), (4, 2), (2, 4)]
CONTEXT = 2048
PREFILL = 4096


def _deployment(tp: int, pp: int) -> Deployment:
    # docs/pipeline_parallel.md's figures: vLLM 0.33's sizing at 0.9 of the
    # device in 16-token blocks, pinned (the release's own default is 0.92).
    return build_deployment(EngineOptions(vllm_version="0.33", model=MODEL, hardware=HARDWARE,
                                          tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                          block_size=16, gpu_memory_utilization=0.9))


def _name(tp: int, pp: int) -> str:
    return f"TP{tp}" if pp == 1 else f"TP{tp} x PP{pp}"


def memory_table() -> None:
    print("| layout | GPUs | weights / GPU (GiB) | KV room / GPU (GiB) | KV blocks | KV tokens | "
          "stage that sets it |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tp, pp in LAYOUTS:
        m = _deployment(tp, pp).memory
        stage = f"{m.stage + 1} of {pp}" if pp > 1 else "-"
        print(f"| {_name(tp, pp)} | {tp * pp} | {m.weight_bytes / GIB:.1f} | {m.kv_cache_bytes / GIB:.1f} | "
              f"{m.num_gpu_blocks:,} | {m.num_gpu_blocks * 16:,} | {stage} |")


def _decode(d: Deployment, batch: int) -> tuple[float, float]:
    """(seconds per generated token of a request, batch tokens per second)."""
    model = d.step_model
    pipeline = model.pipeline
    if pipeline is None:
        t = model.step_time(BatchShape.decode(batch, batch * CONTEXT))
        return t, batch / t
    pp = pipeline.pipeline_parallel_size
    micro = batch // pp
    t = model.step_time(BatchShape.decode(micro, micro * CONTEXT))
    # A microbatch's next decode waits for its output (the latency); the
    # pipeline takes a new microbatch every stage interval.
    period = max(pipeline.batch_latency(t, micro), pp * pipeline.stage_interval(t, micro))
    return period, batch / period


def step_table(batches: list[int]) -> None:
    heads = " | ".join(f"B={b}: ms per token / tok/s" for b in batches)
    print(f"| layout | prefill {PREFILL:,} tokens: latency (ms) | stage (ms) | hand-off (ms) | {heads} |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in batches) + " |")
    for tp, pp in LAYOUTS:
        d = _deployment(tp, pp)
        model = d.step_model
        shape = BatchShape(PREFILL, 1, 1, 0, 0, PREFILL, PREFILL, PREFILL * (PREFILL + 1) // 2)
        t = model.step_time(shape)
        if model.pipeline is None:
            latency, stage, handoff = t, t, 0.0
        else:
            latency = model.pipeline.batch_latency(t, PREFILL)
            stage = model.pipeline.stage_interval(t, PREFILL)
            handoff = model.pipeline.transfer_time(PREFILL)
        cells = []
        for b in batches:
            per_token, rate = _decode(d, b)
            cells.append(f"{per_token * 1e3:.2f} / {rate:,.0f}")
        print(f"| {_name(tp, pp)} | {latency * 1e3:.1f} | {stage * 1e3:.1f} | {handoff * 1e3:.3f} | "
              + " | ".join(cells) + " |")
    print(f"\nstep backend: {_deployment(4, 1).step_model.describe_backend()}")


def simulated_table(rate: float, num_prompts: int) -> None:
    print("| layout | GPUs | output tok/s | per GPU | mean TTFT (ms) | mean TPOT (ms) | p99 TPOT (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tp, pp in LAYOUTS:
        spec = parse_spec(["--model", MODEL, "--hardware", HARDWARE, "-tp", str(tp), "-pp", str(pp),
                           "--dataset-name", "random", "--random-input-len", "1024",
                           "--random-output-len", "256", "--num-prompts", str(num_prompts),
                           "--request-rate", str(rate), "--seed", "1"])
        m = run(spec).metrics
        print(f"| {_name(tp, pp)} | {tp * pp} | {m['output_throughput']:,.0f} | "
              f"{m['output_throughput'] / (tp * pp):,.0f} | {m['mean_ttft_ms']:.0f} | "
              f"{m['mean_tpot_ms']:.1f} | {m['p99_tpot_ms']:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    p.add_argument("--no-simulate", action="store_true", help="only the memory plan and the step price")
    args = p.parse_args()
    memory_table()
    print()
    step_table(args.batches)
    if not args.no_simulate:
        print()
        simulated_table(args.rate, args.num_prompts)


if __name__ == "__main__":
    main()
