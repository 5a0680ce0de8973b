"""The profiled step-time backend: prices from the fit, the same float
stepping and fast-forwarding, steps past the profiled range counted, a
profile of another deployment refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import load_profile
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig

DATA = Path(__file__).parent / "data"


def backend(runtime: RuntimeConfig | None = None, parallel: ParallelConfig | None = None,
            ) -> ProfiledStepTimeModel:
    model = load_model_spec(DATA / "tiny_llama")
    return ProfiledStepTimeModel(model, get_hardware("h100-sxm"), parallel or ParallelConfig(),
                                 runtime or RuntimeConfig(async_scheduling=False),
                                 load_profile(DATA / "tiny_llama_profile.json"))


def test_prices_from_the_fitted_terms() -> None:
    sm = backend()
    t = sm.fit.terms
    shape = BatchShape(num_tokens=300, num_reqs=3, num_sampled=2, num_decodes=2, decode_kv_tokens=400,
                       prefill_tokens=298, prefill_kv_tokens=298, prefill_attn_pairs=298 * 299 // 2)
    gpu = (t["step_s"] + 300 * t["per_token_s"] + 3 * t["per_request_s"] + 2 * t["per_sampled_s"]
           + 298 * 299 // 2 * t["per_prefill_pair_s"] + 400 * t["per_decode_kv_s"])
    assert sm.gpu_time(shape) == pytest.approx(gpu, rel=1e-12)
    # Without async scheduling the host time follows the forward pass.
    assert sm.step_time(shape) == pytest.approx(gpu + 0.5e-3 + 3 * 4e-6, rel=1e-12)
    assert sm.backend == "profiled" and not sm.extrapolated


def test_decode_stretch_is_the_same_float_as_each_step() -> None:
    sm = backend()
    stretch = sm.decode_step_times(8, 8 * 500, 8, 20)
    one_by_one = [sm.step_time(BatchShape.decode(8, 8 * 500 + 8 * j)) for j in range(20)]
    assert stretch == one_by_one
    assert sm.gpu_time(BatchShape.decode(8, 4000)) + 0.5e-3 + 8 * 4e-6 == pytest.approx(stretch[0])


def test_steps_past_the_profiled_range_are_counted_once_per_aggregate() -> None:
    sm = backend()
    r = sm.fit.range
    sm.step_time(BatchShape(r.num_tokens + 100, 1, 1, 0, 0, r.num_tokens + 100, r.num_tokens + 100,
                            (r.num_tokens + 100) ** 2 // 2))
    sm.step_time(BatchShape(r.num_tokens + 50, 1, 1, 0, 0, r.num_tokens + 50, r.num_tokens + 50,
                            (r.num_tokens + 50) ** 2 // 2))
    tokens = [e for e in sm.extrapolated if "profiled tokens" in e]
    assert tokens == [f"2 step(s) past the profiled tokens (profiled up to {r.num_tokens:,}, largest "
                      f"asked {r.num_tokens + 100:,}): extrapolated"]
    # A decode stretch whose last 5 steps leave the profiled KV.
    kv0 = r.decode_kv_tokens - 10 * 4 + 1
    sm.decode_step_times(4, kv0, 4, 15)
    kv = [e for e in sm.extrapolated if "decode KV" in e]
    assert kv and kv[0].startswith("5 step(s) past the profiled decode KV tokens")
    assert "past the profiled range" in sm.describe_backend()


def test_within_range_nothing_is_counted() -> None:
    sm = backend()
    sm.decode_step_times(4, 400, 4, 10)
    sm.step_time(BatchShape(64, 1, 1, 0, 0, 64, 64, 64 * 65 // 2))
    assert not sm.extrapolated
    assert "leave-one-out median |error|" in sm.describe_backend()
    assert "tiny_llama_profile.json" in sm.describe_backend()


def test_profile_of_another_deployment_is_refused() -> None:
    with pytest.raises(UserInputError, match="tensor-parallel-size 1, simulated with 2"):
        backend(parallel=ParallelConfig(tensor_parallel_size=2))
    with pytest.raises(UserInputError, match="kv-cache-dtype auto, simulated with fp8"):
        backend(RuntimeConfig(kv_cache_dtype="fp8"))
    with pytest.raises(UserInputError, match="--dtype bfloat16, simulated in fp16"):
        backend(RuntimeConfig(dtype="fp16"))
    other = load_model_spec(DATA / "tiny_llama")
    from dataclasses import replace
    with pytest.raises(UserInputError, match="num_layers=8 but tiny_llama has 4"):
        ProfiledStepTimeModel(replace(other, num_layers=4), get_hardware("h100-sxm"), ParallelConfig(),
                              RuntimeConfig(), load_profile(DATA / "tiny_llama_profile.json"))


def test_a_float32_profile_prices_a_16_bit_simulation(tmp_path: Path) -> None:
    # A CPU without fast 16-bit GEMMs serves in float32; the profile still prices.
    import json
    data = json.loads((DATA / "tiny_llama_profile.json").read_text())
    data["serve_flags"][1] = "float32"
    p = tmp_path / "f32.json"
    p.write_text(json.dumps(data))
    sm = ProfiledStepTimeModel(load_model_spec(DATA / "tiny_llama"), get_hardware("h100-sxm"),
                               ParallelConfig(), RuntimeConfig(dtype="bf16"), load_profile(p))
    assert sm.gpu_time(BatchShape.decode(4, 400)) > 0


def test_the_smallest_decodes_pay_their_own_cost_in_a_stretch_too() -> None:
    """A profile whose 1-2-token steps cost more than the line (the
    committed tiny-Llama profile, fitted with the small-step terms): a
    stretch of 2-request decodes is priced with that cost, the same float
    as each step alone, and an 8-request one without it."""
    sm = backend()
    t = sm.fit.terms
    assert t["step_2_tokens_s"] > 0
    for n in (1, 2, 3, 4, 8):
        shape = BatchShape.decode(n, n * 300)
        line = (t["step_s"] + n * (t["per_token_s"] + t["per_request_s"] + t["per_sampled_s"])
                + n * 300 * t["per_decode_kv_s"])
        own = {1: t["step_1_token_s"], 2: t["step_2_tokens_s"], 3: t["step_3_tokens_s"],
               4: t["step_4_tokens_s"]}.get(n, 0.0)
        assert sm.gpu_time(shape) == pytest.approx(line + own, rel=1e-12), n
        stretch = sm.decode_step_times(n, n * 300, n, 6)
        assert stretch == [sm.step_time(BatchShape.decode(n, n * 300 + n * j)) for j in range(6)], n
