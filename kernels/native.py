"""spectui's C kernels for CPU (nf4_cpu.c, exact_attention.c): built with the system C compiler, loaded with ctypes.

Each source is compiled at first use (under a second: one file and the headers of this folder it
includes) into a folder the caller names (the loader passes the model cache's `kernels/` folder),
else a temporary one, under a name keyed by a hash of the source, this folder's headers, the flags
and the compiler; a build of an older source is removed when a new one is made. A library is loaded
once per process, and `get` hands the same one to every later caller, whatever folder it names, so
every call of a kernel in a process runs the same code. Where there is no compiler, no AVX2/FMA or
the build fails, `get` returns None with the reason, once per process, and callers keep their torch
or bitsandbytes path.
`SPECTUI_CPU_KERNELS=0` turns them all off (for comparison).
"""

from __future__ import annotations

import ctypes as ct
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

FLAGS = ["-O2", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
DISABLE_VAR = "SPECTUI_CPU_KERNELS"
_LOADED: dict[str, tuple[ct.CDLL | None, str]] = {}  # kernel name -> (library or None, why not), once per process


def cpu_supported() -> bool:
    """x86-64 with AVX2 and FMA (torch reports AVX2 or AVX512 capability only where both are there)."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def disabled() -> bool:
    return os.environ.get(DISABLE_VAR, "1").strip() == "0"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def default_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"spectui-kernels-{os.getuid()}"


def build(name: str, folder: Path | None) -> tuple[ct.CDLL | None, str]:
    """Compile kernels/<name>.c into `folder` unless an equal build is there, and load it -> (library, "") or (None, why)."""
    if not cpu_supported():
        return None, "the CPU lacks AVX2/FMA"
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc) found"
    source = Path(__file__).with_name(f"{name}.c")
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join(FLAGS).encode() + compiler_version(cc).encode()).hexdigest()[:16]
    folder = Path(folder) if folder is not None else default_folder()
    target = folder / f"{name}-{key}.so"
    if not target.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=folder)
            os.close(fd)
            done = subprocess.run([cc, *FLAGS, str(source), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                os.unlink(tmp)
                first = (done.stderr.strip().splitlines() or ["no message"])[0]
                return None, f"compiling {name}.c failed: {first}"
            os.replace(tmp, target)  # atomic: a concurrent build leaves one whole file
            for stale in folder.glob(f"{name}-*.so"):  # builds of older sources or compilers
                if stale != target:
                    stale.unlink(missing_ok=True)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"compiling {name}.c failed: {exc}"
    try:
        return ct.CDLL(str(target)), ""
    except OSError as exc:
        return None, f"loading {name}.c's build failed: {exc}"


def get(name: str, folder: Path | None = None) -> tuple[ct.CDLL | None, str]:
    """This process's library for kernels/<name>.c (built on first call), or (None, why not); the
    switch is read on every call, so turning the kernels off holds after a build too."""
    if disabled():
        return None, f"{DISABLE_VAR}=0"
    if name not in _LOADED:
        _LOADED[name] = build(name, folder)
    return _LOADED[name]


def function(name: str, symbol: str, argtypes: list, folder: Path | None = None):
    """(the C function `symbol` of kernels/<name>.c, returning int, with these argument types, "") or (None, why not)."""
    lib, why = get(name, folder)
    if lib is None:
        return None, why
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = ct.c_int, argtypes
    return fn, ""
