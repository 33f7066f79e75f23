"""Collective boost-tuning of small speculative models (SSMs) for a verifier, SpecInfer style.

Stages (each skips finished work under --resume):

1. prompts   magpie.py  user prompts from a file, or synthesised by the verifier itself (Magpie)
2. data      data.py    the verifier's own answers (batched generate, greedy and sampled mixed)
3. train     train.py   SSM k distils the verifier's tokens, weighted by boost.py towards the
                        positions SSMs 1..k-1 miss; ssm.py builds each SSM
4. evaluate  evaluate.py top-1 / top-k agreement with the verifier, per SSM and together

pipeline.py runs them in order; config.py holds every knob; heldout.py measures SSMs on prompts
they never saw (`spectui tune-eval`).
References: SpecInfer (Miao et al., 2024), section 4 "collective boost-tuning";
Magpie (Xu et al., 2024), alignment data synthesised from the pre-query template alone.

The tuning API (what `spectui tune` and `spectui tune-eval` use):
    TuneConfig, TuneConfigError        the knobs, checked by TuneConfig.validate()
    run_tune(cfg, models_dir=...)      all stages; models_dir: the model cache (as load_engine's)
    read_prompt_file(path)             a prompts file, checked before anything is written
    greedy_answers, agreement_by_category   tune-eval: cached verifier answers, SSM agreement
The names that need torch load on first use, so importing this package (for TuneConfig) is cheap.
"""

from importlib import import_module

from .config import TuneConfig, TuneConfigError

_LAZY_NAMES = {"run_tune": ".pipeline", "read_prompt_file": ".pipeline",
               "greedy_answers": ".heldout", "agreement_by_category": ".heldout"}

__all__ = ["TuneConfig", "TuneConfigError", *_LAZY_NAMES]


def __getattr__(name: str):
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(import_module(_LAZY_NAMES[name], __name__), name)
    return value
