"""The fused direct call of bitsandbytes' 4-bit CPU kernel gives the modules' own bits.

kernels/packed_4bit.py stacks projections that share an input (q|k|v, gate|up) into one call;
the lean verifier (engine/lean_model.py) relies on every output element being exactly what the
separate Linear4bit modules return, for any number of rows.
"""

from __future__ import annotations

import pytest
import torch
from bitsandbytes.functional import has_avx512bf16

from spectui.kernels import native
from spectui.kernels.packed_4bit import own_kernel, pack_group, packed_for_cpu

pytestmark = pytest.mark.skipif(not has_avx512bf16(), reason="bitsandbytes' fused CPU kernel needs AVX512-BF16")


def linear_4bit(in_features: int, out_features: int, quant_type: str, seed: int, blocksize: int = 64):
    import bitsandbytes as bnb

    torch.manual_seed(seed)
    dense = torch.nn.Linear(in_features, out_features, bias=False)
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=False, quant_type=quant_type, compute_dtype=torch.float32)
    layer.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False, quant_type=quant_type,
                                     blocksize=blocksize)
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


@pytest.mark.skipif(native.compiler() is None or native.disabled(), reason="kernels/packed_4bit.c needs a C compiler")
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape, blocksize", [((576, 960), 64), ((1536, 576), 64), ((192, 32), 64), ((512, 96), 128)])
def test_spectuis_kernel_gives_bitsandbytes_bits_for_any_rows_and_threads(quant_type, shape, blocksize):
    """kernels/packed_4bit.c against bitsandbytes' own function on the same packed weights, bit for bit
    (shape: (in, out); blocks of `blocksize` weights along in)."""
    layer = linear_4bit(*shape, quant_type, seed=shape[1] + blocksize, blocksize=blocksize)
    fused = pack_group([layer])
    assert fused is not None and own_kernel() is not None and fused.own is not None
    x = torch.randn(21, shape[0]) * 3
    x[0, :7] = 0.0  # exact zeros, and values far from 1: the lanes' rounding is what must agree
    x[1] *= 1e-3
    threads = torch.get_num_threads()
    with torch.inference_mode():
        for rows in (1, 2, 4, 5, 8, 9, 21):
            expected = fused(x[:rows], own=False)
            try:
                torch.set_num_threads(1)
                alone = fused(x[:rows])
            finally:
                torch.set_num_threads(threads)
            assert torch.equal(fused(x[:rows]), expected), f"{rows} rows"
            assert torch.equal(alone, expected), f"{rows} rows, one thread"
            residual = torch.randn(rows, shape[1]) * 5  # into=: the residual add done in the kernel, torch's bits
            summed = fused(x[:rows], into=residual.clone())
            assert torch.equal(summed, residual + expected), f"{rows} rows added into a residual"
        assert torch.equal(fused(x[:0]), torch.empty(0, shape[1]))
        assert not torch.equal(expected, torch.zeros_like(expected))
