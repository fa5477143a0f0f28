"""The GPU tests. Kernels and entry points run under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, in a
pytest process of their own: .ci/run) on tiny shapes, or on a GPU, where the tests marked `gpu` run at
real sizes too. Without either they are skipped; the code-generation tests (test_codegen.py) need
neither, only numba-cuda's compiler, and run in the main suite."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _run_block(manager, grid_point, *args):
    """The simulator's BlockManager.run without its busy wait. The simulator runs a block's CUDA threads as
    Python threads and opens a barrier once every live one waits there; its own loop checks them without
    pause, holding the interpreter lock, so a thread that wakes or is preempted can wait out the checker's
    whole switch interval, many times a launch. This loop sleeps between checks. Same semantics: a barrier
    opens when every live thread of the block waits at it; a thread's exception aborts the others and is
    raised to the launch."""
    from numba.cuda.simulator.kernel import BlockThread

    threads = []
    for point in np.ndindex(*manager._block_dim):
        t = BlockThread(lambda: manager._f(*args), manager, grid_point, point, manager._debug)
        t.start()
        threads.append(t)
    live = threads
    while live:
        time.sleep(1e-5)
        failed = next((t for t in threads if t.exception), None)
        if failed is not None:
            for t in threads:
                t.abort, t.syncthreads_blocked = True, False
                t.syncthreads_event.set()
            raise failed.exception[0].with_traceback(failed.exception[1])
        live = [t for t in live if t.is_alive()]
        if live and all(t.syncthreads_blocked for t in live):
            for t in live:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()


def _schedule_blocks_without_spinning():
    """Install _run_block where the simulator's classes have the fields it uses; any other version keeps
    its own loop."""
    from numba.cuda.simulator import kernel as sim

    try:
        manager = sim.BlockManager(None, (1, 1, 1), (1, 1, 1), False)
        thread = sim.BlockThread(None, manager, (0, 0, 0), (0, 0, 0), False)
    except Exception:
        return
    if all(hasattr(manager, a) for a in ("_block_dim", "_f", "_debug")) and \
            all(hasattr(thread, a) for a in ("syncthreads_blocked", "syncthreads_event", "exception", "abort")):
        sim.BlockManager.run = _run_block


if SIMULATOR:
    _schedule_blocks_without_spinning()


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
        fill = np.full(a.shape, np.nan if dt.kind in "fc" else np.iinfo(dt).max, dt)
        if SIMULATOR or stream is None:
            a.copy_to_device(fill)
        else:
            # on the workspace's own stream, finished before anything more is queued there: a kernel on a
            # stream that does not wait for the legacy default stream could otherwise run first
            a.copy_to_device(fill, stream=stream)
            stream.synchronize()
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
