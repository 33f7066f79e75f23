"""The 4-bit CPU kernel (kernels/nf4_cpu.c) for machines where bitsandbytes has no fused kernel.

What verification relies on: every output element has the same bits whatever the number of rows
and threads; the dequantised weights are bitsandbytes' own; the sum is as close to the exact one as
bitsandbytes' fp32 path. And where the kernel cannot serve, the layers stay bitsandbytes' own.
"""

from __future__ import annotations

import pytest
import torch

from spectui.kernels import native, nf4_cpu

pytestmark = pytest.mark.skipif(not native.cpu_supported() or native.compiler() is None,
                                reason="the kernel needs x86-64 with AVX2/FMA and a C compiler")


@pytest.fixture(autouse=True)
def fp32_kernel(monkeypatch):
    """These tests are nf4_cpu.c's: where the CPU has AMX, `install` would take nf4_amx.c (tests/kernels/test_nf4_amx.py)."""
    monkeypatch.setenv(nf4_cpu.AMX_VAR, "0")


def linear_4bit(in_features: int, out_features: int, quant_type: str, seed: int, bias: bool = False, nested: bool = False):
    import bitsandbytes as bnb

    torch.manual_seed(seed)
    weight = torch.randn(out_features, in_features) * 0.05
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=bias, quant_type=quant_type, compute_dtype=torch.float32,
                              compress_statistics=nested)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type, compress_statistics=nested)
    layer = layer.to("cpu").eval()
    layer.support_avx512bf16_for_cpu = False  # bitsandbytes' fp32 path, as on a CPU without AVX512-BF16
    return layer


def three_ways(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """layer(x) for x's rows together, each alone, and together on one thread."""
    threads = torch.get_num_threads()
    with torch.inference_mode():
        together = layer(x)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
        torch.set_num_threads(1)
        try:
            one_thread = layer(x)
        finally:
            torch.set_num_threads(threads)
    return together, alone, one_thread


def exact(layer, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T in float64 over bitsandbytes' own dequantised weights."""
    from bitsandbytes.functional import dequantize_4bit

    w = dequantize_4bit(layer.weight.data, layer.weight.quant_state)  # [N, K] fp32
    return x.double() @ w.double().T


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("shape", [(576, 192), (128, 64), (1536, 576)])  # (in, out)
def test_kernel_sums_bitsandbytes_weights_as_closely_as_its_fp32_path(tmp_path, quant_type, shape):
    layer = linear_4bit(*shape, quant_type, seed=shape[0])
    x = torch.randn(9, shape[0])
    with torch.inference_mode():
        stock = layer(x)  # bitsandbytes: dequantise + fp32 matmul
        info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
        assert info.installed == 1 and nf4_cpu.uses_kernel(layer), info.reason
        got = layer(x)
    reference = exact(layer, x)
    assert got.dtype == torch.float32 and got.shape == stock.shape
    err_kernel = (got.double() - reference).abs().max().item()
    err_stock = (stock.double() - reference).abs().max().item()
    assert err_kernel <= 2 * err_stock + 1e-7  # fp32 rounding of a K-term sum, no worse than MKL's
    assert not torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 6, 7, 8, 9, 65, 130])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads(tmp_path, rows):
    layer = linear_4bit(576, 192, "nf4", seed=rows)
    nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    x = torch.randn(rows, 576)
    together, alone, one_thread = three_ways(layer, x)
    with torch.inference_mode():
        batched = layer(x.view(1, rows, 576))  # [B, T, K] as the model calls it
    assert torch.equal(together, alone)
    assert torch.equal(together, one_thread)
    assert batched.shape == (1, rows, 192) and torch.equal(batched[0], together)


def test_adding_into_the_residual_rows_is_torchs_add(tmp_path):
    """LeanModel's C glue adds o's and down's outputs into the residual stream as they come out
    (`into`): the bits of its torch path's `h + linear(x)`."""
    layer = linear_4bit(576, 192, "nf4", seed=3)
    nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    group = nf4_cpu.kernel_group([layer])
    x, h = torch.randn(5, 576), torch.randn(5, 192) * 4
    with torch.inference_mode():
        want = h + layer(x)
        rows = h.clone()
        got = group(x, into=rows)
    assert got is rows and torch.equal(rows.view(torch.int32), want.view(torch.int32))


def test_a_stack_rebinds_its_modules_own_kernels(tmp_path):
    """A kernel binds its weights' addresses once; stacking q|k|v-like modules re-points their tensors
    into the stack, and each module's own kernel (what transformers' forward calls) must read the
    stack from then on, with the bits it had."""
    a, b = linear_4bit(576, 192, "nf4", seed=1), linear_4bit(576, 64, "nf4", seed=2)
    nf4_cpu.install(torch.nn.Sequential(a, b), tmp_path)
    x = torch.randn(3, 576)
    with torch.inference_mode():
        before = a(x), b(x)
        group = nf4_cpu.kernel_group([a, b])
        weight, absmax = group.stack
        assert a.spectui_kernel.pointers[:2] == (weight.data_ptr(), absmax.data_ptr())
        assert b.spectui_kernel.pointers[0] == weight.data_ptr() + a.weight.data.numel()
        assert torch.equal(a(x), before[0]) and torch.equal(b(x), before[1])
        assert torch.equal(group(x), torch.cat(before, dim=-1))


def test_layers_the_kernel_cannot_take_are_left_to_bitsandbytes(tmp_path):
    for layer, words in [(linear_4bit(128, 64, "nf4", 0, bias=True), "bias"),
                         (linear_4bit(128, 64, "nf4", 0, nested=True), "nested"),
                         (linear_4bit(100, 64, "nf4", 0), "shape"),  # K not in blocks of 64
                         (linear_4bit(128, 6, "nf4", 0), "shape")]:  # N not in groups of 4 rows
        info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
        assert info.installed == 0 and words in info.reason and not nf4_cpu.uses_kernel(layer)


@pytest.mark.parametrize("avx512", ["1", "0"])
def test_a_layer_for_bitsandbytes_fused_kernel_is_taken_only_with_the_avx512_path(tmp_path, monkeypatch, avx512):
    """On AVX512-BF16 CPUs bitsandbytes would run a layer through its fused bf16 kernel: the kernel takes it
    where its AVX-512 path runs (faster there), and leaves it on the AVX2 path (no faster)."""
    before = nf4_cpu.avx512_wanted()
    monkeypatch.setenv(nf4_cpu.AVX512_VAR, avx512)
    fused = linear_4bit(128, 64, "nf4", 0)
    fused.support_avx512bf16_for_cpu = True  # bitsandbytes' own fused kernel would run it
    try:
        info = nf4_cpu.install(torch.nn.Sequential(fused), tmp_path)
    finally:
        nf4_cpu.set_avx512(before)  # as the environment says, for the other tests
    if info.avx512:
        assert info.installed == 1 and nf4_cpu.uses_kernel(fused) and not fused.support_avx512bf16_for_cpu
    else:
        assert info.installed == 0 and "fused" in info.reason and fused.support_avx512bf16_for_cpu


def test_without_a_compiler_nothing_is_installed_and_the_reason_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setattr(native, "_LOADED", {})  # a new process: nothing built yet
    layer = linear_4bit(128, 64, "nf4", 0)
    info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    assert info.installed == 0 and "compiler" in info.reason
    assert info.describe().startswith("bitsandbytes (") and not nf4_cpu.uses_kernel(layer)


def test_the_build_is_kept_and_reused(tmp_path):
    lib, why = native.build("nf4_cpu", tmp_path)
    assert lib is not None, why
    built = list(tmp_path.glob("nf4_cpu-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert native.build("nf4_cpu", tmp_path)[0] is not None  # found, not compiled again
    assert built[0].stat().st_mtime_ns == stamp
    stale = tmp_path / "nf4_cpu-0123456789abcdef.so"  # a build of an older source
    stale.write_bytes(b"old")
    built[0].unlink()
    assert native.build("nf4_cpu", tmp_path)[0] is not None
    assert [p.name for p in tmp_path.glob("nf4_cpu-*.so")] == [built[0].name]  # built again, the stale one gone


def test_switched_off_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(native.DISABLE_VAR, "0")
    layer = linear_4bit(128, 64, "nf4", 0)
    info = nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    assert info.installed == 0 and native.DISABLE_VAR in info.reason


def test_training_keeps_bitsandbytes_path(tmp_path):
    layer = linear_4bit(128, 64, "nf4", 0)
    nf4_cpu.install(torch.nn.Sequential(layer), tmp_path)
    x = torch.randn(3, 128, requires_grad=True)
    y = layer(x)  # grad enabled and an input that wants it: bitsandbytes' autograd path
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(12, 64, 32), (960, 576, 64), (576, 1536, 64), (8, 256, 128)])  # (N, K, block)
def test_the_avx512_path_gives_the_avx2_paths_bits(tmp_path, shape):
    fn, why = native.function("nf4_cpu", "spectui_nf4_matmul", nf4_cpu.ARGTYPES, tmp_path)
    assert fn is not None, why
    if not nf4_cpu.set_avx512(True):
        pytest.skip("this CPU lacks AVX-512 F/BW/DQ/VL")
    from bitsandbytes.functional import get_4bit_type

    N, K, bs = shape
    gen = torch.Generator().manual_seed(N + K)
    w = torch.randint(0, 256, (N * K // 2,), dtype=torch.uint8, generator=gen)
    absmax = torch.rand(N * K // bs, generator=gen) + 0.01
    code = get_4bit_type("nf4", device="cpu").float().contiguous()

    def product(x: torch.Tensor, add: bool, threads: int) -> torch.Tensor:
        y = torch.randn(x.shape[0], N, generator=torch.Generator().manual_seed(1)) if add else torch.empty(x.shape[0], N)
        assert fn(x.shape[0], N, K, x.data_ptr(), K, w.data_ptr(), absmax.data_ptr(), bs, code.data_ptr(),
                  y.data_ptr(), N, threads, int(add)) == 0
        return y

    try:
        for M in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 16, 50):  # 9-16: the prefill path, 1-5 rows left past six
            # magnitudes 2^-8 .. 2^8, so that another order of the sum would show in the last bits
            x = torch.randn(M, K, generator=gen) * torch.exp2(torch.randint(-8, 9, (M, K), generator=gen).float())
            for add, threads in ((False, 2), (True, 1)):
                nf4_cpu.set_avx512(True)
                wide = product(x, add, threads)
                nf4_cpu.set_avx512(False)
                narrow = product(x, add, threads)
                assert torch.equal(wide.view(torch.int32), narrow.view(torch.int32)), (M, add, threads)
                assert wide.abs().sum() > 0
    finally:
        nf4_cpu.set_avx512(nf4_cpu.avx512_wanted())
