"""The verifier's output layer on CPU: fast for tree passes, argmax-exact against one-token decoding.

A one-token step computes its logits the "canonical" way: the hidden row x [D] is paired with
itself and multiplied as W [V, D] @ [x, x]^T, one column kept. (MKL's matrix-vector path for a single
row is 2-3x slower than this two-column product on two cores: 10 ms against 3.8 ms for a
49,152 x 576 head.) Every one-token forward -- transformers' own `generate` included -- goes this
way, so the canonical logits are the verifier's logits.

A tree pass over T > 1 rows uses one product W @ X^T [V, T], whose rounding differs from the
canonical one in the last bits. The argmax is what greedy verification needs, and a rounding bound
says when the two argmaxes must agree. For any order of summation, an fp32 dot product of length D
satisfies (Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5)

    |fl(w . x) - w . x| <= gamma_D * sum_i |w_i x_i| <= gamma_D * |w| |x|,   gamma_D = D u / (1 - D u),

with u = 2^-24. Both the fast and the canonical logit of token v lie within e = gamma_D * W_max * |x| of
the exact value (W_max = the largest row norm of W), so they differ by at most 2e. When the fast
top-1 a beats the fast runner-up by more than 4e, the canonical top-1 is the same token. Otherwise
(well under 10% of rows) the tighter per-token bound e_v = gamma_D * sum_i |w_vi x_i| is computed for
the few candidates v within 4e of the top, and the row is clear if f_a - f_v > 2 (e_a + e_v) for each.
Rows still unclear (a true near-tie, about 1 in 100) are recomputed the canonical way, and their
logits are then exactly what a one-token step would give.

So greedy verification picks, at every node, the very token one-token decoding would pick. Logits of
the other rows differ from the canonical ones by at most 2e (about 1e-4 here): sampling reads
probabilities that close to the one-token ones.
"""

from __future__ import annotations

import torch

U32 = 2.0**-24  # unit roundoff of float32


class GuardedHead(torch.nn.Module):
    """Drop-in for a bias-free fp32 `lm_head` (nn.Linear D -> V); shares its weight Parameter."""

    def __init__(self, weight: torch.nn.Parameter) -> None:
        super().__init__()
        self.weight = weight  # [V, D], tied to the embedding where the model ties them
        V, D = weight.shape
        self.in_features, self.out_features = D, V
        self.gamma = D * U32 / (1 - D * U32) * (1 + 1e-3)  # slack: the bounds are themselves computed in fp32
        with torch.no_grad():
            w_max = float(weight.float().norm(dim=1).max())
        self.margin_per_norm = 4.0 * self.gamma * w_max
        self.recomputed = 0  # rows recomputed the canonical way (a counter for tests and profiles)

    def canonical(self, x: torch.Tensor) -> torch.Tensor:
        """x [D] -> logits [V], the one-token way."""
        pair = x[None].expand(2, -1).contiguous()  # [2, D]
        return (self.weight @ pair.T)[:, 0]  # [V]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] -> logits [..., V]."""
        lead = hidden.shape[:-1]
        x = hidden.reshape(-1, hidden.shape[-1])  # [M, D]
        if x.shape[0] == 1:
            return self.canonical(x[0]).view(*lead, -1)
        logits = (self.weight @ x.T).T.contiguous()  # [M, V]
        top2 = logits.topk(2, dim=-1).values  # [M, 2]
        unclear = (top2[:, 0] - top2[:, 1]) <= self.margin_per_norm * x.norm(dim=-1)  # [M]
        for row in unclear.nonzero().flatten().tolist():
            if not self.clear(logits[row], x[row]):
                logits[row] = self.canonical(x[row])
                self.recomputed += 1
        return logits.view(*lead, -1)

    def clear(self, f: torch.Tensor, x: torch.Tensor) -> bool:
        """True if the fast logits f [V] of row x [D] surely have the canonical argmax (per-token bound)."""
        a = int(f.argmax())
        cand = (f >= f[a] - self.margin_per_norm * x.norm()).nonzero().flatten()  # [C], a among them
        e = self.gamma * (self.weight[cand].abs() @ x.abs())  # [C] per-token rounding bounds
        e_a = e[cand == a]
        gap = f[a] - f[cand]  # [C]
        others = cand != a
        return bool((gap[others] > 2 * (e_a + e[others])).all())


def install_guarded_head(model) -> bool:
    """Swap a CPU causal LM's fp32, bias-free lm_head for a GuardedHead (same weight); True if done."""
    head = getattr(model, "lm_head", None)
    if (not isinstance(head, torch.nn.Linear) or head.bias is not None or head.weight.dtype != torch.float32
            or head.weight.device.type != "cpu"):
        return False
    model.lm_head = GuardedHead(head.weight)
    return True
