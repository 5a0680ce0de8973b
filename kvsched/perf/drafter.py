"""Speculative decoding's drafter: its time per engine step and its memory.

What vLLM 0.33 runs (``vllm/v1/spec_decode/llm_base_proposer.py``, the
padded drafter batch it uses by default), after the target model's forward
pass of every step that computed tokens:

- pass 1 runs the drafter over every token the step scheduled (the target's
  hidden state of each position, its input ids shifted by one) and samples
  one draft per request from the last position;
- passes 2..K run it over one token per request (the previous pass's
  draft), K = ``num_speculative_tokens``;
- every pass ends in the LM head over one row per request.

The drafter model per method:

- ``mtp``: one of the checkpoint's multi-token-prediction modules: ``eh_proj``
  (a replicated 16-bit ``nn.Linear`` of [embedding; hidden], 2H -> H), one
  decoder layer of the target (DeepSeek-V3's is an MoE layer, with MLA
  attention) and the target's LM head (shared). With K larger than the
  checkpoint's ``num_nextn_predict_layers`` vLLM reuses the modules
  (``spec_step_idx % num_mtp_layers``; K must then be a multiple of it), so
  every pass costs one module.
- ``eagle``: ``fc`` (replicated, 2H -> H) and one decoder layer of the
  target's width, every pass; the LM head is the target's.
- ``eagle3``: ``fc`` over three of the target's hidden states (3H -> H) in
  the first pass, one decoder layer every pass. Its draft vocabulary is
  often smaller than the target's; without its config the LM head is priced
  at the target's vocabulary (an upper bound).
- ``ngram`` (CPU proposer): no GPU work; a CPU cost per sampling request
  (``NGRAM_CPU_PER_REQUEST_S``) in series with the step (vLLM refuses it
  with async scheduling). ``ngram_gpu``: a GPU match kernel, not priced.

The decoder layer is a one-layer copy of the target priced by the target's
own backend (the same kernel tables or roofline, the same CUDA-graph
padding, no host terms of its own), so a drafter pass costs what one target
layer costs at its tokens, plus the input projection and the LM head. For an
EAGLE head on an MoE target the layer is an MoE layer like the target's
(published EAGLE heads are often dense: an upper bound there).

Memory: the drafter's layer weights (and the input projection) come out of
the KV budget, and each of its attention layers holds KV per token in the
target's block tables (vLLM puts the drafter's layers in the target's KV
cache group): ``num_mtp_layers`` layers for MTP, one for EAGLE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvsched.config import DRAFTER_METHODS, NGRAM_METHODS
from kvsched.errors import UserInputError
from kvsched.perf.host import NO_HOST_TIME
from kvsched.perf.measured import MeasuredStepTimeModel
from kvsched.perf.memory import weight_bytes_per_device
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel

# The CPU n-gram proposer's time per request that samples, per step: a
# numba match over the request's tokens. No published measurement exists
# (nothing in the facts); 10 µs is kvsched's assumption, the order of
# vLLM's other per-request host costs.
NGRAM_CPU_PER_REQUEST_S = 10e-6


@dataclass(frozen=True, slots=True)
class DrafterShape:
    """What a method's drafter is made of."""

    method: str
    num_speculative_tokens: int
    # Attention layers holding KV (0: no drafter model).
    kv_layers: int
    # Input projection (out, in) and whether every pass runs it (else the first only).
    projection: tuple[int, int] | None
    projection_every_pass: bool


def drafter_shape(method: str, num_speculative_tokens: int, model: ModelSpec) -> DrafterShape:
    """The drafter of ``method`` for ``model`` (``num_mtp_layers`` checked by the caller)."""
    h = model.hidden_size
    k = num_speculative_tokens
    if method == "mtp":
        return DrafterShape(method, k, model.num_mtp_layers, (h, 2 * h), True)
    if method == "eagle":
        return DrafterShape(method, k, 1, (h, 2 * h), True)
    if method == "eagle3":
        return DrafterShape(method, k, 1, (h, 3 * h), False)
    if method in NGRAM_METHODS:
        return DrafterShape(method, k, 0, None, False)
    raise UserInputError(f"speculative_config.method={method!r}: no drafter model kvsched prices; use "
                     f"one of {', '.join(DRAFTER_METHODS + NGRAM_METHODS)}")


def layer_spec(model: ModelSpec) -> ModelSpec:
    """A one-layer copy of ``model``: an MoE layer for an MoE model (as
    DeepSeek's MTP module), a dense one otherwise, full attention. A hybrid
    model's other layer kinds are not the drafter's (its one layer attends
    globally); DeepSeek Sparse Attention's indexer is (vLLM's DeepSeek MTP
    layer is a V3.2 decoder layer)."""
    hybrid = model.hybrid
    if hybrid is not None:
        # vLLM's MTP layer always builds its own indexer, whatever the target's sharing.
        hybrid = dataclasses.replace(hybrid, num_linear_layers=0, num_mamba_layers=0, num_chunked_layers=0,
                                     num_mixer_only_layers=0, num_mlp_only_layers=0,
                                     num_shared_index_layers=0)
    return dataclasses.replace(model, name=f"{model.name} (drafter layer)", num_layers=1,
                               first_k_dense_layers=0,
                               intermediate_size=0 if model.is_moe else model.intermediate_size,
                               sliding_window=0, num_sliding_layers=0, num_mtp_layers=0, hybrid=hybrid)


def drafter_weight_bytes(shape: DrafterShape, model: ModelSpec, parallel: ParallelConfig,
                         runtime: RuntimeConfig) -> float:
    """Bytes per device of the drafter's layers and input projection (the
    embedding and LM head are the target's, shared)."""
    if not shape.kv_layers:
        return 0.0
    one = layer_spec(model)
    two = dataclasses.replace(one, num_layers=2)
    per_layer = (weight_bytes_per_device(two, parallel, runtime.dtype, runtime.quantized_layers)
                 - weight_bytes_per_device(one, parallel, runtime.dtype, runtime.quantized_layers))
    projection = 2.0 * shape.projection[0] * shape.projection[1] if shape.projection else 0.0
    return shape.kv_layers * per_layer + projection


class Drafter:
    """Seconds a drafter adds to an engine step (see the module doc)."""

    def __init__(self, shape: DrafterShape, target: StepTimeModel) -> None:
        self.shape = shape
        self.k = shape.num_speculative_tokens
        self.layer_model: StepTimeModel | None = None
        if shape.kv_layers:
            spec = layer_spec(target.model)
            if isinstance(target, MeasuredStepTimeModel):
                layer: StepTimeModel = MeasuredStepTimeModel(
                    spec, target.hardware, target.parallel, target.runtime, NO_HOST_TIME, target.tables)
            else:
                layer = StepTimeModel(spec, target.hardware, target.parallel, target.runtime)
            # Queries past the tables show with the target's.
            layer.extrapolated = target.extrapolated
            self.layer_model = layer
        self.cpu_per_request_s = NGRAM_CPU_PER_REQUEST_S if shape.method == "ngram" else 0.0

    def describe(self) -> str:
        s = self.shape
        what = {"mtp": f"{s.kv_layers} MTP module(s), reused over the K passes",
                "eagle": "one EAGLE layer", "eagle3": "one EAGLE-3 layer",
                "ngram": "CPU n-gram proposer", "ngram_gpu": "GPU n-gram proposer (not priced)"}
        return f"{s.method}, K={s.num_speculative_tokens}: {what[s.method]}"

    def gpu_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        """The drafter's K passes after the target's forward pass of ``shape``."""
        model = self.layer_model
        T = shape.num_tokens
        if model is None or T == 0:
            return 0.0
        B = shape.num_reqs
        proj = self.shape.projection
        # Pass 1: every scheduled token, one row of logits per request.
        first = dataclasses.replace(shape, num_sampled=B, spec_tokens=0)
        t = model.gpu_time(first, global_tokens)
        if proj is not None:
            t += model.linear_time(proj[0], proj[1],
                                   model.padded_tokens(T) if shape.prefill_tokens == 0 else T)
        if self.k > 1:
            # Passes 2..K: one token per request, each context one longer
            # per pass; the experts (EP) see every rank's requests, in the
            # ratio of this rank's.
            kv = shape.decode_kv_tokens + shape.prefill_kv_tokens
            g = max(B, global_tokens * B // T) if global_tokens else None
            padded = model.padded_tokens(B)
            for j in range(1, self.k):
                t += model.gpu_time(BatchShape.decode(B, kv + j * B), g)
                if proj is not None and self.shape.projection_every_pass:
                    t += model.linear_time(proj[0], proj[1], padded)
        return t

    def cpu_time(self, shape: BatchShape) -> float:
        return self.cpu_per_request_s * shape.num_sampled if self.cpu_per_request_s else 0.0
