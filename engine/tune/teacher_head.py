"""The verifier's output layer for making training data: a bf16 or int8 product, its top redone in fp32.

Feature data (engine/tune/features.py) keeps, at every position, the verifier's top-4 next tokens
and their log-probabilities, so every row of every prompt and answer needs the full [V] logits.
The verifier's own output layer (kernels/guarded_head.py) multiplies in fp32: on this 2-core CPU
(AVX512-BF16, no AMX) 0.45-0.8 ms a row for SmolLM2's 49,152 x 576 head, against 0.17-0.25 ms for
the same product with bf16 weights and inputs. It was 40 % of the time a shard of answers took.

TeacherHead takes the fast product and repairs the part that matters:

    fast   = bf16(x) @ bf16(W)^T, rounded to bf16              [n, V]
    top    = the C largest of fast, per row                    [n, C]
    logits = fast, with the `top` entries replaced by x . W_v in fp32 (the exact weights)

A bf16 logit is within about |l| 2^-8 of the fp32 one (weights, input and output each rounded to
8 significant bits), under 0.1 for SmolLM2's logits, so the fp32 top tokens are among the C = 16
largest fast ones unless 16 tokens tie within that: then any of them is the verifier's choice to
within its own rounding. The top-k kept and the argmax decoding takes are fp32 values (a different
summation order than the canonical one-token product: they agree to about 1e-5); the log-softmax's
normaliser takes the tail from bf16 logits, whose errors are unbiased and whose mass is small next
to the top's. Measured on three shards of 32 tuning prompts (31,402 rows; docs/tuning.md): the same
answers, the same top-4 ids everywhere, log-probabilities within 0.06 (mean about 2e-3);
tests/engine/test_teacher_head.py checks the same on the embedded verifier.

Without AVX512-BF16 (the AVX2 kind) torch's bf16 product is emulated and slower than fp32's: 98
ms for 32 rows against 25 ms for W x^T in fp32 (2-core AMD EPYC, Zen 3). There the fast product is
the int8 one that drafters' output layers use (kernels/dense_cpu.py Int8Kernel, kernels/screen_int8.c:
vpmaddwd over int8 weights with a per-row scale, the input in two int8 levels), whose error is about
twice bf16's (screen_int8.py's bound): 29 rows 43.8 -> 14.0 ms, 256 rows 250 -> 172 ms; a greedy
shard of 32 Magpie answers 34.4 / 35.3 -> 29.0 / 33.1 s, of 32 tuning prompts from 19,000 on (long
passages) 73.4 / 72.0 -> 51.7 / 58.0 s, the same answers and top-4 tokens (/work/exp/k51, 2-core AMD
EPYC, Zen 3). Its top C are redone in fp32 as above.
Where neither applies (no C kernels), W x^T in fp32 alone: every logit an fp32 dot product with the
exact weights (another summation order than the canonical one-token product: they agree to about
1e-5).

Training data only: a verifier that decodes for a user keeps its own output layer.
"""

from __future__ import annotations

import torch

from ...kernels import screen_int8
from ...kernels.dense_cpu import Int8Kernel

CANDIDATES = 16  # fast logits recomputed in fp32 per row


def default_product() -> str:
    """bf16 where the CPU multiplies bf16 natively, else int8 where screen_int8.c builds, else fp32."""
    if torch.cpu._is_avx512_bf16_supported():
        return "bf16"
    return "int8" if screen_int8.available() else "fp32"


class TeacherHead:
    """hidden [n, H] -> logits [n, V] fp32, from the verifier's output weight [V, H] (see above). product:
    "bf16" or "int8" (a fast product whose top C are redone in fp32) or "fp32" (W x^T alone); default
    default_product()."""

    def __init__(self, weight: torch.Tensor, candidates: int = CANDIDATES, product: str | None = None) -> None:
        self.weight = weight.detach().float()  # [V, H]: the same storage when the weight is fp32
        self.product = product or default_product()
        if self.product == "int8" and not screen_int8.fits(self.weight.shape[1]):
            self.product = "fp32"
        self.fast = None  # fp32: W x^T alone
        if self.product == "bf16":
            self.fast = weight.detach().to(torch.bfloat16).contiguous()  # [V, H]
        elif self.product == "int8":
            self.fast = Int8Kernel(self.weight)  # x [n, H] -> [n, V] fp32
        self.candidates = candidates

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.reshape(-1, hidden.shape[-1]).float()  # [n, H]
        if self.fast is None:
            return (self.weight @ x.T).T.contiguous().view(*hidden.shape[:-1], -1)  # [V, n] -> [n, V]
        if self.product == "bf16":
            logits = (x.to(torch.bfloat16) @ self.fast.T).float()  # [n, V]
        else:
            logits = self.fast(x.contiguous())  # [n, V] fp32, within the int8 screen's bound
        top = logits.topk(self.candidates, dim=-1).indices  # [n, C]
        exact = torch.bmm(self.weight[top], x[:, :, None])[:, :, 0]  # [n, C, H] @ [n, H, 1] -> [n, C]
        return logits.scatter_(1, top, exact).view(*hidden.shape[:-1], -1)


def use_teacher_head(runner):
    """Give a LeanModel of the verifier TeacherHead as its output layer (training data only) -> runner.
    None (the verifier is not one LeanModel runs) stays None."""
    if runner is not None:
        runner.output_layer = TeacherHead(runner.head.weight)
    return runner
