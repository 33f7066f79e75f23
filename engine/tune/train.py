"""Train one SSM: boost-weighted cross-entropy on the verifier's answer tokens, resumable.

- Sequences: prompt ids + answer ids (the last `max_seq_len` tokens when longer). Only positions
  whose next token is an answer token carry loss: the prompt is the user's, not the verifier's.
- Batches: sequences sorted by length and cut into groups of at most `batch_tokens` padded tokens
  (right padding: causal attention never lets a real position see a pad); each epoch visits the
  groups in a fresh order drawn from (seed, SSM index, epoch), so the schedule is a pure function
  of the data and the step number, which is what makes --resume exact.
- Loss: L = sum_t w_t CE(q_t, y_t) / sum_t w_t with w from boost.py; the vocabulary projection
  runs in chunks of positions on detached hidden states (its [N, V] logits dominate memory).
- AdamW, linear warmup then a cosine decay to lr * min_lr_ratio (LambdaLR).
- Checkpoints every `checkpoint_every` steps and at the end: OUT/ssm-K/checkpoint.pt holds model,
  optimizer, scheduler, step and RNG state, only tensors and plain types (dicts, lists, numbers,
  strings), so --resume loads it with `torch.load(weights_only=True)`: a checkpoint file can
  never run code; one that holds anything else is refused (CheckpointError). The final SSM is
  saved with save_pretrained (safetensors, bf16) plus the verifier's tokenizer; model.safetensors
  is moved in last, so its presence means the SSM is finished.
"""

from __future__ import annotations

import math
import os
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .boost import weighted_cross_entropy
from .distill import answer_rows, distill_loss, with_prompt_positions

LOGIT_CHUNK = 1024  # positions per vocabulary-projection chunk: [1024, 49152] fp32 logits = 200 MB


@dataclass
class Sequence:
    ids: list[int]  # prompt + answer, truncated on the left to max_seq_len
    start: int  # first position whose next token is an answer token; targets = ids[start + 1:]
    mode: str = "sample"  # how the verifier produced the answer: "greedy" | "sample"

    @property
    def targets(self) -> list[int]:
        return self.ids[self.start + 1 :]


def to_sequences(examples, max_seq_len: int) -> list[Sequence]:
    out = []
    for e in examples:
        ids = list(e.prompt_ids) + list(e.answer_ids)
        cut = max(0, len(ids) - max_seq_len)
        start = max(len(e.prompt_ids) - 1 - cut, 0)
        if e.answer_ids and len(ids) - cut >= 2:
            out.append(Sequence(ids[cut:], start, e.mode))
    return out


def make_batches(seqs: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so that len(group) * longest <= batch_tokens (one sequence at least)."""
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].ids), i))
    groups, group, longest = [], [], 0
    for i in order:
        n = len(seqs[i].ids)
        if group and (len(group) + 1) * max(longest, n) > batch_tokens:
            groups.append(group)
            group, longest = [], 0
        group.append(i)
        longest = max(longest, n)
    if group:
        groups.append(group)
    return groups


def collate(seqs: list[Sequence], pad_id: int = 0):
    """-> ids [B, T] (right padded), answer mask [B, T] (True where the next token is a target)."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        ids[row, : len(s.ids)] = torch.tensor(s.ids)
        mask[row, s.start : len(s.ids) - 1] = True
    return ids, mask


def epoch_order(n_batches: int, seed: int, ssm_index: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + ssm_index * 10_007 + epoch)
    return torch.randperm(n_batches, generator=g).tolist()


def total_steps(n_batches: int, epochs: float) -> int:
    return max(1, math.ceil(epochs * n_batches))


def planned_tokens(seqs: list[Sequence], cfg) -> int:
    """Tokens (with prompts, without padding) one SSM's training reads: for the progress bar."""
    batches = make_batches(seqs, cfg.batch_tokens)
    full, part = divmod(total_steps(len(batches), cfg.epochs), len(batches))
    per_epoch = sum(len(s.ids) for s in seqs)
    return full * per_epoch + (part and round(per_epoch * part / len(batches)))


def lr_lambda(total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the base lr at step s: (s+1)/warmup, then min + (1-min)(1 + cos(pi p))/2, p in [0, 1]."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def autocast(device: torch.device, enabled: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def native_bf16() -> bool:
    """This CPU computes bf16 natively (AVX512-BF16); elsewhere torch emulates it, on one thread, ~6x
    slower than fp32 (a 2048x576 by 576x1536 product and its backward on an AVX2 CPU: 539 ms vs 94)."""
    return getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()


def train_step(model, ids, mask, weights, use_bf16: bool, teacher=None, soft_weight: float | torch.Tensor = 0.0) -> float:
    """One forward/backward: ids [B, T], mask [B, T], weights [N] (N = mask.sum()) -> loss value.

    teacher: the verifier's (top_ids [N, K], top_logp [N, K]) at the same positions (distill.py);
    with it the loss mixes soft targets in at `soft_weight`, without it it is the hard-label loss.
    """
    device = next(model.parameters()).device
    ids, mask, weights = ids.to(device), mask.to(device), weights.to(device)
    targets = ids[:, 1:][mask[:, :-1]]  # [N]: the next token at every answer position, row-major
    with autocast(device, use_bf16):
        hidden = model.model(input_ids=ids).last_hidden_state  # [B, T, H]
    selected = hidden[mask]  # [N, H], same row-major order as targets and weights
    detached = selected.detach().float().requires_grad_()
    total = weights.sum().clamp_min(1e-8)
    loss = 0.0
    for lo in range(0, targets.numel(), LOGIT_CHUNK):
        part = slice(lo, lo + LOGIT_CHUNK)
        with autocast(device, use_bf16):
            logits = model.lm_head(detached[part])  # [C, V]
        if teacher is None:
            chunk = weighted_cross_entropy(logits, targets[part], weights[part], total)
        else:
            soft = soft_weight[part] if torch.is_tensor(soft_weight) else soft_weight
            chunk = distill_loss(logits, targets[part], weights[part], teacher[0][part], teacher[1][part], soft, total)
        chunk.backward()  # grads into the tied embedding and detached.grad
        loss += chunk.item()
    selected.backward(detached.grad.to(selected.dtype))  # through the trunk
    return loss


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded safely (weights_only) or lacks what a resume needs."""


def checkpoint_path(folder: Path) -> Path:
    return Path(folder) / "checkpoint.pt"


def save_checkpoint(folder: Path, model, optimizer, scheduler, step: int, total: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    state = dict(  # tensors and plain types only: load_checkpoint reads it with weights_only=True
        model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
        step=int(step), total_steps=int(total), rng=torch.get_rng_state(),
    )
    tmp = checkpoint_path(folder).with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, checkpoint_path(folder))


def load_checkpoint(folder: Path, device) -> dict:
    """The state save_checkpoint wrote, unpickled with weights_only=True (no code runs); CheckpointError otherwise."""
    path = checkpoint_path(folder)
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"checkpoint {path} holds more than tensors and plain types, refused unread; "
                              "delete it to train this SSM from the start") from None
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt: RuntimeError, EOFError, ...
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(exc).__name__}); "
                              "delete it to train this SSM from the start") from None
    needed = {"model": dict, "optimizer": dict, "scheduler": dict, "step": int, "total_steps": int, "rng": torch.Tensor}
    if not isinstance(state, dict) or any(not isinstance(state.get(k), t) for k, t in needed.items()):
        raise CheckpointError(f"checkpoint {path} lacks the state a resume needs; delete it to train this SSM from the start")
    return state


def is_finished(folder: Path) -> bool:
    return (Path(folder) / "model.safetensors").exists() and (Path(folder) / "config.json").exists()


def save_final(model, tokenizer, folder: Path, info: dict | None = None) -> None:
    """save_pretrained in bf16 (safetensors) + the verifier's tokenizer (+ info as spectui-tune.json).

    The weights file lands last, so a folder with model.safetensors is complete.
    """
    import json

    tmp = folder.parent / f".{folder.name}.saving"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    model.float()
    tokenizer.save_pretrained(tmp)
    if info is not None:
        (tmp / "spectui-tune.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in tmp.iterdir())
    for name in [n for n in names if n != "model.safetensors"] + ["model.safetensors"]:
        os.replace(tmp / name, folder / name)
    shutil.rmtree(tmp, ignore_errors=True)


def train_ssm(
    model,
    seqs: list[Sequence],
    weights: list[torch.Tensor],  # per sequence [len(targets)]
    cfg,
    ssm_index: int,
    folder: Path,
    tick: Callable[[int], None] = lambda n: None,
    log: Callable[[str], None] = lambda line: None,
    after_step: Callable[[int, float], None] | None = None,
    teacher: list | None = None,  # per sequence the verifier's (top_ids, top_logp) rows (teacher.py)
) -> dict:
    """Train `model` in place (resuming from folder/checkpoint.pt when cfg.resume); -> stats."""
    device = next(model.parameters()).device
    use_bf16 = cfg.autocast_bf16 and (device.type == "cuda" or native_bf16())
    batches = make_batches(seqs, cfg.batch_tokens)
    total = total_steps(len(batches), cfg.epochs)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)  # no weight decay on norms
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    warmup = min(cfg.warmup_steps, total // 10 + 1)  # short runs (tests) warm up for a tenth of their steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total, warmup, cfg.min_lr_ratio))
    step = 0
    if cfg.resume and checkpoint_path(folder).exists():
        state = load_checkpoint(folder, device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"].cpu())  # the CPU generator's state, whatever map_location moved it to
        step = state["step"]
        if state["total_steps"] != total:
            log(f"ssm-{ssm_index}: checkpoint planned {state['total_steps']} steps, the data now gives {total}")
        log(f"ssm-{ssm_index}: resuming from the checkpoint at step {step}/{total}")
    model.train()

    def group_at(s: int) -> list[int]:  # the sequence indices of step s
        epoch, within = divmod(s, len(batches))
        return batches[epoch_order(len(batches), cfg.seed, ssm_index, epoch)[within]]

    tick(sum(len(seqs[i].ids) for s in range(step) for i in group_at(s)))  # resumed progress
    started, seen, losses = time.perf_counter(), 0, []
    while step < total:
        indices = group_at(step)
        batch, soft, rows = [seqs[i] for i in indices], cfg.soft_weight, None
        w = torch.cat([weights[i] for i in indices])  # [N]
        if teacher is not None:
            if cfg.prompt_weight > 0:  # the prompts' positions too, soft targets only (distill.py)
                batch, w, soft = with_prompt_positions(batch, [weights[i] for i in indices], cfg.prompt_weight, soft)
            rows = answer_rows([teacher[i] for i in indices], batch)
        ids, mask = collate(batch)  # [B, T], [B, T]
        loss = train_step(model, ids, mask, w, use_bf16, rows, soft)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        n_tokens = sum(len(seqs[i].ids) for i in indices)
        seen += n_tokens
        losses.append(loss)
        tick(n_tokens)
        if step % cfg.checkpoint_every == 0 or step == total:
            save_checkpoint(folder, model, optimizer, scheduler, step, total)
            recent = losses[-50:]
            log(f"ssm-{ssm_index}: step {step}/{total}, loss {sum(recent) / len(recent):.3f}, checkpoint saved")
        if after_step is not None:
            after_step(step, loss)
    model.eval()
    elapsed = time.perf_counter() - started
    return dict(steps=total, final_loss=sum(losses[-50:]) / max(1, len(losses[-50:])) if losses else None,
                tokens_per_s=seen / elapsed if elapsed > 0 and seen else None)
