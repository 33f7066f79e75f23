"""spectui as users install it: a wheel built from this tree, installed into a fresh venv and run
from a folder outside the repository, so nothing may be read by a path relative to the current
folder or to the source tree (the default prompts ship as package data, spectui/data/).

The fresh venv has no pip and no dependencies of its own: a .pth file puts the running
interpreter's site-packages (the project venv's) after its own, where only the wheel is installed.
Plain path lines in a .pth file do not run that folder's .pth files, so the project's editable
install of spectui stays inactive; the tests check that the spectui that runs is the installed one.
Offline: the wheel is built without build isolation, and pip never looks at an index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def package_folders() -> dict[str, Path]:
    """Package -> source folder, per pyproject's [tool.setuptools] (a package without a
    package-dir entry lives in its parent's folder)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setup["package-dir"].items()}


def shipped_sources() -> dict[str, Path]:
    """Path inside the wheel -> source file, for every file of the package folders (caches aside)."""
    found = {}
    for package, folder in package_folders().items():
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found[f"{package.replace('.', '/')}/{path.relative_to(folder).as_posix()}"] = path
    return found


def run(args: list, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the wheel from a copy of the tree (no build/ or egg-info in the checkout), install it."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in {f.relative_to(ROOT).parts[0] for f in package_folders().values()}:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull}
    pip = [sys.executable, "-m", "pip"]
    built = run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root / "dist", source], root, env)
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("spectui-*.whl")

    prefix = root / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(prefix)
    python = prefix / "bin" / "python"
    done = run([*pip, "--python", python, "install", "-q", "--no-deps", wheel], root, env)
    assert done.returncode == 0, done.stderr
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, env).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])  # ordered, once each
    (site / "project-dependencies.pth").write_text("".join(f"{p}\n" for p in ours), encoding="utf-8")

    elsewhere = root / "elsewhere"  # the current folder of every run: no ../shared, no checkout
    elsewhere.mkdir()
    home = root / "home"
    return {"wheel": wheel, "python": python, "spectui": prefix / "bin" / "spectui", "site": site,
            "cwd": elsewhere, "env": env | {"SPECTUI_HOME": str(home)}}


def test_the_wheel_holds_every_file_of_the_package_folders(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    missing = sorted(set(shipped_sources()) - names)
    assert not missing, f"in the source tree but not in the wheel (pyproject's packages / package-data): {missing}"
    assert {"spectui/data/vicuna_bench_questions.jsonl", "spectui/data/tune_prompts.jsonl.gz",
            "spectui/data/README.md", "spectui/screens/chat.py", "spectui/widgets/token_tree.py"} <= names


@pytest.mark.slow
def test_installed_spectui_runs_from_another_folder(installed, tiny_dirs, embedded_dir):
    cwd, env, site, spectui = installed["cwd"], installed["env"], installed["site"], installed["spectui"]
    assert not (cwd.parent / "shared").exists() and ROOT not in cwd.parents

    # The installed package is what runs, every module of it (the app's screens and widgets too).
    probe = ("import spectui, spectui.cli, spectui.app, spectui.data, spectui.engine.tune, spectui.kernels; "
             "print(spectui.cli.__file__); print(spectui.app.__file__); print(spectui.data.bench_questions())")
    where = run([installed["python"], "-c", probe], cwd, env)
    assert where.returncode == 0, where.stderr
    cli, app, questions = (Path(line) for line in where.stdout.split())
    assert cli == site / "spectui" / "cli.py" and app == site / "spectui" / "app.py"
    assert questions == site / "spectui" / "data" / "vicuna_bench_questions.jsonl"
    assert spectui.read_text(encoding="utf-8").splitlines()[0] == f"#!{installed['python']}"

    helped = run([spectui, "--help"], cwd, env)
    assert helped.returncode == 0, helped.stderr
    assert all(command in helped.stdout for command in ("generate", "models", "bench", "chat", "tune", "tune-eval"))
    bench_help = run([spectui, "bench", "--help"], cwd, env)
    assert bench_help.returncode == 0 and "80 Vicuna-bench" in bench_help.stdout, bench_help.stderr

    models = run([spectui, "models", "--json"], cwd, env)
    assert models.returncode == 0, models.stderr
    listed = json.loads(models.stdout)
    assert {p["name"] for p in listed["presets"]} == {"smollm2-135m", "llama-7b"}
    assert Path(listed["cache"]["path"]) == Path(env["SPECTUI_HOME"]) / "cache" / "models"

    # bench with no --prompts: the Vicuna questions shipped in the wheel, on a tiny random verifier.
    model = cwd / "tiny"
    shutil.copytree(tiny_dirs["verifier"], model)
    shutil.copy(embedded_dir / "chat_template.jinja", model / "chat_template.jinja")
    report = cwd / "bench.json"
    benched = run([spectui, "bench", "--model", model, "--quant", "none", "--limit", "1", "--max-new-tokens", "4",
                   "--threads", "1", "--merge", "union", "--json", report], cwd, env)
    assert benched.returncode == 0, benched.stderr
    assert f"bench: 1 prompts from {questions}" in benched.stderr.splitlines()
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["prompts"] == 1 and result["per_prompt"][0]["category"] == "generic"
    assert result["methods"]["speculative"]["identical_outputs"] == 1


def test_tune_prompts_unpack_once_into_the_cache(tmp_path):
    from spectui.data import tune_prompts
    from spectui.engine import read_prompt_file as read_prompt_rows
    from spectui.engine.tune import read_prompt_file

    unpacked = tune_prompts(tmp_path)
    assert unpacked.parent == tmp_path / "prompts" and unpacked.stat().st_mode & 0o777 == 0o600
    rows = [json.loads(line) for line in unpacked.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(read_prompt_file(unpacked)) == 2400
    categories = sorted({row["category"] for row in rows})
    assert len(categories) == 8 and [row["category"] for row in rows[:8]] == categories  # round-robin
    assert all(sum(row["category"] == c for row in rows) == 300 for c in categories)
    bench = {text for text, _ in read_prompt_rows(ROOT / "spectui" / "data" / "vicuna_bench_questions.jsonl")}
    assert len(bench) == 80 and not bench & {row["turns"][0] for row in rows}  # measured on, never tuned on
    before = unpacked.stat().st_mtime_ns
    assert tune_prompts(tmp_path) == unpacked and unpacked.stat().st_mtime_ns == before  # not unpacked again


@pytest.mark.skipif(not (SHARED / "tune_prompts.jsonl.gz").is_file(), reason="needs ../shared/data beside the checkout")
def test_shipped_prompts_are_what_the_script_makes():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import package_data
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for name, data in package_data.wanted(SHARED).items():
        assert (ROOT / "spectui" / "data" / name).read_bytes() == data, f"run scripts/package_data.py: {name} differs"
    assert len(package_data.wanted(SHARED)["tune_prompts.jsonl.gz"]) < 1_000_000


def test_tune_takes_the_shipped_prompts_or_a_file_not_both(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\n", encoding="utf-8")
    env = os.environ | {"SPECTUI_HOME": str(tmp_path / "home")}
    spectui = [sys.executable, "-m", "spectui.cli", "tune", "--model", "no-such-model", "--out", str(tmp_path / "out")]

    both = run([*spectui, "--shipped-prompts", "--prompts", prompts], tmp_path, env)
    assert both.returncode == 2 and both.stderr.strip() == "spectui: --prompts and --shipped-prompts: give one of them"

    shipped = run([*spectui, "--shipped-prompts"], tmp_path, env)  # read and checked, then the model is refused
    assert shipped.returncode == 2 and "no-such-model" in shipped.stderr and len(shipped.stderr.strip().splitlines()) == 1
    assert len(list((tmp_path / "home" / "cache" / "prompts").glob("tune_prompts-*.jsonl"))) == 1
    assert not (tmp_path / "out").exists()
