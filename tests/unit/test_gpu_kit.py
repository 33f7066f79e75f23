"""The GPU kit (issue 15, docs/gpu.md) on this machine: scripts/gpu_kit.py's wheel trimming and
report, and scripts/gpu_check.sh's install step, with real zip files, real pip (no index) and a
real interpreter importing through the shim."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gpu_kit", ROOT / "scripts" / "gpu_kit.py")
gpu_kit = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_kit)

LIBS = ["libfake_cpu.so", "libfake_cuda118.so", "libfake_cuda130.so", "libfake_cuda132.so", "libfake_rocm64.so"]


def sha(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], purelib: bool = True) -> Path:
    """A wheel as setuptools writes one: the files, METADATA, WHEEL and a RECORD of them all."""
    dist_info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {str(purelib).lower()}\n"
                                   "Tag: py3-none-any\n").encode()
    record = "".join(f"{path},{sha(data)},{len(data)}\n" for path, data in files.items()) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def pip_install(wheel: Path, target: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target), str(wheel)], check=True, capture_output=True)


def test_trim_wheel_keeps_the_named_libraries_and_writes_a_true_record(tmp_path):
    files = {"fakebnb/__init__.py": b"VALUE = 1\n", "fakebnb/nn/__init__.py": b""}
    files |= {f"fakebnb/{lib}": lib.encode() * 1000 for lib in LIBS}
    src = build_wheel(tmp_path / "src", "fakebnb", "0.1", files, purelib=False)

    out, dropped = gpu_kit.trim_wheel(src, tmp_path / "out", ["libfake_cpu.so", "libfake_cuda130.so"])

    assert out == tmp_path / "out" / src.name
    assert sorted(dropped) == sorted(f"fakebnb/{lib}" for lib in ("libfake_cuda118.so", "libfake_cuda132.so", "libfake_rocm64.so"))
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert "fakebnb/libfake_cpu.so" in names and "fakebnb/libfake_cuda130.so" in names
        assert not names & set(dropped)
        rows = list(csv.reader(io.StringIO(zf.read("fakebnb-0.1.dist-info/RECORD").decode())))
        assert {row[0] for row in rows} == names
        for path, digest, size in rows:
            if path.endswith("/RECORD"):
                assert (digest, size) == ("", "")
            else:
                data = zf.read(path)
                assert (digest, int(size)) == (sha(data), len(data)), path

    target = tmp_path / "site"
    pip_install(out, target)
    assert sorted(p.name for p in (target / "fakebnb").glob("*.so")) == ["libfake_cpu.so", "libfake_cuda130.so"]
    assert (target / "fakebnb" / "__init__.py").read_text() == "VALUE = 1\n"


def test_trim_wheel_refuses_a_library_the_wheel_lacks(tmp_path):
    src = build_wheel(tmp_path, "fakebnb", "0.1", {f"fakebnb/{lib}": b"x" for lib in LIBS})
    with pytest.raises(ValueError, match="libfake_cuda999.so"):
        gpu_kit.trim_wheel(src, tmp_path / "out", ["libfake_cpu.so", "libfake_cuda999.so"])
    assert not (tmp_path / "out" / src.name).exists()


def run_check(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")} | {"PYTHON": sys.executable} | env
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_install_only_puts_the_wheels_in_the_site_and_spectui_on_the_path(tmp_path):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "gpukitprobe", "1.0", {"gpukitprobe/__init__.py": b"VALUE = 42\n"})
    site = tmp_path / "site"

    done = run_check("--install-only", "--site", str(site), env={"GPU_KIT_WHEELS": str(wheels)})

    assert done.returncode == 0, done.stderr
    assert (site / "gpukitprobe" / "__init__.py").is_file()
    exports = [line for line in done.stdout.splitlines() if line.startswith("export PYTHONPATH=")]
    assert exports and (site / "env.sh").read_text().strip() == exports[-1]
    pythonpath = shlex.split(exports[-1])[1].split("=", 1)[1]
    assert pythonpath.split(":")[0] == str(site)
    # From the repo root, where the checkout's own spectui/ (without engine/ or kernels/) comes first on sys.path.
    probe = ("import sys, gpukitprobe, spectui.kernels, spectui.engine.tune, importlib.resources as r, importlib.metadata as m; "
             "print(gpukitprobe.VALUE, getattr(sys.meta_path[0], 'shim', False), spectui.kernels.__file__, "
             "spectui.engine.tune.__file__, r.files('spectui.ssms'), m.version('spectui'))")
    ran = subprocess.run([sys.executable, "-c", probe], env=os.environ | {"PYTHONPATH": pythonpath}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["42", "True", str(ROOT / "kernels" / "__init__.py"),
                                  str(ROOT / "engine" / "tune" / "__init__.py"), str(ROOT / "ssms"), "0.1.0"]


def test_install_only_without_wheels_says_so_in_one_line(tmp_path):
    done = run_check("--install-only", "--site", str(tmp_path / "site"), env={"GPU_KIT_WHEELS": str(tmp_path / "absent")})

    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "make gpu-kit" in lines[0] and ".whl" in lines[0], lines


def test_report_counts_the_junit_and_merges_the_measurements(tmp_path):
    (tmp_path / "gpu-tests.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.gpu.test_k" name="test_a"/><testcase classname="tests.gpu.test_k" name="test_b"/>'
        '<testcase classname="tests.gpu.test_k" name="test_c"><failure message="assert 1 == 2">x</failure></testcase>'
        '<testcase classname="tests.gpu.test_k" name="test_d"><skipped message="s"/></testcase></testsuite></testsuites>')
    (tmp_path / "kernel.json").write_text(json.dumps({"rows": [{"P": 512, "T": 64, "tree_us": 12.5}]}))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"device": "NVIDIA H100", "cuda_available": True, "versions": {"torch": "2.11.0"}}))

    args = ["report", "--dir", str(tmp_path), "--env", str(env), "--tests", "1", "--seconds", "12.34",
            "--step", f"kernel:0:{tmp_path / 'kernel.json'}", "--step", f"costs:absent:{tmp_path / 'costs.json'}"]
    assert gpu_kit.main(args) == 1
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert report["device"] == "NVIDIA H100" and report["versions"] == {"torch": "2.11.0"} and report["seconds"] == 12.3
    assert {k: report["tests"][k] for k in ("total", "passed", "failed", "errors", "skipped")} == {
        "total": 4, "passed": 2, "failed": 1, "errors": 0, "skipped": 1}
    assert report["tests"]["failing"] == ["tests.gpu.test_k::test_c: assert 1 == 2"]
    assert report["measurements"]["kernel"]["result"] == {"rows": [{"P": 512, "T": 64, "tree_us": 12.5}]}
    assert report["measurements"]["costs"]["status"] == "absent"
    assert report["ok"] is False

    (tmp_path / "gpu-tests.xml").write_text('<testsuite tests="1" failures="0" errors="0" skipped="0"><testcase name="t"/></testsuite>')
    assert gpu_kit.main(args[:6] + ["0"] + args[7:]) == 0
    assert json.loads((tmp_path / "gpu-report.json").read_text())["ok"] is True
