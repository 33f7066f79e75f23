#!/usr/bin/env python
# Usage: .venv/bin/python scripts/ttft_turns.py
"""Time to first token per chat turn, with and without reusing the conversation's KV cache."""
import time, sys, torch
from pathlib import Path
from spectui.engine import Conversation, GenerationSettings, RunSpec, load_engine
torch.set_num_threads(2)
from spectui import paths
models, engine = load_engine(RunSpec("smollm2-135m"), cost_cache=paths.costs_dir(), models_dir=paths.models_dir())
turns = ["Tell me about the history of Paris in a few sentences.", "What about London?", "Compare their populations.",
         "Which one has more museums?", "Summarize our conversation in two sentences."]
settings = GenerationSettings(max_new_tokens=96)
for reuse in (False, True):
    conv = Conversation()
    for n, text in enumerate(turns, 1):
        conv.add("user", text)
        ids, _ = conv.prompt_ids(models.tokenizer, models.context_window, 96, models.chat_template)
        start = time.perf_counter(); first = None; reply = []
        for e in engine.generate(ids, settings, reuse=reuse):
            if first is None: first = (time.perf_counter() - start) * 1000
            reply.append(e.new_text)
        conv.add("assistant", "".join(reply))
        print(f"reuse={reuse} turn {n}: prompt {len(ids)} tokens, prefilled {engine.prefilled}, ttft {first:.0f} ms")
