"""Load a preset's verifier (4-bit NF4 by default, through bitsandbytes) and its SSMs.

Sources: the embedded GGUF (converted once to a cached safetensors folder), local folders,
local .gguf files (converted likewise), and hub ids (downloaded into the model cache by
`download_from_hub`, the one function tests replace to serve tiny local models instead, at the
revision engine/presets.py pins). The model cache is a folder the caller names (`models_dir`; the
app's is spectui.paths.models_dir()); without one, only local folders and bundled SSMs load. Cache
entries are checked against their marker at every load (engine/embedded.py's marker helpers); a
damaged one is deleted and fetched or converted again. A 4-bit verifier on the CPU is quantized
once and read back after (engine/quantization.py). Before anything generates, every SSM must
share the verifier's vocabulary.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..kernels.guarded_head import install_guarded_head
from ..kernels import dense_cpu, head_layer, native, packed_4bit
from ..kernels.nf4_cpu import install as install_4bit_kernel
from ..kernels.hf_attention import EXACT_NAME as EXACT_ATTENTION
from .cache_health import (  # noqa: F401 (part of this module's API)
    discard_entry, entry_problem, hub_cache, hub_cache_problem, in_model_cache, mark_entry,
)
from .feature_head import FeatureHead, is_feature_head
from .presets import BUNDLED, EMBEDDED, Preset, hub_revision, shipped_dir
from .settings import RunSpec
from .quantization import FOLDER as QUANTIZED_DIR, keep_fp32_compute, load_quantized, quant_config

QUANTS = ("nf4", "fp4", "int8", "none")
Progress = Callable[[str, float | None], None]


class ModelLoadError(RuntimeError):
    """A model that cannot be fetched or loaded (exit code 1), or a bad combination (exit code 2)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def silence_library_noise() -> None:
    """Keep import-time warnings and progress bars of the ML libraries off the user's screen."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@dataclass
class LoadedModels:
    preset: Preset
    verifier: object
    tokenizer: object
    ssms: list[tuple[str, object]] = field(default_factory=list)  # (name, model)
    device: str = "cpu"
    quant: str = "nf4"
    attention_backend: str = "torch"

    @property
    def context_window(self) -> int:
        return int(getattr(self.verifier.config, "max_position_embeddings", 2048) or 2048)

    @property
    def chat_template(self) -> str | None:
        """The template every chat is rendered with, resolved here once: None when the tokenizer has
        its own (apply_chat_template uses it), else the preset's, else the plain one."""
        from .presets import PLAIN_CHAT_TEMPLATE

        return None if self.tokenizer.chat_template else (self.preset.chat_template or PLAIN_CHAT_TEMPLATE)

    def stop_token_ids(self) -> list[int]:
        return stop_token_ids(self.verifier, self.tokenizer)


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a turn: the model's generation config's, then the tokenizer's EOS."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def check_quant(quant: str) -> None:
    """ModelLoadError (a usage error) for a --quant the engine does not know."""
    if quant not in QUANTS:
        raise ModelLoadError(f"--quant {quant!r}: use one of {', '.join(QUANTS)}", usage=True)


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda: no CUDA device is available on this machine", usage=True)
    if device not in ("cpu", "cuda"):
        raise ModelLoadError(f"--device {device!r}: use auto, cpu or cuda", usage=True)
    return device


def download_from_hub(repo_id: str, revision: str | None, hub_dir: Path) -> Path:
    """Fetch a hub model at revision (None: main) into hub_dir (the model cache's hub/), or find it
    there; the only network path for models. Returns its snapshot folder, named by its commit."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
    options = dict(revision=revision, cache_dir=hub_dir, allow_patterns=patterns)
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, **options))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, **options))
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"cannot download {repo_id} from the model hub: {reason}") from None


def fetch_hub(repo_id: str, models_dir: Path, progress: Progress | None = None) -> Path:
    """A hub model's verified snapshot: one that fails `entry_problem` is deleted and downloaded again
    (one progress line); then its marker records the commit actually downloaded."""
    from .embedded import say

    revision = hub_revision(repo_id)
    folder = download_from_hub(repo_id, revision, hub_cache(models_dir))
    if (problem := entry_problem(folder, models_dir)) is not None:
        if not discard_entry(folder, models_dir):
            raise ModelLoadError(f"the model folder {folder} for {repo_id} is damaged ({problem})")
        say(progress, f"The cached {repo_id} in {folder} is damaged ({problem}): downloading it again")
        folder = download_from_hub(repo_id, revision, hub_cache(models_dir))
        if (problem := entry_problem(folder, models_dir)) is not None:
            raise ModelLoadError(f"{repo_id} is still damaged after downloading it again ({problem})")
    commit = folder.name if folder.parent.name == "snapshots" else revision
    info = {"source": f"hub:{repo_id}", "revision": commit, "requested_revision": revision or "main"}
    mark_entry(folder, info, models_dir)
    return folder


def locate(source: str, models_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """A verifier or SSM source -> a local transformers model folder (cache entries verified first).
    The embedded model, .gguf files and hub ids live in models_dir, the model cache."""
    if source.startswith(BUNDLED):
        return bundled_folder(source)
    path = Path(source).expanduser()
    is_gguf = path.suffix == ".gguf" and path.is_file()
    if source != EMBEDDED and path.exists() and not is_gguf:
        return path
    if models_dir is None:
        raise ModelLoadError(f"{source}: loading it needs a model cache folder (models_dir), and none was given")
    if source == EMBEDDED:
        from .embedded import ensure_embedded

        return ensure_embedded(models_dir, progress)
    return convert_user_gguf(path, models_dir, progress) if is_gguf else fetch_hub(source, models_dir, progress)


def bundled_folder(source: str) -> Path:
    """'bundled:NAME' -> the SSM folder shipped in the package (the repository's ssms/NAME)."""
    folder = shipped_dir() / source.removeprefix(BUNDLED)
    if not (folder / "config.json").exists() and not is_feature_head(folder):
        raise ModelLoadError(f"the bundled SSM {folder.name} is missing from this installation ({folder})")
    return folder


def source_name(source: str) -> str:
    """How a speculator is named in events and on screen: its folder name, repo name or bundled name."""
    if source.startswith(BUNDLED):
        return source.removeprefix(BUNDLED)
    return Path(source).name if Path(source).exists() else source.split("/")[-1]


def convert_user_gguf(gguf: Path, models_dir: Path, progress: Progress | None = None) -> Path:
    """A user's .gguf file -> a cached safetensors folder (keyed by name, size and mtime), verified
    like every cache entry; a damaged one is converted again."""
    import tempfile

    from .embedded import CACHE_MARKER, convert_gguf, say, write_cache_marker

    stat = gguf.stat()
    folder = Path(models_dir) / "gguf" / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    info = {"source": f"gguf:{gguf.resolve()}", "revision": f"{stat.st_size}-{int(stat.st_mtime)}"}
    if folder.exists():
        if (problem := entry_problem(folder, models_dir)) is None:
            mark_entry(folder, info, models_dir)
            return folder
        say(progress, f"The cached conversion of {gguf.name} in {folder} is damaged ({problem}): converting it again")
        shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
    try:
        convert_gguf(gguf, work / "model", progress)
        write_cache_marker(work / "model", CACHE_MARKER, info)  # last: the folder is complete
        (work / "model").rename(folder)
    except Exception as exc:  # a corrupt or unsupported GGUF: say so, keep nothing half-written
        raise ModelLoadError(f"cannot convert {gguf}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def drafter_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA and AVX512-BF16 CPUs, else fp32: a drafter need not be exact, only cheap (here a
    bf16 SSM forward takes 1.3 ms against 3.4-4.6 ms in fp32, mostly its 49k-row output layer)."""
    return torch.bfloat16 if device == "cuda" or torch.cpu._is_avx512_bf16_supported() else torch.float32


def load_drafter(folder: Path, device: str):
    """An SSM as the engine drafts with it (tune and tune-eval measure it the same way)."""
    return load_causal_lm(folder, device, "none", dtype=drafter_dtype(device))


def load_causal_lm(folder: Path, device: str, quant: str = "none", attn: str = "sdpa", dtype: torch.dtype | None = None,
                   kernel_dir: Path | None = None, quantized_dir: Path | None = None):
    """A causal LM as the engine runs it. On CPU with the exact attention, the output layer becomes a
    GuardedHead and 4-bit layers compute with kernels/nf4_cpu.py (compiled into `kernel_dir`; None: a
    temporary folder) where it builds, except on its AVX2 path where bitsandbytes has a fused kernel for this CPU; `model.spectui_4bit`
    says which path their 4-bit layers take. A 4-bit model on the CPU is quantized once and kept in
    `quantized_dir` (engine/quantization.py; None: quantized at every load)."""
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.float32  # also on CUDA: see quant_config
    kwargs = dict(dtype=dtype, attn_implementation=attn, device_map=device)
    config = quant_config(quant)

    def load(path: Path, quantize: bool):
        extra = {"quantization_config": config} if quantize and config is not None else {}
        return AutoModelForCausalLM.from_pretrained(path, **kwargs, **extra)

    kept = quantized_dir if quant in ("nf4", "fp4") and device == "cpu" else None  # CUDA quantizes in no time
    try:
        model = load_quantized(folder, quant, dtype, kept, load)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelLoadError(f"cannot load model from {folder}: {reason}") from None
    if device == "cpu" and attn == EXACT_ATTENTION:
        install_guarded_head(model)  # argmax-exact logits for tree passes (kernels/guarded_head.py)
        native.get("exact_attention", kernel_dir)  # built here, in the cache, rather than at the first call
        dense_cpu.prepare(kernel_dir)  # the output screen's product (and the drafters'), likewise
        head_layer.prepare(kernel_dir)  # a feature head's layer for a drafting level
        native.get("screen_int8", kernel_dir)  # the screen's int8 product (AVX512-VNNI or AVX2)
        native.get("screen_decide", kernel_dir)  # and its decision among the candidates
        if quant in ("nf4", "fp4"):
            packed_4bit.prepare(kernel_dir)  # bitsandbytes' fused product, 8 rows a decoded weight (AVX512-BF16)
            native.get("glue_cpu", kernel_dir)  # the glue between LeanModel's kernels
            native.get("stack_cpu", kernel_dir)  # their calls for every layer at once (spectui 4-bit path)
            model.spectui_4bit = install_4bit_kernel(model, kernel_dir).describe()
    elif config is not None and device == "cpu":
        keep_fp32_compute(model)
    return model.eval()


def load_feature_head(name: str, folder: Path, verifier, device: str):
    """A feature drafter's head (feature_head.py), given the verifier's embedding and output rows."""
    try:
        head = FeatureHead.load(folder, drafter_dtype(device))
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"cannot load feature head {name} from {folder}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if head.config.hidden != verifier.config.hidden_size or int(head.vocab_ids.max()) >= verifier.config.vocab_size:
        raise ModelLoadError(
            f"feature head {name} was made for another verifier (hidden size {head.config.hidden}, "
            f"the verifier's {verifier.config.hidden_size})", usage=True)
    head.attach(verifier.get_input_embeddings().weight, verifier.get_output_embeddings().weight, verifier=verifier)
    head.use_kernels()  # CPU weights on AVX2 CPUs without AVX512-BF16: kernels/dense_cpu.py
    return head


def check_vocabulary(name: str, ssm, ssm_folder: Path, verifier, tokenizer) -> None:
    """Refuse an SSM whose vocabulary differs from the verifier's (token ids would mean other things)."""
    from transformers import AutoTokenizer

    if ssm.config.vocab_size != verifier.config.vocab_size:
        raise ModelLoadError(
            f"SSM {name} has a vocabulary of {ssm.config.vocab_size} tokens, the verifier {verifier.config.vocab_size}: "
            "an SSM must share the verifier's tokenizer",
            usage=True,
        )
    try:
        ssm_tokenizer = AutoTokenizer.from_pretrained(ssm_folder)
    except (OSError, ValueError):
        return  # no tokenizer shipped with the SSM: the vocabulary size is all we can check
    if ssm_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ModelLoadError(
            f"SSM {name} uses a different tokenizer vocabulary from the verifier's: an SSM must share it", usage=True
        )


def load_models(
    preset: Preset,
    extra_ssms: tuple[str, ...] = (),
    quant: str = "nf4",
    device: str = "auto",
    progress: Progress | None = None,
    models_dir: Path | None = None,
) -> LoadedModels:
    """The verifier and SSMs of preset (plus extra_ssms), located in models_dir (see `locate`)."""
    from transformers import AutoTokenizer

    from ..kernels.hf_attention import register_tree_attention
    from ..kernels.backend import resolve_backend

    silence_library_noise()
    check_quant(quant)
    device = pick_device(device)
    backend = resolve_backend(torch.device(device))
    attn = register_tree_attention(backend)

    note = progress or (lambda stage, fraction=None: None)
    folder = locate(preset.verifier, models_dir, progress)
    note(f"loading verifier ({quant})", None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    verifier = load_causal_lm(folder, device, quant, attn, kernel_dir=Path(models_dir) / "kernels" if models_dir else None,
                              quantized_dir=Path(models_dir) / QUANTIZED_DIR if models_dir else None)
    if hasattr(verifier, "spectui_4bit"):
        note(f"4-bit layers: {verifier.spectui_4bit}", None)
    ssms = [load_ssm(source, verifier, tokenizer, device, models_dir, progress) for source in (*preset.ssms, *extra_ssms)]
    return LoadedModels(preset, verifier, tokenizer, ssms, device, quant, backend)


def load_ssm(source: str, verifier, tokenizer, device: str, models_dir: Path | None = None,
             progress: Progress | None = None) -> tuple[str, object]:
    """One speculator beside a loaded verifier -> (name, model): a feature head, or an SSM checked to
    share the verifier's vocabulary."""
    folder = locate(source, models_dir, progress)
    name = source_name(source)
    if progress is not None:
        progress(f"loading SSM {name}", None)
    if is_feature_head(folder):
        return name, load_feature_head(name, folder, verifier, device)
    ssm = load_drafter(folder, device)
    check_vocabulary(name, ssm, folder, verifier, tokenizer)
    return name, ssm


def load_engine(run: RunSpec, progress: Progress | None = None, cost_cache: Path | None = None,
                models_dir: Path | None = None):
    """A RunSpec's load part -> (LoadedModels, SpeculativeEngine): what the CLI and the engine process load.

    Models come from the model cache `models_dir` (see `locate`). The engine's cost model (costs.py)
    is read from `cost_cache` or measured there (about a second; None: measured, not kept).
    """
    from .acceptance_model import acceptance_path
    from .calibrate import prepare_costs
    from .costs import CostKey
    from .presets import choose_speculators, resolve_model, resolve_ssm

    note = progress or (lambda stage, fraction=None: None)
    preset = choose_speculators(resolve_model(run.model), run.speculators)
    extra = tuple(resolve_ssm(s) for s in run.ssms)
    note(f"model {preset.name}: locating", None)
    models = load_models(preset, extra, quant=run.quant, device=run.device, progress=progress, models_dir=models_dir)
    note("building the speculation engine", None)
    engine = build_engine(models)
    for name, _ in models.ssms:
        if name not in engine.speculator_names:
            note(f"feature head {name} not used: it drafts only with a LLaMA verifier on the CPU path", None)
    if engine.drafters:
        note("measuring step costs", None)
        key = CostKey(model=f"{preset.name}:{preset.verifier}:{'+'.join(engine.speculator_names)}",
                      quant=run.quant, device=models.device, threads=torch.get_num_threads(),
                      attention=models.attention_backend, runner=type(engine.verifier).__name__,
                      linear4bit=getattr(models.verifier, "spectui_4bit", ""))
        prepare_costs(engine, cost_cache, key)
        if cost_cache is not None:  # what the auto tree learned, kept per verifier, quant and speculators
            engine.remember_acceptance(acceptance_path(cost_cache, key.model, run.quant))
    return models, engine


def build_engine(models: LoadedModels, ngram: bool | None = None):
    """The SpeculativeEngine for loaded models: one ModelDrafter per SSM, then the n-gram drafter."""
    from .drafters import ModelDrafter, NGramDrafter
    from .speculative import SpeculativeEngine

    from .feature_drafter import FeatureDrafter
    from .lean_model import supports

    # a feature head reads the verifier's hidden states, which the LeanModel path keeps (CPU)
    drafters = [FeatureDrafter(name, model) if isinstance(model, FeatureHead) else ModelDrafter(name, model)
                for name, model in models.ssms if not isinstance(model, FeatureHead) or supports(models.verifier)]
    if models.preset.ngram if ngram is None else ngram:
        drafters.append(NGramDrafter(boundary=frozenset(models.tokenizer.all_special_ids) | set(models.stop_token_ids())))
    return SpeculativeEngine(
        models.verifier, models.tokenizer, drafters, models.stop_token_ids(), models.attention_backend
    )
