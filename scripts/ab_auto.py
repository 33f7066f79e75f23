#!/usr/bin/env python
# Usage: .venv/bin/python scripts/ab_auto.py PROMPTS.jsonl PER_CATEGORY MAX_NEW_TOKENS ROUNDS
"""A/B with repeats: per prompt, incremental and auto alternate ROUNDS times; medians of per-round ratios."""
import time, json, sys, statistics, math, torch
from pathlib import Path
from spectui.engine import GenerationSettings, RunSpec, encode_chat, load_engine
torch.set_num_threads(2)
from spectui import paths
import os
if os.environ.get("AB_SSM_DTYPE"):  # compare SSM dtypes: AB_SSM_DTYPE=float32 (own cost cache)
    import spectui.engine.loading as loading  # an experiment on the engine's internals
    loading.drafter_dtype = lambda device: getattr(torch, os.environ["AB_SSM_DTYPE"])
models, engine = load_engine(RunSpec("smollm2-135m"), cost_cache=paths.cache_dir() / f"costs{os.environ.get('AB_SSM_DTYPE', '')}",
                             models_dir=paths.models_dir())
path, per, N, ROUNDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(path)]
seen = {}; prompts = []
for r in rows:
    c = r.get("category", "generic"); seen[c] = seen.get(c, 0) + 1
    if seen[c] <= per: prompts.append((c, r["turns"][0]))
inc, auto = GenerationSettings(max_new_tokens=N, speculate=False), GenerationSettings(max_new_tokens=N)
def run(ids, s):
    t = time.perf_counter(); toks = []
    for e in engine.generate(ids, s): toks += e.new_tokens
    return len(toks) / (time.perf_counter() - t), e
ids = encode_chat(models.tokenizer, [{"role": "user", "content": "Hello"}], models.chat_template)
run(ids, inc); run(ids, auto)
allr = {}
for k, (cat, p) in enumerate(prompts):
    ids = encode_chat(models.tokenizer, [{"role": "user", "content": p}], models.chat_template)
    ratios, shown, acc = [], [], []
    for r in range(ROUNDS):
        order = [inc, auto] if (k + r) % 2 == 0 else [auto, inc]
        res = {id(s): run(ids, s) for s in order}
        ratios.append(res[id(auto)][0] / res[id(inc)][0]); shown.append(res[id(auto)][1].speedup); acc.append(res[id(auto)][1].mean_accepted)
    med = statistics.median(ratios); allr.setdefault(cat, []).append(med)
    print(f"{k:2d} {cat:14s} P={len(ids):4d} ratio median {med:.2f} rounds {[round(x,2) for x in ratios]} shown {[round(x,2) for x in shown]} tok/step {statistics.mean(acc):.2f}", flush=True)
g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
for c, v in allr.items(): print(c, f"geomean {g(v):.2f} min {min(v):.2f}")
every = [x for v in allr.values() for x in v]; print("all", f"geomean {g(every):.2f} min {min(every):.2f}")
print(json.dumps(engine.cost_model.to_dict()))
