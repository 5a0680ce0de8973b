"""Pipeline parallelism's price: stages, their layers, the activation hand-off.

vLLM splits a model's layers over ``pipeline_parallel_size`` (PP) stages of
``tensor_parallel_size`` (TP) GPUs each (:func:`stage_layers`, vLLM's
``get_pp_indices``). A scheduled batch (a microbatch) passes the stages in
order: each runs its layers (TP inside the stage, with its all-reduces) and
sends its hidden states to the next stage's GPUs. The engine keeps up to PP
batches in flight (kvsched.config.batch_queue_size), so once the pipeline is
full a batch leaves it every stage time, and each batch takes the sum of its
stage times.

The step price (:class:`PipelineStages`): a backend prices the whole model's
forward pass on one TP group (every layer, the LM head, the host's gaps); a
stage takes ``1/PP`` of that, plus sending the batch's activations
(``tokens x hidden_size x 2`` bytes for 16-bit activations, each TP rank its
``1/TP`` slice, over the link between the two stages' GPUs: NVLink or the
switch within a scale-up domain, the scale-out network beyond it), plus the
link's latency. Stages are taken as equal: the LM head and sampling (last
stage) and the embedding (first) are spread over all of them, an error of
one layer's time or so on a 20-layer stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.errors import UserInputError
from kvsched.perf.hardware import Hardware

# vLLM's activations between stages are the residual stream and the hidden
# states in the model's 16-bit dtype (IntermediateTensors).
ACTIVATION_BYTES = 2.0


def stage_layers(num_layers: int, pipeline_parallel_size: int) -> list[int]:
    """Layers per stage as vLLM 0.33 partitions them (``get_pp_indices``,
    without VLLM_PP_LAYER_PARTITION): an even split; a remainder goes one
    layer each to the stages before the last (the last holds the final norm
    and the LM head), from the second-to-last backwards."""
    pp = pipeline_parallel_size
    if num_layers < pp:
        raise UserInputError(f"pipeline_parallel_size={pp} (--pipeline-parallel-size): the model has "
                             f"{num_layers} layers, fewer than the stages; use at most {num_layers}")
    layers = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        layers[-i] += 1
    return layers


def stage_link_bw(hardware: Hardware, tensor_parallel_size: int, pipeline_parallel_size: int) -> float:
    """Per-direction bandwidth of one GPU's link to the next stage: the
    scale-up fabric when all TP x PP GPUs sit in one scale-up domain (NVLink
    within a node), else the scale-out network (refused where the hardware
    data has none)."""
    gpus = tensor_parallel_size * pipeline_parallel_size
    if gpus <= hardware.scaleup_domain:
        # A point-to-point send uses one peer link on a mesh, the switch's
        # per-GPU rate on a switched fabric (a group of two).
        return hardware.scaleup_bw_for_group(2) * hardware.comm_bw_frac
    if hardware.scaleout_bw is None:
        raise UserInputError(
            f"pipeline_parallel_size={pipeline_parallel_size} (--pipeline-parallel-size) with "
            f"tensor_parallel_size={tensor_parallel_size}: {gpus} GPUs, but {hardware.name}'s "
            f"{hardware.scaleup_kind} joins {hardware.scaleup_domain} and the hardware data has no "
            "scale-out bandwidth to price the hand-off between stages beyond them; use at most "
            f"{hardware.scaleup_domain} GPUs per engine, or give scaleout_bw in a hardware file")
    return hardware.scaleout_bw * hardware.comm_bw_frac


@dataclass(frozen=True, slots=True)
class PipelineStages:
    """The pipeline of one engine: PP stages of TP GPUs; see the module doc."""

    pipeline_parallel_size: int
    tensor_parallel_size: int
    hidden_size: int
    link_bw: float
    link_latency_s: float

    @classmethod
    def build(cls, hardware: Hardware, hidden_size: int, tensor_parallel_size: int,
              pipeline_parallel_size: int) -> PipelineStages:
        return cls(pipeline_parallel_size, tensor_parallel_size, hidden_size,
                   stage_link_bw(hardware, tensor_parallel_size, pipeline_parallel_size),
                   hardware.comm_latency_s)

    def transfer_time(self, num_tokens: int) -> float:
        """Seconds to hand a batch's activations to the next stage: each TP
        rank sends its 1/TP slice in parallel."""
        nbytes = num_tokens * self.hidden_size * ACTIVATION_BYTES / self.tensor_parallel_size
        return self.link_latency_s + nbytes / self.link_bw

    def stage_times(self, step_time: float, num_tokens: int) -> list[float]:
        """Each stage's time for a batch whose whole-model forward pass on one
        TP group costs ``step_time``: 1/PP of it, and the hand-off to the
        next stage (none after the last)."""
        pp = self.pipeline_parallel_size
        compute = step_time / pp
        send = compute + self.transfer_time(num_tokens)
        return [send] * (pp - 1) + [compute]

    def batch_latency(self, step_time: float, num_tokens: int) -> float:
        """A batch's time through an empty pipeline: the sum of its stage times."""
        return sum(self.stage_times(step_time, num_tokens))

    def stage_interval(self, step_time: float, num_tokens: int) -> float:
        """How often a full pipeline finishes a batch of this size: its
        slowest stage's time."""
        return max(self.stage_times(step_time, num_tokens))


class PipelineClock:
    """When each stage of one engine's pipeline is next free; places a batch
    on the stages in order (a stage runs one batch at a time, batches keep
    their order)."""

    __slots__ = ("stages", "free")

    def __init__(self, stages: PipelineStages) -> None:
        self.stages = stages
        self.free = [0.0] * stages.pipeline_parallel_size

    def run(self, ready: float, step_time: float, num_tokens: int) -> tuple[float, float]:
        """(start on the first stage, end on the last) of a batch scheduled at
        ``ready`` whose whole-model step costs ``step_time``."""
        free = self.free
        t = ready
        start = -1.0
        for i, d in enumerate(self.stages.stage_times(step_time, num_tokens)):
            if free[i] > t:
                t = free[i]
            if i == 0:
                start = t
            t += d
            free[i] = t
        return start, t
