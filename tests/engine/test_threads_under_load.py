"""The engine's threads under other processes' load (engine/threads.py): a verifier pass has the same bits at
any thread count, so the engine may drop to one thread while other processes hold the cores, and its
answer stays transformers' greedy answer."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from spectui.engine.chat import encode_chat
from spectui.engine.lean_model import LeanModel
from spectui.engine.loading import build_engine
from spectui.engine.settings import GenerationSettings

PROMPT = "Explain what a binary search does, step by step."


@pytest.fixture
def saved_threads():
    saved = torch.get_num_threads()
    yield saved
    torch.set_num_threads(saved)


def passes(runner: LeanModel, ids: list[int], answer: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of a prefill and of one-token passes over `answer`, then of the answer as one chain."""
    runner.reset()
    one = [runner.forward_chain(ids)[-1:]] + [runner.forward_chain([t]) for t in answer]
    runner.reset()
    runner.forward_chain(ids)
    return torch.cat(one), runner.forward_chain(answer)


def test_a_verifier_pass_has_the_same_bits_at_one_and_two_threads(embedded_models, saved_threads):
    m = embedded_models
    runner = LeanModel(m.verifier)
    if not runner.thread_invariant:
        pytest.skip("the verifier does not run spectui's C kernels here (no compiler or no AVX2)")
    ids = encode_chat(m.tokenizer, [{"role": "user", "content": PROMPT}])
    answer = [int(t) for t in m.tokenizer.encode(" Binary search halves the range each time.")]
    torch.set_num_threads(2)
    one_2, chain_2 = passes(runner, ids, answer)
    torch.set_num_threads(1)
    one_1, chain_1 = passes(runner, ids, answer)
    assert torch.equal(one_1, one_2) and torch.equal(chain_1, chain_2)  # bitwise, every logit


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


def test_other_processes_on_every_core_drop_the_engine_to_one_thread_and_the_answer_stays_exact(
        embedded_models, saved_threads):
    m = embedded_models
    engine = build_engine(m)
    if not engine.verifier.thread_invariant or (os.cpu_count() or 1) < 2:
        pytest.skip("needs spectui's C kernels and two cores")
    ids = encode_chat(m.tokenizer, [{"role": "user", "content": PROMPT}])
    x = torch.tensor([ids])
    with torch.inference_mode():
        reference = m.verifier.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=40, do_sample=False,
                                        eos_token_id=m.stop_token_ids(), pad_token_id=m.stop_token_ids()[0])
    torch.set_num_threads(2)
    settings = GenerationSettings(max_new_tokens=40, tree_shape="auto")
    loops = busy_loops(os.cpu_count() or 2)
    try:
        first = list(engine.generate(ids, settings))
        after_first = torch.get_num_threads()
        second = list(engine.generate(ids, settings))
    finally:
        for loop in loops:
            loop.kill()
    for events in (first, second):
        assert [t for e in events for t in e.new_tokens] == reference[0, len(ids):].tolist()
    counts = [e.threads for e in first]
    assert counts[0] == 2 and min(counts) == 1, counts  # the prefill at two, then one beside the loops
    assert second[0].threads == 1  # the next answer resumes where the last one ended
    assert after_first == torch.get_num_threads() == 2  # between answers the count is the caller's
    assert engine.governor.switches >= 1
