"""CUDA tests: compiled Triton kernels and the engine on a GPU (`make gpu-check`, docs/gpu.md).

Every test here is marked `cuda` and skipped where torch sees no CUDA device, which is every
machine CI and development use; they run on a lent GPU through scripts/gpu_check.sh. Triton must
compile here, never interpret, so TRITON_INTERPRET is cleared for each test.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # gpu_models: random LLaMA shapes on the GPU

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("gpu/"):
            item.add_marker(pytest.mark.cuda)
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device (run on a GPU with make gpu-check)"))


@pytest.fixture(autouse=True)
def _compiled_triton(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("SPECTUI_ATTENTION", raising=False)
