"""Train a FeatureHead (engine/feature_head.py) on the verifier's features (engine/tune/features.py).

Data. Each features file holds sequences of rows; row t of a sequence has the token x_t, the
verifier's feature f_t after it and its top-K next tokens. The head's example at position t >= 1:

    input   x_t, f_{t-1}                 target  f_t (regression), the verifier's top-K at t (tokens)

Sequences are cut into windows of `window` positions (the head attends within its window; drafting
later sees the whole context, which only helps it). Windows of one length share a batch.

Loss per position (weights: answer positions 1, prompt positions `prompt_weight`):

    L_t = smooth_l1(f^_t, f_t) + cls_weight * CE(q_t, p_t)

p_t: the verifier's top-K log-probabilities renormalised over the tokens inside the draft vocabulary
(a position whose top-1 lies outside it is kept for the regression only).

Two-step positions (`second_step`): EAGLE's drafts after the first read the head's own predicted
feature, whose error the head never saw when trained only on true features. A second copy of each
window feeds f^_{t-1} (detached) in place of f_{t-1}; its row t attends to the true rows < t and to
itself, as in drafting, through one [T, 2T] mask. It doubles the cost of a batch.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..feature_head import FeatureHead
from .features import read_features


@dataclass
class FeatureTrainConfig:
    window: int = 256
    batch_windows: int = 8
    epochs: float = 1.0
    lr: float = 1e-3
    warmup: int = 30
    cls_weight: float = 0.5
    prompt_weight: float = 0.5
    second_step: bool = True
    seed: int = 0


def draft_vocabulary(parts: list[dict], size: int) -> torch.Tensor:
    """The `size` tokens the verifier ranks first most often in the data (ties: lower id), sorted."""
    counts = torch.zeros(int(max(int(p["top_ids"].max()) for p in parts)) + 1, dtype=torch.long)
    for part in parts:
        counts += torch.bincount(part["top_ids"][:, 0].long(), minlength=len(counts))[: len(counts)]
    return torch.sort(torch.topk(counts, min(size, len(counts))).indices).values


def windows(parts: list[dict], window: int) -> list[tuple[int, int, int, int]]:
    """(part, first row, end row, answer start row) for every window of every sequence."""
    out = []
    for index, part in enumerate(parts):
        starts, answers = part["starts"].tolist(), part["answer_starts"].tolist()
        for s, e, a in zip(starts[:-1], starts[1:], answers):
            for lo in range(s, e - 1, window):
                out.append((index, lo, min(lo + window + 1, e), a))  # +1: row lo only gives f_{t-1}
    return out


def make_batch(parts, chosen, vocab_map: torch.Tensor, prompt_weight: float):
    """-> tensors [B, T(,...)] for windows of one length: tokens, prev, target, positions, top ids
    (draft-vocabulary indices, -1 outside), top logp, weights, the tokens before `tokens` (x_{t-1})."""
    T = max(e - s for _, s, e, _ in chosen) - 1
    B, H = len(chosen), parts[0]["hidden"].shape[1]
    K = parts[0]["top_ids"].shape[1]
    tokens = torch.zeros(B, T, dtype=torch.long)
    before = torch.zeros(B, T, dtype=torch.long)
    prev = torch.zeros(B, T, H, dtype=torch.bfloat16)
    target = torch.zeros(B, T, H, dtype=torch.bfloat16)
    top = torch.full((B, T, K), -1, dtype=torch.long)
    logp = torch.full((B, T, K), -30.0)
    positions = torch.zeros(B, T, dtype=torch.long)
    weights = torch.zeros(B, T)
    for b, (pi, s, e, a) in enumerate(chosen):
        part, n = parts[pi], e - s - 1
        seq_start = int(part["starts"][torch.searchsorted(part["starts"], torch.tensor(s), right=True) - 1])
        tokens[b, :n] = part["ids"][s + 1 : e].long()
        before[b, :n] = part["ids"][s : e - 1].long()
        prev[b, :n] = part["hidden"][s : e - 1]
        target[b, :n] = part["hidden"][s + 1 : e]
        top[b, :n] = vocab_map[part["top_ids"][s + 1 : e].long()]
        logp[b, :n] = part["top_logp"][s + 1 : e].float()
        positions[b, :n] = torch.arange(s + 1 - seq_start, e - seq_start)
        rows = torch.arange(s + 1, e)
        weights[b, :n] = torch.where(rows >= a - 1, 1.0, prompt_weight)
    return tokens, prev, target, positions, top, logp, weights, before


def position_losses(head: FeatureHead, features: torch.Tensor, target, top, logp, cls_weight: float):
    """-> (loss per position [B, T], draft top-1 == verifier top-1 [B, T] bool)."""
    reg = F.smooth_l1_loss(features.float(), target.float(), reduction="none").mean(-1)  # [B, T]
    logits = head.draft_logits(features).float()  # [B, T, Vd]
    inside = top >= 0
    p = torch.where(inside, logp, torch.full_like(logp, -1e9)).softmax(-1)  # renormalised over the draft vocab
    log_q = logits.log_softmax(-1).gather(-1, top.clamp(min=0))  # [B, T, K]
    ce = -(p * torch.where(inside, log_q, torch.zeros_like(log_q))).sum(-1)
    ce = torch.where(inside[..., 0], ce, torch.zeros_like(ce))
    hit = (logits.argmax(-1) == top[..., 0]) & inside[..., 0]
    return reg + cls_weight * ce, hit


def two_step_mask(T: int) -> torch.Tensor:
    """[1, 1, T, 2T]: second-step row t sees true rows < t (the past) and itself."""
    true_part = torch.ones(T, T, dtype=torch.bool).tril_(-1)
    return torch.cat([true_part, torch.eye(T, dtype=torch.bool)], dim=1)[None, None]


def batch_loss(head: FeatureHead, batch, cfg: FeatureTrainConfig):
    tokens, prev, target, positions, top, logp, weights, before = batch
    features, (k, v) = head(tokens, prev, positions, before=before)  # [B, T, H]
    loss, hit = position_losses(head, features, target, top, logp, cfg.cls_weight)
    total = (loss * weights).sum() / weights.sum().clamp(min=1)
    hit2 = None
    if cfg.second_step:
        # input at t: x_t with the head's own f^_{t-1} (the first position has no prediction: kept true)
        own = torch.cat([prev[:, :1].float(), features[:, :-1].detach().float()], dim=1)
        mask = two_step_mask(tokens.shape[1]).to(tokens.device)
        feats2, _ = head(tokens, own, positions, past=(k, v), mask=mask, before=before)
        loss2, hit2 = position_losses(head, feats2, target, top, logp, cfg.cls_weight)
        total = total + (loss2 * weights).sum() / weights.sum().clamp(min=1)
    return total, hit, hit2, weights


def batch_order(n_batches: int, seed: int, step: int) -> int:
    """The batch of optimizer step `step`: each epoch visits all batches in an order drawn from
    (seed, epoch), so the schedule is a function of the step number alone (what makes resume exact)."""
    epoch, within = divmod(step, n_batches)
    order = list(range(n_batches))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[within]


def train_head(head: FeatureHead, parts: list[dict], cfg: FeatureTrainConfig, log: Callable[[str], None] = print,
               budget_s: float | None = None, every_s: float = 600.0, save: Callable[[], None] = lambda: None,
               checkpoints: Path | None = None, checkpoint_every: int = 200,
               after_step: Callable[[int, float], None] | None = None, device: torch.device | None = None) -> dict:
    """AdamW with warm-up, then a cosine decay over `epochs` passes of the windows or, with budget_s,
    over that many seconds (the schedule follows the clock, so a time-boxed run ends at the low lr);
    `save` is called every `every_s` seconds and at the end. -> {"steps", "first_loss" (of this
    process's first step), "final_loss", "seconds"}.

    checkpoints: a folder for resumable training by epochs (tune.train's checkpoint format: model,
    optimizer, scheduler, step; loaded with weights_only): saved every `checkpoint_every` steps and
    at the end, and a run that finds one continues from it exactly.

    device: where the head (with its borrowed embedding and draft rows) lives; batches are built on
    the CPU and moved there (CUDA trains in bf16 autocast; a lent GPU, scripts/gpu_teacher.py)."""
    from .train import autocast, load_checkpoint, native_bf16, save_checkpoint

    vocab_map = torch.full((int(head.embed.shape[0]),), -1, dtype=torch.long)
    vocab_map[head.vocab_ids.cpu()] = torch.arange(len(head.vocab_ids))  # batches are built on the CPU
    all_windows = windows(parts, cfg.window)
    all_windows.sort(key=lambda w: w[2] - w[1])
    batches = [all_windows[i : i + cfg.batch_windows] for i in range(0, len(all_windows), cfg.batch_windows)]
    total = max(1, int(len(batches) * cfg.epochs))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    began, step, seen, hits, hits2, saved = time.perf_counter(), 0, 0.0, 0.0, 0.0, time.perf_counter()

    def progress(s: int) -> float:
        return min(1.0, (time.perf_counter() - began) / budget_s) if budget_s else min(s, total) / total

    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress(s)))))
    if checkpoints is not None and (checkpoints / "checkpoint.pt").exists():
        state = load_checkpoint(checkpoints, "cpu")
        head.load_state_dict(state["model"]), opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step = state["step"]
        log(f"feature head: resuming from the checkpoint at step {step}/{total}")
    loss_value = first_loss = float("nan")
    device = torch.device(device or "cpu")
    use_bf16 = device.type == "cuda" or native_bf16()  # else fp32: emulated bf16 is slower
    while (budget_s and time.perf_counter() - began <= budget_s) or (not budget_s and step < total):
        if time.perf_counter() - saved > every_s:
            save()
            saved = time.perf_counter()
        batch = make_batch(parts, batches[batch_order(len(batches), cfg.seed, step)], vocab_map, cfg.prompt_weight)
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        with autocast(device, use_bf16):
            loss, hit, hit2, weights = batch_loss(head, batch, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step(), sched.step()
        step += 1
        loss_value = float(loss.detach())
        first_loss = loss_value if first_loss != first_loss else first_loss  # NaN until the first step
        if checkpoints is not None and (step % checkpoint_every == 0 or step == total):
            save_checkpoint(checkpoints, head, opt, sched, step, total)
        if after_step is not None:
            after_step(step, loss_value)
        answer = weights == 1.0
        seen += float(answer.sum())
        hits += float((hit & answer).sum())
        hits2 += float((hit2 & answer).sum()) if hit2 is not None else 0.0
        if step % 20 == 0:
            log(f"step {step} (epoch {step / len(batches):.2f}) loss {loss_value:.3f} answer top-1 {hits / max(seen, 1):.3f} "
                f"two-step {hits2 / max(seen, 1):.3f} ({time.perf_counter() - began:.0f} s)")
            seen = hits = hits2 = 0.0
    save()
    return {"steps": step, "first_loss": round(first_loss, 4), "final_loss": round(loss_value, 4),
            "seconds": round(time.perf_counter() - began, 1)}


def load_parts(folder: Path, limit: int | None = None) -> list[dict]:
    files = sorted(Path(folder).glob("part-*.safetensors"))[:limit]
    return [read_features(f) for f in files]
