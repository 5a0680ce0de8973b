"""vllm bench serve's metrics on hand-computed cases, and the weighted ITL
accumulator against numpy on the flattened list."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.errors import UserInputError
from kvsched.sim.metrics import (
    RecordTable,
    RequestRecord,
    benchmark_duration,
    compute_metrics,
    e2el,
    parse_goodput,
    request_latencies,
    sum_present,
    tpot,
    ttft,
)
from kvsched.sim.offload_transfer import OffloadStats
from kvsched.sim.samples import SampleAccumulator

# Three requests, times in seconds:
#   a: sent 0.0, first token 0.5, done 2.5, 10 prompt / 5 output tokens,
#      tokens at 0.5, 0.75, 1.0, 1.5, 2.5 -> ITLs 0.25, 0.25, 0.5, 1.0
#   b: sent 1.0, first token 1.2, done 1.2, 20 prompt / 1 output token (no ITL, no TPOT)
#   c: sent 2.0, first token 3.0, done 4.5, 30 prompt / 3 output tokens,
#      tokens at 3.0, 4.0, 4.5 -> ITLs 1.0, 0.5
RECORDS = [
    RequestRecord("a", 0.0, 0.5, 2.5, 10, 5),
    RequestRecord("b", 1.0, 1.2, 1.2, 20, 1),
    RequestRecord("c", 2.0, 3.0, 4.5, 30, 3),
]
ITLS = [0.25, 0.25, 0.5, 1.0, 1.0, 0.5]
TOKEN_TIMES = [0.5, 0.75, 1.0, 1.5, 2.5, 1.2, 3.0, 4.0, 4.5]


def accumulator(values: list[float]) -> SampleAccumulator:
    acc = SampleAccumulator()
    for v in values:
        acc.add(v)
    return acc


def test_hand_computed_metrics() -> None:
    m = compute_metrics(RECORDS, accumulator(ITLS), duration=5.0, percentiles=(50, 90, 99))
    assert m["duration"] == 5.0
    assert m["completed"] == 3 and m["failed"] == 0
    assert m["total_input_tokens"] == 60 and m["total_output_tokens"] == 9
    assert m["request_throughput"] == pytest.approx(3 / 5)
    assert m["output_throughput"] == pytest.approx(9 / 5)
    assert m["total_token_throughput"] == pytest.approx(69 / 5)
    assert "request_goodput" not in m  # no SLOs given
    # TTFT 0.5, 0.2, 1.0 s. Sorted 0.2, 0.5, 1.0: p90 at index 1.8 -> 0.5 + 0.8*0.5.
    # std: E[x^2] - mean^2 = 1.29/3 - (1.7/3)^2 = 0.98/9.
    assert m["mean_ttft_ms"] == pytest.approx(1700 / 3)
    assert m["median_ttft_ms"] == pytest.approx(500)
    assert m["std_ttft_ms"] == pytest.approx(1000 * math.sqrt(0.98) / 3)
    assert m["p50_ttft_ms"] == pytest.approx(500)
    assert m["p90_ttft_ms"] == pytest.approx(900)
    assert m["p99_ttft_ms"] == pytest.approx(990)
    # TPOT: a (2.5-0.5)/4 = 0.5, c (2.5-1.0)/2 = 0.75; b has one token and is left out.
    assert m["mean_tpot_ms"] == pytest.approx(625)
    assert m["median_tpot_ms"] == pytest.approx(625)
    assert m["std_tpot_ms"] == pytest.approx(125)
    assert m["p90_tpot_ms"] == pytest.approx(725)
    assert m["p99_tpot_ms"] == pytest.approx(747.5)
    # ITL sorted 0.25, 0.25, 0.5, 0.5, 1.0, 1.0: mean 3.5/6, median 0.5,
    # p90 at index 4.5 -> 1.0; var = 2.625/6 - (3.5/6)^2 = 7/72.
    assert m["mean_itl_ms"] == pytest.approx(3500 / 6)
    assert m["median_itl_ms"] == pytest.approx(500)
    assert m["std_itl_ms"] == pytest.approx(1000 * math.sqrt(7 / 72))
    assert m["p50_itl_ms"] == pytest.approx(500)
    assert m["p90_itl_ms"] == pytest.approx(1000)
    # E2EL 2.5, 0.2, 2.5: var = 12.54/3 - (5.2/3)^2.
    assert m["mean_e2el_ms"] == pytest.approx(5200 / 3)
    assert m["median_e2el_ms"] == pytest.approx(2500)
    assert m["std_e2el_ms"] == pytest.approx(1000 * math.sqrt(12.54 / 3 - (5.2 / 3) ** 2))
    assert m["p90_e2el_ms"] == pytest.approx(2500)
    # In flight per whole second since the first send: a in 0-2, b in 1, c in 2-4.
    assert m["max_concurrent_requests"] == 2
    assert "max_output_tokens_per_s" not in m


def test_key_names_follow_vllm() -> None:
    m = compute_metrics(RECORDS, ITLS, 5.0, percentiles=(99.9, 25), goodput_slos={"ttft": 100})
    expected = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_concurrent_requests"]
    for metric in ("ttft", "tpot", "itl", "e2el"):
        expected += [f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms",
                     f"p99.9_{metric}_ms", f"p25_{metric}_ms"]
    assert list(m) == expected
    assert all(type(v) in (int, float) for v in m.values())


def test_max_output_tokens_per_s() -> None:
    times = SampleAccumulator()
    for t in TOKEN_TIMES:
        times.add(t)
    # Per whole second since the first send: [0,1): 0.5, 0.75; [1,2): 1.0, 1.5, 1.2;
    # [2,3): 2.5; [3,4): 3.0; [4,5): 4.0, 4.5.
    m = compute_metrics(RECORDS, ITLS, 5.0, token_times=times)
    assert m["max_output_tokens_per_s"] == 3.0
    # The same tokens given as (time, count) pairs.
    grouped = SampleAccumulator()
    grouped.add(1.2, 3)
    grouped.add(0.1, 2)
    assert compute_metrics(RECORDS, ITLS, 5.0, token_times=grouped)["max_output_tokens_per_s"] == 3.0


def test_goodput_hand_computed() -> None:
    # ttft a 0.5 b 0.2 c 1.0; tpot a 0.5, b counts 0, c 0.75; e2el a 2.5 b 0.2 c 2.5.
    def goodput(slos: dict[str, float]) -> float:
        return float(compute_metrics(RECORDS, ITLS, 5.0, goodput_slos=slos)["request_goodput"])

    assert goodput({"ttft": 600}) == pytest.approx(2 / 5)  # a, b
    assert goodput({"tpot": 500}) == pytest.approx(2 / 5)  # a (exactly at the SLO), b (one token)
    assert goodput({"tpot": 499}) == pytest.approx(1 / 5)  # b only
    assert goodput({"ttft": 600, "e2el": 2000}) == pytest.approx(1 / 5)  # b
    assert goodput({"ttft": 100, "tpot": 1000}) == 0.0
    assert goodput(parse_goodput(["ttft:1000", "tpot:750", "e2el:2500"])) == pytest.approx(3 / 5)


def test_itl_as_array_or_accumulator_agree() -> None:
    rng = np.random.default_rng(4)
    itls = np.round(rng.exponential(0.03, size=5000), 4)
    acc = SampleAccumulator()
    acc.add_array(itls)
    from_array = compute_metrics(RECORDS, itls, 5.0, percentiles=(50, 90, 95, 99, 99.9))
    from_acc = compute_metrics(RECORDS, acc, 5.0, percentiles=(50, 90, 95, 99, 99.9))
    for key, value in from_array.items():
        if key.startswith(("mean_itl", "std_itl")):
            assert from_acc[key] == pytest.approx(value, rel=1e-12)
        else:
            assert from_acc[key] == value, key


def test_empty_lists_report_zero_like_vllm() -> None:
    one_token = [RequestRecord("x", 0.0, 0.1, 0.1, 5, 1)]
    m = compute_metrics(one_token, SampleAccumulator(), 1.0)
    for key in ("mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "median_itl_ms", "p99_itl_ms"):
        assert m[key] == 0.0
    assert compute_metrics(one_token, [], 1.0)["p50_itl_ms"] == 0.0
    assert m["mean_ttft_ms"] == pytest.approx(100)
    none = compute_metrics([], [], 2.0, failed=3)
    assert (none["completed"], none["failed"]) == (0, 3)
    assert (none["mean_e2el_ms"], none["max_concurrent_requests"]) == (0, 0)


def test_client_queue_metrics() -> None:
    records = [RequestRecord("a", 1.0, 1.5, 2.0, 4, 2, arrival_time=0.25),
               RequestRecord("b", 3.0, 3.5, 4.0, 4, 2)]  # no arrival_time: sent on arrival
    m = compute_metrics(records, [0.5, 0.5], 4.0, percentiles=(50,),
                        percentile_metrics=("client_queue_time", "e2el_including_client_queue"))
    assert m["mean_client_queue_time_ms"] == pytest.approx(375)
    assert m["p50_e2el_including_client_queue_ms"] == pytest.approx((1750 + 1000) / 2)
    assert "mean_ttft_ms" not in m


def test_benchmark_duration() -> None:
    assert benchmark_duration(RECORDS) == 4.5
    assert benchmark_duration(RECORDS, start_time=0.5) == 4.0


# ---------------------------------------------------------------- accumulator exactness


def test_weighted_percentiles_equal_numpy_on_the_flattened_list() -> None:
    rng = np.random.default_rng(0)
    qs = [0, 0.1, 1, 5, 10, 25, 33.3, 50, 66.7, 75, 90, 95, 99, 99.9, 100]
    for trial in range(150):
        k = int(rng.integers(1, 40))
        scale = [1.0, 0.01, 1e-3, 123.4][trial % 4]
        values = np.round(rng.random(k) * scale, int(rng.integers(1, 9)))  # rounding makes ties
        counts = rng.integers(0, 7 if trial % 3 else 20_000, size=k)
        counts[0] = max(int(counts[0]), 1)
        acc = SampleAccumulator()
        for v, c in zip(values.tolist(), counts.tolist()):
            acc.add(v, c)
        flat = np.repeat(values, counts)
        assert len(acc) == len(flat)
        for q in [*qs, *(rng.random(3) * 100).tolist()]:
            assert acc.percentile(q) == np.percentile(flat, q), (trial, q)
        assert acc.median() == np.median(flat)
        assert acc.mean() == pytest.approx(float(np.mean(flat)), rel=1e-12)
        assert acc.std() == pytest.approx(float(np.std(flat)), rel=1e-9, abs=1e-15)


def test_accumulator_flush_at_must_be_positive() -> None:
    with pytest.raises(UserInputError, match="flush_at=0"):
        SampleAccumulator(flush_at=0)


def test_accumulator_chunks_and_flattening() -> None:
    acc = SampleAccumulator(flush_at=3)  # exercise the list -> array flushes and merges
    expected: list[float] = []
    rng = np.random.default_rng(9)
    for step in range(50):
        if step % 7 == 0:
            arr = np.round(rng.random(4), 2)
            acc.add_array(arr, [1, 0, 2, 1])
            expected += [arr[0], arr[2], arr[2], arr[3]]
        else:
            gap, count = round(float(rng.random()), 2), int(rng.integers(0, 4))
            acc.add(gap, count)
            expected += [gap] * count
        if step % 10 == 9:  # ask in between: the cache must follow later adds
            assert acc.percentile(90) == np.percentile(expected, 90)
    assert acc.to_array().tolist() == expected
    assert acc.percentile(37.5) == np.percentile(expected, 37.5)
    assert acc.median() == np.median(expected)


def test_accumulator_rejects_bad_samples() -> None:
    acc = SampleAccumulator()
    for value, count in [(-0.1, 1), (math.nan, 1), (math.inf, 1), (0.1, -1)]:
        with pytest.raises(ValueError, match="sample"):
            acc.add(value, count)
    acc.add(0.5, 0)
    assert len(acc) == 0
    with pytest.raises(ValueError, match="no samples"):
        acc.percentile(50)
    with pytest.raises(ValueError, match="counts"):
        acc.add_array([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="sample value"):
        acc.add_array([0.1, -0.2])
    acc.add(0.5)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        acc.percentile(101)


# ---------------------------------------------------------------- goodput parsing and bad input


def test_parse_goodput() -> None:
    slos = parse_goodput(["ttft:500", "tpot:50", "e2el:2000"])
    assert slos == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    assert parse_goodput("ttft:500 tpot:12.5") == {"ttft": 500.0, "tpot": 12.5}
    assert parse_goodput([]) == {}


@pytest.mark.parametrize(("args", "message"), [
    (["itl:5"], "unknown metric 'itl'"),
    (["ttft=5"], "KEY:VALUE"),
    (["ttft:5:6"], "KEY:VALUE"),
    (["ttft:fast"], "not a number"),
    (["ttft:-1"], ">= 0"),
    (["ttft:nan"], ">= 0"),
    (["ttft:1", "ttft:2"], "twice"),
])
def test_parse_goodput_errors(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_goodput(args)


@pytest.mark.parametrize(("records", "kwargs", "message"), [
    (RECORDS, {"duration": 0.0}, "duration"),
    (RECORDS, {"duration": math.inf}, "duration"),
    ([RequestRecord("z", 1.0, 0.5, 2.0, 3, 2)], {}, "RequestRecord z: first_token_time"),
    ([RequestRecord("z", 1.0, 1.5, 1.4, 3, 2)], {}, "RequestRecord z: finish_time"),
    ([RequestRecord("z", 1.0, 1.5, 2.0, 3, 0)], {}, "RequestRecord z: num_output_tokens"),
    ([RequestRecord("z", 1.0, 1.5, 2.0, 0, 2)], {}, "RequestRecord z: num_prompt_tokens"),
    ([RequestRecord("z", 1.0, 1.5, 2.0, 3, 2, arrival_time=1.5)], {}, "RequestRecord z: arrival_time"),
    ([RequestRecord("z", math.nan, 1.5, 2.0, 3, 2)], {}, "RequestRecord z: times"),
    (RECORDS, {"percentiles": (101,)}, "percentiles"),
    (RECORDS, {"goodput_slos": {"itl": 5.0}}, "unknown metric 'itl'"),
    (RECORDS, {"percentile_metrics": ("ttfb",)}, "ttfb"),
    (RECORDS, {"failed": -1}, "failed"),
])
def test_compute_metrics_bad_input(records: list[RequestRecord], kwargs: dict[str, object],
                                   message: str) -> None:
    args: dict[str, object] = {"duration": 5.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        compute_metrics(records, ITLS, **args)  # type: ignore[arg-type]


def _dense_peaks(records: list[RequestRecord], token_times: SampleAccumulator) -> tuple[float, int]:
    """vLLM's own binning (one slot per second of the run): the reference
    the sparse computation must equal."""
    send = np.array([r.send_time for r in records])
    finish = np.array([r.finish_time for r in records])
    start = float(send.min())
    seconds = int(np.ceil(float(finish.max()) - start)) + 1
    per_second = np.zeros(seconds)
    for value, count in zip(*token_times._pairs()):
        b = int(value - start)
        if 0 <= b < seconds:  # int() truncates: -0.5 s is second 0, as in vLLM
            per_second[b] += count
    in_flight = np.zeros(seconds, dtype=np.int64)
    for s, f in zip(send, finish):
        in_flight[int(s - start):int(f - start) + 1] += 1
    return float(per_second.max()), int(in_flight.max())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0, 5), st.floats(0, 5), st.integers(1, 4)),
                min_size=1, max_size=12),
       st.lists(st.tuples(st.floats(0, 45), st.integers(0, 5)), max_size=30))
def test_peaks_equal_vllm_dense_binning(reqs: list[tuple[float, float, float, int]],
                                        tokens: list[tuple[float, int]]) -> None:
    records = [RequestRecord(f"r{i}", s, s + a, s + a + b, 5, n) for i, (s, a, b, n) in enumerate(reqs)]
    times = SampleAccumulator()
    for t, c in tokens:
        times.add(t, c)
    m = compute_metrics(records, [], 1.0, token_times=times)
    assert (m["max_output_tokens_per_s"], m["max_concurrent_requests"]) == _dense_peaks(records, times)


def test_peaks_cost_follows_samples_not_span() -> None:
    # A run spanning ~8000 years (an arrival in year 9999): binning per
    # second would need terabytes; the peaks come from the samples alone.
    late = 2.5e11
    records = [RequestRecord("a", 0.0, 0.5, 2.5, 10, 5), RequestRecord("b", 0.2, 0.6, 1.0, 10, 2),
               RequestRecord("z", late, late + 0.5, late + 1.5, 10, 3)]
    times = SampleAccumulator()
    for t, c in ((0.5, 2), (0.6, 1), (0.9, 1), (2.5, 1), (late + 0.5, 1), (late + 1.2, 2)):
        times.add(t, c)
    m = compute_metrics(records, [], late + 1.5, token_times=times)
    assert m["max_output_tokens_per_s"] == 4.0  # second 0: 2 + 1 + 1
    assert m["max_concurrent_requests"] == 2


def test_record_table_reads_as_its_records_and_gives_the_same_metrics() -> None:
    rng = np.random.default_rng(3)
    records = []
    for i in range(200):
        send = float(rng.uniform(0, 50))
        first = send + float(rng.uniform(0.01, 2))
        out = int(rng.integers(1, 40))
        records.append(RequestRecord(f"r{i}", send, first, first + 0.01 * out, int(rng.integers(1, 900)),
                                     out, send - float(rng.uniform(0, 1))))
    table = RecordTable()
    for r in records:
        table.append(r.request_id, r.send_time, r.first_token_time, r.finish_time,
                     r.num_prompt_tokens, r.num_output_tokens, r.arrival_time)
    assert len(table) == 200 and list(table) == records and table[-1] == records[-1]
    assert table[10:13] == records[10:13]
    itls = SampleAccumulator()
    itls.add_array([0.01] * 50)
    assert compute_metrics(table, itls, 60.0) == compute_metrics(records, itls, 60.0)
    # Concatenation keeps order; per-request token times survive, None-padded.
    other = RecordTable()
    other.append("x", 1.0, 1.5, 2.0, 5, 2, 1.0, [1.5, 2.0])
    both = RecordTable.concat([table, other])
    assert [r.request_id for r in both] == [r.request_id for r in records] + ["x"]
    assert both[0].token_times is None and both[-1].itls == [0.5]
    with pytest.raises(IndexError):
        table[200]


def test_the_latency_definitions() -> None:
    # Sent at 1 s, first token at 3 s, ten tokens, the last at 3.09 s.
    assert ttft(1.0, 3.0) == pytest.approx(2.0)
    assert e2el(1.0, 3.09) == pytest.approx(2.09)
    assert tpot(2.0, 2.09, 10) == pytest.approx(0.01)   # from the first token, not the send
    assert request_latencies(1.0, 3.0, 3.09, 10) == pytest.approx((2.0, 2.09, 0.01))
    assert request_latencies(1.0, 3.0, 3.0, 1)[2] is None  # one token: no TPOT
    record = RequestRecord("r", 1.0, 3.0, 3.09, 5, 10)
    assert (record.ttft, record.e2el, record.tpot) == pytest.approx((2.0, 2.09, 0.01))
    columns = tpot(np.array([2.0, 0.5]), np.array([2.09, 1.5]), np.array([10, 3]))
    assert columns == pytest.approx([0.01, 0.5])
    metrics = compute_metrics([record, RequestRecord("s", 0.0, 0.5, 1.5, 5, 3)], [], 4.0,
                              goodput_slos={"tpot": 20.0})
    assert metrics["mean_ttft_ms"] == pytest.approx(1250.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(255.0)
    assert metrics["request_goodput"] == pytest.approx(1 / 4.0)  # only the 10 ms TPOT meets 20 ms


def test_sum_present_adds_the_cores_that_have_counters_and_changes_none() -> None:
    a = OffloadStats(num_cpu_blocks=10, cpu_hit_tokens=32, store_count=2, store_bytes=1.5,
                     store_seconds=[0.1, 0.2], load_count=1, load_bytes=0.5, load_seconds=[0.3])
    b = OffloadStats(num_cpu_blocks=6, cpu_hit_tokens=16, store_count=1, store_bytes=0.25,
                     store_seconds=[0.4])
    total = sum_present([None, a, None, b])
    assert total == OffloadStats(num_cpu_blocks=16, cpu_hit_tokens=48, store_count=3, store_bytes=1.75,
                                 store_seconds=[0.1, 0.2, 0.4], load_count=1, load_bytes=0.5,
                                 load_seconds=[0.3])
    # The parts are left as they were (the first one is copied, not grown).
    assert a.num_cpu_blocks == 10 and a.store_seconds == [0.1, 0.2]
    assert sum_present([None, None]) is None
    assert sum_present([]) is None
