"""The CPU linear layers' two layouts give F.linear's products at every row count."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from kvsched.model.cpu_gemm import MAX_STREAMING_ROWS, CpuGemm, use_cpu_gemm  # noqa: E402
from kvsched.model.llama import Linear  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_products_match_f_linear(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    got = CpuGemm(weight)(x, b)
    assert got.shape == (rows, 96)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_the_layer_keeps_its_weight_as_a_view_of_the_transposed_copy() -> None:
    layer = Linear(40, 96, bias=False, dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(96 * 40, dtype=torch.float32).reshape(96, 40) / 1000)
    before = layer.weight.detach().clone()
    layer.use_cpu_gemm()
    assert layer.gemm is not None
    assert torch.equal(layer.weight, before)
    assert layer.weight.data_ptr() == layer.gemm.transposed.data_ptr()
    x = torch.ones(MAX_STREAMING_ROWS + 1, 40)
    torch.testing.assert_close(layer(x), F.linear(x, before), rtol=1e-5, atol=1e-5)


def test_only_float32_on_a_cpu() -> None:
    assert use_cpu_gemm(torch.float32, "cpu") == torch.backends.mkldnn.is_available()
    assert not use_cpu_gemm(torch.bfloat16, "cpu")
    assert not use_cpu_gemm(torch.float32, "cuda")
    with pytest.raises(ValueError, match="float32 CPU weight"):
        CpuGemm(torch.zeros(4, 4, dtype=torch.bfloat16))
