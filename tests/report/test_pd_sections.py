"""The report's P/D and KV offloading sections: present with the results
JSON's numbers when the run has them, absent for a plain run, and the page
still well-formed."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any

import pytest
from test_simulate_page import Page, parse_number

from kvsched.report.simulate_page import render_report
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.flags import parse_spec
from kvsched.sim.results import json_safe
from kvsched.sim.run import RunResult, run
from kvsched.sim.simulator import SimConfig, SimResult, Simulator
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B"
VOID = frozenset({"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source",
                  "track", "wbr"})
# SVG elements the charts write self-closed.
SELF_CLOSED = frozenset({"line", "rect", "circle", "path", "polyline", "polygon"})


def simulate(*extra: str) -> RunResult:
    return run(parse_spec(["--model", MODEL, "--hardware", "h100-sxm", "--step-time-backend", "roofline",
                           "--dataset-name", "random", "--num-prompts", "12", "--request-rate", "8",
                           "--random-input-len", "1500", "--random-output-len", "32",
                           "--random-range-ratio", "0", "--random-prefix-len", "1024", "--seed", "3",
                           "--max-model-len", "4096", *extra]))


def doc_workload() -> Workload:
    """Documents A, B, C of 512 tokens (32 blocks) and 8 tokens of question,
    one at a time, then A again: the 64-block GPU cache holds two, so A's
    second prompt finds its blocks in CPU memory only."""
    doc = {name: (100 + i, 512) for i, name in enumerate("ABC")}

    def req(i: int, name: str, at: float) -> WorkloadRequest:
        return WorkloadRequest(f"{name}{i}", at, (doc[name], (UNIQUE_TOKEN_BASE + i, 8)), 4)

    return Workload("docs", (req(0, "A", 0.0), req(1, "B", 1.0), req(2, "C", 2.0), req(3, "A", 3.0)))


def as_saved(result: RunResult) -> dict[str, Any]:
    """The metrics as ``--save-result`` writes them (JSON round trip)."""
    loaded: dict[str, Any] = json.loads(json.dumps(json_safe(result.metrics)))
    return loaded


@pytest.fixture(scope="module")
def pd() -> tuple[RunResult, dict[str, Any]]:
    r = simulate("--disaggregation", "1P2D", "--kv-offloading-size", "8")
    return r, as_saved(r)


@pytest.fixture(scope="module")
def offload() -> tuple[SimResult, dict[str, Any]]:
    """The offloading docs' run (tests/sim/test_offload_sim.py): A's second
    prompt finds its 512 tokens in CPU memory only."""
    deployment = build_deployment(EngineOptions(
        model=MODEL, hardware="h100-sxm", step_time_backend="roofline", max_model_len=960,
        num_gpu_blocks_override=64, kv_offloading_size=1.0,
        vllm_version="0.33"))  # as test_offload_sim's: its 16-token blocks, 32 per document
    config = SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                       offload=deployment.offload)
    r = Simulator(config, doc_workload()).run()
    saved: dict[str, Any] = json.loads(json.dumps(json_safe(r.metrics())))
    return r, saved


class Balance(HTMLParser):
    """Every non-void element closed in order."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def sections(text: str) -> list[str]:
    return [str(a["data-section"]) for tag, a in Page(text).tags if tag == "section" and "data-section" in a]


def check_cell(page: Page, key: str, value: float, result: int = 0) -> None:
    text = page.cells[(key, result)]
    if key.endswith("bytes"):
        assert float(text.replace(",", "")) == pytest.approx(value / 1e9, abs=6e-4), key
    else:
        assert parse_number(text) == pytest.approx(value, abs=0.006 if "%" not in text else 6e-5), key


PD_PARTS = (("arrival", "arrival"), ("queue", "queue"), ("offload_load", "CPU load"), ("prefill", "prefill"),
            ("hop", "hop to decode"), ("decode_admission", "decode admission"), ("transfer", "KV transfer"),
            ("decode_queue", "decode queue"), ("first_token_step", "first decode step"))
STATISTICS = ("mean", "median", "p90", "p99")


def chart_bars(page: Page, chart: str) -> list[tuple[str, float]]:
    """(part, value) of every bar of one chart, in drawing order."""
    out, inside = [], False
    for tag, a in page.tags:
        if tag == "svg":
            inside = a.get("data-chart") == chart
        elif inside and tag == "rect" and a.get("class") == "bar":
            out.append((str(a["data-part"]), float(str(a["data-value"]))))
    return out


def check_ttft_parts(page: Page, m: dict[str, Any], parts: tuple[tuple[str, str], ...],
                     result: int = 0) -> None:
    """The TTFT card: one bar per part (its mean) in a request's order, and
    every part's four statistics in the table, as the JSON has them."""
    split = m["ttft_parts_ms"]
    assert list(split) == [key for key, _ in parts]
    assert chart_bars(page, "ttft-parts") == [(name, pytest.approx(split[key]["mean"], rel=1e-5))
                                              for key, name in parts]
    for key, _ in parts:
        for stat in STATISTICS:
            check_cell(page, f"ttft_parts_ms.{key}.{stat}", split[key][stat], result)


def test_pd_section_shows_the_split_transfers_and_utilisation(pd: tuple[RunResult, dict[str, Any]]) -> None:
    r, m = pd
    text = render_report([("pd", r.result)], "P/D", metrics=[m])
    assert not Balance(text).errors and not Balance(text).stack
    assert sections(text) == ["ttft", "pd", "offload"]
    page = Page(text)
    # The TTFT split's nine bars carry the JSON's means, in the order a request meets them.
    check_ttft_parts(page, m, PD_PARTS)
    assert m["ttft_parts_ms"]["prefill"]["mean"] > 0 and m["ttft_parts_ms"]["transfer"]["p99"] > 0
    # The means add up to the mean TTFT; the old four-part chart is not drawn twice.
    assert sum(p["mean"] for p in m["ttft_parts_ms"].values()) == pytest.approx(m["mean_ttft_ms"], rel=1e-9)
    assert "ttft-split" not in page.charts
    split = m["ttft_split_ms"]
    assert split["prefill_leg_ms"] > 0 and split["kv_wait_and_read_ms"] > 0
    for key, value in split.items():
        check_cell(page, f"ttft_split_ms.{key}", value)
    for key in ("count", "bytes", "mean_ms", "p99_ms"):
        check_cell(page, f"kv_transfer.{key}", m["kv_transfer"][key])
    assert m["kv_transfer"]["count"] == 12 and m["kv_transfer"]["bytes"] > 0
    use = m["role_utilisation"]
    assert set(use) == {"prefill", "decode"}
    assert use["prefill"]["engine_cores"] == 1 and use["decode"]["engine_cores"] == 2
    for role, figures in use.items():
        assert 0 < figures["busy_fraction"] <= 1
        for key, value in figures.items():
            check_cell(page, f"role_utilisation.{role}.{key}", value)
    # The decode role only decodes here: one token per request per step.
    assert use["decode"]["mean_tokens_per_step"] == pytest.approx(use["decode"]["mean_batch_size"])
    # Offloading per role: hit rates and traffic.
    for role, part in m["kv_offload_by_role"].items():
        for key, value in part["prefix_cache_hit_rate_by_tier"].items():
            check_cell(page, f"kv_offload_by_role.{role}.prefix_cache_hit_rate_by_tier.{key}", value)
        for key in ("stores", "store_bytes", "loads", "load_bytes"):
            check_cell(page, f"kv_offload_by_role.{role}.kv_offload.{key}", part["kv_offload"][key])
    tiers = [(a["data-part"], float(str(a["data-value"]))) for tag, a in page.tags
             if tag == "rect" and a.get("data-part") in ("GPU", "CPU")]
    rates = [part["prefix_cache_hit_rate_by_tier"] for part in m["kv_offload_by_role"].values()]
    assert tiers == [(tier, pytest.approx(100 * rate[tier.lower()], rel=1e-5))
                     for rate in rates for tier in ("GPU", "CPU")]


def test_results_saved_without_the_parts_get_the_four_part_chart(
        pd: tuple[RunResult, dict[str, Any]]) -> None:
    r, saved = pd
    m = {k: v for k, v in saved.items() if k != "ttft_parts_ms"}
    text = render_report([("pd", r.result)], "P/D", metrics=[m])
    assert sections(text) == ["pd", "offload"]
    page = Page(text)
    split = m["ttft_split_ms"]
    assert chart_bars(page, "ttft-split") == [(name, pytest.approx(split[key], rel=1e-5)) for key, name in (
        ("prefill_leg_ms", "prefill leg"), ("hop_ms", "hop to decode"),
        ("kv_wait_and_read_ms", "wait + KV read"), ("decode_first_step_ms", "first decode step"))]


def test_offload_section_alone_for_a_colocated_run(offload: tuple[SimResult, dict[str, Any]]) -> None:
    r, m = offload
    text = render_report([("offload", r)], "Offload", metrics=[m])
    assert not Balance(text).errors and not Balance(text).stack
    assert sections(text) == ["offload"]
    page = Page(text)
    tiers = m["prefix_cache_hit_rate_by_tier"]
    assert tiers["cpu"] == 512 / (4 * 520)  # A's second prompt, from CPU memory
    for key, value in tiers.items():
        check_cell(page, f"prefix_cache_hit_rate_by_tier.{key}", value)
    for key in ("num_cpu_blocks", "cpu_hit_tokens", "stores", "store_bytes", "loads", "load_bytes",
                "mean_load_ms"):
        check_cell(page, f"kv_offload.{key}", m["kv_offload"][key])


def test_a_plain_run_has_only_the_ttft_split() -> None:
    r = simulate()
    m = as_saved(r)
    text = render_report([("plain", r.result)], "Plain", metrics=[m])
    assert sections(text) == ["ttft"]
    assert "ttft-split" not in text and "offload-hit-rate" not in text
    page = Page(text)
    check_ttft_parts(page, m, (("arrival", "arrival"), ("queue", "queue"), ("prefill", "prefill")))
    assert m["ttft_parts_ms"]["queue"]["p99"] > 0  # 12 prompts of 1,500 tokens at 8/s queue


def test_two_runs_one_disaggregated_share_the_sections(pd: tuple[RunResult, dict[str, Any]],
                                                       offload: tuple[SimResult, dict[str, Any]]) -> None:
    text = render_report([("pd", pd[0].result), ("offload", offload[0])], "Both",
                         metrics=[pd[1], offload[1]])
    assert not Balance(text).errors
    assert sections(text) == ["ttft", "pd", "offload"]
    page = Page(text)
    # The colocated run has no P/D figures: its cells say so.
    assert page.cells[("kv_transfer.count", 1)] == "-"
    check_cell(page, "kv_transfer.count", pd[1]["kv_transfer"]["count"], 0)
    # Only the P/D run has a split here (the other's metrics come from SimResult.metrics()).
    check_ttft_parts(page, pd[1], PD_PARTS, 0)
    assert not any(result == 1 for key, result in page.cells if key.startswith("ttft_parts_ms."))


def test_two_runs_with_splits_get_a_bar_and_a_table_each(pd: tuple[RunResult, dict[str, Any]]) -> None:
    plain = simulate()
    text = render_report([("pd", pd[0].result), ("plain", plain.result)], "Both",
                         metrics=[pd[1], as_saved(plain)])
    page = Page(text)
    bars = chart_bars(page, "ttft-parts")
    colocated = (("arrival", "arrival"), ("queue", "queue"), ("prefill", "prefill"))
    split = as_saved(plain)["ttft_parts_ms"]
    assert bars[len(PD_PARTS):] == [(name, pytest.approx(split[key]["mean"], rel=1e-5))
                                    for key, name in colocated]
    for key, _ in colocated:
        for stat in STATISTICS:
            check_cell(page, f"ttft_parts_ms.{key}.{stat}", split[key][stat], 1)
