"""The GPU tests. Kernels and entry points run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, in a
pytest process of their own: .ci/run) on tiny shapes, or on a GPU, where the tests marked `gpu` run at
real sizes too. Without either they are skipped; the code-generation tests (test_codegen.py) need
neither, only numba-cuda's compiler, and run in the main suite."""
from __future__ import annotations

import os

import numpy as np
import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _gpu_present() -> bool:
    if SIMULATOR:
        return False
    from dnnkit.backends import cuda

    return cuda.status()["available"]


GPU = _gpu_present()


@pytest.fixture(autouse=True)
def poisoned_workspace(monkeypatch):
    """The backend's workspace arrives filled with NaN (integers: all ones), so a kernel that reads memory
    nothing wrote gives a wrong result instead of the zeros a fresh allocation often holds."""
    from dnnkit.backends import cuda

    scratch = cuda.scratch

    def poisoned(shape, dtype, stream):
        a = scratch(shape, dtype, stream)
        dt = np.dtype(dtype)
        a.copy_to_device(np.full(a.shape, np.nan if dt.kind in "fc" else np.iinfo(dt).max, dt))
        return a

    monkeypatch.setattr(cuda, "scratch", poisoned)


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip_run = pytest.mark.skip(reason="needs a GPU or the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
    skip_gpu = pytest.mark.skip(reason="needs a GPU (real sizes)")
    skip_codegen = pytest.mark.skip(reason="code generation runs outside the simulator")
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        codegen = "test_codegen" in str(item.fspath)
        if codegen and SIMULATOR:
            item.add_marker(skip_codegen)
        elif not codegen and not (SIMULATOR or GPU):
            item.add_marker(skip_run)
        elif item.get_closest_marker("gpu") is not None and not GPU:
            item.add_marker(skip_gpu)
