#!/usr/bin/env python
# Usage: .venv/bin/python scripts/profile_step.py [--prefix 200 1000] [--tree 1 8 64] [--repeats 7]
#        (SPECTUI_RUNNER=transformers profiles transformers' forward, the path before LeanModel;
#        SPECTUI_ATTENTION=torch the fp32 path the engine used before the exact attention)
"""Where a verifier pass spends its time: one verify step (tree forward + greedy acceptance + cache
compaction) of T chain nodes after a prefix, split by module with forward hooks:

  4-bit linears   every bitsandbytes Linear4bit (q/k/v/o, gate/up/down): weight handling + matmul
                  (LeanModel: its fused direct kernel calls, engine/lean_model.py Projection, and
                  o and down through Packed4bit with the residual add they do in place)
  output layer    lm_head (fp32, vocabulary x hidden)
  attention       the attention function (scores, softmax, weighted sum), rotary excluded
  rest of model   the forward minus the above: embedding, norms, rotary, activations, residuals,
                  transformers' Python and dispatch (LeanModel: its C glue and Python)
  engine          the step minus the forward: masks, positions, acceptance, cache compaction
  C stack         LeanModel's decoder stack in one C call (kernels/stack_cpu.c, the AVX2 4-bit path,
                  passes of up to 64 rows): its linears, attention and glue, not split; --no-stack
                  runs the Python layer loop instead, whose parts the columns before it split

Medians over repeats, in ms. The hooks cost a few microseconds each (about 1 ms per pass).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--tree", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--full-logits", action="store_true",
                    help="every logit of every row (sampling, display) instead of greedy decoding's argmax-only output")
    ap.add_argument("--no-stack", action="store_true",
                    help="LeanModel's Python layer loop instead of its one-call C stack, to split the layers' time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import bitsandbytes as bnb
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from spectui import paths
    from spectui.engine import load_models, resolve_model
    from spectui.engine.accept import accept_greedy  # the step's parts, profiled one by one
    from spectui.engine.lean_model import LeanModel, Projection
    from spectui.kernels.nf4_cpu import KernelMatmul
    from spectui.kernels.packed_4bit import Packed4bit
    from spectui.engine.loading import build_engine
    from spectui.engine.tree import TokenTree

    models = load_models(resolve_model("smollm2-135m"), quant="nf4", device="cpu", models_dir=paths.models_dir())
    engine = build_engine(models, ngram=False)
    model = models.verifier
    spent: dict[str, float] = defaultdict(float)

    def timed(name):
        def pre(_module, _args):
            _module._t0 = time.perf_counter()

        def post(_module, _args, _out):
            spent[name] += time.perf_counter() - _module._t0
        return pre, post

    for module in model.modules():
        name = ("4-bit linears" if isinstance(module, bnb.nn.Linear4bit)
                else "output layer" if module is model.lm_head and not isinstance(engine.verifier, LeanModel) else None)
        if name:
            pre, post = timed(name)
            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)
    def clocked(name, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            spent[name] += time.perf_counter() - t0
            return out
        return call

    def clocked_outermost(name, fn):  # a Projection calls its Packed4bit: count the time once
        def call(*a, **kw):
            if inside:
                return fn(*a, **kw)
            inside.append(True)
            try:
                return clocked(name, fn)(*a, **kw)
            finally:
                inside.pop()
        return call

    inside = []
    verifier = engine.verifier
    if isinstance(verifier, LeanModel):
        linear, packed = Projection.__call__, Packed4bit.__call__
        Projection.__call__ = lambda self, x: clocked_outermost("4-bit linears", linear)(self, x)
        Packed4bit.__call__ = (lambda self, x, own=True, into=None:  # o and down, called directly by the glue path
                               clocked_outermost("4-bit linears", packed)(self, x, own, into))
        ours = KernelMatmul.__call__  # the same on the AVX2 path (kernels/nf4_cpu.c)
        KernelMatmul.__call__ = lambda self, x, into=None: clocked_outermost("4-bit linears", ours)(self, x, into)
        verifier.attend = clocked("attention", verifier.attend)
        verifier.output = clocked("output layer", verifier.output)  # the screen (argmax-only) or the full head
        verifier.argmax_only = not args.full_logits  # as the engine decodes greedily without display
        verifier.run = clocked("forward", verifier.run)
        if args.no_stack:
            verifier.stack = None
        elif verifier.stack is not None:
            stack_call = type(verifier.stack).__call__
            type(verifier.stack).__call__ = lambda self, *a: clocked("C stack", stack_call)(self, *a)
    else:
        impl = model.config._attn_implementation
        ALL_ATTENTION_FUNCTIONS[impl] = clocked("attention", ALL_ATTENTION_FUNCTIONS[impl])  # looked up every call
        model.forward = clocked("forward", model.forward)
    g = torch.Generator().manual_seed(0)
    print(f"{type(verifier).__name__}, attention {models.attention_backend}, {args.threads} threads, "
          f"{'full logits' if args.full_logits or not isinstance(verifier, LeanModel) else 'argmax-only output'}, "
          f"median of {args.repeats} steps, ms\n")
    print("| prefix | T | step | C stack | 4-bit linears | output layer | attention | rest of model | engine |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for prefix_len in args.prefix:
        prefix = torch.randint(100, 40000, (prefix_len,), generator=g).tolist()
        verifier.reset()
        verifier.forward_chain(prefix[:-1], last_only=True)
        base = verifier.length
        for T in args.tree:
            rows = defaultdict(list)
            for rep in range(args.repeats + 1):
                spent.clear()
                tree = TokenTree.with_root(prefix[-1])
                tree.add_path(torch.randint(100, 40000, (T - 1,), generator=g).tolist(), 0)
                t0 = time.perf_counter()
                accept_greedy(tree, engine.score_tree(tree))
                verifier.crop(base)
                step = time.perf_counter() - t0
                if rep == 0:
                    continue  # the first pass of a shape allocates
                parts = {k: v * 1000 for k, v in spent.items()}
                rows["step"].append(step * 1000)
                parted = ("C stack", "4-bit linears", "output layer", "attention")
                for k in parted:
                    rows[k].append(parts.get(k, 0.0))
                rows["rest"].append(parts["forward"] - sum(parts.get(k, 0.0) for k in parted))
                rows["engine"].append(step * 1000 - parts["forward"])
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(f"| {prefix_len} | {T} | {med['step']:.1f} | {med['C stack']:.1f} | {med['4-bit linears']:.1f} | {med['output layer']:.1f} "
                  f"| {med['attention']:.1f} | {med['rest']:.1f} | {med['engine']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
