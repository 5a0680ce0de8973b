"""docs/lora.md's worked example: Llama-3.1-8B on one H100, 8 adapters in a
Zipf(1) mix, max_loras 8/4/2 beside the base model, and the per-step LoRA
prices. Run: ``python benchmarks/lora_example.py`` (about 20 s on one core)."""

from __future__ import annotations

from kvsched.perf.hardware import get_hardware
from kvsched.perf.lora import Adapter, lora_cost
from kvsched.perf.model_catalog import get_model
from kvsched.sim.flags import parse_spec
from kvsched.sim.run import run

WORKLOAD = ["--num-prompts", "500", "--request-rate", "10", "--random-input-len", "1024",
            "--random-output-len", "128"]
ZIPF = ["--enable-lora", "--num-lora-adapters", "8", "--lora-zipf-alpha", "1.0"]
RUNS = (("base model (no --enable-lora)", []),
        ("--enable-lora, --max-loras 8, --lora-share 0",
         ["--enable-lora", "--max-loras", "8", "--lora-share", "0"]),
        ("--max-loras 8", [*ZIPF, "--max-cpu-loras", "8", "--max-loras", "8"]),
        ("--max-loras 4", [*ZIPF, "--max-cpu-loras", "8", "--max-loras", "4"]),
        ("--max-loras 2", [*ZIPF, "--max-cpu-loras", "8", "--max-loras", "2"]),
        ("--max-loras 2, --max-cpu-loras 2", [*ZIPF, "--max-loras", "2"]))


def main() -> None:
    print("| deployment | KV blocks | req/s | mean TTFT ms | P90 TTFT ms | mean TPOT ms | P90 E2EL ms | "
          "loads disk/CPU | load s | kernel s |")
    for name, extra in RUNS:
        m = run(parse_spec(WORKLOAD + extra)).metrics
        lora = m.get("lora")
        loads = f"{lora['loads_from_disk']}/{lora['loads_from_cpu']}" if lora else "-"
        print(f"| {name} | {m['num_gpu_blocks']} | {m['request_throughput']:.2f} | {m['mean_ttft_ms']:.0f} | "
              f"{m['p90_ttft_ms']:.0f} | {m['mean_tpot_ms']:.2f} | {m['p90_e2el_ms']:.0f} | {loads} | "
              f"{lora['load_seconds'] if lora else 0:.2f} | {lora['kernel_seconds'] if lora else 0:.2f} |")
    model, hardware = get_model("meta-llama/Llama-3.1-8B"), get_hardware("h100-sxm")
    for rank in (8, 16, 64):
        cost = lora_cost(model, hardware, 1, 8, rank, None, False, ())
        a = Adapter("a", "", rank)
        kernels = ", ".join(f"{t} tok/{n} adapters {cost.kernel_seconds(t, n) * 1e3:.2f} ms"
                            for t, n in ((64, 1), (256, 8), (8192, 1), (8192, 8)))
        print(f"rank {rank}: adapter {cost.adapter_bytes(a) / 1e6:.1f} MB, 8 slots "
              f"{cost.slot_bytes() / 2**30:.2f} GiB, load from CPU "
              f"{cost.load_seconds(a, False) * 1e3:.1f} ms, from disk "
              f"{cost.load_seconds(a, True) * 1e3:.0f} ms")
        print(f"  kernels: {kernels}")


if __name__ == "__main__":
    main()
