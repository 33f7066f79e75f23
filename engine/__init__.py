"""spectui.engine: SpecInfer-style tree speculation that streams StepEvents. Its public API.

Everything outside engine/ (the CLI, the app, bench, scripts) imports from here; the tuning
commands from `spectui.engine.tune`. The engine imports nothing of the app: every folder it uses
is given by its caller (`models_dir`: the model cache; `cost_cache`: measured step costs).

    from spectui.engine import Conversation, GenerationSettings, chat_turn, load_engine

    cache = Path("~/.cache/spectui").expanduser()  # spectui's own folders: spectui/paths.py
    run = RunSpec("smollm2-135m", settings=GenerationSettings(max_new_tokens=64))
    models, engine = load_engine(run, models_dir=cache / "models", cost_cache=cache / "costs")
    conversation = Conversation(system=None)
    conversation.add("user", "What is the capital of France?")
    for event in chat_turn(engine, models, conversation, run.settings):
        print(event.new_text, end="")  # one StepEvent per verifier step

Run       RunSpec: what to load (model, ssms, speculators, quant, device) and how to generate
          (GenerationSettings); the one record the CLI, the app's config, the engine process and bench share.
Load      load_engine(run, progress, cost_cache, models_dir) -> (LoadedModels,
          SpeculativeEngine); load_models (the models without an engine); load_ssm (one more speculator
          beside a loaded verifier: bench's assistant); resolve_model / resolve_ssm
          (--model / --ssm values, checked before loading); preset_rows(models_dir), cache_entries(models_dir)
          and remove_cache_entry(models_dir, name) (`spectui models`); model_choices(models_dir) and
          speculator_choices(model, models_dir) (the app's model picker), choose_speculators (a preset with
          other speculators; load_engine's `speculators`);
          QUANTS, check_quant and pick_device (--quant / --device, checked before loading).
Generate  SpeculativeEngine.generate(prompt ids, GenerationSettings) yields StepEvents; Conversation
          (history, chat template, context budget) and chat_turn (one assistant turn of it);
          encode_chat; GenerationSettings with parse_tree / tree_text and DEFAULT_TREE, DEFAULT_MERGE.
Events    StepEvent, TreeNode, RunInfo and BONUS_SOURCE (engine/events.py, the only contract with the
          consumers); write_trace, read_trace, read_runs (JSONL traces, checked whole on reading).
Process   EngineWorker(LoadRequest) runs load_engine and chat turns in a child process (what the app
          does); prepare_engine_process (call before a UI takes stderr); engine_threads.
Errors    ModelSpecError, ModelLoadError (.usage: bad flags), ContextError, TraceError, PromptFileError, WorkerError,
          EngineDied, AttentionBackendError, CacheEntryError; ValueError from GenerationSettings.
Files     private_dir, write_private: folders 0700, atomic 0600 files (the engine's cache markers);
          read_prompt_file: a prompts file (JSONL or one a line) as [(prompt, category)], the one
          reader of bench, tune and tune-eval.

Importing this package is cheap: the names that need torch (load_engine, load_models, load_ssm, LoadedModels,
ModelLoadError, QUANTS, check_quant, pick_device, SpeculativeEngine, AttentionBackendError) load on first use.
"""

from importlib import import_module

from .catalog import CacheEntryError, cache_entries, model_choices, preset_rows, remove_cache_entry, speculator_choices
from .chat import ContextError, Conversation, chat_turn, encode_chat
from .events import BONUS_SOURCE, RunInfo, StepEvent, TraceError, TreeNode, read_runs, read_trace, write_trace
from .files import private_dir, write_private
from .presets import DEFAULT_PRESET, ModelSpecError, choose_speculators, resolve_model, resolve_ssm
from .prompt_files import PromptFileError, read_prompt_file
from .settings import DEFAULT_MERGE, DEFAULT_TREE, GenerationSettings, RunSpec, parse_tree, tree_text
from .worker import EngineDied, EngineWorker, LoadRequest, WorkerError, engine_threads, prepare_engine_process

_LAZY = {  # module -> the names it gives; these modules import torch, so they load on first use (PEP 562)
    ".loading": ("LoadedModels", "ModelLoadError", "QUANTS", "check_quant", "load_engine", "load_models", "load_ssm", "pick_device"),
    ".speculative": ("SpeculativeEngine",),
    "..kernels": ("AttentionBackendError",),
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "BONUS_SOURCE", "CacheEntryError", "DEFAULT_MERGE", "DEFAULT_PRESET", "DEFAULT_TREE", "ContextError", "Conversation", "EngineDied", "EngineWorker",
    "GenerationSettings", "LoadRequest", "ModelSpecError", "PromptFileError", "RunInfo", "RunSpec", "StepEvent", "TraceError", "TreeNode",
    "WorkerError", "cache_entries", "chat_turn", "choose_speculators", "encode_chat", "engine_threads", "model_choices", "parse_tree", "prepare_engine_process",
    "preset_rows", "private_dir", "read_prompt_file", "remove_cache_entry", "read_runs", "read_trace", "resolve_model", "resolve_ssm", "speculator_choices", "tree_text",
    "write_private", "write_trace", *_LAZY_NAMES,
]


def __getattr__(name: str):
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(_LAZY_NAMES[name], __name__), name)
    return value
