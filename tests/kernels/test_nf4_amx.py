"""The 4-bit kernel on AMX tiles (kernels/nf4_amx.c), where the CPU has AMX-BF16.

What verification relies on: every output element has the same bits whatever the number of rows beside it
and the threads; the kernel computes its header's arithmetic (bf16 inputs and code values, fp32 block sums,
the block scale applied in fp32), so its error is bf16's, bounded; stacked modules read views of one set of
tiles with the bits they have alone. Where the CPU lacks AMX these tests skip (nf4_cpu.c serves there).
"""

from __future__ import annotations

import pytest
import torch

from spectui.kernels import native, nf4_cpu

from test_nf4_cpu import linear_4bit, three_ways  # tests/kernels is on the path (no package)


def amx_here() -> bool:
    if not native.cpu_supported() or native.compiler() is None:
        return False
    fn, _ = nf4_cpu.amx_kernel()
    return fn is not None


pytestmark = pytest.mark.skipif(not amx_here(), reason="needs a CPU with AMX-BF16 (and Linux lending its tiles)")


def installed(layer, tmp_path) -> nf4_cpu.KernelInfo:
    info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    assert info.installed == 1 and info.amx and "AMX" in info.describe(), info
    return info


def header_arithmetic(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the header's result in float64: bf16 inputs and code values, exact block sums, fp64 scaling;
    the sum of the terms' magnitudes, which bounds fp32's rounding of the block sums)."""
    state = layer.weight.quant_state
    N, K, bs = int(state.shape[0]), int(state.shape[1]), int(state.blocksize)
    packed = layer.weight.data.reshape(-1)
    q = torch.stack([packed >> 4, packed & 15], 1).reshape(N, K).long()  # high nibble first
    code = state.code.float().bfloat16().double()[q]  # [N, K]
    xb = x.float().bfloat16().double()  # [M, K]
    scale = state.absmax.double().reshape(N, K // bs)
    sums = torch.einsum("mbk,nbk->mnb", xb.reshape(-1, K // bs, bs), code.reshape(N, K // bs, bs))  # [M, N, blocks]
    magnitude = torch.einsum("mbk,nbk->mnb", xb.abs().reshape(-1, K // bs, bs), code.abs().reshape(N, K // bs, bs))
    return (sums * scale).sum(-1), (magnitude * scale).sum(-1)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape", [(576, 192), (128, 64), (1536, 576)])  # (in, out)
def test_the_kernel_computes_its_headers_arithmetic(tmp_path, quant_type, shape):
    layer = linear_4bit(*shape, quant_type, seed=shape[0])
    x = torch.randn(9, shape[0])
    installed(layer, tmp_path)
    with torch.inference_mode():
        got = layer(x)
    reference, magnitude = header_arithmetic(layer, x)
    assert got.dtype == torch.float32 and got.shape == (9, shape[1])
    assert ((got.double() - reference).abs() <= 1e-5 * magnitude + 1e-30).all()
    assert not torch.equal(got, torch.zeros_like(got))


def test_its_error_is_bf16s(tmp_path):
    """Against bitsandbytes' own fp32 weights and exact sums: about 2^-8 of the terms' magnitudes at most."""
    from bitsandbytes.functional import dequantize_4bit

    layer = linear_4bit(576, 192, "nf4", seed=3)
    w = dequantize_4bit(layer.weight.data, layer.weight.quant_state).double()  # [N, K]
    x = torch.randn(5, 576)
    installed(layer, tmp_path)
    with torch.inference_mode():
        got = layer(x).double()
    exact = x.double() @ w.T
    bound = 2.0 ** -7 * (x.double().abs() @ w.abs().T)
    assert ((got - exact).abs() <= bound).all()
    assert (got - exact).abs().max() > 0  # bf16, not fp32: not the same numbers


@pytest.mark.parametrize("in_features", [576, 1536])  # 9 and 24 blocks of 64: a row alone takes one or two passes
@pytest.mark.parametrize("rows", [2, 3, 7, 15, 16, 17, 40, 130])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads(tmp_path, rows, in_features):
    """One row alone goes through its own path (its blocks as the rows of a tile); with others, through
    group_rows: the same bits."""
    layer = linear_4bit(in_features, 192, "nf4", seed=rows)
    installed(layer, tmp_path)
    together, alone, one_thread = three_ways(layer, torch.randn(rows, in_features))
    assert torch.equal(together, alone)
    assert torch.equal(together, one_thread)


def test_adding_into_rows_is_one_rounding_after_the_product(tmp_path):
    layer = linear_4bit(576, 192, "nf4", seed=11)
    installed(layer, tmp_path)
    x, h = torch.randn(3, 576), torch.randn(3, 192)
    with torch.inference_mode():
        product = layer(x)
        into = h.clone()
        layer.spectui_kernel(x, into=into)
    assert torch.equal(into, h + product)


def test_a_stack_reads_views_of_one_set_of_tiles_with_each_modules_bits(tmp_path):
    layers = [linear_4bit(576, out, "nf4", seed=out) for out in (576, 192, 192)]  # q, k, v
    model = torch.nn.Sequential(*layers)
    info = nf4_cpu.install(model, tmp_path)
    assert info.installed == 3 and info.amx
    x = torch.randn(4, 576)
    with torch.inference_mode():
        alone = [layer(x) for layer in layers]
        stack = nf4_cpu.kernel_group(layers)
        together = stack(x)
        again = [layer(x) for layer in layers]  # their own kernels now read the stack's tiles
    assert torch.equal(together, torch.cat(alone, dim=1))
    assert all(torch.equal(a, b) for a, b in zip(alone, again))
    tiles = stack.tensors[0]
    for layer in layers:
        own = layer.spectui_kernel.tensors[0]
        assert own.untyped_storage().data_ptr() == tiles.untyped_storage().data_ptr()  # views, not copies


def test_switched_off_by_the_environment_the_fp32_kernel_serves(tmp_path, monkeypatch):
    monkeypatch.setenv(nf4_cpu.AMX_VAR, "0")
    layer = linear_4bit(576, 192, "nf4", seed=5)
    info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    assert info.installed == 1 and not info.amx and "AMX" not in info.describe()
