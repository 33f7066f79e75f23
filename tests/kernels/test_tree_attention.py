"""Tree attention: Triton kernel (interpreted on CPU) vs torch reference, backend choice, HF wiring.

Tolerances, kernel output (fp32/fp16/bf16 inputs) vs the reference evaluated in float32 on the
same already-rounded inputs, checked as |got - want| <= atol + rtol * |want|:
    float32  atol 1e-5  rtol 1e-5   (observed max ~1e-6)
    float16  atol 3e-3  rtol 2e-3   (observed max ~1.2e-3; P is rounded to fp16 before P @ V)
    bfloat16 atol 3e-2  rtol 2e-2   (observed max ~2e-2; P is rounded to bf16 before P @ V)
Hypothesis runs derandomized (same examples on every run) and without an example database, so
CI is reproducible and writes no files.
"""

import sys

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spectui.kernels import AttentionBackendError, resolve_backend, tree_attention, tree_attention_reference
from spectui.kernels import backend as backend_mod
from spectui.kernels.reference import ancestor_mask
from spectui.kernels.triton_tree import pack_tree_mask, tree_attention_triton

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=3e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}
# function_scoped_fixture: conftest's autouse env fixture is the same for every example.
FAST = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@st.composite
def trees(draw, min_nodes: int, max_nodes: int) -> list[int]:
    """Random parent array: node i's parent is any earlier node (or -1: another root)."""
    T = draw(st.integers(min_nodes, max_nodes))
    return [-1] + [draw(st.integers(-1 if i > 1 else 0, i - 1)) for i in range(1, T)]  # forests allowed


def make_inputs(seed, B, Hq, Hkv, T, D, P, dtype, parents_per_batch):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, P + T, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, P + T, D, generator=g).to(dtype)
    mask = torch.stack([ancestor_mask(p) for p in parents_per_batch])  # [B, T, T]
    return q, k, v, mask


def truth(q, k, v, mask, P, scale=None):
    """The reference evaluated in float32 on the (already rounded) low-precision inputs."""
    return tree_attention_reference(q.float(), k.float(), v.float(), mask, P, scale)


def brute_force(q, k, v, mask, P, scale):
    """Per-node loop: softmax over the prefix plus the node's ancestors, in float64."""
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    out = torch.zeros(B, Hq, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            for i in range(T):
                keys = list(range(P)) + [P + j for j in range(T) if mask[b, i, j]]
                kk, vv = k[b, h // G, keys].double(), v[b, h // G, keys].double()
                s = (kk @ q[b, h, i].double()) * scale
                p = torch.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ vv
    return out


# ---------------------------------------------------------------- reference

@FAST
@given(parents=trees(1, 12), P=st.sampled_from([0, 1, 9]), heads=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
       D=st.sampled_from([16, 80]), seed=st.integers(0, 2**16))
def test_reference_matches_brute_force_loop(parents, P, heads, D, seed):
    q, k, v, mask = make_inputs(seed, 1, *heads, len(parents), D, P, torch.float64, [parents])
    want = brute_force(q, k, v, mask, P, 0.3)
    got = tree_attention_reference(q, k, v, mask, P, scale=0.3)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- kernel vs reference

@pytest.mark.slow  # the Triton interpreter: ~12 s of the quick loop
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@settings(FAST, max_examples=20)
@given(data=st.data(), B=st.integers(1, 2), heads=st.sampled_from([(2, 2), (4, 2), (8, 1)]),
       D=st.sampled_from([16, 64, 80, 96, 128]), P=st.sampled_from([0, 1, 47, 300]),
       splits=st.sampled_from([None, 2, 3]), seed=st.integers(0, 2**16))
def test_kernel_matches_reference(dtype, data, B, heads, D, P, splits, seed):
    T = data.draw(st.integers(1, 24) | st.integers(56, 70), label="T")  # > 64: two tree tiles, 3 words
    chain = [-1] + list(range(T - 1))  # deepest tree: full causal mask
    parents = [data.draw(trees(T, T) | st.just(chain), label="tree") for _ in range(B)]
    event("two tree tiles (T > 64)" if T > 64 else "one tree tile")
    event("split prefix" if splits and P > 64 else "single pass")
    q, k, v, mask = make_inputs(seed, B, *heads, T, D, P, dtype, parents)
    got = tree_attention_triton(q, k, v, mask, P, num_splits=splits)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), truth(q, k, v, mask, P), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gqa_32_query_heads_over_8_kv_heads(dtype):
    parents = [-1, 0, 0, 1, 1, 2, 5]
    q, k, v, mask = make_inputs(1, 1, 32, 8, 7, 64, 300, dtype, [parents])
    for splits in (1, 3):
        got = tree_attention_triton(q, k, v, mask, 300, num_splits=splits)
        torch.testing.assert_close(got.float(), truth(q, k, v, mask, 300), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_big_tree_split_prefix_odd_head_dim(dtype):
    """Pinned: two tree tiles (T=100, 4 mask words) + 4 prefix splits + D=80 in one launch."""
    rng = torch.Generator().manual_seed(9)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=rng)) for i in range(1, 100)]
    q, k, v, mask = make_inputs(9, 1, 4, 2, 100, 80, 300, dtype, [parents])
    got = tree_attention_triton(q, k, v, mask, 300, num_splits=4)
    torch.testing.assert_close(got.float(), truth(q, k, v, mask, 300), **TOL[dtype])


@pytest.mark.parametrize("T", [31, 32, 33, 128])
def test_word_boundaries_and_sign_bits(T):
    """A chain sets every bit of every row prefix, including bit 31 (the int32 sign bit) of each word."""
    chain = [-1] + list(range(T - 1))
    q, k, v, mask = make_inputs(T, 1, 2, 1, T, 64, 1, torch.float32, [chain])
    bits = pack_tree_mask(mask)
    assert bits.shape == (1, T, (T + 31) // 32) and bits.dtype == torch.int32
    unpacked = (bits.unsqueeze(-1).to(torch.int64) >> torch.arange(32)) & 1  # [B, T, W, 32]
    assert torch.equal(unpacked.flatten(2)[..., :T].bool(), mask)
    torch.testing.assert_close(tree_attention_triton(q, k, v, mask, 1), truth(q, k, v, mask, 1), **TOL[torch.float32])


def test_scale_strided_views_and_out_buffer():
    """HF hands over q as a transposed view and wants [B, T, H, D] out: strides must be honoured."""
    q, k, v, mask = make_inputs(3, 2, 4, 2, 9, 96, 70, torch.float16, [[-1, 0, 0, 2, 2, 4, 0, 6, 7]] * 2)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, [B, H, T, D] with T-major strides
    out = torch.empty(2, 9, 4, 96, dtype=torch.float16)
    res = tree_attention_triton(q_view, k, v, mask, 70, scale=0.05, out=out.transpose(1, 2))
    assert res.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.transpose(1, 2).float(), truth(q, k, v, mask, 70, 0.05), **TOL[torch.float16])


def test_row_with_nothing_to_attend_is_zero_like_sdpa():
    q, k, v, mask = make_inputs(4, 1, 2, 2, 3, 64, 0, torch.float32, [[-1, 0, 1]])
    mask[0, 1] = False  # node 1 sees nothing (not a tree; SDPA semantics: output 0)
    got = tree_attention_triton(q, k, v, mask, 0)
    assert torch.equal(got[0, :, 1], torch.zeros(2, 64))
    torch.testing.assert_close(got, tree_attention_reference(q, k, v, mask, 0), **TOL[torch.float32])


# ---------------------------------------------------------------- validation and backends

@pytest.mark.parametrize("case, message", [
    ("q3d", "4-D"), ("int_dtype", "unsupported"), ("mixed_dtype", "dtypes differ"), ("gqa", "multiple"),
    ("T0", "tree size"), ("T129", "tree size"), ("prefix", "prefix_len"), ("mask_dtype", "bool"),
    ("mask_shape", "tree_mask shape"), ("head_dim", "head dim"),
])
@pytest.mark.parametrize("fn", [tree_attention, tree_attention_triton])
def test_bad_inputs_raise_value_error(case, message, fn):
    B, Hq, Hkv, T, D, P = 1, 4, 2, 5, 64, 3
    q, k, v, m = torch.randn(B, Hq, T, D), torch.randn(B, Hkv, P + T, D), torch.randn(B, Hkv, P + T, D), \
        torch.ones(B, T, T, dtype=torch.bool).tril()
    if case == "q3d":
        q = q[0]
    elif case == "int_dtype":
        q, k, v = (x.to(torch.int32) for x in (q, k, v))
    elif case == "mixed_dtype":
        k = k.half()
    elif case == "gqa":
        k, v = torch.randn(B, 3, P + T, D), torch.randn(B, 3, P + T, D)
    elif case in ("T0", "T129"):
        T = 0 if case == "T0" else 129
        q, k, v, m = torch.randn(B, Hq, T, D), torch.randn(B, Hkv, P + T, D), torch.randn(B, Hkv, P + T, D), \
            torch.ones(B, T, T, dtype=torch.bool)
    elif case == "prefix":
        P = P + 1
    elif case == "mask_dtype":
        m = m.int()
    elif case == "mask_shape":
        m = m[:, :4, :4]
    elif case == "head_dim":
        q, k, v = q[..., :8], k[..., :8], v[..., :8]
    with pytest.raises(ValueError, match=message):
        fn(q, k, v, m, P)


def test_backend_resolution(monkeypatch):
    assert resolve_backend("cpu") == "exact"  # auto on CPU, even with TRITON_INTERPRET=1
    assert resolve_backend(torch.device("cuda")) == "triton"  # auto on CUDA, triton importable
    assert resolve_backend("cpu", "triton") == "triton"  # interpreter allowed (conftest sets it)
    monkeypatch.setenv("SPECTUI_ATTENTION", "torch")
    assert resolve_backend(torch.device("cuda")) == "torch"
    assert resolve_backend("cpu", "exact") == "exact"
    monkeypatch.setenv("SPECTUI_ATTENTION", "Triton ")
    assert resolve_backend("cpu") == "triton"


@pytest.mark.parametrize("env, interpret, pattern", [
    ("triton", "0", "TRITON_INTERPRET=1"), ("trition", "1", "not one of"), ("cuda", "1", "not one of"),
])
def test_backend_requests_the_machine_cannot_honour(monkeypatch, env, interpret, pattern):
    monkeypatch.setenv("SPECTUI_ATTENTION", env)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(AttentionBackendError, match=pattern) as err:
        resolve_backend("cpu")
    assert "\n" not in str(err.value)
    q, k, v, m = make_inputs(0, 1, 2, 2, 3, 64, 4, torch.float32, [[-1, 0, 0]])
    with pytest.raises(AttentionBackendError):
        tree_attention(q, k, v, m, 4)


def test_triton_requested_but_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    backend_mod._triton_import_error.cache_clear()
    try:
        assert resolve_backend(torch.device("cuda")) == "torch"  # auto degrades quietly
        with pytest.raises(AttentionBackendError, match="cannot be imported"):
            resolve_backend(torch.device("cuda"), "triton")
    finally:
        monkeypatch.undo()
        backend_mod._triton_import_error.cache_clear()
    assert resolve_backend(torch.device("cuda")) == "triton"


def test_public_function_dispatches_on_environment(monkeypatch):
    q, k, v, m = make_inputs(5, 1, 4, 2, 6, 80, 20, torch.float32, [[-1, 0, 1, 1, 0, 4]])
    ref = tree_attention_reference(q, k, v, m, 20)
    monkeypatch.setenv("SPECTUI_ATTENTION", "torch")
    assert torch.equal(tree_attention(q, k, v, m, 20), ref)
    monkeypatch.setenv("SPECTUI_ATTENTION", "triton")
    via_env = tree_attention(q, k, v, m, 20)
    assert not torch.equal(via_env, ref)  # a different implementation ran (bitwise-different sums) ...
    torch.testing.assert_close(via_env, ref, **TOL[torch.float32])  # ... with the same answer
    torch.testing.assert_close(tree_attention(q, k, v, m, 20, backend="triton"), ref, **TOL[torch.float32])


def test_bench_without_cuda_says_so_and_exits_zero(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark would run for real")
    from spectui.kernels import bench

    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA" in out


# ---------------------------------------------------------------- transformers integration

@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from spectui.kernels.hf_attention import register_tree_attention

    assert register_tree_attention() == register_tree_attention() == "spectui_tree"  # idempotent
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def run_steps(model, impl, steps):
    """Feed `steps` (model kwargs) one after another over one DynamicCache; return logits and backends."""
    from transformers import DynamicCache

    from spectui.kernels.hf_attention import last_backend

    model.set_attn_implementation(impl)
    cache = DynamicCache(config=model.config)
    logits, backends = [], []
    with torch.no_grad():
        for kw in steps:
            logits.append(model(**kw, past_key_values=cache, use_cache=True).logits)
            backends.append(last_backend())
    return logits, backends


def tree_step(prefix_len, parents_per_batch, seed):
    """Model kwargs for one verification step: T tree tokens, 4-D bool mask, depth-based positions."""
    T = len(parents_per_batch[0])
    tree = torch.stack([ancestor_mask(p) for p in parents_per_batch])  # [B, T, T]
    B = tree.shape[0]
    mask = torch.cat([torch.ones(B, T, prefix_len, dtype=torch.bool), tree], dim=-1)[:, None]  # [B, 1, T, P+T]
    position_ids = prefix_len + tree.sum(-1) - 1  # depth of each node below the prefix
    ids = torch.randint(0, 100, (B, T), generator=torch.Generator().manual_seed(seed))
    return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_hf_tree_step_matches_sdpa(tiny_llama, monkeypatch, backend):
    monkeypatch.setenv("SPECTUI_ATTENTION", backend)
    prompt = dict(input_ids=torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(1)))
    steps = [prompt, tree_step(20, [[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 0, 4]], seed=2)]
    want, _ = run_steps(tiny_llama, "sdpa", steps)
    got, backends = run_steps(tiny_llama, "spectui_tree", steps)
    assert backends == ["sdpa-fallback", backend]  # prefill has no mask; the tree step used our kernel
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_hf_prefills_match_sdpa(tiny_llama, monkeypatch):
    monkeypatch.setenv("SPECTUI_ATTENTION", "triton")
    g = torch.Generator().manual_seed(3)
    steps = [
        dict(input_ids=torch.randint(0, 100, (1, 20), generator=g)),  # mask None -> is_causal SDPA
        dict(input_ids=torch.randint(0, 100, (1, 7), generator=g)),  # chunk over a cache: causal 4-D mask
        dict(input_ids=torch.randint(0, 100, (1, 130), generator=g)),  # T > 128: SDPA fallback
    ]
    want, _ = run_steps(tiny_llama, "sdpa", steps)
    got, backends = run_steps(tiny_llama, "spectui_tree", steps)
    # The chunk reaches the kernel only because sdpa_mask is registered for "spectui_tree": without it
    # transformers passes mask=None and a 7-query chunk over 27 keys would be mis-masked.
    assert backends == ["sdpa-fallback", "triton", "sdpa-fallback"]
    for got_i, want_i in zip(got, want):
        torch.testing.assert_close(got_i, want_i, atol=1e-5, rtol=1e-5)


def test_hf_left_padded_batch_prefill_matches_sdpa(tiny_llama, monkeypatch):
    monkeypatch.setenv("SPECTUI_ATTENTION", "triton")
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, :3] = 0  # row 1 is left-padded by 3
    step = dict(input_ids=torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(4)),
                attention_mask=pad, position_ids=(pad.cumsum(-1) - 1).clamp(min=0))
    (want,), _ = run_steps(tiny_llama, "sdpa", [step])
    (got,), backends = run_steps(tiny_llama, "spectui_tree", [step])
    assert backends == ["triton"]  # 4-D padded causal mask with an empty prefix goes to the kernel
    valid = pad.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)


def test_hf_mask_buffer_refilled_in_place_under_inference_mode(tiny_llama, monkeypatch):
    """A verifier may reuse one mask buffer per step; inference tensors carry no version counter."""
    from transformers import DynamicCache

    monkeypatch.setenv("SPECTUI_ATTENTION", "triton")
    prompt = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(6))
    steps = [tree_step(20, [[-1, 0, 0, 1]], seed=7), tree_step(20, [[-1, 0, 1, 2]], seed=7)]  # same tokens

    def run(impl):
        tiny_llama.set_attn_implementation(impl)
        cache = DynamicCache(config=tiny_llama.config)
        logits = []
        with torch.inference_mode():
            tiny_llama(input_ids=prompt, past_key_values=cache)
            buf = torch.empty_like(steps[0]["attention_mask"])
            for step in steps:
                buf.copy_(step["attention_mask"])  # same tensor object, new tree
                logits.append(tiny_llama(input_ids=step["input_ids"], attention_mask=buf,
                                         position_ids=step["position_ids"], past_key_values=cache).logits)
                cache.crop(-4)  # drop the 4 tree tokens (transformers 5: negative = how many to remove)
        return logits

    want, got = run("sdpa"), run("spectui_tree")
    assert not torch.allclose(want[0], want[1], atol=1e-3)  # the two trees really differ
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
