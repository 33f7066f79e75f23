"""The fused direct call of bitsandbytes' 4-bit CPU kernel gives the modules' own bits.

kernels/packed_4bit.py stacks projections that share an input (q|k|v, gate|up) into one call;
the lean verifier (engine/lean_model.py) relies on every output element being exactly what the
separate Linear4bit modules return, for any number of rows.
"""

from __future__ import annotations

import pytest
import torch
from bitsandbytes.functional import has_avx512bf16

from spectui.kernels.packed_4bit import pack_group, packed_for_cpu

pytestmark = pytest.mark.skipif(not has_avx512bf16(), reason="bitsandbytes' fused CPU kernel needs AVX512-BF16")


def linear_4bit(in_features: int, out_features: int, quant_type: str, seed: int):
    import bitsandbytes as bnb

    torch.manual_seed(seed)
    dense = torch.nn.Linear(in_features, out_features, bias=False)
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, quant_type=quant_type, compute_dtype=torch.float32)
    layer.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False, quant_type=quant_type)
    return layer.to("cpu").eval()


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_one_call_for_stacked_projections_gives_each_modules_bits(quant_type, rows):
    group = [linear_4bit(192, n, quant_type, seed) for seed, n in enumerate([192, 64, 64])]  # q, k, v shaped
    fused = pack_group(group)
    assert fused is not None and fused.N == 320
    x = torch.randn(rows, 192)
    with torch.inference_mode():
        expected = torch.cat([layer(x) for layer in group], dim=-1)  # [rows, 320]
        got = fused(x)
        one_by_one = torch.cat([fused(x[i:i + 1]) for i in range(rows)])
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)
    assert torch.equal(one_by_one, got)  # a row's bits do not depend on the rows beside it


def test_layers_the_kernel_cannot_take_are_refused():
    import bitsandbytes as bnb

    training = linear_4bit(128, 64, "nf4", 0).train()  # bitsandbytes repacks only for inference
    assert not packed_for_cpu(training) and pack_group([training]) is None
    assert pack_group([torch.nn.Linear(128, 64, bias=False)]) is None  # not 4-bit
    with_bias = bnb.nn.Linear4bit(128, 64, bias=True, quant_type="nf4").to("cpu").eval()
    assert pack_group([with_bias]) is None
    mixed = [linear_4bit(128, 64, "nf4", 0), linear_4bit(128, 64, "fp4", 1)]  # one call has one code
    assert pack_group(mixed) is None
