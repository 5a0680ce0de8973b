"""make_tiny_model: its tokenizer, determinism, the CLI command and bad arguments."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from kvsched.model.config import load_model_config  # noqa: E402
from kvsched.model.tiny import (  # noqa: E402
    add_make_tiny_model_parser,
    build_tokenizer,
    make_tiny_model,
)

TEXTS = ["Hello world, the quick scheduler runs.", "café naïve 東京 🙂 Zürich £5",
         "def f(x):\n    return x + 1\n", "  leading spaces and\ttabs  "]


def _digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_tokenizer_round_trip_and_special_tokens(tiny: Callable[..., Path]) -> None:
    path = tiny(arch="llama")
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    config = load_model_config(path)
    assert tok.get_vocab_size(with_added_tokens=True) == config.vocab_size == 512
    assert max(tok.get_vocab(with_added_tokens=True).values()) == 511  # ids 0..511, no gaps
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<pad>")] == [0, 1, 2, 3]
    assert config.bos_token_id == 1 and config.eos_token_ids == (2,)
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert ids[0] == 1 and 1 not in ids[1:]  # <s> prepended, like Llama
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special_tokens=False) == "<s>" + text
    assert len(tok.encode(TEXTS[0]).ids) < 0.6 * len(TEXTS[0])  # learned merges at work
    assert tok.encode("hello</s>", add_special_tokens=False).ids[-1] == 2
    # Every id decodes (the model may emit any of them), bytes included.
    assert all(isinstance(tok.decode([i]), str) for i in range(512))


def test_tokenizer_loads_in_transformers(tiny: Callable[..., Path]) -> None:
    transformers = pytest.importorskip("transformers")
    path = tiny(arch="llama")
    ours = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    for hf in (transformers.AutoTokenizer.from_pretrained(path),
               transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))):
        for text in TEXTS:
            assert hf(text).input_ids == ours.encode(text).ids
    hf = transformers.AutoTokenizer.from_pretrained(path)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.unk_token_id) == (1, 2, 3, 0)
    assert hf.decode(hf(TEXTS[1]).input_ids, skip_special_tokens=True) == TEXTS[1]


def test_vocab_is_padded_to_vocab_size() -> None:
    tok = build_tokenizer(4000)  # more than the corpus's merges: filled with <extra_N>
    vocab = tok.get_vocab(with_added_tokens=True)
    assert tok.get_vocab_size(with_added_tokens=True) == len(vocab) == 4000
    assert sorted(vocab.values()) == list(range(4000))
    assert any(name.startswith("<extra_") for name in vocab)
    assert tok.decode(tok.encode(TEXTS[0]).ids) == TEXTS[0]
    small = build_tokenizer(300)
    assert small.get_vocab_size(with_added_tokens=True) == 300


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    a = make_tiny_model(tmp_path / "a", arch="qwen3", seed=7, num_layers=1)
    b = make_tiny_model(tmp_path / "b", arch="qwen3", seed=7, num_layers=1)
    c = make_tiny_model(tmp_path / "c", arch="qwen3", seed=8, num_layers=1)
    assert _digest(a) == _digest(b)
    assert _digest(a)["model.safetensors"] != _digest(c)["model.safetensors"]
    assert _digest(a)["tokenizer.json"] == _digest(c)["tokenizer.json"]


def test_cli_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvsched")
    add_make_tiny_model_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "cli"
    args = parser.parse_args(["make-tiny-model", str(out), "--arch", "qwen3", "--hidden-size", "32",
                              "--num-layers", "1", "--vocab-size", "300", "--seed", "3",
                              "--shards", "2", "--head-dim", "16", "--tie-word-embeddings"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    config = load_model_config(out)
    assert (config.architecture, config.hidden_size, config.num_layers, config.vocab_size,
            config.head_dim, config.tie_word_embeddings) == ("Qwen3ForCausalLM", 32, 1, 300, 16, True)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # Bad values reach make_tiny_model and fail there as ValueError (the CLI prints it).
    bad = parser.parse_args(["make-tiny-model", str(tmp_path / "bad"), "--num-heads", "3",
                             "--num-kv-heads", "1"])
    with pytest.raises(ValueError, match=r"hidden_size=64: must be a multiple of num_heads=3"):
        bad.func(bad)
    assert not (tmp_path / "bad").exists()  # nothing written
    bad = parser.parse_args(["make-tiny-model", str(tmp_path / "bad"), "--arch", "gpt2"])
    with pytest.raises(ValueError, match=r"arch='gpt2': unsupported; use one of llama, mistral"):
        bad.func(bad)
    with pytest.raises(SystemExit):  # argparse itself rejects a non-integer
        parser.parse_args(["make-tiny-model", str(out), "--hidden-size", "big"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"arch": "gpt2"}, r"arch='gpt2': unsupported; use one of llama, mistral, qwen2, qwen3"),
    ({"num_layers": 0}, r"num_layers=0: must be a positive integer"),
    ({"num_kv_heads": 3}, r"num_kv_heads=3: must divide num_heads=4"),
    ({"head_dim": 15}, r"head_dim=15: must be a positive even integer"),
    ({"vocab_size": 100}, r"vocab_size=100: must be an integer >= 260"),
    ({"initializer_range": 2.0}, r"initializer_range=2\.0: must be in \(0, 1\]"),
    ({"dtype": "int8"}, r"dtype='int8': unsupported; use one of float32, bfloat16, float16"),
    ({"shards": 0}, r"shards=0: must be a positive integer"),
    ({"shards": 1000}, r"shards=1000: more shards than tensors \(21\); use fewer"),
    ({"sliding_window": 8}, r"sliding_window=8: only the gemma3 and mistral tiny models have a window"),
    ({"arch": "gemma3", "sliding_window": 0}, r"sliding_window=0: must be a positive integer"),
    ({"arch": "gemma3", "sliding_window_pattern": 0},
     r"sliding_window_pattern=0: must be a positive integer"),
])
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_tiny_model(tmp_path / "x", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_out_dir_must_not_be_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"out_dir='.*file': exists and is not a directory"):
        make_tiny_model(tmp_path / "file")
