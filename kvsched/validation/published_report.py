"""The tables of docs/validation.md from ``kvsched.validation.published``'s results.

    python benchmarks/validate_perf.py                      # every table, full Splitwise table last
    python benchmarks/validate_perf.py --update-doc docs/validation.md
    python benchmarks/validate_perf.py --check-doc docs/validation.md   # exit 1 if the doc is stale

``docs/validation.md`` holds the generated tables between
``<!-- BEGIN validate_perf:NAME -->`` / ``<!-- END validate_perf:NAME -->``
markers; ``--update-doc`` rewrites them from this run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.model_catalog import get_model
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import BatchShape, ParallelConfig
from kvsched.validation.errors import rel_err
from kvsched.validation.published import (
    DSR1,
    DSV3,
    FACTS,
    FP8,
    PCAP,
    SPLITWISE_HARDWARE,
    SPLITWISE_MODELS,
    Comparison,
    SplitwiseResult,
    check_pcap_rows,
    decode_breakdown,
    kernel_comparisons,
    kv_capacity_llama8b,
    pending_comparisons,
    serving_comparisons,
    simulate,
    splitwise_results,
    step_model,
)

DESCRIPTION = "Check kvsched's performance model against every usable published number."

# --------------------------------------------------------------------------
# Formatting


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} %"


def num(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


HW_LABEL = {"a100-80gb": "A100", "h100-80gb": "H100", PCAP: "H100-pcap"}
MODEL_LABEL = {"llama2-70b": "Llama-2-70B", "bloom-176b": "BLOOM-176B"}
METRICS = (("prompt", "prefill (prompt_time)"), ("token", "decode step (token_time)"), ("e2e", "e2e_time"))


def _stats(errors: list[float]) -> tuple[str, str, str, str]:
    if not errors:
        return "0", "-", "-", "-"
    abs_e = [abs(e) for e in errors]
    return (str(len(errors)), f"{statistics.median(abs_e) * 100:.1f} %",
            f"{statistics.fmean(abs_e) * 100:.1f} %", pct(statistics.median(errors)))


def splitwise_summary(results: list[SplitwiseResult]) -> str:
    groups: dict[tuple[str, str], list[SplitwiseResult]] = defaultdict(list)
    for r in results:
        groups[(r.group.model, r.group.hardware)].append(r)
    rows = []
    for (model, hw), rs in groups.items():
        for metric, label in METRICS:
            errs = [rel_err(*r.metric(metric)) for r in rs if r.counts(metric)]
            if errs:  # the power-capped rows: prompt_time only (token and e2e are copies)
                rows.append([MODEL_LABEL[model], HW_LABEL[hw], label, *_stats(errs)])
    for metric, label in METRICS:
        errs = [rel_err(*r.metric(metric)) for r in results
                if r.group.hardware != PCAP and r.counts(metric)]
        rows.append(["**all measured (A100 + H100)**", "", label, *_stats(errs)])
    return table(["model", "hardware", "metric", "n", "median abs err", "MAPE", "median signed err"], rows)


def _cell(pred: float, meas: float) -> str:
    return f"{num(meas)} / {num(pred)} ({pct(rel_err(pred, meas))})"


Key = tuple[str, str, int, int, int, int]


def _index(results: list[SplitwiseResult]) -> dict[Key, SplitwiseResult]:
    return {(r.group.model, r.group.hardware, r.group.tp, r.group.prompt, r.group.batch, r.group.tokens): r
            for r in results}


def _measured_configs(results: list[SplitwiseResult]) -> list[tuple[str, str, int]]:
    """(model, hardware, TP) of the measured (not power-capped) rows, Llama first."""
    configs = {(r.group.model, r.group.hardware, r.group.tp) for r in results if r.group.hardware != PCAP}
    return sorted(configs, key=lambda c: (c[0] != "llama2-70b", c[1], c[2]))


def splitwise_representative(results: list[SplitwiseResult]) -> str:
    index = _index(results)
    configs = _measured_configs(results)
    rows = []
    for model, hw, tp in configs:
        cells = [MODEL_LABEL[model], HW_LABEL[hw], str(tp)]
        for prompt, batch in ((512, 1), (8192, 1), (512, 16)):
            r = index[(model, hw, tp, prompt, batch, 128)]
            cells.append(_cell(r.prompt_ms, r.group.prompt_ms))
        for batch in (1, 16, 64):
            r = index[(model, hw, tp, 512, batch, 128)]
            mark = " †" if "kv>capacity" in r.flags else ""
            cells.append(_cell(r.token_ms, r.group.token_ms) + mark)
        rows.append(cells)
    header = ["model", "hw", "TP", "prefill 512x1 ms", "prefill 8192x1 ms", "prefill 512x16 ms",
              "decode b1 ms", "decode b16 ms", "decode b64 ms"]
    return table(header, rows) + ("\n\nCells: measured / predicted (signed error). † batch exceeds the "
                                  "KV capacity (excluded from the aggregates).")


def _linear_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * (m.num_params() - m.embedding_params() - m.lm_head_params())


def splitwise_diagnostics(results: list[SplitwiseResult]) -> str:
    index = _index(results)
    configs = _measured_configs(results)
    rows = []
    for model, hw, tp in configs:
        spec = get_model(SPLITWISE_MODELS[model])
        dev = get_hardware(SPLITWISE_HARDWARE[hw])
        d = index[(model, hw, tp, 512, 1, 128)]
        resid = d.group.token_ms - d.token_ms
        p = index[(model, hw, tp, 8192, 1, 128)]
        flops = 8192 * _linear_flops_per_token(spec) + (
            4.0 * spec.num_heads * spec.head_dim * spec.num_layers * (8192 * 8193 // 2))
        peak = tp * dev.bf16_flops
        meas_s, pred_s = p.group.prompt_ms / 1e3, p.prompt_ms / 1e3
        b32 = index[(model, hw, tp, 512, 32, 128)]
        slope_meas = (b32.group.token_ms - d.group.token_ms) / 31
        slope_pred = (b32.token_ms - d.token_ms) / 31
        rows.append([MODEL_LABEL[model], HW_LABEL[hw], str(tp), num(d.group.token_ms), num(d.token_ms),
                     num(resid), f"{resid * 1e3 / spec.num_layers:.0f}",
                     f"{slope_meas:.3f} / {slope_pred:.3f}",
                     f"{flops / meas_s / peak * 100:.0f} %", f"{flops / pred_s / peak * 100:.0f} %",
                     f"{8192 / meas_s / tp:,.0f}", f"{8192 / pred_s / tp:,.0f}"])
    header = ["model", "hw", "TP", "decode b1 meas ms", "pred ms", "unmodelled ms/step", "µs/layer",
              "ms per extra seq b1->b32 meas / pred", "prefill 8192 MFU meas", "pred",
              "prefill tok/s/GPU meas", "pred"]
    return table(header, rows)


def splitwise_full(results: list[SplitwiseResult]) -> str:
    rows = []
    for r in results:
        g = r.group
        rows.append([MODEL_LABEL[g.model], HW_LABEL[g.hardware], str(g.tp), str(g.prompt), str(g.batch),
                     str(g.tokens), str(g.runs), num(g.prompt_ms), num(r.prompt_ms),
                     pct(rel_err(r.prompt_ms, g.prompt_ms)), num(g.token_ms), num(r.token_ms),
                     pct(rel_err(r.token_ms, g.token_ms)), num(g.e2e_ms), num(r.e2e_ms),
                     pct(rel_err(r.e2e_ms, g.e2e_ms)), " ".join(r.flags)])
    header = ["model", "hw", "TP", "prompt", "batch", "tokens", "runs", "prefill meas", "pred", "err",
              "token meas", "pred", "err", "e2e meas", "pred", "err", "flags"]
    return table(header, rows)


def comparison_table(rows: list[Comparison]) -> str:
    return table(["comparison", "metric", "predicted", "measured", "error", "status", "what differs"],
                 [[c.name, c.metric, num(c.predicted), num(c.measured), pct(c.error), c.status, c.note]
                  for c in rows])


def splitwise_notes(results: list[SplitwiseResult], facts: Path) -> str:
    n, lo, hi, same = check_pcap_rows(facts / "splitwise_perf_model.csv")
    over = sorted({f"{MODEL_LABEL[r.group.model]} {HW_LABEL[r.group.hardware]} TP{r.group.tp} batch "
                   f"{r.group.batch}x({r.group.prompt}+{r.group.tokens}) > {r.kv_capacity:,} tokens"
                   for r in results if "kv>capacity" in r.flags})
    stopped = sum(1 for r in results if r.group.hardware != PCAP
                  and any(f.startswith("stopped@") for f in r.flags))
    caps = sorted({(MODEL_LABEL[r.group.model], HW_LABEL[r.group.hardware], r.group.tp, r.kv_capacity)
                   for r in results if r.group.hardware != PCAP})
    csv_rows = sum(r.group.runs for r in results)
    lines = [
        f"- {len(results)} configurations ({csv_rows} CSV rows averaged over repeats).",
        f"- H100-pcap: {n} rows; prompt_time = uncapped x {lo:.4f}..{hi:.4f}, token_time and e2e_time "
        f"{'identical to' if same else 'different from'} the uncapped rows: derived, not measured. "
        "Predicted as an uncapped H100 and reported separately (not in the 'all measured' aggregates).",
        "- KV capacity (plan_memory, fp16, 0.9): "
        + "; ".join(f"{m} {h} TP{tp} {c:,}" for m, h, tp, c in caps) + " tokens.",
        "- Excluded (batch does not fit the KV cache, the run cannot be one static batch): "
        + ("; ".join(over) if over else "none") + ".",
        f"- {stopped} measured configurations generated fewer tokens than token_size (the implied count "
        "n from e2e = prompt + (n-1) x token is > 5 % below it; EOS, no ignore_eos): their token_time and "
        "e2e are predicted for n, and their e2e is not aggregated (n comes from the measured times).",
        "- Sign: error = (predicted - measured) / measured; negative = the model predicts a faster step "
        "than measured (optimistic).",
    ]
    return "\n".join(lines)


def kv_section() -> str:
    rows = []
    for mbt, seqs in ((8192, 256), (16384, 1024)):
        kv = kv_capacity_llama8b(mbt, seqs)
        rows.append([f"max_num_batched_tokens {mbt}, max_num_seqs {seqs}",
                     f"{kv.tokens:,} ({kv.blocks:,} blocks)", "none in shared/facts", kv.describe])
    return ("Llama-3.1-8B on 1x H100 SXM, bf16 weights and KV, gpu_memory_utilization 0.9, block size 16.\n\n"
            + table(["profile run", "predicted KV tokens", "measured", "plan_memory"], rows))


# --------------------------------------------------------------------------
# Driver


def headline(results: list[SplitwiseResult], serving: list[Comparison], kernel: list[Comparison],
             pending: list[Comparison]) -> str:
    rows = []
    for pool, label, capped in (("A100 + H100", "measured", False), ("H100-pcap", "derived", True)):
        for metric, name in METRICS:
            errs = [rel_err(*r.metric(metric)) for r in results
                    if (r.group.hardware == PCAP) == capped and r.counts(metric)]
            if not errs:
                continue
            optimistic = sum(1 for e in errs if e < 0)
            rows.append([f"Splitwise {name}, {pool} ({label})", str(len(errs)),
                         f"{statistics.median([abs(e) for e in errs]) * 100:.1f} %",
                         f"{pct(min(errs))} .. {pct(max(errs))}",
                         f"optimistic in {optimistic} of {len(errs)}"])
    groups: dict[str, list[Comparison]] = defaultdict(list)
    for c in serving + kernel:
        if c.error is not None:
            key = c.name.split(",")[0] + f" ({c.metric})"
            groups[key].append(c)
    for key, cs in groups.items():
        errs = [c.error for c in cs if c.error is not None]
        direction = ("optimistic" if all(_optimistic(c) for c in cs)
                     else "pessimistic" if not any(_optimistic(c) for c in cs) else "mixed")
        rows.append([key, str(len(errs)), f"{statistics.median([abs(e) for e in errs]) * 100:.1f} %",
                     " / ".join(pct(e) for e in errs), direction])
    skipped = sum(1 for c in serving if c.status == "not comparable")
    dp = sum(1 for c in pending if c.status == "in balance.md")
    rows.append([f"not comparable: {skipped + len(pending) - dp}; DP policy effects: {dp} (docs/balance.md); "
                 "KV capacity: no measurement in the facts", "-", "-", "-", "-"])
    return table(["comparison", "n", "median abs err", "signed errors", "model is"], rows)


def _optimistic(c: Comparison) -> bool:
    """A time predicted too low or a rate predicted too high."""
    err = c.error or 0.0
    return err > 0 if ("tok/s" in c.metric or "TFLOP/s" in c.metric) else err < 0


def build_sections(facts: Path = FACTS) -> dict[str, str]:
    results = splitwise_results(facts)
    serving = serving_comparisons()
    kernel = kernel_comparisons()
    pending = pending_comparisons()
    return {
        "headline": headline(results, serving, kernel, pending),
        "splitwise-notes": splitwise_notes(results, facts),
        "splitwise-summary": splitwise_summary(results),
        "splitwise-representative": splitwise_representative(results),
        "splitwise-diagnostics": splitwise_diagnostics(results),
        "serving": comparison_table(serving),
        "serving-diagnostics": serving_diagnostics(),
        "kernel": comparison_table(kernel),
        "pending": comparison_table(pending),
        "kv-capacity": kv_section(),
        "splitwise-full": splitwise_full(results),
    }


TITLES = {
    "headline": "Headline errors",
    "splitwise-notes": "Splitwise: data checks",
    "splitwise-summary": "Splitwise static batches: errors per model, hardware and metric",
    "splitwise-representative": "Splitwise: representative configurations",
    "splitwise-diagnostics": "Splitwise: where the time goes (decode residual, prefill efficiency)",
    "serving": "Published serving numbers",
    "serving-diagnostics": "DeepSeek decode: where the time goes",
    "kernel": "Published kernel figures",
    "pending": "Data-parallel measurements",
    "kv-capacity": "KV capacity",
    "splitwise-full": "Splitwise: every configuration",
}
_BLOCK = re.compile(r"(<!-- BEGIN validate_perf:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- END validate_perf:"
                    r"(?P=name) -->)", re.S)


def render_doc(text: str, sections: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in sections:
            raise UserInputError(f"unknown generated block {name!r}; known: {', '.join(sections)}")
        return m.group(1) + sections[name] + "\n" + m.group(4)

    return _BLOCK.sub(repl, text)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--facts", type=Path, default=FACTS, help="directory of the facts files")
    parser.add_argument("--update-doc", type=Path, help="rewrite the generated blocks of this markdown file")
    parser.add_argument("--check-doc", type=Path, help="exit 1 if this file's generated blocks are stale")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    sections = build_sections(args.facts)
    for name, body in sections.items():
        out(f"## {TITLES[name]}\n\n{body}\n")
    out(f"({time.perf_counter() - t0:.1f} s)")
    for path in (args.update_doc, args.check_doc):
        if path is None:
            continue
        text = path.read_text(encoding="utf-8")
        new = render_doc(text, sections)
        if path is args.update_doc:
            path.write_text(new, encoding="utf-8")
        elif new != text:
            sys.stderr.write(f"{path}: generated blocks are stale; run --update-doc {path}\n")
            return 1
    return 0


def serving_diagnostics() -> str:
    """Where the DeepSeek decode gap is: the residual per layer against the model's
    fixed per-layer kernel term and the size of the expert slices it streams."""
    m = get_model(DSR1)
    hw = get_hardware("h200")
    tp = 8
    layers = m.num_layers
    slice_mb = m.expert_params() / tp / 1e6  # FP8: one byte per weight
    rows = []
    for isl, osl, tpot in ((1024, 1024, 22.73), (8192, 1024, 12.05), (1024, 8192, 10.93)):
        r = simulate(DSR1, "h200", ParallelConfig(tp), FP8, isl, osl, 20, 4)
        resid = tpot - r["median_tpot_ms"]
        rows.append([f"InferenceX conc 4, {isl // 1024}k/{osl // 1024}k", num(tpot), num(r["median_tpot_ms"]),
                     num(resid), f"{resid * 1e3 / layers:.0f}"])
    for batch, measured in ((1, 30.29), (8, 206.32), (32, 760.52)):
        per_token = batch / measured * 1e3  # run duration / 256 output positions
        pred = step_model(DSV3, "h200", ParallelConfig(tp), FP8).step_time(
            BatchShape.decode(batch, batch * 256)) * 1e3
        rows.append([f"SGLang v0.4.1 batch {batch} (ms per output position incl. prefill)", num(per_token),
                     num(pred), num(per_token - pred), f"{(per_token - pred) * 1e3 / layers:.0f}"])
    touched = m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** 4)
    header = ["DeepSeek decode, 8xH200 TP8", "measured ms", "model ms", "unmodelled ms", "µs/layer"]
    ctx = 8192 + 512
    sm = step_model(DSR1, "h200", ParallelConfig(tp), FP8)
    parts = decode_breakdown(sm, BatchShape.decode(4, 4 * ctx))
    if parts is None:
        split = "(breakdown unavailable: the model's terms changed; update decode_breakdown)"
    else:
        split = (f"The model's step at 4 sequences of {ctx:,} tokens: {sum(parts.values()) * 1e3:.2f} ms = "
                 + " + ".join(f"{name} {t * 1e3:.2f}" for name, t in parts.items()) + " ms.")
    return table(header, rows) + "\n\n" + split + (
        f" Fixed kernel latency = {layers} layers x {sm.fixed_gpu_s / layers * 1e6:.0f} µs (the roofline's "
        f"per-kernel latencies; efficiencies: {sm.factors.source}); each MoE layer touches "
        f"≈{touched:.0f} of {m.num_experts} experts at 4 sequences, each a {slice_mb:.1f} MB FP8 slice per "
        f"GPU under TP8, streamed at {sm.expert_bw / hw.mem_bw:.2f} of the memory bandwidth.")
