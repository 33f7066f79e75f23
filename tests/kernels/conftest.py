"""Kernel tests run the Triton kernel on CPU tensors through triton's numpy interpreter.

spectui.kernels.triton_tree wraps its kernels per launch and calls only triton builtins, so
TRITON_INTERPRET=1 only has to be set before the first launch -- it does not matter that another
test folder (or transformers) imported triton earlier. The variable is set per test here and
restored afterwards, so the rest of the pytest process is unaffected.
"""

import pytest


@pytest.fixture(autouse=True)
def _interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("SPECTUI_ATTENTION", raising=False)  # a developer's shell setting must not leak in


@pytest.fixture(scope="session")
def tree_attention_models(embedded_dir):
    """The embedded preset loaded with the "spectui_tree" attention (SPECTUI_ATTENTION=torch at
    load): fp32 4-bit compute, attention through the Triton kernel or masked SDPA per call."""
    import os

    from spectui import paths
    from spectui.engine.loading import load_models
    from spectui.engine.presets import PRESETS

    saved = os.environ.get("SPECTUI_ATTENTION")
    os.environ["SPECTUI_ATTENTION"] = "torch"
    try:
        return load_models(PRESETS["smollm2-135m"], quant="nf4", device="cpu", models_dir=paths.models_dir())
    finally:
        if saved is None:
            os.environ.pop("SPECTUI_ATTENTION")
        else:
            os.environ["SPECTUI_ATTENTION"] = saved
