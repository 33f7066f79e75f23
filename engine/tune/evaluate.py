"""Agreement of SSMs with the verifier on held-out answers: the acceptance a tree can hope for.

For every held-out answer position t with verifier token y_t and SSM j's logits q_t^(j):

    top-1(j)     = mean_t [argmax q_t^(j) = y_t]               (a greedy chain of SSM j survives t)
    top-k(j)     = mean_t [y_t in top_k(q_t^(j))]              (a width-k tree level of SSM j holds y_t)
    together-1   = mean_t [exists j: argmax q_t^(j) = y_t]     (the merged tree's top-1 children)
    together-k   = mean_t [exists j: y_t in top_k(q_t^(j))]

Numbers are given for all held-out positions and for the greedy answers alone (the verifier's
argmax path: what greedy decoding accepts). SSMs run as the engine runs them (fp32 on CPU).
"""

from __future__ import annotations

from typing import Callable

import torch

from .train import LOGIT_CHUNK, Sequence, collate, make_batches


@torch.no_grad()
def predict_topk_features(head, seqs: list[Sequence], k: int, tick: Callable[[int], None] = lambda n: None) -> list[torch.Tensor]:
    """A feature head (engine/feature_head.py), teacher-forced as it drafts a first level: at position
    t >= 1 it reads the token x_t and the verifier's feature f_{t-1} (one verifier pass per sequence)
    -> per sequence its top-k tokens at each target position [len(targets), k]. As in the engine
    (feature_drafter.py), a long prompt is fed from its last CATCH_UP_WINDOW positions on."""
    from ..feature_drafter import window_offset
    from ..lean_model import LeanModel

    runner = LeanModel(head.verifier)
    runner.keep_hidden = True
    out = []
    for seq in seqs:
        runner.reset()
        runner.forward_chain(seq.ids, last_only=True)
        features = runner.hidden[0]  # [L, H]
        L = len(seq.ids)
        off = window_offset(seq.start)  # positions 1 .. off are not fed (the first root is at seq.start)
        predicted, _ = head(torch.tensor([seq.ids[off + 1 :]]), features[None, off : L - 1],
                            torch.arange(off + 1, L)[None], before=torch.tensor([seq.ids[off : L - 1]]))  # [1, L-1-off, H]
        top = head.vocab_ids[torch.topk(head.draft_logits(predicted[0]).float(), k, dim=-1).indices]  # position t = row t-1-off
        out.append(top[max(seq.start - 1, 0) - off : L - 2 - off] if seq.start >= 1 else torch.cat([top[:1], top[: L - 2]]))
        tick(L)
    runner.reset()
    return out


@torch.no_grad()
def predict_topk(model, seqs: list[Sequence], k: int, batch_tokens: int = 4096,
                 tick: Callable[[int], None] = lambda n: None) -> list[torch.Tensor]:
    """-> per sequence the SSM's top-k tokens at each target position: [len(targets), k] (best first)."""
    if getattr(model, "verifier", None) is not None:  # a feature head: it reads the verifier's features
        return predict_topk_features(model, seqs, k, tick)
    device = next(model.parameters()).device
    out: list[torch.Tensor | None] = [None] * len(seqs)
    for group in make_batches(seqs, batch_tokens):
        ids, mask = collate([seqs[i] for i in group])  # [B, T], [B, T]
        hidden = model.model(input_ids=ids.to(device)).last_hidden_state[mask.to(device)]  # [N, H]
        top = torch.cat([
            torch.topk(model.lm_head(hidden[lo : lo + LOGIT_CHUNK]).float(), k, dim=-1).indices
            for lo in range(0, hidden.shape[0], LOGIT_CHUNK)
        ]).cpu()  # [N, k]
        counts = mask.sum(dim=1).tolist()
        for i, part in zip(group, torch.split(top, counts)):
            out[i] = part
        tick(sum(len(seqs[i].ids) for i in group))
    return out  # type: ignore[return-value]


def agreement(predictions: list[list[torch.Tensor]], seqs: list[Sequence], k: int) -> dict:
    """predictions[j][i] [A_i, k] for SSM j and sequence i -> {"ssms": [...], "together": {...}, "positions": N}."""
    if not seqs or not predictions:
        return {"positions": 0, "ssms": [], "together": {}}
    targets = torch.cat([torch.tensor(s.targets) for s in seqs])  # [N]
    tops = [torch.cat(p) for p in predictions]  # each [N, k]
    top1 = torch.stack([t[:, 0] == targets for t in tops])  # [J, N]
    topk = torch.stack([(t[:, :k] == targets[:, None]).any(dim=1) for t in tops])  # [J, N]
    rate = lambda hits: round(hits.float().mean().item(), 4)  # noqa: E731
    return {
        "positions": int(targets.numel()),
        "ssms": [{"top1": rate(top1[j]), f"top{k}": rate(topk[j])} for j in range(len(tops))],
        "together": {"top1": rate(top1.any(dim=0)), f"top{k}": rate(topk.any(dim=0))},
    }


def evaluate(models_: list[tuple[str, object]], seqs: list[Sequence], k: int, batch_tokens: int,
             tick: Callable[[int], None] = lambda n: None) -> dict:
    """Agreement of each (name, SSM) and of all together, on all held-out answers and on greedy ones."""
    predictions = [predict_topk(model, seqs, k, batch_tokens, tick) for _, model in models_]
    greedy = [i for i, s in enumerate(seqs) if s.mode == "greedy"]
    report = {"all": agreement(predictions, seqs, k),
              "greedy": agreement([[p[i] for i in greedy] for p in predictions], [seqs[i] for i in greedy], k)}
    for part in report.values():
        for entry, (name, _) in zip(part["ssms"], models_):
            entry["name"] = name
    return report


def report_lines(report: dict) -> list[str]:
    """Human-readable agreement lines (held-out positions; greedy answers in brackets)."""
    k = report["top_k"]
    lines = [f"agreement with the verifier on {report['data']['held_out_positions']} held-out answer tokens "
             f"(greedy answers only in brackets):"]

    def fmt(all_: dict, greedy: dict) -> str:
        g = lambda key: f" [{greedy[key]:.1%}]" if greedy.get(key) is not None else ""  # noqa: E731
        return f"top-1 {all_.get('top1', 0):.1%}{g('top1')}, top-{k} {all_.get(f'top{k}', 0):.1%}{g(f'top{k}')}"

    for entry in report["ssms"]:
        agreement = entry.get("agreement", {})
        lines.append(f"  {entry['name']}: {fmt(agreement.get('all', {}), agreement.get('greedy', {}))}")
    lines.append(f"  together (any SSM): {fmt(report['together']['all'], report['together']['greedy'])}")
    return lines
