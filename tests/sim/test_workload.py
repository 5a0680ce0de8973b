"""Workloads: the random dataset of vllm bench serve, the real trace loaders,
prefix sharing through token ids, scaling/truncation and bad input."""

from __future__ import annotations

import datetime
import itertools
import json
import math
import statistics
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import StepTimeModel
from kvsched.request import SamplingParams
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import (
    HASH_BLOCK_TOKEN_BASE,
    MOONCAKE_BLOCK_TOKENS,
    RANDOM_PREFIX_TOKEN,
    UNIQUE_TOKEN_BASE,
    RandomRequests,
    Workload,
    WorkloadRequest,
    load_azure,
    load_jsonl,
    load_mooncake,
    load_workload,
    random_workload,
)

TRACES = next((p for p in (Path(__file__).resolve().parents[2].parent / "shared" / "traces",
                         Path("/work/shared/traces")) if p.is_dir()),
              Path(__file__).resolve().parents[2].parent / "shared" / "traces")
CONV = TRACES / "azure_llm_2023_conv.csv"
CODE = TRACES / "azure_llm_2023_code.csv"
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"

needs_traces = pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared traces not found in {TRACES}")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def conv() -> Workload:
    return load_azure(CONV)


@pytest.fixture(scope="module")
def code() -> Workload:
    return load_azure(CODE)


@pytest.fixture(scope="module")
def mooncake() -> Workload:
    return load_mooncake(MOONCAKE)


def first_last_data_lines(path: Path) -> tuple[str, str]:
    lines = path.read_bytes().decode().splitlines()
    return lines[1], lines[-1]


def seconds_between_azure_stamps(a: str, b: str) -> Decimal:
    # A different route from the loader's: datetime on the whole seconds,
    # Decimal on the fraction.
    def split(stamp: str) -> tuple[datetime.datetime, Decimal]:
        whole, fraction = stamp.split(".")
        return datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S"), Decimal("0." + fraction)

    (ta, fa), (tb, fb) = split(a), split(b)
    return Decimal(int((tb - ta).total_seconds())) + fb - fa


@needs_traces
def test_azure_conv_trace(conv: Workload) -> None:
    assert len(conv) == 19_366
    assert conv.name == "azure_llm_2023_conv"
    first, last = first_last_data_lines(CONV)
    assert first == "2023-11-16 18:15:46.6805900,374,44"
    assert last == "2023-11-16 19:14:08.4025270,197,183"
    # By hand: 19:14:08.4025270 - 18:15:46.6805900 = 58 min 21.7219370 s.
    assert seconds_between_azure_stamps(first.split(",")[0], last.split(",")[0]) == Decimal("3501.7219370")
    assert conv.requests[0].arrival_time == 0.0
    assert conv.requests[-1].arrival_time == 3501.721937
    r0, rn = conv.requests[0], conv.requests[-1]
    assert (r0.request_id, r0.prompt_runs, r0.output_len) == ("azure-0", ((UNIQUE_TOKEN_BASE, 374),), 44)
    assert (rn.request_id, rn.num_prompt_tokens, rn.output_len) == ("azure-19365", 197, 183)
    assert conv.total_prompt_tokens == 22_361_870
    assert conv.total_output_tokens == 4_088_665
    assert conv.max_concurrency is None


@needs_traces
def test_azure_code_trace(code: Workload) -> None:
    assert len(code) == 8_819
    first, last = first_last_data_lines(CODE)
    assert seconds_between_azure_stamps(first.split(",")[0], last.split(",")[0]) == Decimal("3435.9480560")
    assert code.requests[-1].arrival_time == 3435.948056
    assert code.total_prompt_tokens == 18_059_974
    assert code.total_output_tokens == 245_896
    arrivals = [r.arrival_time for r in code.requests]
    assert arrivals == sorted(arrivals)


@needs_traces
def test_azure_token_totals_by_another_route(conv: Workload) -> None:
    rows = [line.split(",") for line in CONV.read_text().splitlines()[1:]]
    assert sum(int(r[1]) for r in rows) == conv.total_prompt_tokens
    assert sum(int(r[2]) for r in rows) == conv.total_output_tokens


@needs_traces
def test_mooncake_trace(mooncake: Workload) -> None:
    assert len(mooncake) == 12_031
    lines = MOONCAKE.read_text().splitlines()
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    assert (first["timestamp"], last["timestamp"]) == (0, 3_536_999)
    assert mooncake.requests[0].arrival_time == 0.0
    assert mooncake.requests[-1].arrival_time == 3536.999
    assert mooncake.total_prompt_tokens == 144_793_823
    assert mooncake.total_output_tokens == 4_122_048
    # Line 1: input 6758 = 13 blocks of 512 + 102, hash ids 0..13.
    r0 = mooncake.requests[0]
    full_blocks = [(HASH_BLOCK_TOKEN_BASE + h, 512) for h in range(13)]
    assert r0.prompt_runs == (*full_blocks, (HASH_BLOCK_TOKEN_BASE + 13, 102))
    assert r0.num_prompt_tokens == first["input_length"] == 6758
    assert r0.output_len == 500


@needs_traces
def test_mooncake_requests_share_exactly_their_common_blocks(mooncake: Workload) -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    # Lines 1 and 2 share only hash id 0: exactly one block of tokens.
    a, b = mooncake.requests[0].prompt_token_ids(), mooncake.requests[1].prompt_token_ids()
    assert rows[0]["hash_ids"][:2] != rows[1]["hash_ids"][:2]
    assert common_prefix(a, b) == MOONCAKE_BLOCK_TOKENS
    # The first later line that continues line i's conversation (same first
    # three blocks) shares exactly as many leading blocks as the trace says.
    by_prefix: dict[tuple[int, ...], int] = {}
    pair = None
    for i, row in enumerate(rows):
        key = tuple(row["hash_ids"][:3])
        if len(key) == 3 and key in by_prefix:
            pair = (by_prefix[key], i)
            break
        by_prefix.setdefault(key, i)
    assert pair is not None
    i, j = pair
    hi, hj = rows[i]["hash_ids"], rows[j]["hash_ids"]
    shared = common_prefix(hi, hj)
    assert shared >= 3
    expected = sum(min(MOONCAKE_BLOCK_TOKENS, rows[i]["input_length"] - k * MOONCAKE_BLOCK_TOKENS,
                       rows[j]["input_length"] - k * MOONCAKE_BLOCK_TOKENS) for k in range(shared))
    ti, tj = mooncake.requests[i].prompt_token_ids(), mooncake.requests[j].prompt_token_ids()
    assert common_prefix(ti, tj) == expected


# ---------------------------------------------------------------- timestamps


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_timestamps_parsed_exactly(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                 "2023-11-16 23:59:59.9000001,5,1\r\n"
                 "2023-11-17 00:00:00.1,6,2\r\n"
                 "2023-11-17 00:00:02,7,3\r\n"
                 "\r\n")
    w = load_azure(path)
    # Each arrival is the exact difference rounded once to a float.
    assert [r.arrival_time for r in w.requests] == [0.0, 0.1999999, 2.0999999]
    assert [r.output_len for r in w.requests] == [1, 2, 3]


def test_azure_columns_in_any_order(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "GeneratedTokens,TIMESTAMP,ContextTokens\n9,2023-01-01 00:00:00,4\n")
    r = load_azure(path).requests[0]
    assert (r.num_prompt_tokens, r.output_len) == (4, 9)


# ---------------------------------------------------------------- bad files

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(("text", "line", "field"), [
    ("TIMESTAMP,ContextTokens\n" + OK_ROW, 1, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,abc,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,-5,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,0,4\n", 3, "ContextTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5,0\n", 3, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5,1_0\n", 3, "GeneratedTokens"),
    (HEADER + OK_ROW + "2023-11-16 18:15:47.0,5\n", 3, "fields"),
    (HEADER + OK_ROW + "yesterday,5,4\n", 3, "TIMESTAMP"),
    (HEADER + OK_ROW + "2023-02-30 18:15:47.0,5,4\n", 3, "TIMESTAMP"),
    (HEADER + OK_ROW + "2023-11-16 18:15:40.0,5,4\n", 3, "TIMESTAMP"),
])
def test_bad_azure_rows_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(ValueError, match=rf"bad\.csv, line {line}: .*{field}"):
        load_azure(path)


def mooncake_line(**fields: object) -> str:
    row: dict[str, object] = {"timestamp": 10, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
    row.update(fields)
    return json.dumps({k: v for k, v in row.items() if v is not None}) + "\n"


@pytest.mark.parametrize(("bad", "field"), [
    ("{not json\n", "JSON"),
    ("[1, 2]\n", "object"),
    (mooncake_line(hash_ids=None), "hash_ids"),
    (mooncake_line(extra=1), "extra"),
    (mooncake_line(hash_ids=[0]), "hash_ids"),
    (mooncake_line(hash_ids=[0, 1, 2]), "hash_ids"),
    (mooncake_line(hash_ids=[0, -1]), r"hash_ids\[1\]"),
    (mooncake_line(hash_ids=[0, "x"]), r"hash_ids\[1\]"),
    (mooncake_line(output_length=0), "output_length"),
    (mooncake_line(input_length=-3, hash_ids=[]), "input_length"),
    (mooncake_line(input_length=12.5), "input_length"),
    (mooncake_line(output_length=True), "output_length"),
    (mooncake_line(timestamp=5), "timestamp"),
    (mooncake_line(timestamp=-1), "timestamp"),
])
def test_bad_mooncake_lines_name_file_line_and_field(tmp_path: Path, bad: str, field: str) -> None:
    path = write(tmp_path, "bad.jsonl", mooncake_line() + "\n" + bad)
    with pytest.raises(ValueError, match=rf"bad\.jsonl, line 3: .*{field}"):
        load_mooncake(path)


def test_mooncake_small_file(tmp_path: Path) -> None:
    path = write(tmp_path, "m.jsonl", mooncake_line(timestamp=1500) + mooncake_line(
        timestamp=2750, input_length=512, hash_ids=[0]))
    w = load_mooncake(path)
    assert [r.arrival_time for r in w.requests] == [0.0, 1.25]
    assert w.requests[0].prompt_runs == ((HASH_BLOCK_TOKEN_BASE, 512), (HASH_BLOCK_TOKEN_BASE + 1, 88))
    assert w.requests[1].prompt_runs == ((HASH_BLOCK_TOKEN_BASE, 512),)


def test_jsonl_sorted_stably_and_ids_in_file_order(tmp_path: Path) -> None:
    lines = [{"arrival_time": 2.5, "input_tokens": 3, "output_tokens": 1},
             {"arrival_time": 0, "input_tokens": 4, "output_tokens": 2},
             {"arrival_time": 2.5, "input_tokens": 5, "output_tokens": 3}]
    path = write(tmp_path, "w.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    w = load_jsonl(path)
    assert [r.request_id for r in w.requests] == ["jsonl-1", "jsonl-0", "jsonl-2"]
    assert [r.arrival_time for r in w.requests] == [0.0, 2.5, 2.5]
    assert w.requests[0].prompt_token_ids() == [UNIQUE_TOKEN_BASE + 1] * 4


@pytest.mark.parametrize(("bad", "field"), [
    ('{"arrival_time": -1, "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": NaN, "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": "0", "input_tokens": 3, "output_tokens": 1}', "arrival_time"),
    ('{"arrival_time": 1, "input_tokens": 3}', "output_tokens"),
    ('{"arrival_time": 1, "input_tokens": 3, "output_tokens": 0}', "output_tokens"),
    ('{"arrival_time": 1, "input_tokens": 0, "output_tokens": 1}', "input_tokens"),
    ('{"arrival_time": 1, "input_tokens": 3, "output_token": 1}', "output_token"),
])
def test_bad_jsonl_lines(tmp_path: Path, bad: str, field: str) -> None:
    path = write(tmp_path, "bad.jsonl", '{"arrival_time": 0, "input_tokens": 3, "output_tokens": 1}\n' + bad)
    with pytest.raises(ValueError, match=rf"bad\.jsonl, line 2: .*{field}"):
        load_jsonl(path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.csv: cannot read"):
        load_azure(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match=r"empty\.csv: empty file"):
        load_azure(write(tmp_path, "empty.csv", ""))
    with pytest.raises(ValueError, match=r"header\.csv: no data rows"):
        load_azure(write(tmp_path, "header.csv", HEADER))
    with pytest.raises(ValueError, match=r"blank\.jsonl: no requests"):
        load_mooncake(write(tmp_path, "blank.jsonl", "\n\n"))


# ---------------------------------------------------------------- load_workload


def test_load_workload_dispatch(tmp_path: Path) -> None:
    path = write(tmp_path, "w.jsonl", '{"arrival_time": 0, "input_tokens": 3, "output_tokens": 1}\n')
    assert load_workload("jsonl", path, max_concurrency=4).max_concurrency == 4
    w = load_workload("random", num_prompts=3, input_len=5, output_len=2)
    assert [r.num_prompt_tokens for r in w.requests] == [5, 5, 5]
    azure = write(tmp_path, "a.csv", HEADER + OK_ROW)
    assert load_workload("azure", azure).requests[0].output_len == 44
    moon = write(tmp_path, "m.jsonl", mooncake_line())
    assert load_workload("mooncake", str(moon)).requests[0].num_prompt_tokens == 600


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("sharegpt", "x.json"), {}, "unknown dataset name 'sharegpt'"),
    (("azure",), {}, "needs dataset_path"),
    (("random", "x.csv"), {}, "reads no file"),
    (("random",), {"random_input_len": 5}, "unknown option"),
    (("jsonl", "x.jsonl"), {"seed": 1}, "unknown option"),
])
def test_load_workload_errors(args: tuple[str, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_workload(*args, **kwargs)


# ---------------------------------------------------------------- random dataset


def test_random_defaults_are_vllm_bench_defaults() -> None:
    w = random_workload()
    assert len(w) == 1000
    assert {r.num_prompt_tokens for r in w.requests} == {1024}
    assert {r.output_len for r in w.requests} == {128}
    assert {r.arrival_time for r in w.requests} == {0.0}  # request rate inf
    assert w.max_concurrency is None
    assert w.requests[7].prompt_runs == ((UNIQUE_TOKEN_BASE + 7, 1024),)


def test_random_matches_vllm_for_the_same_seed() -> None:
    # Golden values from vLLM 0.33.0's get_sampling_params (default_rng(3),
    # range ratio 0.5, no special tokens) and get_request (np.random.seed(3),
    # rate 2, burstiness 0.5).
    w = random_workload(8, 1000, 200, 0.5, request_rate=2.0, burstiness=0.5, seed=3)
    assert [r.request_id for r in w.requests] == [f"random-{i}" for i in range(8)]
    assert [r.num_prompt_tokens for r in w.requests] == [1312, 585, 679, 737, 681, 1302, 1370, 1082]
    assert [r.output_len for r in w.requests] == [107, 118, 166, 187, 224, 196, 153, 132]
    assert [r.arrival_time for r in w.requests] == [
        0.40886230662139794, 0.521773587789365, 2.6759537918878915, 2.6969970717084983,
        2.700531318579925, 2.7017222500608566, 3.3134555479123784, 4.0]


def test_random_length_ranges_and_determinism() -> None:
    ratio = {"input": 0.3, "output": 0.95}
    w = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=5)
    inputs = [r.num_prompt_tokens for r in w.requests]
    outputs = [r.output_len for r in w.requests]
    # [floor(70.7), ceil(131.3)] and [max(1, floor(10*0.05)), ceil(10*1.95)], every value hit.
    assert set(inputs) == set(range(70, 133))
    assert set(outputs) == set(range(1, 21))
    same = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=5)
    assert same == w
    other = random_workload(3000, input_len=101, output_len=10, range_ratio=ratio, seed=6)
    assert [r.num_prompt_tokens for r in other.requests] != inputs


def gaps(w: Workload) -> list[float]:
    times = [0.0] + [r.arrival_time for r in w.requests]
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_random_arrival_process(burstiness: float, cv: float) -> None:
    n, rate = 20_000, 4.0
    w = random_workload(n, input_len=1, output_len=1, request_rate=rate, burstiness=burstiness, seed=1)
    g = gaps(w)
    assert w.requests[-1].arrival_time == pytest.approx(n / rate, rel=1e-12)  # vLLM rescales to n/rate
    assert statistics.fmean(g) == pytest.approx(1 / rate, rel=1e-9)
    # Gamma(shape k) gaps have coefficient of variation 1/sqrt(k).
    assert statistics.pstdev(g) / statistics.fmean(g) == pytest.approx(cv, rel=0.1)
    assert all(x >= 0 for x in g)


def test_random_constant_rate_when_burstiness_is_infinite() -> None:
    w = random_workload(10, input_len=1, output_len=1, request_rate=5.0, burstiness=math.inf)
    assert [r.arrival_time for r in w.requests] == pytest.approx([0.2 * (i + 1) for i in range(10)])


def test_random_prefix_is_shared_exactly() -> None:
    w = random_workload(5, input_len=30, output_len=4, prefix_len=100, range_ratio=0.5, seed=2)
    a, b = w.requests[0].prompt_token_ids(), w.requests[1].prompt_token_ids()
    assert a[:100] == [RANDOM_PREFIX_TOKEN] * 100
    assert common_prefix(a, b) == 100
    assert all(r.num_prompt_tokens >= 115 for r in w.requests)
    only_prefix = random_workload(2, input_len=0, prefix_len=8)
    assert only_prefix.requests[0].prompt_runs == ((RANDOM_PREFIX_TOKEN, 8),)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_prompts": 0}, "num_prompts"),
    ({"input_len": 0}, "prefix_len"),
    ({"range_ratio": 1.0}, "range_ratio"),
    ({"range_ratio": {"input": 0.1}}, "range_ratio"),
    ({"request_rate": 0}, "request_rate"),
    ({"burstiness": 0}, "burstiness"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"seed": -1}, "seed"),
])
def test_random_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        random_workload(num_prompts=kwargs.pop("num_prompts", 3), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- Workload helpers


def small_workload() -> Workload:
    reqs = tuple(WorkloadRequest(f"r{i}", float(t), ((UNIQUE_TOKEN_BASE + i, 2),), 1)
                 for i, t in enumerate([0, 1, 1, 3, 10]))
    return Workload("small", reqs, max_concurrency=2)


def test_scaled_and_truncated() -> None:
    w = small_workload()
    half = w.scaled(0.5)
    assert [r.arrival_time for r in half.requests] == [0, 0.5, 0.5, 1.5, 5]
    assert [r.request_id for r in half.requests] == [r.request_id for r in w.requests]
    assert half.max_concurrency == 2
    assert [r.request_id for r in w.truncated(num_requests=2).requests] == ["r0", "r1"]
    assert [r.request_id for r in w.truncated(duration=3).requests] == ["r0", "r1", "r2"]
    assert len(w.truncated(num_requests=4, duration=100)) == 4
    with pytest.raises(ValueError, match="time_scale"):
        w.scaled(0)
    with pytest.raises(ValueError, match="duration"):
        w.truncated(duration=-1)
    with pytest.raises(ValueError, match="no request arrives before"):
        Workload("late", (WorkloadRequest("x", 5.0, ((1, 1),), 1),)).truncated(duration=1)


def test_workload_sorts_stably_and_checks_ids() -> None:
    a = WorkloadRequest("a", 2.0, ((1, 1),), 1)
    b = WorkloadRequest("b", 1.0, ((1, 1),), 1)
    c = WorkloadRequest("c", 2.0, ((1, 1),), 1)
    assert [r.request_id for r in Workload("w", (a, b, c)).requests] == ["b", "a", "c"]
    with pytest.raises(ValueError, match="duplicate request_id 'a'"):
        Workload("w", (a, a))
    with pytest.raises(ValueError, match="requests is empty"):
        Workload("w", ())


def test_workload_request_validation() -> None:
    r = WorkloadRequest("x", 0, [[5, 2], [6, 1]], 3)  # type: ignore[arg-type]
    assert r.prompt_runs == ((5, 2), (6, 1))
    assert r.num_prompt_tokens == 3
    assert r.prompt_token_ids() == [5, 5, 6]
    cases: list[tuple[dict[str, object], str]] = [
        ({"output_len": 0}, "output_len"), ({"arrival_time": -1.0}, "arrival_time"),
        ({"arrival_time": math.nan}, "arrival_time"), ({"prompt_runs": ()}, "prompt_runs"),
        ({"prompt_runs": ((5, 0),)}, "count"), ({"prompt_runs": ((-1, 3),)}, "token_id"),
        ({"output_len": True}, "output_len"), ({"request_id": ""}, "request_id")]
    for kwargs, field in cases:
        args: dict[str, object] = {"request_id": "x", "arrival_time": 0.0, "prompt_runs": ((1, 1),),
                                   "output_len": 1}
        args.update(kwargs)
        with pytest.raises(ValueError, match=field):
            WorkloadRequest(**args)  # type: ignore[arg-type]


def test_a_huge_prompt_costs_no_token_list() -> None:
    # A 5e8-token row (a corrupt trace): the request is refused for its length,
    # as vLLM refuses it, without ever expanding its prompt.
    huge = WorkloadRequest("huge", 0.0, ((UNIQUE_TOKEN_BASE, 500_000_000),), 4)
    small = WorkloadRequest("small", 0.0, ((UNIQUE_TOKEN_BASE + 1, 100),), 4)
    request = huge.to_request(SamplingParams(max_tokens=4), 0.0)
    assert len(request.all_token_ids) == 500_000_000 and request.private
    config = SimConfig(SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=2048),
                       CacheConfig(num_gpu_blocks=200, block_size=16),
                       StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm")))
    result = Simulator(config, Workload("w", (huge, small))).run()
    assert [f[0] for f in result.failed] == ["huge"] and "max_model_len" in result.failed[0][1]
    assert [r.request_id for r in result.records] == ["small"]


def test_random_requests_are_built_on_demand_as_listed() -> None:
    # The random dataset keeps columns and builds each request when asked:
    # the same requests a list would hold, by index, slice and iteration.
    w = random_workload(num_prompts=50, input_len=30, output_len=9, range_ratio=0.5, prefix_len=4,
                        request_rate=10.0, seed=5)
    reqs = w.requests
    assert isinstance(reqs, RandomRequests) and len(reqs) == 50
    r7 = reqs[7]
    assert r7.request_id == "random-7"
    assert r7.prompt_runs[0] == (RANDOM_PREFIX_TOKEN, 4)
    assert r7.prompt_runs[1][0] == UNIQUE_TOKEN_BASE + 7 and 15 <= r7.prompt_runs[1][1] <= 45
    assert reqs[-1].request_id == "random-49" and reqs[-1] == reqs[49]
    listed = list(reqs)
    assert [r.request_id for r in listed] == [f"random-{i}" for i in range(50)]
    assert list(w.arrival_times()) == [r.arrival_time for r in listed]
    assert w.total_prompt_tokens == sum(r.num_prompt_tokens for r in listed)
    assert w.total_output_tokens == sum(r.output_len for r in listed)
    # Slices keep the ids of their position in the whole workload.
    tail = w.truncated(num_requests=10).requests
    assert [r.request_id for r in tail] == [f"random-{i}" for i in range(10)]
    assert reqs[20:23] == listed[20:23]
    cut = w.truncated(duration=listed[30].arrival_time)
    assert len(cut) == sum(1 for r in listed if r.arrival_time < listed[30].arrival_time)
    # Scaling multiplies each arrival as a WorkloadRequest would.
    half = w.scaled(0.5)
    assert [r.arrival_time for r in half.requests] == [r.arrival_time * 0.5 for r in listed]
    with pytest.raises(IndexError):
        reqs[50]
