"""End to end: the verifier's tree steps through the Triton kernel (interpreted on CPU) produce
the same greedy tokens as the torch backend, on the embedded default model.

The model is loaded with the "spectui_tree" attention, which reads SPECTUI_ATTENTION at every call,
so one loaded model serves both runs.
"""

from __future__ import annotations

import pytest

from spectui.engine.chat import encode_chat
from spectui.engine.drafters import NGramDrafter
from spectui.engine.settings import GenerationSettings
from spectui.engine.speculative import SpeculativeEngine
from spectui.kernels.hf_attention import last_backend

PROMPTS = [
    "Repeat exactly: one two three, one two three, one two three.",
    "Spell the word banana letter by letter.",
]


def run(models, prompt, monkeypatch, backend):
    monkeypatch.setenv("SPECTUI_ATTENTION", backend)
    engine = SpeculativeEngine(models.verifier, models.tokenizer, [NGramDrafter()], models.stop_token_ids())
    ids = encode_chat(models.tokenizer, [{"role": "user", "content": prompt}])
    events = list(engine.generate(ids, GenerationSettings(max_new_tokens=16, tree_shape=(1, 1, 1))))  # n-gram drafts every step
    tree_steps = sum(1 for e in events if e.drafted > 0)
    return [t for e in events for t in e.new_tokens], tree_steps


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_triton_backend_matches_torch_backend(tree_attention_models, monkeypatch, prompt):
    torch_tokens, _ = run(tree_attention_models, prompt, monkeypatch, "torch")
    assert last_backend() in ("torch", "sdpa-fallback")
    triton_tokens, tree_steps = run(tree_attention_models, prompt, monkeypatch, "triton")
    assert tree_steps > 0, "no tree step ran, so the kernel was not exercised"
    assert triton_tokens == torch_tokens
