"""feature_train.make_batch: each window's rows line up (x_t, x_{t-1}, f_{t-1} in; f_t and the top tokens at
t out); a head that reads the previous token (prev_token) learns from them to copy what followed an
earlier occurrence of its input token, which a one-layer head without it cannot."""

from __future__ import annotations

from dataclasses import replace

import torch

from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
from spectui.engine.tune.feature_train import FeatureTrainConfig, batch_loss, make_batch, windows

V, H = 24, 32
CONFIG = FeatureHeadConfig(hidden=H, heads=2, kv_heads=1, head_dim=16, intermediate=48, draft_vocab=V, prev_token=True)


def part(lengths: list[int], answer_at: list[int], seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return {"ids": torch.randint(0, V, (n,), generator=g, dtype=torch.int32),
            "hidden": torch.randn(n, H, generator=g).bfloat16(),
            "top_ids": torch.randint(0, V, (n, 4), generator=g, dtype=torch.int32),
            "top_logp": torch.full((n, 4), -1.4).half(),
            "starts": starts, "answer_starts": starts[:-1] + torch.tensor(answer_at)}


def test_rows_line_up_within_each_sequence():
    p = part([9, 14], [4, 6])
    chosen = windows([p], window=5)
    tokens, prev, target, positions, top, logp, weights, before = make_batch([p], chosen, torch.arange(V), 0.5)
    ids = p["ids"].long()
    for b, (_, s, e, a) in enumerate(chosen):
        n = e - s - 1
        assert tokens[b, :n].tolist() == ids[s + 1 : e].tolist()
        assert before[b, :n].tolist() == ids[s : e - 1].tolist()  # the token before each input: x_{t-1}
        assert torch.equal(prev[b, :n], p["hidden"][s : e - 1]) and torch.equal(target[b, :n], p["hidden"][s + 1 : e])
        assert top[b, :n].tolist() == p["top_ids"][s + 1 : e].long().tolist()
        assert not weights[b, n:].any()  # a short window's padding does not count


def induction_data(n: int, g: torch.Generator, half: int = 8, gap: int = 8) -> tuple[dict, torch.Tensor]:
    """n sequences: `half` distinct random tokens, 0 .. gap other ones, then the first `half` again; the target
    at each position is the next token (one-hot), the verifier's features all zero. In the repeat the next
    token is what followed the current one the first time, at an offset that varies: only a look back by
    token can find it. -> (a features part, [n, L] True at the repeat's inputs that have such a target)."""
    L = 2 * half + gap
    ids = torch.zeros(n, L, dtype=torch.long)
    where = torch.zeros(n, L, dtype=torch.bool)
    top = torch.zeros(n, L, dtype=torch.long)
    lengths = []
    for b in range(n):
        pool = torch.randperm(V, generator=g)
        r = int(torch.randint(0, gap + 1, (1,), generator=g))
        seq = torch.cat([pool[:half], pool[half : half + r], pool[:half]])
        ids[b, : len(seq)] = seq
        top[b, : len(seq) - 1] = seq[1:]
        where[b, half + r : len(seq) - 1] = True
        lengths.append(len(seq))
    flat = torch.cat([ids[b, :n_] for b, n_ in enumerate(lengths)])
    tops = torch.cat([top[b, :n_] for b, n_ in enumerate(lengths)])
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    part = {"ids": flat.int(), "hidden": torch.zeros(len(flat), H).bfloat16(), "top_ids": tops[:, None].repeat(1, 4).int(),
            "top_logp": torch.tensor([0.0, -30.0, -30.0, -30.0]).half().repeat(len(flat), 1),
            "starts": starts, "answer_starts": starts[:-1]}
    return part, where


def repeat_hits(prev_token: bool, steps: int = 300, lr: float = 1e-2) -> float:
    """Train on fresh sequences every step (nothing to memorise) -> top-1 hits over a new batch's repeats."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    head = FeatureHead(replace(CONFIG, prev_token=prev_token))
    head.vocab_ids.copy_(torch.arange(V))
    head.attach(torch.randn(V, H), torch.randn(V, H))
    cfg = FeatureTrainConfig(second_step=False, cls_weight=1.0)
    opt = torch.optim.Adam(head.parameters(), lr=lr)

    def batch(n):
        part, where = induction_data(n, g)
        chosen = [(0, s, e, s) for s, e in zip(part["starts"][:-1].tolist(), part["starts"][1:].tolist())]  # whole sequences
        tokens, *rest = make_batch([part], chosen, torch.arange(V), 1.0)
        return (tokens, *rest), where[:, 1 : tokens.shape[1] + 1]  # row t of the batch is input x_{t+1}

    for _ in range(steps):
        loss, _, _, _ = batch_loss(head, batch(32)[0], cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    test, where = batch(64)
    with torch.no_grad():
        _, hit, _, _ = batch_loss(head, test, cfg)
    return float(hit[where].float().mean())


def test_only_a_prev_token_head_learns_to_copy_from_earlier_in_the_sequence():
    assert repeat_hits(prev_token=True) > 0.8
    assert repeat_hits(prev_token=False) < 0.3  # one layer, no previous token: no induction
