#!/usr/bin/env python3
"""The GPU kit's Python half (issue 15, docs/gpu.md); stdlib only, Python >= 3.11 (tomllib).

  trim-wheel SRC OUTDIR --keep LIB ...   copy a wheel without the native libraries not named
                                         (bitsandbytes ships one per CUDA/ROCm version), RECORD rewritten
  shim SITE --repo ROOT                  make spectui importable from the checkout ROOT for any Python
                                         that has SITE on PYTHONPATH: nothing is built or copied
  env --json PATH                        device, versions and import checks, printed and saved
  report --dir DIR ...                   DIR/gpu-report.json from the env, the junit xml and the
                                         measurements' JSON; exits 1 when anything failed

scripts/gpu_kit.sh (here, `make gpu-kit`) calls trim-wheel; scripts/gpu_check.sh (on the GPU
machine, `make gpu-check`) calls the rest.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from importlib import metadata
from pathlib import Path

NATIVE_SUFFIXES = (".so", ".dll", ".dylib", ".pyd")
DISTS = ("torch", "triton", "transformers", "bitsandbytes", "accelerate", "platformdirs", "psutil", "gguf",
         "numpy", "safetensors", "tokenizers", "huggingface_hub", "pytest", "spectui")
IMPORTS = ("triton", "bitsandbytes", "accelerate", "platformdirs", "spectui.kernels", "spectui.engine.loading")
REPORT_NAME = "gpu-report.json"
SHIM_TEMPLATE = '''\
"""Written by scripts/gpu_kit.py shim (make gpu-check): spectui served from the checkout {root}.

This folder is on PYTHONPATH, so Python imports this file at startup. It puts a finder first on
sys.meta_path that maps spectui and its subpackages onto the checkout's folders (pyproject's
[tool.setuptools.package-dir]), as an editable install does, whatever else is on sys.path (the
checkout's own spectui/ when run from its root); then it runs the sitecustomize it shadows, if any.
"""

import importlib.machinery
import importlib.util
import os
import sys

PACKAGE_DIRS = {dirs!r}


class SpectuiCheckoutFinder:
    shim = True

    def find_spec(self, name, path=None, target=None):
        folder = PACKAGE_DIRS.get(name)
        if folder is None:
            return None
        init = os.path.join(folder, "__init__.py")
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[folder])


if not any(getattr(finder, "shim", False) for finder in sys.meta_path):
    sys.meta_path.insert(0, SpectuiCheckoutFinder())


def _run_shadowed():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_shadowed()
'''


# -- trim-wheel ---------------------------------------------------------------------------------

def record_hash(data: bytes) -> str:
    """A RECORD hash: sha256, urlsafe base64 without padding (the wheel spec)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def is_native(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(NATIVE_SUFFIXES) or ".so." in base


def trim_wheel(src: Path, out_dir: Path, keep: list[str]) -> tuple[Path, list[str]]:
    """Write out_dir/<src's name>: src without its native libraries whose file name is not in keep,
    with a RECORD that lists exactly the files written (signatures of the old RECORD dropped).
    Returns the new wheel's path and the names dropped; a keep name the wheel lacks is an error."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / src.name
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        record = [i.filename for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
        if len(record) != 1:
            raise ValueError(f"{src.name}: expected one .dist-info/RECORD, found {len(record)}")
        dist_info = record[0].rsplit("/", 1)[0]
        natives = {i.filename.rsplit("/", 1)[-1] for i in infos if is_native(i.filename)}
        missing = sorted(set(keep) - natives)
        if missing:
            raise ValueError(f"{src.name} has no {', '.join(missing)} (its native libraries: {', '.join(sorted(natives))})")
        signatures = {f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s"}
        dropped = [i.filename for i in infos if (is_native(i.filename) and i.filename.rsplit("/", 1)[-1] not in keep)
                   or i.filename in signatures]
        rows = io.StringIO()
        writer = csv.writer(rows, lineterminator="\n")
        tmp = dest.with_name(dest.name + ".part")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in infos:
                if info.filename in dropped or info.filename == record[0]:
                    continue
                data = zin.read(info)
                zout.writestr(copy_info(info), data)
                if not info.is_dir():
                    writer.writerow([info.filename, record_hash(data), len(data)])
            writer.writerow([record[0], "", ""])
            zout.writestr(copy_info(zin.getinfo(record[0])), rows.getvalue())
    os.replace(tmp, dest)
    return dest, dropped


def copy_info(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """The entry's name, date and permissions, deflated."""
    new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    new.external_attr = info.external_attr
    new.create_system = info.create_system
    new.compress_type = zipfile.ZIP_STORED if info.is_dir() else zipfile.ZIP_DEFLATED
    return new


# -- shim ---------------------------------------------------------------------------------------

def write_shim(site: Path, repo: Path) -> dict[str, str]:
    """SITE/sitecustomize.py mapping spectui's packages onto repo's folders, and a spectui
    .dist-info so importlib.metadata knows its version. Returns the package -> folder map."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    dirs = project.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    name = project["project"]["name"]
    mapping = {name: str(repo / name)} | {package: str(repo / folder) for package, folder in dirs.items() if package}
    for package, folder in mapping.items():
        if not (Path(folder) / "__init__.py").is_file():
            raise ValueError(f"{package}: {folder}/__init__.py is missing")
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SHIM_TEMPLATE.format(root=repo, dirs=mapping))
    for old in site.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"{name}-{project['project']['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {project['project']['version']}\n")
    (info / "INSTALLER").write_text("scripts/gpu_kit.py shim\n")
    return mapping


# -- env ----------------------------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def collect_env() -> dict:
    """What the check ran on: device, CUDA, versions of the dists that matter, imports that work."""
    import importlib

    env: dict = {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform()}
    versions = {}
    for dist in DISTS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    env["versions"] = versions
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            env["nvidia_smi"] = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            env["nvidia_smi"] = first_line(exc)
    else:
        env["nvidia_smi"] = None
    imports = {}
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if env["cuda_available"]:
            props = torch.cuda.get_device_properties(0)
            env["device"] = props.name
            env["capability"] = f"{props.major}.{props.minor}"
            env["memory_gib"] = round(props.total_memory / 2**30, 1)
            env["device_count"] = torch.cuda.device_count()
        else:
            env["device"] = "cpu (torch sees no CUDA device)"
        imports["torch"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        env["device"] = None
        imports["torch"] = first_line(exc)
    for name in IMPORTS:
        try:
            module = importlib.import_module(name)
            imports[name] = f"ok ({Path(module.__file__).parent})"
        except Exception as exc:  # noqa: BLE001
            imports[name] = first_line(exc)
    env["imports"] = imports
    bnb = sys.modules.get("bitsandbytes")
    if bnb is not None:
        lib = getattr(bnb, "cextension", None) and bnb.cextension.lib
        env["bitsandbytes_library"] = f"{type(lib).__name__} {getattr(getattr(lib, '_lib', None), '_name', None)}"
    return env


def print_env(env: dict) -> None:
    print(f"device: {env.get('device')}  (nvidia-smi -L: {env.get('nvidia_smi')})")
    print(f"python {env['python']}  torch CUDA {env.get('torch_cuda')}  cuda_available {env.get('cuda_available')}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()))
    for name, state in env["imports"].items():
        print(f"import {name}: {state}")
    if "bitsandbytes_library" in env:
        print(f"bitsandbytes library: {env['bitsandbytes_library']}")


# -- report -------------------------------------------------------------------------------------

def junit_counts(path: Path) -> dict:
    """passed/failed/errors/skipped of a pytest junit xml, and the names of what failed."""
    if not path.is_file():
        return {"junit": None}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"junit": f"unreadable: {exc}"}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failing = []
    for case in root.iter("testcase"):
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            message = (bad.get("message") or "").strip().splitlines()
            failing.append(f"{case.get('classname')}::{case.get('name')}: {message[0] if message else ''}"[:300])
    return {"total": counts["tests"], "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"], "failing": failing[:20]}


def rc_status(rc: int | None) -> str:
    if rc is None:
        return "absent"
    return {0: "ok", 124: "timed out", 137: "timed out (killed)"}.get(rc, "failed")


def build_report(report_dir: Path, env: dict, install: str, tests_rc: int | None, steps: list[tuple[str, int | None, Path]],
                 seconds: float) -> dict:
    tests = {"rc": tests_rc, "status": rc_status(tests_rc)} | junit_counts(report_dir / "gpu-tests.xml")
    if tests_rc == 5:
        tests["status"] = "no tests collected"
    tests_ok = tests_rc in (0, 5) and not tests.get("failed") and not tests.get("errors")
    measurements, measured_ok = {}, True
    for name, rc, path in steps:
        entry: dict = {"rc": rc, "status": rc_status(rc), "json": path.name}
        if rc is not None:
            try:
                entry["result"] = json.loads(path.read_text())
            except FileNotFoundError:
                entry["result"] = None
                if rc == 0 and env.get("cuda_available") is False:
                    entry["status"] = "ok"  # the measurements write no JSON without a GPU
                    entry["note"] = f"no CUDA, no {path.name}"
                elif rc == 0:
                    entry["status"] = f"exit 0 but no {path.name}"
            except (OSError, ValueError) as exc:
                entry["result"] = None
                entry["status"] = f"{path.name} unreadable: {first_line(exc)}"
            measured_ok &= entry["status"] == "ok"
        measurements[name] = entry
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": env.get("device"),
        "cuda": env.get("cuda_available"),
        "versions": env.get("versions"),
        "env": {key: value for key, value in env.items() if key != "versions"},
        "install": install,
        "tests": tests,
        "measurements": measurements,
        "seconds": round(seconds, 1),
        "ok": install == "ok" and tests_ok and measured_ok,
    }


def parse_step(text: str) -> tuple[str, int | None, Path]:
    """NAME:RC:JSONPATH, RC an exit code or 'absent' (the script is not in this checkout)."""
    name, rc, path = text.split(":", 2)
    return name, None if rc == "absent" else int(rc), Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    trim = sub.add_parser("trim-wheel")
    trim.add_argument("src", type=Path)
    trim.add_argument("out_dir", type=Path)
    trim.add_argument("--keep", action="append", required=True, help="file name of a native library to keep")
    shim = sub.add_parser("shim")
    shim.add_argument("site", type=Path)
    shim.add_argument("--repo", type=Path, required=True)
    env = sub.add_parser("env")
    env.add_argument("--json", type=Path, required=True)
    report = sub.add_parser("report")
    report.add_argument("--dir", type=Path, required=True)
    report.add_argument("--env", type=Path, required=True)
    report.add_argument("--install", default="ok", help="'ok' or why the install step failed")
    report.add_argument("--tests", default=None, help="pytest's exit code (absent when it did not run)")
    report.add_argument("--step", action="append", default=[], type=parse_step, help="NAME:RC:JSON")
    report.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)

    if args.command == "trim-wheel":
        try:
            dest, dropped = trim_wheel(args.src, args.out_dir, args.keep)
        except (ValueError, zipfile.BadZipFile, OSError) as exc:
            print(f"trim-wheel: {first_line(exc)}", file=sys.stderr)
            return 1
        print(f"{dest.name}: {args.src.stat().st_size / 2**20:.1f} MiB -> {dest.stat().st_size / 2**20:.1f} MiB, "
              f"kept {', '.join(args.keep)}, dropped {len(dropped)} files")
        return 0
    if args.command == "shim":
        try:
            mapping = write_shim(args.site.resolve(), args.repo.resolve())
        except (ValueError, KeyError, OSError, tomllib.TOMLDecodeError) as exc:
            print(f"shim: {first_line(exc)}", file=sys.stderr)
            return 1
        print(f"spectui from {args.repo.resolve()}: {', '.join(mapping)}")
        return 0
    if args.command == "env":
        data = collect_env()
        print_env(data)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
        return 0
    try:
        env_data = json.loads(args.env.read_text())
    except (OSError, ValueError) as exc:
        env_data = {"error": first_line(exc)}
    tests_rc = None if args.tests in (None, "", "absent") else int(args.tests)
    data = build_report(args.dir, env_data, args.install, tests_rc, args.step, args.seconds)
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / REPORT_NAME).write_text(json.dumps(data, indent=2) + "\n")
    tests = data["tests"]
    parts = [f"device {data['device']}", f"install {data['install']}",
             f"tests {tests['status']} (" + ", ".join(f"{k} {tests.get(k)}" for k in ("passed", "failed", "errors", "skipped")) + ")"]
    parts += [f"{name} {m['status']}" for name, m in data["measurements"].items()]
    print(f"report {args.dir / REPORT_NAME}: " + "; ".join(parts) + f"; {data['seconds']} s; {'OK' if data['ok'] else 'FAILED'}")
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
