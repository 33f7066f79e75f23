"""Shared fixtures: a throwaway SPECTUI_HOME for the whole session, and the embedded model folder.

The converted embedded model lives in a persistent test cache (SPECTUI_TEST_MODELS, else
~/.cache/spectui-tests/models) so only the first run on a machine fetches and converts it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def models_test_root() -> Path:
    """Persistent cache root for models the tests need (kept across runs, unlike SPECTUI_HOME)."""
    root = os.environ.get("SPECTUI_TEST_MODELS")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "spectui-tests" / "models"


@pytest.fixture(scope="session", autouse=True)
def spectui_home(tmp_path_factory: pytest.TempPathFactory):
    """Point SPECTUI_HOME at a temp dir for the session so no test touches the real user dirs."""
    home = tmp_path_factory.mktemp("spectui-home")
    patch = pytest.MonkeyPatch()
    patch.setenv("SPECTUI_HOME", str(home))
    yield home
    patch.undo()


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder (fetched and converted on first use)."""
    from spectui import paths
    from spectui.engine.embedded import EMBEDDED_NAME, ensure_embedded

    folder = ensure_embedded(models_test_root())
    link = paths.models_dir() / EMBEDDED_NAME  # what the CLI and the app look up, under SPECTUI_HOME
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder, target_is_directory=True)
    return folder


@pytest.fixture(scope="session")
def embedded_models(embedded_dir):
    """The embedded preset loaded as the CLI loads it: NF4 verifier, n-gram drafter."""
    from spectui.engine.loading import load_models
    from spectui.engine.presets import PRESETS

    from spectui import paths

    return load_models(PRESETS["smollm2-135m"], quant="nf4", device="cpu", models_dir=paths.models_dir())


@pytest.fixture(scope="session")
def embedded_ssm(embedded_dir):
    """The embedded model's unquantised weights loaded as the engine loads an SSM (bf16 where the CPU
    has AVX512-BF16, else fp32): a near-perfect SSM for the NF4 verifier."""
    from spectui.engine.loading import load_drafter

    return load_drafter(embedded_dir, "cpu")


@contextlib.contextmanager
def make_read_only(path):
    """`path` (file or folder) read-only for this process; root ignores modes, so it also gets chattr +i."""
    mode = path.stat().st_mode
    path.chmod(mode & ~0o222)
    locked = False
    try:
        if os.geteuid() == 0:
            locked = bool(shutil.which("chattr")) and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
            if not locked:
                pytest.skip("running as root and chattr +i is not available: cannot make a read-only path")
        yield path
    finally:
        if locked:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@pytest.fixture
def read_only():
    """make_read_only as a fixture: `with read_only(path): ...`."""
    return make_read_only


# `make test-fast` (pytest --fast): the quick loop. Tests that load the embedded model's weights
# (directly or through the app or the CLI), drive a terminal, or are marked slow are skipped; tiny
# random models still run (they borrow only the embedded tokenizer).
HEAVY_FIXTURES = {"embedded_models", "embedded_ssm", "model_home"}


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", help="skip tests that load the embedded model or drive tmux")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test`: -n 2 --dist loadgroup) the tests outside tests/tui run one after
    # another in one worker, as without it: most keep both cores busy (torch's threads), and two at once
    # would only fight over them. The TUI tests, which wait on terminals and engine processes about half
    # of their time (measured: 50 % idle alone), take the other worker and fill those gaps.
    serial = pytest.mark.xdist_group("serial")
    for item in items:
        if not item.nodeid.startswith("tests/tui/"):  # node ids are relative to the root (pyproject.toml)
            item.add_marker(serial)
    if not config.getoption("--fast"):
        return
    skip = pytest.mark.skip(reason="--fast: loads the embedded model, drives a terminal or is slow")
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        direct = "embedded_dir" in names and "tiny_dirs" not in names  # the real model, not just its tokenizer
        if names & HEAVY_FIXTURES or direct or item.get_closest_marker("slow") or "tmux" in item.nodeid:
            item.add_marker(skip)
