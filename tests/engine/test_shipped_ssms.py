"""The speculators shipped for the embedded default (a feature head it drafts with, a boost-tuned SSM it names
as extra): in budget, each named by the preset, loaded, lossless."""

from __future__ import annotations

import json
from pathlib import Path

from spectui.engine.chat import Conversation, chat_turn
from spectui.engine.loading import build_engine
from spectui.engine.presets import BUNDLED, PRESETS, shipped_ssms
from spectui.engine.settings import GenerationSettings

SSMS = Path(__file__).resolve().parents[2] / "ssms"


def test_shipped_ssms_fit_the_budget():
    preset = PRESETS["smollm2-135m"]
    named = [s.removeprefix(BUNDLED) for s in preset.made_for]
    assert sorted(named) == shipped_ssms()  # every folder in ssms/ is one the preset drafts with or offers
    folders = [SSMS / name for name in named]
    assert len(folders) >= 2
    total = 0
    for folder in folders:
        if (folder / "feature_head.json").exists():  # a feature head (engine/feature_head.py) for the 576-wide verifier
            config = json.loads((folder / "feature_head.json").read_text())["feature_head"]
            assert config["hidden"] == 576 and config["draft_vocab"] == 8192
        else:
            config = json.loads((folder / "config.json").read_text())
            assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
        total += sum(f.stat().st_size for f in folder.iterdir())
    assert total <= 40 * 2**20  # together at most 40 MB in the repository
    assert "spectui tune" in (SSMS / "README.md").read_text()  # how they were made


def test_the_preset_loads_them_and_stays_lossless(embedded_models):
    from dataclasses import replace

    from spectui import paths
    from spectui.engine.loading import load_ssm

    preset = PRESETS["smollm2-135m"]
    assert [name for name, _ in embedded_models.ssms] == [s.removeprefix(BUNDLED) for s in preset.ssms]
    extra = [load_ssm(s, embedded_models.verifier, embedded_models.tokenizer, "cpu", paths.models_dir()) for s in preset.extra_ssms]
    models = replace(embedded_models, ssms=[*embedded_models.ssms, *extra])  # the same verifier, every shipped SSM drafting
    names = [name for name, _ in models.ssms]
    assert names == [s.removeprefix(BUNDLED) for s in preset.made_for]
    engine = build_engine(models)
    assert engine.speculator_names == [*names, "ngram"]
    for prompt in ("What is the capital of France?", "Give me three tips for staying focused."):
        tokens = {}
        for mode, settings in {
            "fixed": GenerationSettings(max_new_tokens=40, tree_shape=(1, 1, 1)),  # every SSM drafts every step
            "auto": GenerationSettings(max_new_tokens=40),  # the default: SSMs draft where they pay
            "incremental": GenerationSettings(max_new_tokens=40, speculate=False),
        }.items():
            conversation = Conversation()
            conversation.add("user", prompt)
            events = list(chat_turn(engine, models, conversation, settings))
            tokens[mode] = [t for e in events for t in e.new_tokens]
            if mode == "fixed":
                origins = {o for e in events for o in e.token_origins}
                assert any(name in o for o in origins for name in names)  # the SSMs get tokens accepted
        assert tokens["fixed"] == tokens["auto"] == tokens["incremental"]
