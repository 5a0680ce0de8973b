"""The vision encoder's pricer built for a deployment (which images a step
encodes is the scheduler's ``scheduled_encoder_inputs``)."""

from __future__ import annotations

from kvsched.perf.hardware import Hardware
from kvsched.perf.roofline_factors import KERNEL_LATENCY_S, roofline_factors
from kvsched.perf.step_time import gemm_flop_rate
from kvsched.perf.vision import EncoderPricer, VisionSpec


def encoder_pricer(vision: VisionSpec | None, hardware: Hardware,
                   tensor_parallel_size: int) -> EncoderPricer | None:
    """The encoder's pricer on ``hardware`` (None for a text-only model):
    16-bit GEMM rate and weight bandwidth at the roofline's efficiencies."""
    if vision is None:
        return None
    factors = roofline_factors(hardware)
    return EncoderPricer(vision, gemm_flop_rate("bf16", hardware, factors),
                         hardware.mem_bw * factors.gemm_bf16.bw_eff, tensor_parallel_size, KERNEL_LATENCY_S)
