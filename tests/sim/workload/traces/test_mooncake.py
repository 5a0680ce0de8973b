"""The Mooncake trace loader: the published conversation trace, prompts that
share exactly their common hash blocks, and bad lines named by file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.sim.workload import HASH_BLOCK_TOKEN_BASE, MOONCAKE_BLOCK_TOKENS, Workload, load_mooncake

TRACES = next((p for p in (Path(__file__).resolve().parents[4].parent / "shared" / "traces",
                         Path("/work/shared/traces")) if p.is_dir()),
              Path(__file__).resolve().parents[4].parent / "shared" / "traces")
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"

needs_traces = pytest.mark.skipif(not MOONCAKE.exists(), reason=f"shared traces not found in {TRACES}")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture(scope="module")
def mooncake() -> Workload:
    return load_mooncake(MOONCAKE)


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


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


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
