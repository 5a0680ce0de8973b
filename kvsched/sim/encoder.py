"""The vision encoder's time in the simulator: which of a request's images
a step encodes, and the pricer built for a deployment."""

from __future__ import annotations

from collections.abc import Sequence

from kvsched.perf.hardware import Hardware
from kvsched.perf.roofline_factors import KERNEL_LATENCY_S, roofline_factors
from kvsched.perf.step_time import gemm_flop_rate
from kvsched.perf.vision import EncoderPricer, VisionSpec
from kvsched.sim.workload.model import MMItem


def items_encoded(items: Sequence[MMItem], num_computed: int, num_new: int) -> list[MMItem]:
    """The items a step computing prompt tokens ``[num_computed,
    num_computed + num_new)`` runs the encoder on: those whose placeholder
    starts in that range.

    This stands in for the scheduler's report of the encoder inputs it
    scheduled (vLLM's ``scheduled_encoder_inputs``), until kvsched's
    scheduler reports them: vLLM schedules an item's encoder input in the
    first step whose chunk overlaps its placeholder, which is the chunk
    holding its first token while nothing of it is cached. Not modelled
    here: an item whose tokens a prefix-cache hit skips (vLLM encodes it
    only if a later chunk still overlaps it), the encoder cache's sharing
    of identical items, and its budget splitting a chunk before an item
    (``disable_chunked_mm_input``, the encoder compute budget). A request
    preempted and recomputed encodes its items again, as vLLM does once
    its encoder-cache entries are freed."""
    end = num_computed + num_new
    return [item for item in items if num_computed <= item.offset < end]


def encoder_pricer(vision: VisionSpec | None, hardware: Hardware,
                   tensor_parallel_size: int) -> EncoderPricer | None:
    """The encoder's pricer on ``hardware`` (None for a text-only model):
    16-bit GEMM rate and weight bandwidth at the roofline's efficiencies."""
    if vision is None:
        return None
    factors = roofline_factors(hardware)
    return EncoderPricer(vision, gemm_flop_rate("bf16", hardware, factors),
                         hardware.mem_bw * factors.gemm_bf16.bw_eff, tensor_parallel_size, KERNEL_LATENCY_S)
