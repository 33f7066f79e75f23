"""kernels/glue_cpu.c gives the bits of the torch ops it replaces in LeanModel (engine/lean_model.py):
LlamaRMSNorm's tail (rounded to bf16, or fp32 as it is), apply_rotary_pos_emb with the cache
writes, and silu(gate) * up (rounded to bf16, or fp32)."""

from __future__ import annotations

import pytest
import torch

from spectui.engine.lean_model import rms_norm, rotate
from spectui.kernels.glue_cpu import bits, glue

GLUE = glue()
pytestmark = pytest.mark.skipif(GLUE is None, reason="kernels/glue_cpu.c is not built here (no AVX2 or no compiler)")


def awkward(*shape: int, seed: int) -> torch.Tensor:
    """Gaussian values at many scales, with zeros, signed zeros, tiny and huge entries mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
    flat = x.view(-1)
    picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=g)
    flat[picks] = torch.tensor([0.0, -0.0, 1e-40, -3e38, 3e38, 1.5e-39])[torch.arange(len(picks)) % 6]
    return x


@pytest.mark.parametrize("fp32", [False, True])  # bf16 rows for packed_4bit.c; fp32 for nf4_cpu.c (every bit seen)
@pytest.mark.parametrize("rows,n", [(1, 576), (3, 576), (7, 64), (2, 4096)])
def test_rms_norm_is_the_torch_bits(rows, n, fp32):
    g = torch.Generator().manual_seed(rows * n)
    dtype, norm = (torch.float32, GLUE.rms_norm_f32) if fp32 else (torch.bfloat16, GLUE.rms_norm_bf16)
    for seed in range(4):
        h = awkward(rows, n, seed=seed)
        weight = torch.randn(n, generator=g) * 2
        for eps in (1e-5, 1e-6, 0.1):
            want = rms_norm(h[None], (weight, eps))[0].to(dtype)  # [rows, n], LeanModel's torch path
            got = norm(h, weight, eps)
            assert got.dtype == dtype
            assert torch.equal(bits(got), bits(want)), (seed, eps)


@pytest.mark.parametrize("T,Hq,Hkv,D", [(1, 9, 3, 64), (5, 9, 3, 64), (3, 8, 8, 128), (2, 4, 1, 80)])
def test_rope_store_is_the_torch_bits(T, Hq, Hkv, D):
    qkv = awkward(T, (Hq + 2 * Hkv) * D, seed=T + Hq)
    positions = torch.arange(40, 40 + T, dtype=torch.float32)
    freqs = positions[:, None] * (10000.0 ** (-torch.arange(0, D, 2).float() / D))[None]  # [T, D/2]
    angles = torch.cat([freqs, freqs], dim=-1)  # [T, D]
    cos, sin = angles.cos(), angles.sin()
    capacity, start = 64, 17
    cache = torch.full((2, 1, Hkv, capacity, D), 7.0)  # [2, B, Hkv, capacity, D]
    expected = cache.clone()

    qk, v = qkv.split([(Hq + Hkv) * D, Hkv * D], dim=-1)
    qk = rotate(qk.view(1, T, Hq + Hkv, D).transpose(1, 2), cos[None, None], sin[None, None])  # LeanModel's torch path
    expected[0, :, :, start:start + T] = qk[:, Hq:]
    expected[1, :, :, start:start + T] = v.view(1, T, Hkv, D).transpose(1, 2)

    q = GLUE.rope_store(qkv, cos, sin, Hq, Hkv, cache[0, 0, :, start:start + T], cache[1, 0, :, start:start + T])
    assert q.shape == (1, Hq, T, D)
    assert torch.equal(q.view(torch.int32), qk[:, :Hq].contiguous().view(torch.int32))
    assert torch.equal(cache.view(torch.int32), expected.view(torch.int32))  # nothing written outside the T rows


@pytest.mark.parametrize("fp32", [False, True])  # bf16 for packed_4bit.c (AVX512 exp); fp32 for nf4_cpu.c (8-lane exp)
def test_silu_mul_is_the_torch_bits(fp32):
    dtype, silu_mul, kernel, capabilities = ((torch.float32, GLUE.silu_mul_f32, GLUE._silu_f32, ("AVX2", "AVX512")) if fp32
                                             else (torch.bfloat16, GLUE.silu_mul_bf16, GLUE._silu, ("AVX512",)))
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in capabilities:  # on AVX512 CPUs without BF16 the C stack needs the fp32 one (stop 64)
        assert kernel is not None, f"the C silu should serve an {capability} CPU (torch's Sleef exp found and matching)"
    for T in (1, 3, 8):
        gate_up = awkward(T, 2 * 1536, seed=T)  # LlamaMLP's gate|up rows, as the 4-bit kernel writes them
        gate_up[:, :1536] = gate_up[:, :1536].clamp(-120, 120)  # and some in exp's overflow range
        gate, up = gate_up.chunk(2, dim=-1)
        want = (torch.nn.functional.silu(gate) * up).to(dtype)
        got = silu_mul(gate_up)
        assert got.shape == (T, 1536) and torch.equal(bits(got), bits(want)), T


@pytest.mark.parametrize("n", [576, 100, 4096])
def test_rms_norm_is_the_torch_bits_with_either_sum_of_squares(n):
    """The sum of squares in C (torch's order, checked at first use) or torch's own (rows beyond
    SUM_ROWS, or where the check failed): the same bits either way."""
    from spectui.kernels.glue_cpu import SUM_ROWS, Glue

    h = awkward(SUM_ROWS + 1, n, seed=n)
    weight = torch.randn(n, generator=torch.Generator().manual_seed(1))
    want = rms_norm(h[None], (weight, 1e-5))[0].to(torch.bfloat16)
    fallback = Glue(GLUE._rms, GLUE._rope)
    fallback._sum_checked[n, False] = fallback._sum_checked[n, True] = False  # as where the C order is not torch's
    want32 = rms_norm(h[None], (weight, 1e-5))[0]
    for glue_ in (GLUE, fallback):
        for rows in (1, 5, SUM_ROWS, SUM_ROWS + 1):
            got = glue_.rms_norm_bf16(h[:rows], weight, 1e-5)
            assert torch.equal(got.view(torch.int16), want[:rows].view(torch.int16)), rows
            got = glue_.rms_norm_f32(h[:rows], weight, 1e-5)
            assert torch.equal(got.view(torch.int32), want32[:rows].view(torch.int32)), rows

