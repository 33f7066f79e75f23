"""Every C kernel builds wherever spectui's C kernels are meant to run (x86-64 with AVX2 and FMA, a C
compiler). Elsewhere a kernel that fails to build falls back to torch and its tests skip, so without
this check a source that no longer compiles would show only as skipped tests and a slower engine."""

from pathlib import Path

import pytest

from spectui.kernels import native

SOURCES = sorted(path.stem for path in Path(native.__file__).parent.glob("*.c"))


@pytest.mark.skipif(not native.cpu_supported() or native.compiler() is None, reason="no AVX2/FMA CPU or no C compiler")
@pytest.mark.parametrize("name", SOURCES)
def test_every_kernel_builds_here(name, tmp_path):
    library, why = native.build(name, tmp_path)
    assert library is not None, why
    assert len(list(tmp_path.glob(f"{name}-*.so"))) == 1
