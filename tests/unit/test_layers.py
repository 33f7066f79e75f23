"""The layers, read from the sources' import statements (AST): the app sits on the engine, the
engine on kernels, and nothing points back up.

- kernels/ imports nothing of spectui but itself; engine/ nothing of spectui but itself and
  kernels (no spectui.paths, config, store, widgets), and never textual;
- the app's own modules (spectui/**.py) reach the engine through its public API only
  (`spectui.engine`, `spectui.engine.tune`), and import each other without a cycle;
- the public API resolves, and importing it (or the CLI) does not import torch.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"spectui": ROOT / "spectui", "spectui.engine": ROOT / "engine", "spectui.kernels": ROOT / "kernels"}
PUBLIC_ENGINE = {"spectui.engine", "spectui.engine.tune"}


def module_name(path: Path) -> str:
    """spectui.engine.tune.data for engine/tune/data.py, per pyproject's package-dir mapping."""
    for package, folder in sorted(PACKAGES.items(), key=lambda item: -len(str(item[1]))):
        if path.is_relative_to(folder):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


MODULES = {module_name(p) for folder in PACKAGES.values() for p in sources(folder)}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file, function-level ones included;
    `from X import a` gives X, and X.a too when that is one of spectui's modules."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names if f"{module}.{a.name}" in MODULES]
    return found


def is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(folder: Path, bad) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in sources(folder) for line, m in imports(p) if bad(m)]


def test_kernels_import_nothing_of_spectui_but_themselves():
    assert violations(PACKAGES["spectui.kernels"], lambda m: is_under(m, "spectui") and not is_under(m, "spectui.kernels")) == []


def test_the_engine_imports_nothing_of_the_app():
    def bad(module: str) -> bool:
        ours = is_under(module, "spectui.engine") or is_under(module, "spectui.kernels")
        return (is_under(module, "spectui") and not ours) or is_under(module, "textual")

    assert violations(PACKAGES["spectui.engine"], bad) == []


def app_modules() -> dict[str, Path]:
    """spectui/*.py: the CLI, the commands, bench, paths, config, store, the app's controller."""
    return {module_name(p): p for p in sorted(PACKAGES["spectui"].glob("*.py"))}


def test_the_app_reaches_the_engine_through_its_public_api_only():
    everything = sorted(p for p in PACKAGES["spectui"].rglob("*.py") if "__pycache__" not in p.parts)  # screens, widgets too
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in everything
           for line, module in imports(path) if is_under(module, "spectui.engine") and module not in PUBLIC_ENGINE]
    assert bad == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of graph (module -> modules it imports), as a path that ends where it starts."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    return next(filter(None, (visit(n) for n in sorted(graph) if n not in state)), None)


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_app_modules_import_each_other_without_a_cycle():
    modules = app_modules()
    graph = {name: {m for _, m in imports(path) if m in modules and m != name} for name, path in modules.items()}
    assert find_cycle(graph) is None


def test_the_public_api_resolves_every_name():
    for package in sorted(PUBLIC_ENGINE):
        module = importlib.import_module(package)
        assert module.__all__ and len(module.__all__) == len(set(module.__all__))
        assert [name for name in module.__all__ if not hasattr(module, name)] == [], package
        assert [name for name in module.__all__ if f"{package}.{name}" in MODULES] == []  # no name hides a submodule
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018


def test_importing_the_api_and_the_cli_does_not_import_torch():
    code = ("import sys, spectui.engine, spectui.engine.tune, spectui.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
