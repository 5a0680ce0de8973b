"""kvsched's sampling of vllm bench serve's datasets against the outputs of
vLLM's own dataset code (tests/conformance/make_bench_dataset_goldens.py ran
vLLM 0.32's get_samples on the files in tests/data/benchdatasets with the
420-token tokenizer there; sonnet, which vLLM 0.32 dropped, an older
release's SonnetDataset): every request's prompt_len, expected_output_len
and the server's token count of its prompt, in order, and the state
vLLM's arrival draws start from."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvsched.sim.workload.bench.burstgpt import sample_burstgpt
from kvsched.sim.workload.bench.custom import sample_custom
from kvsched.sim.workload.bench.prefix_repetition import sample_prefix_repetition
from kvsched.sim.workload.bench.random_text import random_lengths
from kvsched.sim.workload.bench.sharegpt import sample_sharegpt
from kvsched.sim.workload.bench.sonnet import sample_sonnet
from kvsched.sim.workload.random_dataset import _split_range_ratio
from kvsched.sim.workload.tokenizer import HFTokenizer, read_tokenizer

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "benchdatasets"
GOLDENS = sorted((ROOT / "tests" / "conformance" / "bench_datasets").glob("*.json"))


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return read_tokenizer(DATA / "tokenizer" / "tokenizer.json")


def _flags(text: str) -> dict[str, Any]:
    words = shlex.split(text)
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        key = words[i][2:].replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[key] = words[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _state_fingerprint(state: Any) -> dict[str, object]:
    _, keys, pos, has_gauss, _ = state.get_state()
    digest = hashlib.sha256(np.asarray(keys, dtype=np.uint32).tobytes()).hexdigest()
    return {"pos": int(pos), "keys_sha256": digest, "has_gauss": int(has_gauss)}


def _kvsched(case: dict[str, Any], tok: HFTokenizer) -> tuple[list[tuple[int, int, int]], Any]:
    f = _flags(case["flags"])
    name, n, seed = f["dataset_name"], int(f["num_prompts"]), int(f.get("seed", 0))
    path = DATA / f["dataset_path"] if "dataset_path" in f else None
    state = np.random.RandomState(seed)
    shuffle_off = bool(f.get("disable_shuffle", False))
    if name == "random":
        ratio_text = f.get("random_range_ratio", "0")
        ratio = _split_range_ratio(json.loads(ratio_text) if ratio_text.startswith("{")
                                   else float(ratio_text))
        r = random_lengths(tok, n, int(f["random_input_len"]), int(f["random_output_len"]), ratio,
                           int(f.get("random_prefix_len", 0)), seed)
        return [(p, o, p + r.special_tokens) for p, o in zip(r.prompt_lens, r.output_lens)], state
    if name == "sharegpt":
        out = f.get("sharegpt_output_len")
        samples = sample_sharegpt(path, tok, n, seed, None if out is None else int(out), shuffle_off)
    elif name == "burstgpt":
        samples = sample_burstgpt(path, tok, n, seed)
    elif name == "sonnet":
        samples = sample_sonnet(path, tok, n, seed, int(f["sonnet_input_len"]), int(f["sonnet_output_len"]),
                                int(f["sonnet_prefix_len"]))
    elif name == "custom":
        samples = sample_custom(path, tok, n, seed, int(f.get("custom_output_len", 256)),
                                bool(f.get("skip_chat_template", False)), shuffle_off)
    else:
        samples, state = sample_prefix_repetition(
            tok, n, seed, int(f["prefix_repetition_prefix_len"]), int(f["prefix_repetition_suffix_len"]),
            int(f["prefix_repetition_num_prefixes"]), int(f["prefix_repetition_output_len"]), shuffle_off)
    return [(s.prompt_len, s.expected_output_len, s.server_prompt_len) for s in samples], state


def test_goldens_cover_every_dataset() -> None:
    names = {_flags(json.loads(p.read_text())["flags"])["dataset_name"] for p in GOLDENS}
    assert names == {"random", "sharegpt", "burstgpt", "sonnet", "prefix_repetition", "custom"}


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_same_lengths_as_vllm(golden: Path, tokenizer: HFTokenizer) -> None:
    case = json.loads(golden.read_text())
    expected = [(r["prompt_len"], r["expected_output_len"], r["server_prompt_len"]) for r in case["requests"]]
    got, state = _kvsched(case, tokenizer)
    assert got == expected
    # vllm bench serve draws its arrival gaps from numpy's global state next.
    assert _state_fingerprint(state) == case["numpy_state_after"]
