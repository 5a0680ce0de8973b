"""kvsched.perf.pipeline: vLLM's layer partition, the stage price and the pipeline's clock."""

from __future__ import annotations

import dataclasses

import pytest

from kvsched.errors import UserInputError
from kvsched.perf import get_hardware, get_model
from kvsched.perf.memory import plan_memory
from kvsched.perf.pipeline import PipelineClock, PipelineStages, stage_layers, stage_link_bw
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig


@pytest.mark.parametrize("layers, pp, expected", [
    (80, 2, [40, 40]),
    (80, 4, [20, 20, 20, 20]),
    (80, 3, [27, 27, 26]),      # the remainder to the stages before the last
    (10, 4, [2, 3, 3, 2]),      # 2 left over: the two middle stages
    (61, 8, [7, 7, 8, 8, 8, 8, 8, 7]),  # (vLLM's get_pp_indices gives the same)
])
def test_layers_split_as_vllm_splits_them(layers: int, pp: int, expected: list[int]) -> None:
    assert stage_layers(layers, pp) == expected


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(UserInputError, match="pipeline_parallel_size=5"):
        stage_layers(4, 5)


STAGES = PipelineStages(pipeline_parallel_size=2, tensor_parallel_size=2, hidden_size=1000,
                        link_bw=1e9, link_latency_s=1e-5)


def test_the_hand_off_is_each_tp_ranks_slice_over_the_link() -> None:
    # 100 tokens x 1000 x 2 bytes / TP 2 = 100 kB at 1 GB/s: 100 us, plus 10 us.
    assert STAGES.transfer_time(100) == pytest.approx(1.1e-4)


def test_stage_times_split_the_step_and_add_the_hand_off() -> None:
    assert STAGES.stage_times(0.01, 100) == pytest.approx([0.005 + 1.1e-4, 0.005])
    assert STAGES.batch_latency(0.01, 100) == pytest.approx(0.01011)
    assert STAGES.stage_interval(0.01, 100) == pytest.approx(0.00511)


def test_the_clock_overlaps_batches_on_different_stages() -> None:
    clock = PipelineClock(STAGES)
    s = 0.005 + 1.1e-4  # stage 0 of a 10 ms, 100-token step
    # Two batches ready at once: the second enters stage 0 when the first leaves it.
    assert clock.run(0.0, 0.01, 100) == pytest.approx((0.0, s + 0.005))
    assert clock.run(0.0, 0.01, 100) == pytest.approx((s, 2 * s + 0.005))
    # A short batch behind them waits for stage 1 to free.
    start, end = clock.run(0.0, 0.002, 100)
    assert start == pytest.approx(2 * s)
    assert end == pytest.approx(2 * s + 0.005 + 0.001)


def test_stages_in_one_node_use_nvlink_and_beyond_it_the_network() -> None:
    h100 = get_hardware("h100-sxm")
    assert stage_link_bw(h100, 2, 4) == pytest.approx(h100.scaleup_bw_for_group(2) * h100.comm_bw_frac)
    with_network = dataclasses.replace(h100, scaleout_bw=50e9)
    assert stage_link_bw(with_network, 4, 4) == pytest.approx(50e9 * h100.comm_bw_frac)
    if h100.scaleout_bw is None:
        with pytest.raises(UserInputError, match="pipeline_parallel_size=4"):
            stage_link_bw(h100, 4, 4)


LLAMA70 = get_model("Llama-3.1-70B")
H100 = get_hardware("h100-sxm")


def _plan(tp: int, pp: int):  # type: ignore[no-untyped-def]
    return plan_memory(LLAMA70, H100, ParallelConfig(tp, pipeline_parallel_size=pp), RuntimeConfig(),
                       16, 0.9, 8192, 256)


def test_a_stage_holds_its_layers_weights_and_kv() -> None:
    one, two = _plan(2, 1), _plan(2, 2)
    embedding = LLAMA70.vocab_size * LLAMA70.hidden_size * 2 / 2  # bf16, over TP 2
    # Llama's LM head is as large as its embedding: either stage holds half
    # the layers and one of them.
    layers = one.weight_bytes - 2 * embedding
    assert two.weight_bytes == pytest.approx(layers / 2 + embedding)
    # A block holds the KV of the stage's 40 layers: half of all 80.
    assert two.bytes_per_block == pytest.approx(one.bytes_per_block / 2)
    assert two.pipeline_parallel_size == 2 and "PP stage 1 of 2" in two.describe()


def test_pp_and_tp_on_as_many_gpus_hold_about_as_much_kv() -> None:
    # TP4 and TP2 x PP2: each GPU a quarter of the weights, a quarter of a
    # token's KV; the PP stage adds one 16-bit embedding shard (2 GiB here).
    tp4, pp2 = _plan(4, 1), _plan(2, 2)
    assert pp2.num_gpu_blocks < tp4.num_gpu_blocks
    assert pp2.num_gpu_blocks == pytest.approx(tp4.num_gpu_blocks, rel=0.02)


def test_a_model_too_large_for_its_stages_is_refused() -> None:
    with pytest.raises(UserInputError, match="pipeline_parallel_size=2"):
        plan_memory(get_model("Llama-3.1-405B"), H100, ParallelConfig(1, pipeline_parallel_size=2),
                    RuntimeConfig(), 16, 0.9, 8192, 256)
