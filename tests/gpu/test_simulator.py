"""The block scheduler the GPU tests install in Numba's CUDA simulator (conftest.py): barriers open only
when every live thread of the block waits at them, and a thread's exception stops the launch and reaches
the caller. Simulator only."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from numba import cuda  # noqa: E402

from gpu_helpers import dev, host  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"),
                                reason="the simulator's scheduler")


def _kernels():
    @cuda.jit
    def rotate(x, rounds):
        """Each round every thread writes its value to shared memory, waits, and takes its neighbour's:
        right only if no thread reads before all have written."""
        s = cuda.shared.array(64, np.float64)
        i = cuda.threadIdx.x
        n = cuda.blockDim.x
        v = x[cuda.blockIdx.x, i]
        for _ in range(rounds):
            s[i] = v
            cuda.syncthreads()
            v = s[(i + 1) % n]
            cuda.syncthreads()
        x[cuda.blockIdx.x, i] = v

    @cuda.jit
    def fails(x):
        cuda.syncthreads()
        if cuda.threadIdx.x == 5:
            x[1000] = 1.0
        cuda.syncthreads()
        x[cuda.threadIdx.x] = 2.0

    return rotate, fails


def test_barriers_open_when_every_thread_waits():
    rotate, _ = _kernels()
    x = np.arange(3 * 64, dtype=np.float64).reshape(3, 64)
    d = dev(x)
    rotate[3, 64](d, 5)
    assert np.array_equal(host(d), np.roll(x, -5, axis=1))


def test_a_thread_exception_stops_the_launch():
    _, fails = _kernels()
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        fails[1, 32](dev(np.zeros(32)))


def test_the_gpu_status_names_the_simulator():
    """Under the simulator there is no device to describe: the GPU backend says so (dnnkit info, the CLI's
    --device cuda), rather than failing on the simulator's device."""
    from dnnkit.backends import cuda as backend

    s = backend.status()
    assert not s["available"] and "CUDA simulator" in s["reason"] and s["devices"] == []
