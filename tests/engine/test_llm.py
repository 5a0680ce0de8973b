"""kvsched.LLM beyond greedy parity: seeded sampling, stop strings, logprobs,
abort, bad input and the ``generate`` / ``make-tiny-model`` commands."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvsched.cli import main  # noqa: E402
from kvsched.engine.llm import LLM, default_sampling_params  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tiny: Callable[..., Path]) -> Path:
    return tiny(arch="llama")


@pytest.fixture(scope="module")
def llm(ckpt: Path) -> LLM:
    return LLM(str(ckpt), max_num_seqs=16, max_num_batched_tokens=256, kv_cache_memory="16MiB")


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 512) for _ in range(n)]


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


SAMPLED = dict(temperature=0.9, top_p=0.95, top_k=50, min_p=0.01, repetition_penalty=1.1,
               max_tokens=24, ignore_eos=True)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(ckpt: Path, llm: LLM) -> None:
    target = {"prompt_token_ids": _ids(0, 30)}
    params = SamplingParams(seed=1234, **SAMPLED)  # type: ignore[arg-type]
    alone = llm.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids
    # Same request amid others (unseeded and differently seeded), at another position.
    others = [{"prompt_token_ids": _ids(i, 10 + 7 * i)} for i in range(1, 8)]
    mixed_params = [SamplingParams(**SAMPLED) for _ in others]  # type: ignore[arg-type]
    mixed_params[2] = SamplingParams(seed=99, **SAMPLED)  # type: ignore[arg-type]
    outs = llm.generate([*others[:3], target, *others[3:]], [*mixed_params[:3], params, *mixed_params[3:]],
                        use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone
    # A fresh engine (another process's worth of state) gives the same tokens.
    again = LLM(str(ckpt), max_num_seqs=2, max_num_batched_tokens=64, kv_cache_memory="16MiB", seed=7)
    assert again.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids == alone
    # And the seed matters: another one gives another sequence.
    other = llm.generate([target], SamplingParams(seed=4321, **SAMPLED),  # type: ignore[arg-type]
                         use_tqdm=False)[0].outputs[0].token_ids
    assert other != alone


def test_stop_strings_truncate_the_text(llm: LLM) -> None:
    prompt = "The quick brown fox jumps over"
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0]
    assert len(full.text) > 12
    stop = full.text[6:10]
    cut = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                              stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full.text[:full.text.index(stop)]
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < 30
    kept = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop],
                                               include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert kept.text == full.text[:full.text.index(stop) + len(stop)]


def test_logprobs_are_those_of_the_model(llm: LLM) -> None:
    out = llm.generate({"prompt_token_ids": _ids(5, 12)},
                       SamplingParams(max_tokens=5, temperature=0.0, logprobs=2, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 5
    total = 0.0
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and entry[token].rank == 1  # greedy takes the top token
        assert all(lp.decoded_token == llm.tokenizer.decode([t], skip_special_tokens=False)
                   for t, lp in entry.items())
        assert len(entry) == 2 or len(entry) == 3
        assert all(lp.logprob <= 0.0 for lp in entry.values())
        total += entry[token].logprob
    assert out.cumulative_logprob is not None and math.isclose(out.cumulative_logprob, total)


def test_max_tokens_min_tokens_and_eos(llm: LLM) -> None:
    out = llm.generate({"prompt_token_ids": _ids(6, 9)},
                       SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 7 and out.outputs[0].finish_reason == "length"
    eos = llm.engine.model_config.eos_token_ids[0]
    # With the EOS token stopping and min_tokens forcing 5 tokens first.
    out = llm.generate({"prompt_token_ids": _ids(6, 9)},
                       SamplingParams(max_tokens=7, min_tokens=5, temperature=0.0, stop_token_ids=[
                           *range(4, 512)]), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "stop" and out.stop_reason == out.token_ids[-1]
    assert eos not in out.token_ids[:5]


def test_eos_and_extra_eos_ids_as_vllm(tmp_path: Path, ckpt: Path, llm: LLM) -> None:
    prompt = {"prompt_token_ids": _ids(12, 10)}

    def run(engine: LLM, max_tokens: int = 8, **kwargs: object) -> Any:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, skip_special_tokens=False,
                                **kwargs)  # type: ignore[arg-type]
        return engine.generate(prompt, params, use_tqdm=False)[0].outputs[0]

    full = run(llm, ignore_eos=True).token_ids
    texts = [run(llm, n, ignore_eos=True).text if n else "" for n in range(9)]  # of the first n tokens
    # A token the greedy run first samples at position k >= 1, adding text, becomes an EOS id.
    k = next(i for i in range(1, 8) if full[i] not in full[:i] and texts[i + 1] != texts[i])
    x = full[k]
    text_before, text_through = texts[k], texts[k + 1]
    model = _copy_checkpoint(ckpt, tmp_path / "m")

    # x as the model's EOS: the request stops there, x stays in token_ids, its
    # text is left out unless include_stop_str_in_output (vLLM's stop_terminated).
    _edit_json(model / "config.json", eos_token_id=x)
    _edit_json(model / "generation_config.json", eos_token_id=x)
    eos_llm = LLM(str(model), kv_cache_memory="8MiB")
    out = run(eos_llm)
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (full[:k + 1], "stop", None)
    assert out.text == text_before
    assert run(eos_llm, include_stop_str_in_output=True).text == text_through

    # x as an extra EOS id of generation_config.json: a stop id, except for
    # requests that ignore EOS; min_tokens masks it either way.
    _edit_json(model / "config.json", eos_token_id=2)
    _edit_json(model / "generation_config.json", eos_token_id=[2, x])
    extra_llm = LLM(str(model), kv_cache_memory="8MiB")
    out = run(extra_llm)
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (full[:k + 1], "stop", x)
    out = run(extra_llm, ignore_eos=True)
    assert (out.token_ids, out.finish_reason) == (full, "length")
    out = run(extra_llm, ignore_eos=True, min_tokens=k + 1)
    assert out.token_ids[:k] == full[:k] and out.token_ids[k] != x


def test_abort_and_step_api(llm: LLM) -> None:
    rid = llm.add_request({"prompt_token_ids": _ids(7, 20)},
                          SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    produced = []
    for _ in range(3):
        produced += llm.step()
    assert any(o.request_id == rid for o in produced)
    (aborted,) = llm.abort(rid)
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert 0 < len(aborted.outputs[0].token_ids) < 50
    assert not llm.has_unfinished_requests()
    llm.step()  # frees the aborted request's runner state
    llm.engine.runner.check_invariants()


def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path, ckpt: Path, llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        LLM(str(tmp_path))
    with pytest.raises(ValueError, match="unknown engine argument"):
        LLM(str(ckpt), max_num_seq=4)
    bad_arch = _copy_checkpoint(ckpt, tmp_path / "bad")
    _edit_json(bad_arch / "config.json", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(str(bad_arch))
    too_long = {"prompt_token_ids": [5] * 5000}
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": [5, 6]}, too_long], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [5, 100000]}, use_tqdm=False)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    assert not llm.has_unfinished_requests()  # the good prompt was not queued either


def test_generate_and_make_tiny_model_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    assert main(["make-tiny-model", str(model), "--arch", "qwen3"]) == 0
    out = tmp_path / "out.json"
    assert main(["generate", "--model", str(model), "--prompt", "Hello there", "--prompt", "Once upon",
                 "--max-tokens", "6", "--temperature", "0", "--ignore-eos", "--no-progress",
                 "--kv-cache-memory", "8MiB", "--output-json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["prompt"] for r in rows] == ["Hello there", "Once upon"]
    assert all(len(r["token_ids"]) == 6 and r["finish_reason"] == "length" for r in rows)
    assert "Output:" in capsys.readouterr().out
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["generate", "--model", str(model), "--prompt", "x", "--kv-cache-memory", "lots"]) == 2
    assert "kv_cache_memory" in capsys.readouterr().err


def test_generate_reads_prompt_files(tmp_path: Path, ckpt: Path) -> None:
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"prompt": "hello"}\n{"prompt_token_ids": [5, 6, 7]}\n')
    out = tmp_path / "o.json"
    for path, expected in ((text, ["first prompt", "second prompt"]), (lines, ["hello", None])):
        assert main(["generate", "--model", str(ckpt), "--prompts-file", str(path), "--max-tokens", "3",
                     "--no-progress", "--kv-cache-memory", "8MiB", "--output-json", str(out)]) == 0
        assert [r["prompt"] for r in json.loads(out.read_text())] == expected
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    assert main(["generate", "--model", str(ckpt), "--prompts-file", str(bad)]) == 2


def test_generation_config_gives_the_default_sampling_params(tmp_path: Path, ckpt: Path) -> None:
    model = _copy_checkpoint(ckpt, tmp_path / "m")
    gen = json.loads((model / "generation_config.json").read_text())
    gen.update(temperature=0.0, top_p=0.5)
    (model / "generation_config.json").write_text(json.dumps(gen))
    llm = LLM(str(model), kv_cache_memory="8MiB")
    assert llm.default_sampling_params.temperature == 0.0 and llm.default_sampling_params.top_p == 0.5
    prompt = {"prompt_token_ids": _ids(11, 10)}
    default = llm.generate(prompt, use_tqdm=False)[0].outputs[0].token_ids
    greedy = llm.generate(prompt, SamplingParams(temperature=0.0), use_tqdm=False)[0].outputs[0].token_ids
    assert default == greedy and len(default) == 16  # vLLM's max_tokens default
    gen["top_p"] = 7
    (model / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(ValueError, match=r"generation_config\.json.*top_p"):
        LLM(str(model))
    with pytest.raises(ValueError, match="n=2"):
        SamplingParams(n=2)


def test_generation_config_defaults_take_vllms_keys_and_skip_nulls(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "eos_token_id": 2, "temperature": None, "top_k": None, "top_p": 0.9, "max_new_tokens": 5,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "skip_special_tokens": False,
        "do_sample": True}))
    assert default_sampling_params(tmp_path) == SamplingParams(
        top_p=0.9, max_tokens=5, presence_penalty=0.5, frequency_penalty=-0.5, skip_special_tokens=False)
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"generation_config\.json: top level must be a JSON object"):
        default_sampling_params(tmp_path)


def test_a_front_end_arrival_time_is_the_requests(llm: LLM) -> None:
    # A server stamps the request when its handler takes it; the metrics and
    # the FCFS order count from there, not from when the engine thread adds it.
    rid = llm.add_request({"prompt_token_ids": _ids(5, 8)},
                          SamplingParams(max_tokens=2, temperature=0.0), arrival_time=1000.0)
    assert llm.engine.scheduler.requests[rid].arrival_time == 1000.0
    outs = []
    while llm.has_unfinished_requests():
        outs += llm.step()
    final = [o for o in outs if o.request_id == rid and o.finished]
    assert final[0].metrics.arrival_time == 1000.0
    assert final[0].metrics.first_token_time > 1000.0
