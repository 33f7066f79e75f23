"""Collective boost-tuning of small speculative models (SSMs) for a verifier, SpecInfer style.

Stages (each skips finished work under --resume):

1. prompts   magpie.py  user prompts from a file, or synthesised by the verifier itself (Magpie)
2. data      data.py    the verifier's own answers (batched generate, greedy and sampled mixed)
3. train     train.py   SSM k distils the verifier's tokens, weighted by boost.py towards the
                        positions SSMs 1..k-1 miss; ssm.py builds each SSM
4. evaluate  evaluate.py top-1 / top-k agreement with the verifier, per SSM and together

pipeline.py runs them in order; config.py holds every knob.
References: SpecInfer (Miao et al., 2024), section 4 "collective boost-tuning";
Magpie (Xu et al., 2024), alignment data synthesised from the pre-query template alone.
"""

from .config import TuneConfig, TuneConfigError

__all__ = ["TuneConfig", "TuneConfigError"]
