"""The llama-7b preset's wiring and 4-bit loading, through tiny random LLaMA folders.

Only the hub download is replaced: `download_from_hub` maps the preset's hub ids to tiny model
folders saved in a temp dir; everything else (NF4 quantisation through bitsandbytes, the plain
chat template for a base model, the SSMs, the vocabulary check) is the real path.
"""

from __future__ import annotations

import pytest
import torch

from spectui import paths
from spectui.engine import loading
from spectui.engine.chat import Conversation, chat_turn
from spectui.engine.loading import ModelLoadError, build_engine, drafter_dtype, load_models
from spectui.engine.presets import HUB_REVISIONS, PLAIN_CHAT_TEMPLATE, PRESETS, ModelSpecError, resolve_model
from spectui.engine.settings import GenerationSettings, RunSpec


@pytest.fixture
def fake_hub(tiny_dirs, monkeypatch):
    folders = {
        "huggyllama/llama-7b": tiny_dirs["verifier"],
        "JackFram/llama-68m": tiny_dirs["ssm68"],
        "JackFram/llama-160m": tiny_dirs["ssm160"],
    }
    asked = []

    def download(repo_id, revision, hub_dir):
        asked.append(repo_id)
        revisions.append(revision)
        return folders[repo_id]

    revisions = []
    download.revisions = revisions

    monkeypatch.setattr(loading, "download_from_hub", download)
    return asked


def test_llama7b_preset_loads_nf4_verifier_and_two_ssms(fake_hub):
    import bitsandbytes as bnb

    models = load_models(PRESETS["llama-7b"], models_dir=paths.models_dir(), quant="nf4", device="cpu")
    assert fake_hub == ["huggyllama/llama-7b", "JackFram/llama-68m", "JackFram/llama-160m"]
    assert loading.download_from_hub.revisions == [HUB_REVISIONS["huggyllama/llama-7b"], None,
                                                   HUB_REVISIONS["JackFram/llama-160m"]]  # pinned where known
    q_proj = models.verifier.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, bnb.nn.Linear4bit)
    assert q_proj.weight.quant_state.quant_type == "nf4"
    assert [name for name, _ in models.ssms] == ["llama-68m", "llama-160m"]
    assert all(p.dtype == drafter_dtype("cpu") for _, ssm in models.ssms for p in ssm.parameters())  # bf16 on AVX512-BF16
    assert models.chat_template == PLAIN_CHAT_TEMPLATE  # a base model gets the plain template
    engine = build_engine(models)
    assert engine.speculator_names == ["llama-68m", "llama-160m", "ngram"]


@pytest.mark.parametrize("speculators, names, fetched", [
    ("ngram", ["ngram"], ["huggyllama/llama-7b"]),
    ("none", [], ["huggyllama/llama-7b"]),
    ("JackFram/llama-160m", ["llama-160m", "ngram"], ["huggyllama/llama-7b", "JackFram/llama-160m"]),
])
def test_load_engine_takes_another_choice_of_speculators(fake_hub, speculators, names, fetched):
    """The app's model picker: the preset's verifier with the n-gram drafter alone, none, or one SSM
    instead of its own two (only what is chosen is fetched and loaded)."""
    from spectui.engine.loading import load_engine

    models, engine = load_engine(RunSpec("llama-7b", speculators=speculators, quant="none", device="cpu"),
                                 models_dir=paths.models_dir())
    assert engine.speculator_names == names and fake_hub == fetched
    assert models.preset.name == "llama-7b"


def test_llama7b_preset_generates_losslessly(fake_hub):
    models = load_models(PRESETS["llama-7b"], models_dir=paths.models_dir(), quant="nf4", device="cpu")
    engine = build_engine(models)
    conversation = Conversation(system="Be brief.")
    conversation.add("user", "Say hello.")
    events = list(chat_turn(engine, models, conversation, GenerationSettings(max_new_tokens=24)))
    tokens = [t for e in events for t in e.new_tokens]
    ids, _ = Conversation(system="Be brief.", messages=conversation.messages[:1]).prompt_ids(
        models.tokenizer, models.context_window, 24, models.chat_template
    )
    assert models.tokenizer.decode(ids).startswith("Be brief.\n\nUSER: Say hello.\nASSISTANT:")
    x = torch.tensor([ids])
    with torch.inference_mode():
        ref = models.verifier.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
            eos_token_id=models.stop_token_ids(), pad_token_id=models.stop_token_ids()[0],
        )[0, len(ids):].tolist()
    assert tokens == ref
    assert conversation.messages[-1].role == "assistant"
    assert conversation.messages[-1].content == "".join(e.new_text for e in events)


@pytest.mark.parametrize("quant", ["fp4", "int8", "none"])
def test_other_quantisations_load(fake_hub, quant):
    models = load_models(PRESETS["llama-7b"], models_dir=paths.models_dir(), quant=quant, device="cpu")
    layer = models.verifier.model.layers[0].self_attn.q_proj
    assert type(layer).__name__ == {"fp4": "Linear4bit", "int8": "Linear8bitLt", "none": "Linear"}[quant]


def test_ssm_with_foreign_vocabulary_is_refused(tiny_dirs):
    preset = resolve_model(str(tiny_dirs["verifier"]))
    with pytest.raises(ModelLoadError) as info:
        load_models(preset, (str(tiny_dirs["foreign"]),), quant="none", device="cpu")
    assert info.value.usage and "vocabulary" in str(info.value)


def test_unknown_and_missing_models_name_the_presets(tmp_path):
    for spec in ["no-such-preset", str(tmp_path / "missing"), "./nope.gguf"]:
        with pytest.raises(ModelSpecError) as info:
            resolve_model(spec)
        assert "smollm2-135m" in str(info.value) and "llama-7b" in str(info.value)
    assert resolve_model("org/some-model").verifier == "org/some-model"


def test_bad_quant_and_device_are_usage_errors(tiny_dirs):
    preset = resolve_model(str(tiny_dirs["verifier"]))
    with pytest.raises(ModelLoadError) as info:
        load_models(preset, quant="q3", device="cpu")
    assert info.value.usage
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError) as info:
            load_models(preset, quant="none", device="cuda")
        assert info.value.usage and "CUDA" in str(info.value)
