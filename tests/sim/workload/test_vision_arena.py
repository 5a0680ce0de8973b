"""``--dataset-name hf`` over a local copy of VisionArena (parquet), as
vLLM's VisionArenaDataset reads it with ``--disable-shuffle``: the first
user turn and the first image of each row, in file order."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.errors import UserInputError
from kvsched.sim.workload.bench.vision_arena import read_vision_arena

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _png(width: int, height: int) -> bytes:
    header = struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height)
    return b"\x89PNG\r\n\x1a\n" + header + bytes(5)


def _write(path: Path, rows: list[tuple[str, int, int]]) -> None:
    table = pa.Table.from_pylist([
        {"conversation": [[{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]],
         "images": [{"bytes": _png(w, h), "path": None}, {"bytes": _png(1, 1), "path": None}]}
        for text, w, h in rows])
    pq.write_table(table, path)


@pytest.fixture
def arena(tmp_path: Path) -> Path:
    data = tmp_path / "VisionArena-Chat" / "data"
    data.mkdir(parents=True)
    # Two train shards (read in path order) and a test shard (not read).
    _write(data / "train-00000-of-00002.parquet", [("What is this?", 640, 480), ("Count the cats.", 32, 32)])
    _write(data / "train-00001-of-00002.parquet", [("Where was it taken?", 1280, 720)])
    _write(data / "test-00000-of-00001.parquet", [("unused", 8, 8)])
    return tmp_path / "VisionArena-Chat"


def test_rows_in_file_order_with_their_first_image(arena: Path) -> None:
    rows = read_vision_arena(arena, "lmarena-ai/VisionArena-Chat", "train")
    assert [(text, struct.unpack(">II", data[16:24])) for text, data in rows] == [
        ("What is this?", (640, 480)), ("Count the cats.", (32, 32)), ("Where was it taken?", (1280, 720))]
    assert [t for t, _ in read_vision_arena(arena, "lmarena-ai/VisionArena-Chat", "test")] == ["unused"]
    with pytest.raises(UserInputError, match="hf-name"):
        read_vision_arena(arena, "lmarena-ai/other", "train")
    with pytest.raises(UserInputError, match=r"not a lmarena-ai/vision-arena-bench-v0\.1 row"):
        read_vision_arena(arena, "lmarena-ai/vision-arena-bench-v0.1", "train")


def test_simulate_reads_the_local_copy(arena: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("aiconfigurator_core")
    args = ["simulate", "--model", "Qwen/Qwen3-VL-8B-Instruct", "--hardware", "h100", "--dataset-name", "hf",
            "--dataset-path", str(arena), "--hf-name", "lmarena-ai/VisionArena-Chat", "--num-prompts", "5",
            "--hf-output-len", "12"]
    assert main(args) == 2  # vLLM's shuffle is not reproduced: --disable-shuffle is needed
    assert "--disable-shuffle" in capsys.readouterr().err
    assert main([*args, "--disable-shuffle"]) == 0
    out = capsys.readouterr().out
    # 3 rows, oversampled to 5; 12 tokens each.
    assert "Successful requests:                             5" in out
    assert "Total generated tokens:                         60" in out
