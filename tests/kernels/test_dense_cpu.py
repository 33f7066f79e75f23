"""The drafters' dense kernel (kernels/dense_cpu.c): x @ W^T (+ b) over bf16 weights, or int8 weights with
a scale a row, for any number of rows, threads and output sizes, and where it is wired in (LeanModel's SSM
path, the feature head)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spectui.kernels import dense_cpu, native
from spectui.kernels.head_layer import int8_layer

pytestmark = pytest.mark.skipif(not native.cpu_supported() or native.compiler() is None,
                                reason="the kernel needs x86-64 with AVX2/FMA and a C compiler")


def kernel(weight, bias=None):
    fn, why = native.function("dense_cpu", "spectui_dense_bf16", dense_cpu.ARGTYPES)
    assert fn is not None, why
    return dense_cpu.DenseKernel(fn, weight, bias)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 64, 130])
@pytest.mark.parametrize("N,K", [(64, 32), (30, 16), (7, 8), (8192, 576)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_the_fp32_product_over_the_same_weights(M, N, K, threads):
    torch.manual_seed(M * 1000 + N + K)
    weight, bias, x = torch.randn(N, K), torch.randn(N), torch.randn(M, K)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel(weight, bias)(x)
        plain = kernel(weight)(x[:, None, :])  # leading dims kept: [M, 1, N]
    finally:
        torch.set_num_threads(previous)
    rounded = weight.to(torch.bfloat16).double()  # what the kernel multiplies by: bf16 widens exactly
    want = x.double() @ rounded.T  # [M, N]
    scale = (x.double().abs() @ rounded.abs().T).max()  # bound of the sum's rounding, up to a factor
    assert got.shape == (M, N) and got.dtype == torch.float32 and plain.shape == (M, 1, N)
    assert (got.double() - want - bias.double()).abs().max() <= 1e-5 * scale + 1e-6
    assert (plain[:, 0].double() - want).abs().max() <= 1e-5 * scale + 1e-6


@pytest.mark.parametrize("M", [1, 2, 3, 5, 9, 70])
@pytest.mark.parametrize("N,K", [(64, 32), (30, 16), (7, 8), (960, 576)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_product_is_the_fp32_product_over_its_dequantised_weights(M, N, K, threads):
    fn, why = native.function("dense_cpu", "spectui_dense_int8_x16", dense_cpu.ARGTYPES)
    assert fn is not None, why
    torch.manual_seed(M * 1000 + N + K)
    weight, bias = torch.randn(N, K), torch.randn(N)
    x = torch.randn(M, K).to(torch.bfloat16)  # the head layer's rows: bf16, widened exactly
    layer = int8_layer(weight)
    scale = layer[: 4 * N].view(torch.float32)  # [N]
    q = layer[4 * N :].view(torch.int8).view(N, K)
    assert (scale * 127 - weight.abs().amax(dim=1)).abs().max() <= 1e-6 * weight.abs().max()
    assert (scale[:, None] * q - weight).abs().max() <= scale.max() / 2 * (1 + 1e-5)  # round to nearest
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = torch.empty(M, N)
        fn(M, N, K, x.data_ptr(), K, layer.data_ptr(), bias.data_ptr(), got.data_ptr(), N, threads)
    finally:
        torch.set_num_threads(previous)
    sums = x.double() @ q.double().T  # [M, N]: exact in fp32 lanes up to the sum's rounding
    want = sums * scale.double() + bias.double()
    bound = (x.double().abs() @ q.double().abs().T) * scale.double()
    assert (got.double() - want).abs().max() <= (1e-5 * bound + 1e-5).max()


def test_rows_do_not_depend_on_their_neighbours():
    """A row's result is the same whether it is computed alone, second of two or inside a block."""
    torch.manual_seed(0)
    weight, x = torch.randn(96, 64), torch.randn(70, 64)
    k = kernel(weight)
    many = k(x)
    for m in (0, 1, 5, 69):
        alone = k(x[m : m + 1])
        assert torch.allclose(alone[0], many[m], rtol=1e-6, atol=1e-5)


def test_only_for_cpus_where_drafters_run_fp32(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert dense_cpu.dense(torch.randn(16, 8)) is None  # bf16 drafters through torch there
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert isinstance(dense_cpu.dense(torch.randn(16, 8)), dense_cpu.DenseKernel)
    assert dense_cpu.dense(torch.randn(16, 12)) is None  # K not in blocks of 8
    monkeypatch.setenv(native.DISABLE_VAR, "0")
    assert dense_cpu.dense(torch.randn(16, 8)) is None


def test_ssm_and_feature_head_layers_use_it_where_wanted(monkeypatch):
    from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
    from spectui.engine.lean_model import LeanModel
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()  # a tiny random SSM
    lean = LeanModel(model, drafting=True)
    assert lean.output_layer is not None and all(p.dense is not None for layer in lean.layers
                                               for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
    verifying = LeanModel(model)  # a verifier on the SDPA path keeps its fp32 weights
    assert verifying.output_layer is None and all(p.dense is None for layer in verifying.layers
                                                for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
    ids = [5, 9, 2, 7, 11, 3]
    with torch.inference_mode():
        got = lean.forward_chain(ids)  # [T, V]
        want = model(torch.tensor([ids])).logits[0].float()
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item())  # bf16 weights: close, not equal
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8

    head = FeatureHead(FeatureHeadConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, draft_vocab=32))
    head.attach(torch.randn(100, 64), torch.randn(100, 64))
    tokens, prev, positions = torch.tensor([[3, 4, 5]]), torch.randn(1, 3, 64), torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        plain, _ = head(tokens, prev, positions)
        assert head.use_kernels() and set(head.kernels) == {"fc", "qkv", "o", "gate_up", "down", "draft"}
        fast, _ = head(tokens, prev, positions)
        assert torch.allclose(fast, plain, atol=0.02 * plain.abs().max().item())
        assert torch.allclose(head.draft_logits(fast), fast @ head.draft_rows.T, rtol=1e-2, atol=1e-2)


DOT = pytest.mark.skipif(not dense_cpu.dot_available(), reason="spectui_dot_bf16 needs AVX512-BF16")


@DOT
@pytest.mark.parametrize("M", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("N,K", [(64, 32), (30, 40), (7, 600), (8192, 576)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_dot_kernel_sums_exact_bf16_products_in_fp32(M, N, K, threads):
    """Up to DOT_MAX_ROWS rows the C loop: within gamma_K sum |x_k w_k| of the exact product of the
    bf16-rounded operands (the bound argmax_head.py relies on); more rows go through torch's bf16
    product, whose output is rounded to bf16 (2^-8 relative)."""
    torch.manual_seed(M * 1000 + N + K)
    weight, bias, x = torch.randn(N, K), torch.randn(N), torch.randn(M, K)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel = dense_cpu.bf16_dot(weight, bias)
        got = kernel(x)
        plain = dense_cpu.bf16_dot(weight)(x.to(torch.bfloat16)[:, None, :])  # bf16 rows, leading dims kept
    finally:
        torch.set_num_threads(previous)
    xb, wb = x.to(torch.bfloat16).double(), weight.to(torch.bfloat16).double()
    want = xb @ wb.T  # [M, N]
    size = xb.abs() @ wb.abs().T  # [M, N]: sum |x_k w_k|
    gamma = K * 2.0**-24 / (1 - K * 2.0**-24)
    assert got.shape == (M, N) and got.dtype == torch.float32 and plain.shape == (M, 1, N)
    if M <= dense_cpu.DOT_MAX_ROWS:
        assert ((plain[:, 0].double() - want).abs() <= gamma * size + 1e-30).all()
        assert ((got.double() - bias.double() - want).abs() <= gamma * size + 2.0**-23 * got.double().abs()).all()
    else:
        assert ((plain[:, 0].double() - want).abs() <= 2.0**-8 * want.abs() + gamma * size + 1e-30).all()


@DOT
def test_the_dot_kernel_serves_bf16_drafters():
    """On AVX512-BF16 CPUs drafters are bf16 (engine/loading.py drafter_dtype): an SSM's projections and
    output layer and the feature head's layers take spectui_dot_bf16, and give what torch's bf16 gives."""
    from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
    from spectui.engine.lean_model import LeanModel
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    lean = LeanModel(model, drafting=True)
    assert isinstance(lean.output_layer, dense_cpu.DotKernel)
    assert all(isinstance(p.dense, dense_cpu.DotKernel) for layer in lean.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
    ids = [5, 9, 2, 7, 11, 3]
    with torch.inference_mode():
        got = torch.cat([lean.forward_chain([token]) for token in ids])  # one row a pass: the C loop
        want = model(torch.tensor([ids])).logits[0].float()
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8

    head = FeatureHead(FeatureHeadConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, draft_vocab=32))
    head = head.to(torch.bfloat16)
    head.attach(torch.randn(100, 64), torch.randn(100, 64))
    tokens, prev, positions = torch.tensor([[3]]), torch.randn(1, 1, 64), torch.tensor([[1]])
    with torch.inference_mode():
        plain, _ = head(tokens, prev, positions)
        assert head.use_kernels() and all(isinstance(k, dense_cpu.DotKernel) for k in head.kernels.values())
        fast, _ = head(tokens, prev, positions)
        assert fast.dtype == torch.bfloat16
        assert torch.allclose(fast.float(), plain.float(), atol=0.03 * plain.abs().max().item())


@pytest.mark.parametrize("M,V", [(1, 8192), (3, 8192), (2, 64), (1, 8)])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 16])
def test_softmax_top_is_torchs_topk_of_the_softmax(M, V, k):
    """spectui_softmax_top: the k largest columns, largest first, and their softmax probabilities."""
    if k > V:
        return
    fn = dense_cpu.softmax_top_function()
    assert fn is not None
    torch.manual_seed(M * 100 + V + k)
    logits = torch.randn(M, V) * 4
    logits[0, V // 2] = 30.0  # a peaked row: the rest of its mass is tiny but counted
    columns, probs = dense_cpu.softmax_top(logits, k, fn)
    want = torch.topk(torch.softmax(logits.double(), dim=-1), k, dim=-1)
    assert columns.shape == probs.shape == (M, k) and columns.dtype == torch.int64 and probs.dtype == torch.float32
    assert torch.equal(columns, want.indices)
    assert torch.allclose(probs.double(), want.values, rtol=1e-5, atol=1e-9)
    assert torch.equal(dense_cpu.softmax_top(logits, k, None)[0], want.indices)  # torch's ops without the C function


def test_softmax_top_breaks_ties_towards_the_lower_column_and_falls_back_where_it_cannot_run():
    fn = dense_cpu.softmax_top_function()
    logits = torch.zeros(1, 16)
    logits[0, [3, 9, 12]] = 2.0
    columns, probs = dense_cpu.softmax_top(logits, 2, fn)
    assert columns.tolist() == [[3, 9]]
    assert probs[0].tolist() == pytest.approx([torch.e**2 / (3 * torch.e**2 + 13)] * 2, rel=1e-6)
    odd = torch.randn(2, 12)  # V not a multiple of 8: torch's ops
    got = dense_cpu.softmax_top(odd, 3, fn)
    want = torch.topk(torch.softmax(odd, dim=-1), 3, dim=-1)
    assert torch.equal(got[0], want.indices) and torch.equal(got[1], want.values)
