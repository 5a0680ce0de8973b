"""A step-time backend priced from measured vLLM kernels.

:class:`MeasuredStepTimeModel` is :class:`~kvsched.perf.step_time.StepTimeModel`
with the parts the tables cover replaced by measured latencies
(:mod:`kvsched.perf.kernels`), per operator:

- every GEMM of the attention block and of dense MLPs, at m = the step's
  tokens (decode-only batches padded to the CUDA-graph capture size, as the
  roofline pads them), and the LM head at m = the requests that sample
  (vLLM keeps it in 16 bits);
- attention: decodes as one generation call over the step's decodes at
  their mean KV length, prefill chunks as one context call over the chunks,
  at the prompt length that gives the batch's query-key pairs;
- MLA attention (DeepSeek-V3/R1, Kimi-K2.5): the same two calls on the MLA
  module tables, which time DeepSeek-V3's whole attention block per heads
  per GPU; kvsched keeps each module less its projections (the 16-bit GEMM
  table at the module's tokens) and prices the model's projections as
  GEMMs above: q/latent down, q up and o at the step's tokens, the latent's
  up-projection (prefill only) at the prefill's KV tokens;
- TP all-reduce: vLLM's custom all-reduce, two per layer;
- norms and activations: bytes at aiconfigurator's achieved bandwidth plus
  its 3 µs per kernel (the tables have no such kernels; this is
  aiconfigurator's own analytic rule).

- routed experts: vLLM's fused-MoE kernel for the model's expert shape,
  TP/EP split and precision, at the tokens entering the layer (all DP
  ranks' tokens when experts are sharded over them), under
  aiconfigurator's default routing skew; the router and shared experts as
  GEMMs;
- all-to-all under expert parallelism: DeepEP's dispatch and combine per
  MoE layer at the rank's tokens, low-latency kernels for decode-only
  steps, high-throughput ones for steps with prefill (aiconfigurator's
  pairing for vLLM's wide-EP serving), where the table has the MoE shape
  and the EP size (one node).

Weights in 16 bits or in the deployment's format (``RuntimeConfig.dtype``
over ``quantized_layers``): each GEMM and the fused MoE read the table of
the format they run in. What the tables lack stays roofline and is listed in
``roofline_parts``: GEMMs of a format no GEMM table has (NVFP4 off
Blackwell), routed experts of shapes or formats the MoE table lacks,
all-to-all over EP sizes or MoE shapes the all-to-all table lacks. Host
and framework time are the fitted terms of :mod:`kvsched.perf.host` (per
step, per sampled request, per layer of a step with prefill, DP agreement;
the arrival terms act in the event loop). The scheduler's own CPU time per
step (RuntimeConfig's ``cpu_step_s``, ``cpu_per_request_s``) still overlaps
the forward pass under async scheduling, as in the roofline. The
kernel latencies include each kernel's launch, so the roofline's fixed
per-kernel latency is not added.
"""

from __future__ import annotations

import math

from kvsched.errors import UserInputError
from kvsched.perf.checkpoint_format import quantizes
from kvsched.perf.hardware import Hardware
from kvsched.perf.host import HostTerms, default_host_terms
from kvsched.perf.kernels import (
    GEMM_DTYPES,
    KV_DTYPES,
    MLA_TABLE_SHAPE,
    MOE_DTYPES,
    A2aCurves,
    A2aKey,
    AttentionKey,
    Curve,
    Grid2D,
    KernelTables,
    MlaKey,
    MlaShape,
    MoeKey,
    load_tables,
    measured_available,
    system_for,
)
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import (
    KERNEL_LATENCY_S,
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    combine_step_time,
)

ELEMENTWISE_BW_FRAC = 0.8      # aiconfigurator's empirical_bw_scaling_factor for ElementWise
ELEMENTWISE_LATENCY_S = 3e-6   # aiconfigurator's mem_empirical_constant_latency


def measured_coverage(model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                      runtime: RuntimeConfig) -> str | None:
    """Why the measured backend cannot price this deployment (None: it can)."""
    system = system_for(hardware.id)
    if system is None:
        return f"no measured vLLM tables for {hardware.id}"
    if not measured_available():
        return "aiconfigurator-core is not installed (pip install -e \".[measured]\")"
    tp = parallel.tensor_parallel_size
    if not model.splits_over(tp):
        return f"{model.num_heads} heads ({model.num_kv_heads} KV) do not split over TP {tp}"
    hybrid = model.hybrid
    if hybrid is not None and (hybrid.num_single_block_layers or model.moe_latent_size):
        # The measured GEMMs are laid out as attention and an MLP in every layer, at the hidden width.
        return (f"{model.name}'s single-block layers (a mixer or an MLP alone) or latent MoE are not laid "
                "out by the measured backend")
    tables = load_tables(system)
    # 16-bit GEMMs (LM head, routers, unquantized layers) must be measured;
    # quantized GEMMs a table lacks fall back to the roofline one by one.
    if not tables.gemm_table("bfloat16").curves:
        return f"no measured bfloat16 GEMMs on {system}"
    kv = KV_DTYPES.get(runtime.kv_cache_dtype)
    if model.is_mla:
        return _mla_coverage(model, tables, tp, kv)
    key = _attention_key(model, tp, kv or "")
    if kv is None or not tables.has_attention(key):
        return f"no measured {key.describe()} on {system}"
    if model.num_sliding_layers and not tables.has_attention(_window_key(key, model.sliding_window)):
        return f"no measured sliding-window ({model.sliding_window}) attention on {system}"
    if tp > 1 and tp not in tables.allreduce_curves():
        return f"no measured all-reduce over {tp} GPUs on {system}"
    return None


def _mla_coverage(model: ModelSpec, tables: KernelTables, tp: int, kv: str | None) -> str | None:
    system = tables.system
    # The module tables time DeepSeek-V3's attention block: the attention
    # itself must have its shape (the projections are re-priced per model).
    t = MLA_TABLE_SHAPE
    shape = (model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim)
    if shape != (t.kv_lora_rank, t.qk_nope_head_dim, t.qk_rope_head_dim, t.v_head_dim):
        return (f"MLA latent {shape[0]} + {shape[2]}, head dims {shape[1]}/{shape[3]}: the measured MLA "
                f"modules are DeepSeek-V3's ({t.kv_lora_rank} + {t.qk_rope_head_dim}, "
                f"{t.qk_nope_head_dim}/{t.v_head_dim})")
    if model.num_sliding_layers:
        return "sliding-window MLA layers are not measured"
    key = _mla_key(model, tp, kv or "")
    if kv is None or not tables.has_mla(key):
        return f"no measured module for {key.describe()} on {system}"
    if tp > 1 and tp not in tables.allreduce_curves():
        return f"no measured all-reduce over {tp} GPUs on {system}"
    return None


def _mla_key(model: ModelSpec, tp: int, kv_dtype: str) -> MlaKey:
    # The module rows with 16-bit projections: the measured backend keeps
    # their attention part only and prices the model's projections in its own
    # format from the GEMM tables (see MeasuredStepTimeModel._mla_grid).
    return MlaKey(model.num_heads // tp, kv_dtype, "bfloat16")


def _attention_key(model: ModelSpec, tp: int, kv_dtype: str) -> AttentionKey:
    # KV heads are replicated when there are fewer than TP ranks.
    return AttentionKey(model.num_heads // tp, int(model.kv_heads_per_rank(tp)), model.head_dim, kv_dtype)


def _window_key(key: AttentionKey, window: int) -> AttentionKey:
    return AttentionKey(key.num_heads, key.num_kv_heads, key.head_dim, key.kv_dtype, window)


class RooflineGemm:
    """A GEMM the tables lack, priced as the roofline prices it (weights read
    once, 2 FLOPs per weight per token) plus its per-kernel latency, which
    the measured latencies include."""

    __slots__ = ("weights", "flop_rate", "bytes_per_weight", "bandwidth")
    x_max = math.inf

    def __init__(self, weights: int, flop_rate: float, bytes_per_weight: float, bandwidth: float) -> None:
        self.weights = weights
        self.flop_rate = flop_rate
        self.bytes_per_weight = bytes_per_weight
        self.bandwidth = bandwidth

    def __call__(self, m: float) -> float:
        compute = 2.0 * m * self.weights / self.flop_rate
        memory = self.weights * self.bytes_per_weight / self.bandwidth
        return (compute if compute > memory else memory) + KERNEL_LATENCY_S


GemmCost = Curve | RooflineGemm


class MeasuredStepTimeModel(StepTimeModel):
    """Seconds per step from measured vLLM kernels (see the module doc)."""

    backend = "measured"

    def __init__(self, model: ModelSpec, hardware: Hardware,
                 parallel: ParallelConfig | None = None,
                 runtime: RuntimeConfig | None = None, host: HostTerms | None = None,
                 tables: KernelTables | None = None) -> None:
        """``tables``: the system's tables when already loaded (a drafter's
        one-layer model shares its target's)."""
        # Host time around the kernels (kvsched.perf.host, added by the
        # base class): the fitted default, or a user's calibration.
        super().__init__(model, hardware, parallel, runtime,
                         host if host is not None else default_host_terms(hardware.name)[0])
        reason = measured_coverage(model, hardware, self.parallel, self.runtime)
        if reason is not None:
            raise UserInputError(f"step_time_backend='measured': {reason}; use 'roofline'")
        system = system_for(hardware.id)
        assert system is not None
        self.tables: KernelTables = tables if tables is not None else load_tables(system)
        m, tp = model, self.tp
        self.roofline_parts: list[str] = []
        kv_dtype = KV_DTYPES[self.runtime.kv_cache_dtype]
        h = m.hidden_size
        L = m.num_layers
        layers = self.runtime.quantized_layers
        quant = GEMM_DTYPES.get(self.runtime.dtype)
        if quant is not None and not self.tables.gemm_table(quant).curves:
            quant = None
        unmeasured: list[str] = []

        def linear(part: str, n: int, k: int) -> GemmCost:
            """A GEMM of ``part``: 16-bit unless the format covers the part;
            roofline when no table has the format's GEMMs."""
            if not quantizes(layers, part):
                return self._gemm("bfloat16", n, k)
            if quant is None:
                if part not in unmeasured:
                    unmeasured.append(part)
                return RooflineGemm(n * k, self.lin_flops, self.weight_bytes, self.lin_bw)
            return self._gemm(quant, n, k)

        # Attention: the block's GEMMs at the step's tokens, (cost over m,
        # calls per step), and the attention kernels over (batch, length).
        self.attn_key: AttentionKey | None = None
        self.window_key: AttentionKey | None = None
        self.mla_key: MlaKey | None = None
        self._kv_up: GemmCost | None = None
        self._ctx_window: Grid2D | None = None
        self._gen_window: Grid2D | None = None
        if m.is_mla:
            # The module tables time the whole MLA block; kvsched keeps their
            # attention part (_mla_grid) and prices the model's projections
            # here like any GEMM: the ones every token runs at the step's
            # tokens, the latent's up-projection (prefill only) at the
            # prefill's KV tokens in _attention_time.
            self.mla_key = _mla_key(m, tp, kv_dtype)
            shape = MlaShape(h, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                             m.v_head_dim)
            per_token, kv_up = shape.projections(self.mla_key.num_heads)
            gemms: list[tuple[GemmCost, int]] = [(linear("attention", n, k), L) for n, k in per_token]
            self._kv_up = linear("attention", *kv_up)
            self._ctx_full = self._mla_grid("context", self.mla_key)
            self._gen_full = self._mla_grid("generation", self.mla_key)
            self._ctx_name, self._gen_name = "MLA context module", "MLA generation module"
        else:
            key = self.attn_key = _attention_key(m, tp, kv_dtype)
            q = key.num_heads * m.head_dim
            gemms = [(linear("attention", q + 2 * key.num_kv_heads * m.head_dim, h), L),
                     (linear("attention", h, q), L)]
            ctx, gen = self.tables.context(key), self.tables.generation(key)
            assert ctx is not None and gen is not None  # measured_coverage checked them
            self._ctx_full, self._gen_full = ctx, gen
            if m.num_sliding_layers:
                self.window_key = _window_key(key, m.sliding_window)
                self._ctx_window = self.tables.context(self.window_key)
                self._gen_window = self.tables.generation(self.window_key)
                assert self._ctx_window is not None and self._gen_window is not None
            self._ctx_name, self._gen_name = "context attention", "generation attention"
        dense = m.num_dense_layers
        if dense:
            inter = m.intermediate_size // tp
            up = 2 * inter if m.mlp_kind == "swiglu" else inter
            gemms += [(linear("dense_mlp", up, h), dense), (linear("dense_mlp", h, inter), dense)]
        self._gemms = gemms
        self._lm_head = self._gemm("bfloat16", -(-m.vocab_size // tp), h)
        self._allreduce = self.tables.allreduce_curve(tp) if tp > 1 else None
        # Norm-add twice per layer (read and write residual and hidden), the
        # MLP activation once per dense layer; 16-bit activations.
        self._elementwise_bytes_per_token = 2 * (L * 2 * (2 * h + 2 * h)
                                                 + dense * 3 * (m.intermediate_size // tp))
        self._elementwise_kernels = 2 * L + dense
        self._elementwise_bw = hardware.mem_bw * ELEMENTWISE_BW_FRAC
        # MoE: the routed experts from the fused-MoE table where it has the
        # shape, the router (16-bit) and shared experts as GEMMs.
        self._moe: Curve | None = None
        self._moe_gemms: list[GemmCost] = []
        self._a2a: A2aCurves | None = None
        self._a2a_memo: dict[tuple[int, bool], float] = {}
        if m.is_moe:
            ep = self.ep
            moe_dtype = (MOE_DTYPES.get(self.runtime.dtype, self.runtime.dtype)
                         if quantizes(layers, "routed_experts") else "bfloat16")
            self.moe_key = MoeKey(moe_dtype, h, m.moe_intermediate_size, m.experts_per_token,
                                  m.num_experts, self.parallel.expert_tensor_parallel_size, ep)
            self._moe = self.tables.moe(self.moe_key)
            self._moe_gemms.append(self._gemm("bfloat16", m.num_experts, h))  # router, 16-bit
            if m.num_shared_experts:
                shared = m.num_shared_experts * m.shared_expert_intermediate_size // tp
                up = 2 * shared if m.mlp_kind == "swiglu" else shared
                self._moe_gemms += [linear("shared_experts", up, h), linear("shared_experts", h, shared)]
            if self._moe is None:
                self.roofline_parts.append(f"routed experts (no measured {self.moe_key.describe()})")
            if ep > 1 and self.parallel.uses_all_to_all:
                self._a2a = self.tables.all_to_all(A2aKey(h, m.experts_per_token, m.num_experts, ep))
                if self._a2a is None:
                    self.roofline_parts.append(f"all-to-all (no measured DeepEP over {ep} GPUs for "
                                               f"{m.num_experts} experts, top-{m.experts_per_token}, "
                                               f"hidden {h} on {system})")
        if unmeasured:
            self.roofline_parts.insert(0, f"{', '.join(p.replace('_', ' ') for p in unmeasured)} GEMMs "
                                          f"(no measured {self.runtime.dtype} GEMMs on {system})")
        self._tokens_memo: dict[int, float] = {}
        self._linear_curves: dict[tuple[int, int], Curve] = {}
        self._head_memo: dict[int, float] = {}
        self._gen_memo: dict[int, tuple[Curve, Curve | None, int]] = {}

    def _rebuilt(self, host: HostTerms) -> MeasuredStepTimeModel:
        return MeasuredStepTimeModel(self.model, self.hardware, self.parallel, self.runtime, host,
                                     self.tables)

    def describe_backend(self) -> str:
        t = self.tables
        text = f"measured vLLM {t.vllm_version} kernels ({t.system}, aiconfigurator-core tables)"
        text += ", " + self.host_note()
        if self.roofline_parts:
            text += "; roofline for " + ", ".join(self.roofline_parts)
        if self.extrapolated:
            n = len(self.extrapolated)
            text += f"; {n} quer{'y' if n == 1 else 'ies'} past the tables (listed in the saved JSON)"
        return text

    def _gemm(self, dtype: str, n: int, k: int) -> Curve:
        return self.tables.gemm_curve(dtype, n, k, self.extrapolated)

    def linear_time(self, n: int, k: int, tokens: int) -> float:
        """A replicated 16-bit GEMM from the measured table (its curve built once)."""
        curve = self._linear_curves.get((n, k))
        if curve is None:
            curve = self._linear_curves[n, k] = self._gemm("bfloat16", n, k)
        if tokens > curve.x_max:
            self.extrapolated.add(f"GEMM m={tokens} past the measured {curve.x_max:g}")
        return curve(tokens)

    def _mla_grid(self, kind: str, key: MlaKey) -> Grid2D:
        """The MLA modules' attention part over (batch, length): each measured
        module less its projections (DeepSeek-V3's, 16-bit, read from the
        GEMM table at the module's tokens). What is left (norms, RoPE, the
        KV-cache write, the attention kernels, and for decodes the absorbed
        batched matmuls) is what a step adds to its own projections, priced
        at its tokens: a mixed step reads the weights once, a chunk with
        cached context runs them over its new tokens only, and a model's
        format other than 16 bits costs its own GEMMs. A step of fresh prompts
        of one length (or of decodes at a capture size) gets the module back.
        The remainder is interpolated like attention."""
        per_token, kv_up = MLA_TABLE_SHAPE.projections(key.num_heads)
        shapes = [*per_token, kv_up] if kind == "context" else per_token
        curves = [self._gemm(key.gemm_dtype, n, k) for n, k in shapes]
        cells: dict[int, dict[int, float]] = {}
        for b, row in self.tables.mla_cells(kind, key).items():
            cells[b] = {}
            for length, module in row.items():
                tokens = b * length if kind == "context" else b
                # Floored at 0: where the GEMM table puts the projections above
                # the module (up to 8 % of it, at 1 to 4 heads per GPU, a
                # fused down projection off the GEMM grid), there is nothing
                # left to add.
                rest = module - sum(c(tokens) for c in curves)
                cells[b][length] = rest if rest > 0.0 else 0.0
        return Grid2D.from_cells(cells)

    # -- token-count parts ------------------------------------------------------
    def _token_time(self, tokens: int) -> float:
        """GEMMs, norms/activations and all-reduces of a step of ``tokens`` tokens."""
        t = self._tokens_memo.get(tokens)
        if t is None:
            t = 0.0
            for curve, calls in self._gemms:
                if tokens > curve.x_max:
                    self.extrapolated.add(f"GEMM m={tokens} past the measured {curve.x_max:g}")
                t += curve(tokens) * calls
            t += (tokens * self._elementwise_bytes_per_token / self._elementwise_bw
                  + self._elementwise_kernels * ELEMENTWISE_LATENCY_S)
            ar = self._allreduce
            if ar is not None:
                elements = tokens * self.hidden
                if elements > ar.x_max:
                    self.extrapolated.add(f"all-reduce of {elements} elements past the measured {ar.x_max:g}")
                t += 2 * self.num_layers * ar(elements)
            self._tokens_memo[tokens] = t
        return t

    def _head_time(self, num_sampled: int) -> float:
        t = self._head_memo.get(num_sampled)
        if t is None:
            t = self._head_memo[num_sampled] = self._lm_head(num_sampled) if num_sampled else 0.0
        return t

    def _batch_parts(self, T: int, global_tokens: int, num_sampled: int,
                     num_logits: int | None = None) -> tuple[float, float]:
        lin = self._token_time(T)
        # Host gaps (kvsched.perf.host) ride with the LM head: both are per
        # step and per sampled request, for decode and mixed steps alike.
        # The LM head runs over every row of logits (verified drafts too).
        rows = num_sampled if num_logits is None or not num_sampled else num_logits
        rest = self.add_host_gaps(self._head_time(rows), num_sampled)
        if self.moe_layers:
            lin += self.moe_layers * self._moe_time(T, global_tokens)
            rest += self._all_to_all_time(T)
        return lin, rest

    def _moe_time(self, tokens: int, global_tokens: int) -> float:
        """One MoE layer: router, shared experts, routed experts."""
        t = sum(curve(tokens) for curve in self._moe_gemms)
        curve = self._moe
        if curve is None:
            return t + self._routed_expert_time(tokens, global_tokens)
        # Experts sharded over the DP ranks see every rank's tokens.
        entering = global_tokens if self.ep > 1 else tokens
        if entering > curve.x_max:
            self.extrapolated.add(f"fused MoE of {entering} tokens past the measured {curve.x_max:g}")
        return t + curve(entering)

    def _all_to_all_time(self, T: int) -> float:
        """The roofline's all-to-all where the table lacks it; a measured
        one is priced with the step's kind in _attention_time."""
        return super()._all_to_all_time(T) if self._a2a is None else 0.0

    def _measured_all_to_all(self, tokens: int, prefill: bool) -> float:
        """Dispatch and combine of every MoE layer, ``tokens`` per EP rank:
        DeepEP's low-latency kernels for decode-only steps, its
        high-throughput ones for steps with prefill, as aiconfigurator pairs
        them for vLLM's wide-EP deployments."""
        key = (tokens, prefill)
        t = self._a2a_memo.get(key)
        if t is None:
            a = self._a2a
            assert a is not None
            dispatch, combine = (a.ht_dispatch, a.ht_combine) if prefill else (a.ll_dispatch, a.ll_combine)
            if tokens > dispatch.x_max:
                self.extrapolated.add(f"all-to-all of {tokens} tokens per rank past the measured "
                                      f"{dispatch.x_max:g}")
            t = self._a2a_memo[key] = self.moe_layers * (dispatch(tokens) + combine(tokens))
        return t

    # -- attention ----------------------------------------------------------------
    def _attention_time(self, s: BatchShape) -> float:
        """Attention (MLA: the modules' attention part, and the latent's
        up-projection over the prefill's KV), and a measured all-to-all: the
        parts that depend on the step's composition, not only its tokens."""
        t = 0.0
        if s.num_decodes:
            if s.spec_query_keys:
                # Verifications: the one-query kernels, scaled by what the
                # extra queries add on the roofline.
                t += (self._decode_attention(s.num_decodes, s.decode_kv_tokens)
                      * self.spec_attention_factor(s.decode_kv_tokens, s.spec_query_keys))
            else:
                t += self._decode_attention(s.num_decodes, s.decode_kv_tokens)
        num_prefills = s.num_reqs - s.num_decodes
        if num_prefills and s.prefill_attn_pairs:
            # The prompt length whose causal pairs, over this many prompts,
            # are the batch's: pairs/b = l(l+1)/2.
            b = num_prefills
            length = (math.sqrt(8.0 * s.prefill_attn_pairs / b + 1.0) - 1.0) / 2.0
            t += self._context_attention(self._ctx_full, b, length) * self.full_layers
            if self._ctx_window is not None:
                t += self._context_attention(self._ctx_window, b, length) * self.sliding_layers
            kv_up = self._kv_up
            if kv_up is not None:
                # Un-absorbed prefill expands the latent of every KV token
                # the chunks attend to, cached context included.
                if s.prefill_kv_tokens > kv_up.x_max:
                    self.extrapolated.add(f"GEMM m={s.prefill_kv_tokens} past the measured {kv_up.x_max:g}")
                t += kv_up(s.prefill_kv_tokens) * self.full_layers
        if self._a2a is not None:
            if s.prefill_tokens:
                t += self._measured_all_to_all(s.num_tokens, True)
            else:
                t += self._measured_all_to_all(self.padded_tokens(s.num_tokens), False)
        return t

    def _context_attention(self, grid: Grid2D, b: int, length: float) -> float:
        if length > grid.measured_up_to(b):
            self.extrapolated.add(f"{self._ctx_name} batch {b} length {length:.0f} past the measured cells")
        return grid.batch_curve(b)(length)

    def _generation(self, B: int) -> tuple[Curve, Curve | None, int]:
        """Memo per decode batch size: the full and windowed KV curves, and
        the KV length up to which both read measured cells."""
        g = self._gen_memo.get(B)
        if g is None:
            full = self._gen_full
            limit = full.measured_up_to(B)
            window = None
            wgrid = self._gen_window
            if wgrid is not None:
                window = wgrid.batch_curve(B)
                limit = min(limit, wgrid.measured_up_to(B))
            g = self._gen_memo[B] = (full.batch_curve(B), window, limit)
        return g

    def _note_past_generation_cells(self, B: int, kv: float, limit: int) -> None:
        if kv > limit:
            self.extrapolated.add(f"{self._gen_name} batch {B} KV {kv:.0f} past the measured cells")

    def _decode_attention(self, B: int, kv_tokens: int) -> float:
        full, window, limit = self._generation(B)
        kv = kv_tokens / B
        self._note_past_generation_cells(B, kv, limit)
        t = full(kv) * self.full_layers
        if window is not None:
            t += window(kv) * self.sliding_layers
        return t

    def decode_step_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          global_tokens: int | None = None) -> list[float]:
        """As the roofline's: every pure-decode step is priced here, so
        stepping and fast-forward give the same float."""
        if self.hybrid is not None:
            return self._stepped_decode_times(num_reqs, first_kv_tokens, kv_step, count, global_tokens)
        lin, rest, cpu = self.decode_batch_parts(num_reqs, global_tokens)
        overlap = self.async_scheduling
        full, window, limit = self._generation(num_reqs)
        # The stretch's longest context decides whether it leaves the table.
        self._note_past_generation_cells(num_reqs, (first_kv_tokens + (count - 1) * kv_step) / num_reqs,
                                         limit)
        full_layers, sliding_layers = self.full_layers, self.sliding_layers
        a2a = (self._measured_all_to_all(self.padded_tokens(num_reqs), False)
               if self._a2a is not None else None)
        # _attention_time of each decode-only step, inlined (one pass per
        # stretch): the same operations in the same order, so the same float.
        kvs = [(first_kv_tokens + j * kv_step) / num_reqs for j in range(count)]
        full_kv = full.ascending(kvs)
        window_kv = window.ascending(kvs) if window is not None else None
        out: list[float] = []
        append = out.append
        for j in range(count):
            attn = full_kv[j] * full_layers
            if window_kv is not None:
                attn += window_kv[j] * sliding_layers
            if a2a is not None:
                attn += a2a
            append(combine_step_time(lin + attn + rest, cpu, overlap))
        return out
