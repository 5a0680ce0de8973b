"""``kvsched generate``: every size-like flag bounded before anything is
allocated, and a prompts file that is not text named in the error.

The checkpoints here have no weights (config and tokenizer only): a flag that
got past its bound would fail later with "safetensors", so each refusal below
also shows that nothing was loaded or allocated first."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvsched.cli import main  # noqa: E402
from kvsched.engine import command  # noqa: E402
from kvsched.engine.core import host_available_memory  # noqa: E402


@pytest.fixture(scope="module")
def no_weights(tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("no-weights")
    for f in tiny(arch="llama").iterdir():
        if not f.name.endswith(".safetensors"):
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsched: error: "), err
    for word in words:
        assert word in err, (word, err)
    assert "safetensors" not in err
    return err


@pytest.mark.parametrize(("flags", "words"), [
    # The scheduler's limits: 2**24, the bound simulate shares.
    (["--max-num-seqs", "100000000"], ["max_num_seqs=100000000", "--max-num-seqs", "16,777,216"]),
    (["--max-num-batched-tokens", "1000000000000"],
     ["max_num_batched_tokens=1000000000000", "--max-num-batched-tokens", "16,777,216"]),
    (["--max-model-len", "9" * 400], ["max_model_len=<a 400-digit integer>", "--max-model-len"]),
    (["--max-model-len", "100000"], ["max_model_len=100000", "max_position_embeddings (2048)"]),
    (["--long-prefill-token-threshold", "1000000000000"],
     ["long_prefill_token_threshold=1000000000000", "max_model_len"]),
    (["--block-size", "100000000"], ["block_size=100000000", "--block-size", "[1, 4096]"]),
    (["--block-size", "0"], ["block_size=0", "--block-size"]),
    (["--num-gpu-blocks-override", "1000000000000"],
     ["num_gpu_blocks_override=1000000000000", "16,777,216", "--num-gpu-blocks-override"]),
    (["--seed", "100000000000000000000000"], ["seed=100000000000000000000000", "[-2**63, 2**64 - 1]"]),
    (["--sampling-seed", "-100000000000000000000000"],
     ["--sampling-seed=-100000000000000000000000", "[-2**63, 2**64 - 1]"]),
    (["--max-tokens", "100000000"], ["--max-tokens=100000000", "16,777,216"]),
    (["--max-tokens", "0"], ["--max-tokens=0", "[1, "]),
    (["--min-tokens", "100000000"], ["--min-tokens=100000000", "16,777,216"]),
    (["--logprobs", "100000000"], ["--logprobs=100000000", "16,777,216"]),
    (["--kv-cache-memory", "0"], ["kv_cache_memory='0'", "positive"]),
])
def test_each_size_flag_is_bounded_before_anything_loads(
        no_weights: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]) -> None:
    _refused(capsys, ["generate", "--model", str(no_weights), "--prompt", "x", *flags], *words)


def test_a_kv_cache_larger_than_the_machine_is_refused_naming_the_flag(
        no_weights: Path, capsys: pytest.CaptureFixture[str]) -> None:
    available = host_available_memory()
    if available is None or available >= 10**13:
        pytest.skip("this machine's available memory is unknown or above 10 TB")
    # 10 TB of blocks of 16 tokens of this model: above the RAM, so refused
    # for it (the block pool's bound would come second).
    err = _refused(capsys, ["generate", "--model", str(no_weights), "--prompt", "x", "--kv-cache-memory",
                            "10TB"], "kv_cache_memory=10000000000000", "--kv-cache-memory",
                   "of RAM available on this machine", "give at most")
    assert "block pool" not in err
    _refused(capsys, ["generate", "--model", str(no_weights), "--prompt", "x", "--num-gpu-blocks-override",
                      "16777216", "--block-size", "4096"],
             "num_gpu_blocks_override=16777216", "of RAM available on this machine", "lower it to at most")


@pytest.mark.parametrize(("name", "content", "words"), [
    ("random.bin", bytes([0xD1, 0x9F, 0xFF, 0xFE, 0x80, 0x00, 0x41]) * 20, ["not UTF-8 text", "0xff"]),
    ("invalid.txt", b"a prompt\n\xc3\x28 broken\n", ["not UTF-8 text", "offset 9"]),
    ("nul.txt", b"first prompt\nsecond\x00prompt\n", [":2: a NUL byte", "not a text file"]),
    ("nul.jsonl", b'{"prompt": "a"}\n\x00\x00\x00\x00', [":2: a NUL byte"]),
])
def test_a_binary_prompts_file_is_named_in_the_error(
        no_weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str, content: bytes, words: list[str]) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    err = _refused(capsys, ["generate", "--model", str(no_weights), "--prompts-file", str(path)], *words)
    assert str(path) in err


def test_the_prompts_file_and_the_prompt_count_are_bounded(tmp_path: Path) -> None:
    # Small bounds passed in, so no large file is written.
    def read(*argv: str) -> list[object]:
        args = argparse.Namespace(prompt=[], prompts_file=None)
        for flag, value in zip(argv[::2], argv[1::2], strict=True):
            if flag == "--prompt":
                args.prompt.append(value)
            else:
                args.prompts_file = value
        return command.read_prompts(args, max_file_bytes=64, max_prompts=3)

    big = tmp_path / "big.txt"
    big.write_text("a prompt\n" * 8)  # 72 bytes
    with pytest.raises(ValueError, match=f"{big}: larger than 64 bytes"):
        read("--prompts-file", str(big))
    big.write_text("a prompt\n" * 7)  # 63 bytes: within
    with pytest.raises(ValueError, match=f"{big}:4: more than 3 prompts"):
        read("--prompts-file", str(big))
    many = tmp_path / "many.txt"
    many.write_text("a\nb\n\nc\n")
    assert read("--prompts-file", str(many)) == ["a", "b", "c"]
    with pytest.raises(ValueError, match=f"{many}:4: more than 3 prompts"):
        read("--prompt", "x", "--prompts-file", str(many))
    with pytest.raises(ValueError, match="--prompt: 4 prompts, more than the 3"):
        read(*["--prompt", "x"] * 4)
    assert command.MAX_PROMPTS_FILE_BYTES == 2**28 and command.MAX_NUM_PROMPTS == 10**6
