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
