"""A multimodal run end to end: ``kvsched simulate --dataset-name random-mm``
on a vision-language model, its TTFT holding the vision encoder's time."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvsched.cli import main
from kvsched.sim.run import prepare, sim_config
from kvsched.sim.simulator import Simulator
from kvsched.sim.spec import RunSpec, WorkloadSpec

# Qwen3-VL-8B's config.json is bundled with aiconfigurator-core ([measured]).
needs_bundled = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                   reason="aiconfigurator-core's bundled configs are needed")
MODEL = "Qwen/Qwen3-VL-8B-Instruct"


@needs_bundled
def test_ttft_holds_the_encoder_time_of_the_request_image() -> None:
    spec = RunSpec(workload=WorkloadSpec(dataset_name="random-mm", num_prompts=1, random_input_len=100,
                                         random_output_len=4, seed=0,
                                         random_mm_bucket_config="{(720, 1280, 1): 1.0}")
                   ).with_engine(model=MODEL, hardware="h100")
    prepared = prepare(spec)
    (request,) = prepared.accepted.requests
    (image,) = request.mm_items
    # 720x1280 -> 704x1280 in 16-px patches (44 x 80), merged 2 x 2.
    assert (image.num_patches, image.length) == (44 * 80, 22 * 40)
    config = sim_config(prepared.deployment, spec)
    assert config.encoder is not None
    with_encoder = Simulator(config, prepared.accepted).run().metrics()
    without = Simulator(dataclasses.replace(config, encoder=None), prepared.accepted).run().metrics()
    # One request, prefilled in one step: the encoder's seconds on its image are the difference.
    added = with_encoder["mean_ttft_ms"] - without["mean_ttft_ms"]
    assert added == pytest.approx(config.encoder.seconds([image.num_patches]) * 1e3, rel=1e-9)
    assert added > 1.0  # a 0.6B-parameter ViT over 3520 patches: milliseconds on an H100


@needs_bundled
def test_simulate_cli_runs_random_mm(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--model", MODEL, "--hardware", "h100", "--dataset-name", "random-mm",
                 "--num-prompts", "6", "--random-input-len", "64", "--random-output-len", "8",
                 "--random-mm-base-items-per-request", "2", "--random-mm-num-mm-items-range-ratio", "0.5",
                 "--random-mm-limit-mm-per-prompt", '{"image": 3}',
                 "--random-mm-bucket-config", "{(256, 256, 1): 0.5, (512, 512, 1): 0.5}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Successful requests:                             6" in out
    assert "Mean TTFT (ms):" in out


def test_random_mm_on_a_text_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--dataset-name", "random-mm",
                 "--num-prompts", "2"])
    assert code == 2
    assert "takes none" in capsys.readouterr().err


def test_random_mm_flags_belong_to_random_mm(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--num-prompts", "2", "--random-mm-base-items-per-request", "2"])
    assert code == 2
    assert "only for --dataset-name random-mm" in capsys.readouterr().err


@needs_bundled
def test_simulate_cli_runs_custom_image(capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = Path(__file__).resolve().parents[1] / "data" / "benchdatasets" / "custom_image" / "prompts.jsonl"
    code = main(["simulate", "--model", MODEL, "--hardware", "h100", "--dataset-name", "custom_image",
                 "--dataset-path", str(jsonl), "--num-prompts", "8", "--custom-output-len", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Successful requests:                             8" in out


def test_custom_image_needs_its_file(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--model", MODEL, "--dataset-name", "custom_image", "--num-prompts", "2"])
    assert code == 2
    assert "needs --dataset-path" in capsys.readouterr().err


@needs_bundled
def test_a_text_workload_needs_no_vision_tower() -> None:
    # Text requests never reach the encoder: its pricer (and the vision_config it reads) is
    # built for the image datasets only.
    spec = RunSpec(workload=WorkloadSpec(num_prompts=2, random_input_len=32, random_output_len=4)
                   ).with_engine(model=MODEL, hardware="h100")
    prepared = prepare(spec)
    assert sim_config(prepared.deployment, spec).encoder is None


class _CountingPricer:
    """The run's encoder pricer, noting the patches of every step it prices."""

    def __init__(self, pricer: Any) -> None:
        self.pricer = pricer
        self.calls: list[list[int]] = []

    def max_tokens_per_item(self) -> dict[str, int]:
        return dict(self.pricer.max_tokens_per_item())

    def seconds(self, patches: Sequence[int]) -> float:
        self.calls.append(list(patches))
        return float(self.pricer.seconds(patches))


@needs_bundled
@pytest.mark.parametrize("shared", [False, True])
def test_an_image_sent_twice_is_encoded_once(shared: bool) -> None:
    """vLLM's encoder cache is keyed by the image's hash: a second request
    with the same image, while the first's output is cached, encodes
    nothing; a different image is encoded again."""
    spec = RunSpec(workload=WorkloadSpec(dataset_name="random-mm", num_prompts=2, random_input_len=100,
                                         random_output_len=4, seed=0, request_rate=1.0,
                                         random_mm_bucket_config="{(720, 1280, 1): 1.0}")
                   ).with_engine(model=MODEL, hardware="h100")
    prepared = prepare(spec)
    first, second = prepared.accepted.requests
    (image,) = first.mm_items
    if shared:
        moved = dataclasses.replace(image, offset=second.mm_items[0].offset)
        second = dataclasses.replace(second, mm_items=(moved,))
    workload = dataclasses.replace(prepared.accepted, requests=(first, second))
    config = sim_config(prepared.deployment, spec)
    counting = _CountingPricer(config.encoder)
    Simulator(dataclasses.replace(config, encoder=counting), workload).run()
    encoded = [p for call in counting.calls for p in call]
    # 720x1280 -> 44 x 80 patches per image.
    assert encoded == ([44 * 80] if shared else [44 * 80, 44 * 80])
