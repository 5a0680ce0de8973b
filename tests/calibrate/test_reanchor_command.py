"""``kvsched calibrate --reanchor`` on a real vLLM run kept in the repository
(issue 21's matrix: the tiny Llama's profile, and the warm-up of the
``llama-s16-b256`` server an hour later, with its iteration log), and its
refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvsched.cli import main
from kvsched.perf.step_profile import load_profile

ROOT = Path(__file__).parents[2]
MATRIX = ROOT / "benchmarks" / "real_vllm" / "results" / "matrix-quiet"
RUN = MATRIX / "llama-s16-b256"
PROFILE = MATRIX / "profiles" / "llama.json"


def engine() -> list[str]:
    kv_tokens = json.loads((RUN / "server.json").read_text())["kv_cache_tokens"]
    return ["--model", str(ROOT / "tests" / "perf" / "data" / "tiny_llama"),
            "--served-model-name", "/work/tiny/llama-tiny-f32", "--max-model-len", "2048",
            "--max-num-seqs", "16", "--max-num-batched-tokens", "256", "--block-size", "128",
            "--num-gpu-blocks-override", str(kv_tokens // 128), "--no-async-scheduling",
            "--step-time-profile", str(PROFILE)]


def test_reanchors_the_profile_on_a_logged_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "anchored.json"
    code = main(["calibrate", *engine(), "--reanchor", "--bench", str(RUN / "warmup.json"),
                 "--server-log", str(RUN / "warmup.server.log.gz"), "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    # The warm-up's 12 requests made 45 steps; every one explained.
    assert "45 logged steps explained" in text
    m = re.search(r"with prompt tokens x([\d.]+), pure decode x([\d.]+)", text)
    assert m is not None, text
    prefill, decode = float(m.group(1)), float(m.group(2))
    # An hour after profiling the shared host ran slower, decode more so.
    assert 1.0 < prefill < decode
    before, after = load_profile(PROFILE), load_profile(out)
    assert len(after.steps) == len(before.steps) == 880
    for old, new in zip(before.steps, after.steps):
        factor = prefill if old.prefill_tokens else decode
        assert new.elapsed_ms == pytest.approx(factor * old.elapsed_ms, rel=2e-3)
    assert "re-anchored on" in after.notes[-1]


@pytest.mark.parametrize(("extra", "needle"), [
    (["--bench", str(RUN / "warmup.json")], "needs --server-log"),
    (["--bench", str(RUN / "warmup.json"), "--bench", str(RUN / "closed8.json"),
      "--server-log", str(RUN / "warmup.server.log.gz")], "exactly one --bench"),
    (["--bench", str(RUN / "warmup.json"), "--server-log", str(RUN / "server.json")],
     "no engine iteration lines"),
    (["--bench", str(RUN / "warmup.json"), "--server-log", "/nonexistent/server.log"], "cannot read it"),
    (["--bench", str(RUN / "warmup.json"), "--server-log", str(RUN / "closed8.server.log.gz")],
     "cannot re-anchor a profile"),
])
def test_bad_reanchor_inputs_are_one_clear_error(extra: list[str], needle: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", *engine(), "--reanchor", *extra, "-o", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code != 0 and needle in err, err
    assert not (tmp_path / "x.json").exists()


def test_server_log_without_reanchor_and_a_profile_missing_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", *engine(), "--bench", str(RUN / "warmup.json"), "--server-log",
                 str(RUN / "warmup.server.log.gz"), "-o", str(tmp_path / "x.json")])
    assert code != 0 and "with --reanchor only" in capsys.readouterr().err
    code = main(["calibrate", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--reanchor",
                 "--bench", str(RUN / "warmup.json"), "--server-log", str(RUN / "warmup.server.log.gz"),
                 "-o", str(tmp_path / "x.json")])
    assert code != 0 and "give --step-time-profile" in capsys.readouterr().err
