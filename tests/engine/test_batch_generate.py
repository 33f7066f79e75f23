"""Batched decoding with LeanModel (engine/batch_generate.py): the answers transformers' generate gives.

spectui tune answers thousands of prompts with the verifier; the batched LeanModel path must give,
greedy, exactly the answers of transformers' left-padded batched generate, and each prompt's answer
must not depend on the others in its batch.
"""

from __future__ import annotations

import torch

from spectui.engine.batch_generate import generate_batch
from spectui.engine.lean_model import LeanModel
from spectui.engine.loading import load_causal_lm
from spectui.engine.tune.data import Example, answer_batch
from spectui.engine.tune.features import FeatureRows, feature_pass, read_features, save_kept_features
from spectui.kernels.hf_attention import register_tree_attention


class Settings:
    max_answer_tokens = 12
    sample_temperature = 0.8
    sample_top_p = 0.95


def prompts() -> list[list[int]]:
    torch.manual_seed(3)
    return [torch.randint(300, 3000, (n,)).tolist() for n in (5, 17, 9, 30)]  # different lengths: left padding


def tiny_verifier(tiny_dirs):
    return load_causal_lm(tiny_dirs["verifier"], "cpu", "nf4", register_tree_attention("exact"))


def test_greedy_batches_give_transformers_answers(tiny_dirs):
    model = tiny_verifier(tiny_dirs)
    stop = [int(model.config.eos_token_id)]
    ours = answer_batch(model, prompts(), "greedy", Settings, stop, LeanModel(model))
    theirs = answer_batch(model, prompts(), "greedy", Settings, stop)  # transformers' generate
    assert ours == theirs
    assert all(len(answer) == Settings.max_answer_tokens or done for answer, done in ours)
    alone = [generate_batch(LeanModel(model), [p], Settings.max_answer_tokens, stop)[0] for p in prompts()]
    assert alone == ours  # a prompt's answer does not depend on its batch


def test_a_repeated_prompt_is_prefilled_once_with_the_same_rows(tiny_dirs):
    """A Magpie round sends one prompt many times: prefill_left_padded runs it once and copies its
    key/values and logits, which are what prefilling it again gives, bit for bit."""
    model = tiny_verifier(tiny_dirs)
    p = prompts()
    batch = [p[1], p[0], p[1], p[1], p[3], p[0]]
    runner = LeanModel(model)
    calls = []
    forward = runner.forward_chain
    runner.forward_chain = lambda *a, **k: calls.append(1) or forward(*a, **k)
    logits = runner.prefill_left_padded(batch)  # [6, V]
    assert len(calls) == 3  # three different prompts
    shared, W = runner.kv.clone(), max(map(len, batch))
    alone = LeanModel(model)
    for b, prompt in enumerate(batch):
        alone.reset()
        assert torch.equal(alone.forward_chain(prompt, last_only=True)[0], logits[b])
        assert torch.equal(alone.kv[:, :, 0, :, : len(prompt)], shared[:, :, b, :, W - len(prompt) : W])
    answers = generate_batch(runner, batch, Settings.max_answer_tokens, [0])
    assert answers == [generate_batch(LeanModel(model), [q], Settings.max_answer_tokens, [0])[0] for q in batch]


def test_an_answer_ends_at_its_stop_token(tiny_dirs):
    model = tiny_verifier(tiny_dirs)
    runner = LeanModel(model)
    first = generate_batch(runner, prompts(), Settings.max_answer_tokens, [0])
    stop = first[1][0][3]  # the fourth token prompt 1 answers greedily: make it a stop token
    answers = generate_batch(runner, prompts(), Settings.max_answer_tokens, [0, stop])
    assert answers[1] == (first[1][0][:4], True)
    for (answer, done), (full, _) in zip(answers, first):
        assert answer == full[: len(answer)]  # the same tokens up to its own end
        assert done == (stop in answer) and (not done or answer[-1] == stop and answer.count(stop) == 1)


def test_sampled_batches_are_reproducible_draws(tiny_dirs):
    model = tiny_verifier(tiny_dirs)
    runner = LeanModel(model)
    draws = [generate_batch(runner, prompts(), 8, [0], greedy=False, temperature=0.8, top_p=0.95,
                            generator=torch.Generator().manual_seed(seed)) for seed in (1, 1, 2)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert all(len(answer) == 8 for answer, _ in draws[0])


def test_groups_and_finished_rows_leave_answers_unchanged(tiny_dirs):
    model = tiny_verifier(tiny_dirs)
    runner = LeanModel(model)
    whole = generate_batch(runner, prompts(), Settings.max_answer_tokens, [0], groups=[[0, 1, 2, 3]])
    split = generate_batch(runner, prompts(), Settings.max_answer_tokens, [0], groups=[[2, 0], [3, 1]])
    assert split == whole  # each group decoded on its own, rows in any order
    stops = [0] + [answer[2] for answer, _ in whole[:3]]  # three rows finish early: the cache drops them
    ended = generate_batch(runner, prompts(), Settings.max_answer_tokens, stops, groups=[[0, 1, 2, 3]])
    for (answer, done), (full, _) in zip(ended, whole):
        assert answer == full[: len(answer)] and (done or len(answer) == Settings.max_answer_tokens)
    assert sum(done for _, done in ended) >= 3 and ended[3][0] == whole[3][0][: len(ended[3][0])]


def test_features_kept_while_decoding_are_a_teacher_forced_pass(tiny_dirs, tmp_path):
    """FeatureRows (engine/tune/features.py) keeps the verifier's rows as batched decoding computes
    them: a teacher-forced pass's over prompt + answer[:-1] (hidden states and top tokens bit for bit),
    for rows that stop early (the cache drops them) and rows decoded in other groups."""
    model = tiny_verifier(tiny_dirs)
    runner = LeanModel(model)
    whole = generate_batch(runner, prompts(), Settings.max_answer_tokens, [0])
    stops = [0] + [answer[2] for answer, _ in whole[:2]]  # two rows end at their third token
    kept = FeatureRows(k=4)
    answers = generate_batch(runner, prompts(), Settings.max_answer_tokens, stops, groups=[[2, 0], [3, 1]], on_rows=kept.add)
    assert answers == generate_batch(runner, prompts(), Settings.max_answer_tokens, stops)  # keeping changes no answer
    assert sum(done for _, done in answers) >= 2
    for b, (prompt, (answer, _)) in enumerate(zip(prompts(), answers)):
        rows = kept.of(b, len(prompt), len(answer))
        reference = feature_pass(LeanModel(model), prompt + answer[:-1], k=4)
        assert rows[0].shape[0] == len(prompt) + len(answer) - 1
        assert torch.equal(rows[0], reference[0]) and torch.equal(rows[1], reference[1]), f"prompt {b}"  # hidden, top ids
        # log-probabilities: the output layer's float32 product may round differently for 1 row and for many
        torch.testing.assert_close(rows[2], reference[2], rtol=2**-10, atol=2**-14)
    examples = [Example("", p, a, "greedy", done) for p, (a, done) in zip(prompts(), answers)]
    path = tmp_path / "part-00000.safetensors"
    positions = save_kept_features(path, examples, kept)
    saved = read_features(path)
    assert positions == sum(len(p) + len(a) - 1 for p, (a, _) in zip(prompts(), answers)) == len(saved["hidden"])
    assert saved["ids"].tolist() == [t for p, (a, _) in zip(prompts(), answers) for t in p + a[:-1]]
