"""The feature head's layer in one C call (kernels/head_layer.c) against the head's torch forward.

A random FeatureHead: the C layer's output rows and the keys/values it writes into the cache must
match the fp32 torch forward to within 2 % (the C path rounds each product's input to bf16, and on
AVX2 CPUs without AVX512-BF16 reads its weights in int8, a scale a row), for a causal catch-up after
cached slots and for a tree level whose rows see only some slots, with the drafter's cache in bf16
(a bf16 drafter, AVX512-BF16 CPUs) or fp32 (an fp32 one, other AVX2 CPUs); and a FeatureDrafter
drafts through it where `use_kernels` builds it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spectui.engine.feature_drafter import FeatureDrafter
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
from spectui.engine.tree import TokenTree
from spectui.kernels import native
from spectui.kernels.head_layer import max_rows

V, H = 500, 64
CONFIG = FeatureHeadConfig(hidden=H, heads=4, kv_heads=2, head_dim=16, intermediate=96, rope_theta=10_000.0,
                           draft_vocab=200)

pytestmark = pytest.mark.skipif(not native.cpu_supported() or native.compiler() is None,
                                reason="the layer needs AVX2 and a C compiler")
DRAFTER_DTYPE = torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() else torch.float32  # as loading.py picks


def make_head(seed: int = 0, prev_token: bool = False) -> FeatureHead:
    torch.manual_seed(seed)
    head = FeatureHead(replace(CONFIG, prev_token=prev_token))
    with torch.no_grad():
        head.norm_in.uniform_(0.5, 1.5)
        head.norm_post.uniform_(0.5, 1.5)
    head.vocab_ids.copy_(torch.randperm(V)[: CONFIG.draft_vocab].sort().values)
    head.attach(torch.randn(V, H), torch.randn(V, H) * 3)
    return head.eval()


def close(got: torch.Tensor, want: torch.Tensor, rel: float = 0.02) -> bool:
    got, want = got.float(), want.float()
    return bool((got - want).norm() <= rel * want.norm())


@pytest.mark.parametrize("T,used,prev_token", [(1, 0, False), (1, 7, False), (3, 12, False), (8, 30, False),
                                               (1, 7, True), (8, 30, True)])
@pytest.mark.parametrize("tree_mask", [False, True])
@pytest.mark.parametrize("cache", [torch.bfloat16, torch.float32])
def test_rows_and_cache_writes_match_the_torch_forward(T, used, prev_token, tree_mask, cache):
    head = make_head(prev_token=prev_token)
    layer = head.make_layer_kernel()
    assert layer is not None
    g = torch.Generator().manual_seed(T * 100 + used)
    tokens = torch.randint(0, V, (used + T,), generator=g).tolist()
    prev = torch.randn(used + T, H, generator=g)
    before = torch.tensor([0, *tokens[:-1]])  # x_{t-1}: what a prev_token head reads beside f_{t-1}
    positions = list(range(1, used + T + 1))
    mask = None
    if tree_mask:  # row t sees the first used - 2 slots, itself, and each other new row with chance 1/2
        mask = torch.zeros(T, used + T, dtype=torch.bool)
        mask[:, : max(used - 2, 0)] = True
        mask[:, used:] = torch.rand(T, T, generator=g) < 0.5
        mask[torch.arange(T), used + torch.arange(T)] = True
    with torch.no_grad():
        past = None
        if used:
            _, past = head(torch.tensor([tokens[:used]]), prev[None, :used], torch.tensor([positions[:used]]),
                           before=before[None, :used])
        want, (k, v) = head(torch.tensor([tokens[used:]]), prev[None, used:], torch.tensor([positions[used:]]), past,
                            None if mask is None else mask[None, None], before[None, used:])
    cap = used + T + 5
    kv = torch.zeros(2, CONFIG.kv_heads, cap, CONFIG.head_dim, dtype=cache)
    if used:
        kv[0, :, :used], kv[1, :, :used] = past[0][0], past[1][0]
    rows = head.prev_inputs(prev[used:], before[used:])  # [T, H], or [T, 2H] with e(x_{t-1})
    got = layer(tokens[used:], rows.to(torch.bfloat16), positions[used:], kv, used, mask)
    assert got.shape == (T, H) and got.dtype == torch.bfloat16
    assert close(got, want[0])
    assert close(kv[0, :, used : used + T], k[0, :, used:]) and close(kv[1, :, used : used + T], v[0, :, used:], 0.01)
    assert not kv[:, :, used + T :].any()  # nothing written past the rows' slots


def test_a_drafter_drafts_through_the_layer_as_the_torch_path_does():
    head = make_head(1)
    reference = FeatureDrafter("torch", make_head(1))  # the fp32 torch path
    fast_head = make_head(1).to(DRAFTER_DTYPE)
    fast_head.attach(head.embed, torch.zeros(V, H).index_copy(0, head.vocab_ids, head.draft_rows), DRAFTER_DTYPE)
    assert fast_head.use_kernels() and fast_head.layer_kernel is not None
    fast = FeatureDrafter("c", fast_head)
    torch.manual_seed(5)
    committed = torch.randint(0, V, (20,)).tolist()
    feats = torch.randn(19, H)
    calls = []
    fn = fast_head.layer_kernel.fn
    fast_head.layer_kernel.fn = lambda *args: calls.append(args[0]) or fn(*args)  # rows of each C call
    reference.take_features(0, feats)
    fast.take_features(0, feats)
    tree = TokenTree.with_root(committed[-1])
    children = reference.begin(committed, tree, 0, 2)
    fast.begin(committed, TokenTree.with_root(committed[-1]), 0, 2)  # a 19-row catch-up: C where max_rows allows
    reference.expand(tree, 0, children, 2)
    fast.expand(tree, 0, children, 2)  # the same level of 2 rows: the C layer in `fast`
    assert calls == ([19] if 19 <= max_rows(DRAFTER_DTYPE) else []) + [2]
    for node in [0, *children]:
        assert close(fast.own_feature[node], reference.own_feature[node], 0.03)
    reference.finish()
    fast.finish()
    assert fast.used == fast.fed == reference.used == 19
