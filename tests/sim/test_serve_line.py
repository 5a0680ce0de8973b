"""A pasted vllm serve / vllm bench serve line: vLLM's flag list, its
classification, and the kvsched flags a line becomes."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from kvsched.cli import build_parser
from kvsched.commands.simulate import spec_of
from kvsched.errors import UserInputError
from kvsched.perf import get_hardware
from kvsched.sim import serve_line as sl
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.flags import simulate_flag_parser, with_pasted
from kvsched.sim.serve_line import (
    BENCH,
    NO_EFFECT,
    REFUSED,
    SERVE,
    USED,
    KvschedFlags,
    VllmFlag,
    VllmFlags,
    classify,
    human_int,
    missing_from_release,
    paste,
    read_flags,
    split_line,
    vllm_flags,
)
from kvsched.tune.space import SERVE_FIELDS
from kvsched.vllm_versions import FLAGS_SINCE, VLLM_VERSIONS, release_has

KVSCHED = KvschedFlags(simulate_flag_parser())
RELEASES = ("0.33", "0.34")  # written out: a new release needs its list and these tests


def test_one_list_per_modelled_release() -> None:
    assert VLLM_VERSIONS == RELEASES
    assert sorted(p.name for p in sl.DATA.glob("vllm_flags_*.json")) == [
        "vllm_flags_0.33.json", "vllm_flags_0.34.json", "vllm_flags_no_effect.json"]


@pytest.mark.parametrize("release, version, counts", [
    ("0.33", "0.33.0", (320, 101)), ("0.34", "0.34.0", (327, 101))])
def test_flag_lists_are_the_releases_and_complete_enough(release: str, version: str,
                                                         counts: tuple[int, int]) -> None:
    flags = vllm_flags(release)
    assert (flags.release, flags.version) == (release, version)
    assert flags.serve_default_model == "Qwen/Qwen3-0.6B"
    serve = {o for f in flags.serve for o in f.options}
    bench = {o for f in flags.bench for o in f.options}
    # Written from vLLM's parsers: their counts then, and flags every user passes.
    assert (len(flags.serve), len(flags.bench)) == counts
    assert {"--host", "--port", "--api-key", "--served-model-name", "-tp", "--max-num-seqs"} <= serve
    assert {"--dataset-name", "--request-rate", "--backend", "--endpoint"} <= bench
    # 0.33's parser pairs --enable-x with --disable-x and still takes the
    # older --no-enable-x (hidden from its help).
    switch = {f.dest: f for f in flags.serve}["enable_prefix_caching"]
    assert (switch.options, switch.arity, switch.negations) == (
        ("--enable-prefix-caching",), "none", ("--disable-prefix-caching", "--no-enable-prefix-caching"))
    reverse = {f.dest: f for f in flags.serve}["disable_sliding_window"]
    assert (reverse.options, reverse.negations) == (
        ("--disable-sliding-window",), ("--enable-sliding-window", "--no-disable-sliding-window"))
    assert {f.dest: f for f in flags.serve}["api_key"].arity == "many"


def test_0_34_adds_seven_serve_flags_and_drops_none() -> None:
    old, new = ({f.dest for f in vllm_flags(r).serve} for r in RELEASES)
    assert sorted(new - old) == [
        "cache_aware_admission_threshold", "cache_aware_admission_window", "checkpoint_prepare_on_startup",
        "enable_extensible_kv_cache", "headless_client_handshake_address", "max_num_inflight_kv_loads",
        "shuffle_safetensors_files"]
    assert old - new == set()
    assert vllm_flags("0.33").bench == vllm_flags("0.34").bench


def test_releases_of_engine_arguments_agree_with_the_lists() -> None:
    """FLAGS_SINCE (which release added an engine argument) and the
    releases' own flag lists tell the same story."""
    for name in FLAGS_SINCE:
        assert [name in sl.serve_dests(r) for r in RELEASES] == [release_has(r, name) for r in RELEASES]


def test_tuner_dimensions_are_flags_of_every_release_or_none() -> None:
    """A candidate's line is written before its release is known (it keeps
    the flags every release takes): none of its dimensions may be a flag of
    some releases only, which its line would leave out."""
    some = [n for n in SERVE_FIELDS if any(n in sl.serve_dests(r) for r in RELEASES)]
    assert [n for n in some if n not in sl.serve_dests_of_every_release()] == []
    assert "max_num_seqs" in some


@pytest.mark.parametrize("release", RELEASES)
def test_flag_file_is_as_its_script_writes_it(release: str) -> None:
    """The committed list is the script's output, not edited by hand (the
    script needs vLLM, so only its writer is run here)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "real_vllm" / "list_vllm_flags.py"
    spec = importlib.util.spec_from_file_location("list_vllm_flags", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = sl.flags_file(release).read_text(encoding="utf-8")
    assert script.to_text(json.loads(text)) == text
    assert script.out_path(f"{release}.0") == sl.flags_file(release)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("command", [SERVE, BENCH])
def test_every_vllm_flag_is_classified(command: str, release: str) -> None:
    """No vLLM flag is "unknown": each is used, of no effect, or refused."""
    unclassified = [f.dest for f in vllm_flags(release).of(command)
                    if classify(command, f.dest, KVSCHED) is None]
    assert unclassified == []


def test_new_flags_are_classified_with_their_reasons() -> None:
    def kind(dest: str) -> str:
        verdict = classify(SERVE, dest, KVSCHED)
        assert verdict is not None
        return verdict.kind

    # 0.34's flags kvsched models, forwarded to its own flags of the same name.
    assert [kind(d) for d in ("enable_extensible_kv_cache", "max_num_inflight_kv_loads",
                              "cache_aware_admission_window", "cache_aware_admission_threshold")] == \
        [USED] * 4
    # Start-up, life-cycle, rendering and debugging settings.
    assert [kind(d) for d in ("headless_client_handshake_address", "checkpoint_prepare_on_startup",
                              "shuffle_safetensors_files", "reasoning_effort_map", "sleep_mode_backend",
                              "watchdog_config")] == [NO_EFFECT] * 6
    # 0.33's persistent decode kernel: another step time.
    monokernel = classify(SERVE, "monokernel", KVSCHED)
    assert monokernel is not None and monokernel.kind == REFUSED
    assert monokernel.reason == "a kernel or compilation choice: kvsched prices vLLM's default kernels and " \
                                "CUDA graphs"


@pytest.mark.parametrize("command", [SERVE, BENCH])
def test_tables_name_only_vllm_flags_once(command: str) -> None:
    dests = {f.dest for r in RELEASES for f in vllm_flags(r).of(command)}
    no_effect = sl.SERVE_NO_EFFECT if command == SERVE else sl.BENCH_NO_EFFECT
    refused = sl.SERVE_REFUSED if command == SERVE else sl.BENCH_REFUSED
    listed = [d for group in no_effect.values() for d in group] + list(refused)
    assert sorted(set(listed) - dests) == []  # no stale name
    assert len(listed) == len(set(listed))  # each flag has one rule


@pytest.mark.parametrize("command", [SERVE, BENCH])
def test_no_rule_shadowed_by_a_kvsched_flag(command: str) -> None:
    """A flag kvsched's parser takes is forwarded before any table is read:
    a refusal or no-effect reason left for it (say, once the feature lands)
    is dead and misleads the reader."""
    no_effect = sl.SERVE_NO_EFFECT if command == SERVE else sl.BENCH_NO_EFFECT
    refused = sl.SERVE_REFUSED if command == SERVE else sl.BENCH_REFUSED
    listed = [d for group in no_effect.values() for d in group] + list(refused)
    shadowed = [d for d in listed if d not in sl.NOT_FORWARDED[command] and KVSCHED.action(d) is not None]
    assert shadowed == []


def test_classification_of_familiar_flags() -> None:
    def kind(command: str, dest: str) -> str:
        verdict = classify(command, dest, KVSCHED)
        assert verdict is not None
        return verdict.kind

    assert [kind(SERVE, d) for d in ("host", "port", "api_key", "served_model_name", "enable_log_requests",
                                     "uvicorn_log_level", "tokenizer_mode", "chat_template", "seed")] == \
        [NO_EFFECT] * 9
    assert [kind(SERVE, d) for d in ("tensor_parallel_size", "max_num_seqs", "gpu_memory_utilization",
                                     "enable_prefix_caching", "speculative_config", "model_tag",
                                     "pipeline_parallel_size")] == [USED] * 7
    assert [kind(SERVE, d) for d in ("enforce_eager", "attention_backend", "cpu_offload_gb")] == \
        [REFUSED] * 3
    assert [kind(BENCH, d) for d in ("backend", "endpoint", "host", "temperature", "save_result")] == \
        [NO_EFFECT] * 5
    assert [kind(BENCH, d) for d in ("num_prompts", "request_rate", "max_concurrency", "seed", "goodput",
                                     "input_len", "ignore_eos")] == [USED] * 7
    assert [kind(BENCH, d) for d in ("use_beam_search", "ramp_up_strategy", "spec_bench_output_len")] == \
        [REFUSED] * 3
    assert [kind(BENCH, d) for d in ("sharegpt_output_len", "prefix_repetition_num_prefixes",
                                     "percentile_metrics", "disable_shuffle")] == [USED] * 4


def test_lora_flags_are_used() -> None:
    def kind(command: str, dest: str) -> str:
        verdict = classify(command, dest, KVSCHED)
        assert verdict is not None
        return verdict.kind

    assert [kind(SERVE, d) for d in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras",
                                     "fully_sharded_loras", "lora_modules", "lora_target_modules")] == \
        [USED] * 7
    assert [kind(BENCH, d) for d in ("lora_modules", "lora_assignment")] == [USED] * 2
    assert kind(SERVE, "lora_dtype") == NO_EFFECT


def test_split_line_continuations_env_quotes_and_shell_words() -> None:
    line = ("CUDA_VISIBLE_DEVICES=0,1 vllm serve m \\\n  --a 1 \\  \n  --b $'{\"x\":\n 1}' "
            "> out.log 2>&1 &")
    assert split_line(SERVE, line) == (["m", "--a", "1", "--b", '{"x":\n 1}'],
                                       ["CUDA_VISIBLE_DEVICES=0,1"], [">", "out.log", "2>&1", "&"])
    # A guide's <placeholder> is a word, not a redirection.
    assert split_line(BENCH, "vllm bench serve --dataset-path <your path>/x.json")[0] == \
        ["--dataset-path", "<your", "path>/x.json"]
    assert split_line(SERVE, "python3 -m vllm.entrypoints.openai.api_server --model m")[0] == ["--model", "m"]
    assert split_line(BENCH, "python benchmarks/benchmark_serving.py --num-prompts 5")[0] == \
        ["--num-prompts", "5"]
    assert split_line(SERVE, "m -tp 2")[0] == ["m", "-tp", "2"]  # flags alone


@pytest.mark.parametrize("command, line, message", [
    (SERVE, "vllm bench serve --num-prompts 5", "that is a vllm bench serve line; give it to --bench"),
    (BENCH, "vllm serve m", "that is a vllm serve line; give it to --serve"),
    (SERVE, "vllm chat --url x", "expected a line that runs `vllm serve`"),
    (SERVE, "vllm serve $MODEL -tp 2", "$MODEL is a shell variable"),
    (SERVE, "vllm serve m --chat-template 'x", "cannot split the line"),
])
def test_split_line_errors(command: str, line: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message.replace("$", r"\$")):
        split_line(command, line)


def test_read_flags_as_vllms_parser_reads_them() -> None:
    given, positional = read_flags(SERVE, [
        "m", "--max_num_seqs=8", "-tp", "2", "--no-enable-prefix-caching", "--api-key", "a", "b",
        "-O3", "--speculative-config.method", "ngram", "--hf-token", "--disable-chunked-prefill",
        "--enable-sliding-window"], "0.33")
    assert positional == ["m"]
    assert [(g.flag.dest, g.value) for g in given] == [
        ("max_num_seqs", "8"), ("tensor_parallel_size", "2"), ("enable_prefix_caching", False),
        ("api_key", ["a", "b"]), ("optimization_level", "3"), ("speculative_config", {"method": "ngram"}),
        ("hf_token", True), ("enable_chunked_prefill", False), ("disable_sliding_window", False)]
    given, _ = read_flags(BENCH, ["--request-rate", "-1", "--metadata", "a=1", "b=2", "--ignore-eos"], "0.34")
    assert [(g.flag.dest, g.value) for g in given] == [
        ("request_rate", "-1"), ("metadata", ["a=1", "b=2"]), ("ignore_eos", True)]


@pytest.mark.parametrize("command, words, message", [
    (SERVE, ["m", "--max-num-seq", "8"], "--max-num-seq is not a vllm serve flag of vLLM 0.33; did you "
                                         "mean --max-num-seqs"),
    (SERVE, ["m", "--kvsched-only"], "--kvsched-only is not a vllm serve flag"),
    (SERVE, ["m", "--max-model-len"], "--max-model-len needs a value"),
    (SERVE, ["m", "--port", "--host", "x"], "--port needs a value"),
    (SERVE, ["m", "--enforce-eager=1"], "--enforce-eager is a switch and takes no value"),
    (BENCH, ["--num-promts", "5"], "did you mean --num-prompts"),
])
def test_read_flags_errors(command: str, words: list[str], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        read_flags(command, words, "0.33")


def test_paste_maps_used_flags_and_lists_the_rest() -> None:
    pasted = paste(
        "CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen3-8B --host 0.0.0.0 --port 8001 --api-key k "
        "--served-model-name qwen -tp 2 --max-num-seqs 64 --max-model-len 32k --no-enable-prefix-caching "
        "--pipeline-parallel-size 1 --disable-log-requests --seed 7",
        "vllm bench serve --backend openai --model qwen --dataset-name random --input-len 512 "
        "--output-len 64 --num-prompts 10 --request-rate 4 --ignore-eos --seed 3 --goodput ttft:500 tpot:50",
        KVSCHED, "0.33")
    assert list(pasted.argv) == [
        "--model", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2", "--max-num-seqs", "64",
        "--max-model-len", "32000", "--no-enable-prefix-caching", "--pipeline-parallel-size", "1",
        "--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "64",
        "--num-prompts", "10", "--request-rate", "4", "--seed", "3", "--goodput", "ttft:500", "tpot:50"]
    # 0.33 takes --disable-log-requests again (--enable-log-requests' off switch).
    serve_ignored = ("CUDA_VISIBLE_DEVICES=0,1 (environment)", "--host", "--port", "--api-key",
                     "--served-model-name", "--disable-log-requests", "--seed")
    assert pasted.ignored == (*(("--serve", w) for w in serve_ignored), ("--bench", "--backend"))
    assert pasted.report() == [
        "ignored (does not affect the prediction): --serve CUDA_VISIBLE_DEVICES=0,1 (environment), --host, "
        "--port, --api-key, --served-model-name, --disable-log-requests, --seed; --bench --backend"]
    assert pasted.notes == ()  # --ignore-eos given
    assert dict(pasted.origins)["max_num_seqs"] == "--serve's --max-num-seqs 64"


def test_paste_spec_flags_merge_into_speculative_config() -> None:
    pasted = paste("vllm serve m --spec-method ngram --spec-tokens 3 "
                   "--speculative-config.prompt_lookup_max 4", None, KVSCHED, "0.33")
    i = pasted.argv.index("--speculative-config")
    assert json.loads(pasted.argv[i + 1]) == {"prompt_lookup_max": 4, "method": "ngram",
                                              "num_speculative_tokens": 3}
    with pytest.raises(UserInputError, match="both set method"):
        paste("""vllm serve m --spec-method ngram --speculative-config '{"method": "eagle"}'""", None,
              KVSCHED, "0.33")


def test_paste_without_a_model_serves_vllms_default() -> None:
    pasted = paste("vllm serve --port 8000", None, KVSCHED, "0.34")
    assert pasted.argv[:2] == ("--model", "Qwen/Qwen3-0.6B")
    assert pasted.notes == ("--serve: no model given: vLLM 0.34 serves Qwen/Qwen3-0.6B",)


@pytest.mark.parametrize("serve, bench, message", [
    ("vllm serve m --enforce-eager", None, "--serve: --enforce-eager: no CUDA graphs"),
    ("vllm serve m --attention-backend FLASHINFER", None, "a kernel or compilation choice"),
    ("vllm serve m --compilation-config.mode 3", None, "a kernel or compilation choice"),
    ("vllm serve m --model n", None, "the model m and --model n differ"),
    ("vllm serve m n", None, "takes one model"),
    ("vllm serve m", "vllm bench serve --model other", "--model other is not the model --serve serves"),
    (None, "vllm bench serve --ramp-up-strategy linear", "a ramped request rate"),
    (None, "vllm bench serve --dataset-name spec_bench --spec-bench-output-len 5",
     "spec_bench dataset kvsched"),
    (None, "vllm bench serve --num-prompts 5 extra", "takes no positional words"),
])
def test_paste_refuses_what_kvsched_cannot_model(serve: str | None, bench: str | None, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        paste(serve, bench, KVSCHED, "0.33")


def test_paste_ignores_another_datasets_flags_and_vllms_defaults() -> None:
    pasted = paste("vllm serve m --enforce-eager --no-enforce-eager -O2 --runner generate",
                   "vllm bench serve --sharegpt-output-len 5 --model m --ignore-eos", KVSCHED, "0.33")
    assert pasted.ignored == (("--serve", "--no-enforce-eager"), ("--serve", "--optimization-level"),
                              ("--serve", "--runner"),
                              ("--bench", "--sharegpt-output-len (applies to --dataset-name sharegpt only)"))
    assert list(pasted.argv) == ["--model", "m"]


def test_paste_names_what_became_of_a_retired_flag() -> None:
    pasted = paste("vllm serve m --swap-space 4 --use-v2-block-manager", None, KVSCHED, "0.34")
    # --swap-space took a value: 4 is its, not a second model.
    assert pasted.ignored == (
        ("--serve", "--swap-space (V0's CPU swap space (V1 preempts by recomputing); vLLM 0.34 no longer "
                    "takes it)"),
        ("--serve", "--use-v2-block-manager (V0's block manager switch; vLLM 0.34 no longer takes it)"))
    assert list(pasted.argv) == ["--model", "m"]
    # A retired flag no release takes (else the release's own reading is the one).
    assert [f for f in sl.RETIRED for r in RELEASES if f in vllm_flags(r).lookup(SERVE)] == []


# vLLM 0.34's flags kvsched models, on one line (the cache-aware admission
# knobs, the in-flight KV load cap and the extensible KV cache).
LINE_0_34 = ("vllm serve Qwen/Qwen3-8B --enable-extensible-kv-cache --max-num-inflight-kv-loads 4 "
             "--cache-aware-admission-window 16 --cache-aware-admission-threshold 0.7")


def test_a_0_34_line_sets_its_new_flags() -> None:
    pasted = paste(LINE_0_34, None, KVSCHED, "0.34")
    assert list(pasted.argv) == [
        "--model", "Qwen/Qwen3-8B", "--enable-extensible-kv-cache", "--max-num-inflight-kv-loads", "4",
        "--cache-aware-admission-window", "16", "--cache-aware-admission-threshold", "0.7"]
    assert pasted.ignored == ()
    args, _ = with_pasted(build_parser().parse_args(
        ["simulate", "--vllm-version", "0.34", "--hardware", "h100-sxm", "--serve", LINE_0_34]))
    engine = spec_of(args).deployment.group.engine
    assert (engine.vllm_version, engine.model, engine.enable_extensible_kv_cache,
            engine.max_num_inflight_kv_loads, engine.cache_aware_admission_window,
            engine.cache_aware_admission_threshold) == ("0.34", "Qwen/Qwen3-8B", True, 4, 16, 0.7)
    # 0.34's off switch for the cache, in its own spelling.
    off = paste("vllm serve m --disable-extensible-kv-cache", None, KVSCHED, "0.34")
    assert list(off.argv) == ["--model", "m", "--no-enable-extensible-kv-cache"]


def test_the_same_line_is_refused_for_0_33() -> None:
    with pytest.raises(UserInputError) as e:
        paste(LINE_0_34, None, KVSCHED, "0.33")
    assert str(e.value) == ("--serve: vLLM 0.33 has no --enable-extensible-kv-cache (vLLM 0.34 added it); "
                            "drop it, or simulate vLLM 0.34 with --vllm-version 0.34")
    # simulate --vllm-version 0.33 reads the pasted line as 0.33's.
    with pytest.raises(UserInputError,
                       match=r"vLLM 0\.33 has no --max-num-inflight-kv-loads \(vLLM 0\.34 added it\)"):
        with_pasted(build_parser().parse_args(
            ["simulate", "--hardware", "h100-sxm", "--vllm-version", "0.33",
             "--serve", "vllm serve m --max-num-inflight-kv-loads 2"]))
    # simulate's default release is 0.34, which has the flag.
    args, _ = with_pasted(build_parser().parse_args(
        ["simulate", "--hardware", "h100-sxm", "--serve", "vllm serve m --max-num-inflight-kv-loads 2"]))
    assert args.max_num_inflight_kv_loads == 2
    with pytest.raises(UserInputError, match=r"vllm_version='0.32' \(--vllm-version\): not a vLLM release"):
        paste("vllm serve m", None, KVSCHED, "0.32")


def _release(release: str, *serve: str) -> VllmFlags:
    return VllmFlags(release, release + ".0", "m", tuple(VllmFlag((o,), (), o[2:].replace("-", "_"), "one")
                                                          for o in serve), ())


def test_a_flag_a_later_release_dropped_is_refused_naming_the_one_that_had_it() -> None:
    """0.34 dropped no flag of 0.33's: the rule, on hand-made lists of
    three releases (--old only in the first, --new from the second on)."""
    releases = {"1.0": _release("1.0", "--old", "--kept"), "1.1": _release("1.1", "--kept", "--new"),
                "1.2": _release("1.2", "--kept", "--new")}
    assert missing_from_release(SERVE, "--old", "1.2", releases) == (
        "vLLM 1.2 has no --old (vLLM 1.0 had it); drop it, or simulate vLLM 1.0 with --vllm-version 1.0")
    assert missing_from_release(SERVE, "--new", "1.0", releases) == (
        "vLLM 1.0 has no --new (vLLM 1.1 added it); drop it, or simulate vLLM 1.1 with --vllm-version 1.1")
    assert missing_from_release(SERVE, "--kept", "1.0", releases) is None  # every release has it
    assert missing_from_release(SERVE, "--never", "1.0", releases) is None
    assert missing_from_release(BENCH, "--old", "1.2", releases) is None  # another command's flag


@pytest.mark.parametrize("release, given, words", [
    ("0.33", {}, []),
    ("0.34", {}, ["--block-size", "16"]),
    ("0.34", {"enable_extensible_kv_cache": False},
     ["--block-size", "16", "--no-enable-extensible-kv-cache"]),
])
def test_written_serve_lines_take_only_the_releases_flags(release: str, given: dict[str, object],
                                                          words: list[str]) -> None:
    """A serve line written for a release (the tuner's) spells only flags
    that release's vllm serve takes."""
    opts = EngineOptions(vllm_version=release, block_size=16, **given)  # type: ignore[arg-type]
    written = sl.release_serve_words(opts, get_hardware("h100-sxm"))
    assert written == words
    known = vllm_flags(release).lookup(SERVE)
    assert all(w in known for w in written if w.startswith("--"))


def test_paste_bench_without_ignore_eos_notes_it() -> None:
    pasted = paste(None, "vllm bench serve --model m --num-prompts 3", KVSCHED, "0.33")
    assert list(pasted.argv) == ["--model", "m", "--num-prompts", "3"]
    assert len(pasted.notes) == 1 and "no --ignore-eos" in pasted.notes[0]


def test_human_int_as_vllm_reads_it() -> None:
    assert [human_int(t) for t in ("4096", "1k", "25.6k", "32K", "1M", "2g")] == \
        ["4096", "1000", "25600", "32768", "1048576", "2000000000"]
    with pytest.raises(UserInputError, match="whole number"):
        human_int("1.5K")


# Values of every kind a flag may be given (none for a switch).
ANY_VALUES = ("", "1", "0", "auto", "{}", "x y")


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("command", [SERVE, BENCH])
def test_any_single_flag_with_any_value_is_taken_or_one_clear_error(command: str, release: str) -> None:
    """Every vLLM flag, with values of each kind: kvsched flags its own
    parser takes, or a UserInputError; never another exception."""
    parser = simulate_flag_parser()
    outcomes = {"taken": 0, "refused": 0}
    for flag in vllm_flags(release).of(command):
        for value in ANY_VALUES:
            if flag.arity == "none" and value:
                continue
            words = f"{flag.options[0]} {value}".strip()
            line = f"vllm serve m {words}" if command == SERVE else f"vllm bench serve {words}"
            try:
                pasted = (paste(line, None, KVSCHED, release) if command == SERVE
                          else paste(None, line, KVSCHED, release))
                parser.parse_args(list(pasted.argv))
            except (UserInputError, argparse.ArgumentError):
                outcomes["refused"] += 1
            else:
                outcomes["taken"] += 1
    assert outcomes["taken"] > 100 and outcomes["refused"] > 100
