"""kernels/stack_cpu.c runs LeanModel's layer loop in one call with the loop's bits.

The embedded verifier (NF4, every 4-bit layer on kernels/nf4_cpu.c where it builds) goes through
the passes a decode loop makes twice, once with the stack and once with the Python loop
(`stack = None`): the logits and the cache must be equal bit for bit. tests/engine/test_lean_model.py
compares the same runner with transformers' forward.
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.lean_model import LeanModel
from spectui.engine.tree import TokenTree
from spectui.kernels.exact_attention import prepare_mask
from spectui.kernels.glue_cpu import SUM_ROWS


@pytest.fixture(scope="module")
def lean(embedded_models):
    model = LeanModel(embedded_models.verifier)
    if model.glue is None or not model.glue_fp32:
        pytest.skip("the 4-bit layers do not all run kernels/nf4_cpu.c here (AVX512-BF16, or no compiler)")
    assert model.stack is not None  # the fp32 C glue runs these layers: the stack takes them
    return model


def passes(lean: LeanModel, prompt: list[int]) -> list[torch.Tensor]:
    """A prefill the stack takes and one it leaves to the loop, one-token steps, a causal chain, a
    tree with two branches, the kept path; the logits of each pass and the cache at the end."""
    lean.reset()
    out = [lean.forward_chain(prompt[:SUM_ROWS]), lean.forward_chain(prompt[SUM_ROWS:])]  # 64 rows, then 96
    token = int(out[-1][-1].argmax())
    for _ in range(2):
        out.append(lean.forward_chain([token], last_only=True))
        token = int(out[-1][-1].argmax())
    out.append(lean.forward_chain(prompt[3:8]))
    tree = TokenTree.with_root(token)
    tree.add_path(prompt[2:7], 0)
    tree.add_path(prompt[2:4] + prompt[9:11], 0)
    out.append(lean.forward_tree(tree))
    base = lean.length - len(tree)
    lean.keep(list(range(base)) + [base + i for i in (0, 1, 2, 6, 7)])
    out.append(lean.forward_chain([7, 8]))
    out.append(lean.kv[..., : lean.length, :].clone())
    return out


def test_the_stack_gives_the_loops_bits(lean, embedded_models):
    prompt = embedded_models.tokenizer.encode("Wind moves over the wheat and the farmers watch the sky. " * 14)[:160]
    stack = lean.stack
    with_stack = passes(lean, prompt)
    lean.stack = None
    try:
        with_loop = passes(lean, prompt)
    finally:
        lean.stack = stack
    assert len(with_stack) == len(with_loop) == 8
    for i, (a, b) in enumerate(zip(with_stack, with_loop)):
        assert a.shape == b.shape and torch.equal(a, b), f"pass {i}: max diff {(a - b).abs().max()}"


def test_the_stack_takes_what_its_kernels_take(lean):
    """At most SUM_ROWS rows (the norms' own sums of squares) and a causal pass or one mask for all heads
    that covers the rows and every key."""
    assert lean.stack.applies(1, 10, None) and lean.stack.applies(SUM_ROWS, 100, None)
    assert not lean.stack.applies(0, 10, None) and not lean.stack.applies(SUM_ROWS + 1, 100, None)
    one_mask = prepare_mask(torch.ones(1, 1, 3, 10, dtype=torch.bool), lean.heads, lean.kv_heads)
    assert lean.stack.applies(3, 10, one_mask) and not lean.stack.applies(3, 11, one_mask)
    per_head = prepare_mask(torch.ones(1, lean.heads, 3, 10, dtype=torch.bool), lean.heads, lean.kv_heads)
    assert not lean.stack.applies(3, 10, per_head)
