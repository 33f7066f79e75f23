"""TeacherHead (engine/tune/teacher_head.py): training data's output layer keeps the verifier's top tokens.

Feature data keeps the verifier's top-4 next tokens and their log-probabilities at every position,
and greedy answers follow its argmax. TeacherHead computes the logits from bf16 or int8 products and
redoes the largest in fp32; on the embedded verifier's real rows it must give the same top-4 tokens, the
same argmax and log-probabilities within a few hundredths, and leave batched answers unchanged.
"""

from __future__ import annotations

import pytest
import torch

from spectui.engine.lean_model import LeanModel
from spectui.engine.tune.data import answer_batch, prompt_ids
from spectui.engine.tune.features import FeatureRows
from spectui.engine.tune.teacher import top_rows
from spectui.engine.tune.teacher_head import TeacherHead, use_teacher_head
from spectui.kernels import screen_int8

TEXTS = [
    "Summarise the plot of a heist film in three sentences, then name its weakest scene.",
    "def merge(a, b):\n    # merge two sorted lists into one sorted list\n",
    "Translate to French: the train leaves at nine and the station is closed on Sundays.",
    "A farmer has 17 sheep and all but 9 run away. How many are left? Explain step by step.",
]


class Settings:
    max_answer_tokens = 24
    sample_temperature = 0.8
    sample_top_p = 0.95


def rendered(models) -> list[list[int]]:
    return [prompt_ids(models.tokenizer, t, models.context_window, Settings.max_answer_tokens, None) for t in TEXTS]


@pytest.mark.parametrize("product", ["bf16", "int8", "fp32"])
def test_top_tokens_and_log_probs_match_the_verifiers(embedded_models, product):
    if product == "int8" and not screen_int8.available():
        pytest.skip("kernels/screen_int8.c did not build here")
    runner = LeanModel(embedded_models.verifier)
    runner.keep_hidden = True
    hidden = []
    for ids in rendered(embedded_models):
        runner.reset()
        runner.forward_chain(ids)
        hidden.append(runner.hidden[0].clone())
    x = torch.cat(hidden)  # [n, H]: every row of four real prompts
    reference = runner.head(x).float()  # [n, V]: the verifier's own output layer
    head = TeacherHead(runner.head.weight, product=product)
    assert head.product == product
    logits = head(x)
    ref_ids, ref_logp = top_rows(reference, 4)
    ids, logp = top_rows(logits, 4)
    assert x.shape[0] > 150
    assert torch.equal(ids, ref_ids)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    diff = (logp.float() - ref_logp.float()).abs()
    assert diff.max() < 0.08 and diff.mean() < 0.005, (diff.max(), diff.mean())
    # the top logits are recomputed ones, fp32 dot products with the exact weights; the rest are rounded
    top = logits.topk(4, dim=-1).indices  # [n, 4]
    torch.testing.assert_close(logits.gather(1, top), reference.gather(1, top), rtol=0, atol=1e-4)
    tail = (logits - reference).abs().max()
    if product != "fp32":
        assert 1e-4 < tail < {"bf16": 0.5, "int8": 1.0}[product], tail  # fast products elsewhere: close
    else:
        assert tail < 1e-4  # W x^T in fp32 everywhere: the fp32 logits but for the summation order


def test_batched_answers_and_kept_rows_are_unchanged(embedded_models):
    prompts = rendered(embedded_models)
    stops = embedded_models.stop_token_ids()
    plain, fast = LeanModel(embedded_models.verifier), use_teacher_head(LeanModel(embedded_models.verifier))
    assert fast.output_layer is not None and plain.output_layer is None
    kept_plain, kept_fast = FeatureRows(), FeatureRows()
    answers = answer_batch(embedded_models.verifier, prompts, "greedy", Settings, stops, plain, kept_plain.add)
    assert answer_batch(embedded_models.verifier, prompts, "greedy", Settings, stops, fast, kept_fast.add) == answers
    assert sum(len(a) for a, _ in answers) > 40
    for b, (prompt, (answer, _)) in enumerate(zip(prompts, answers)):
        h0, ids0, logp0 = kept_plain.of(b, len(prompt), len(answer))
        h1, ids1, logp1 = kept_fast.of(b, len(prompt), len(answer))
        assert torch.equal(h0, h1) and torch.equal(ids0, ids1)
        assert (logp0.float() - logp1.float()).abs().max() < 0.08
    assert use_teacher_head(None) is None
