"""The blocked GEMM driver's plans for where A lies and which thread packs it: A read where it lies
(few columns, contiguous rows), and A packed a micro-panel at a time by each thread where threads split
the columns one B block each; against the float64 reference, and the bits of one thread."""
from __future__ import annotations

import numpy as np
import pytest

import dnnkit
from dnnkit.reference import rel_l2
from helpers import DTYPES, tolerance, ukernel_geometry

BLOCKED = dnnkit.algos.get("gemm", "cpu", "blocked_gemm")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_a_rows_read_in_place(isa, num_threads, dtype):
    """Products of few columns (up to 512) on an A with contiguous rows, which micro-kernels that can read A
    where it lies (AVX2) do not pack: row tails, several depth blocks, rows in reverse order (a negative
    row stride), a row stride past the row, beta, a bias per column and an activation."""
    g = ukernel_geometry(isa, dtype)
    rng = np.random.default_rng(11)
    for m, n, k in [(g["MR"] + 1, 17, 2 * g["KC"] + 3), (2 * g["MR"] - 1, 512, 33), (1, 300, 5), (100, 64, g["KC"])]:
        base = rng.standard_normal((m, k + 7)).astype(dtype)
        for a in (base[:, 3:3 + k], base[::-1, :k]):
            b = rng.standard_normal((k, n)).astype(dtype)
            bias = rng.standard_normal(n).astype(dtype)
            c0 = rng.standard_normal((m, n)).astype(dtype)
            c = c0.copy()
            dnnkit.gemm(a, b, c, alpha=0.5, beta=-1.0)
            want = 0.5 * a.astype(np.float64) @ b.astype(np.float64) - c0
            assert rel_l2(c, want) <= tolerance(BLOCKED, dtype), (m, n, k)
            y = dnnkit.linear(np.ascontiguousarray(a), np.ascontiguousarray(b.T), bias, activation="relu")
            want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
            assert rel_l2(y, want) <= tolerance(BLOCKED, dtype), (m, n, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_gemm_column_shares_of_one_block_pack_a_per_thread(isa, dtype, threads):
    """Products whose threads split the columns, one B block each, and pack A a micro-panel at a time into
    slots of their own: square, tall, row tails, k past KC, a share not a whole number of panels, threads
    with no columns (four threads on two panels), beta 1; the bits those of one thread where the depth
    blocks are the same."""
    g = ukernel_geometry(isa, dtype)
    mr, nr = g["MR"], g["NR"]
    rng = np.random.default_rng(23)
    previous = dnnkit.get_num_threads()
    try:
        for m, n, k in [(256, 256, 256), (2 * mr + 3, 5 * nr + 7, g["KC"] + 9), (3 * mr - 1, 600, 40),
                        (mr, 2 * nr, 700), (2 * mr, 2 * nr - 3, 300)]:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            c0 = rng.standard_normal((m, n)).astype(dtype)
            want = a.astype(np.float64) @ b.astype(np.float64) + c0
            got = []
            for t in (1, threads):
                dnnkit.set_num_threads(t)
                c = c0.copy()
                dnnkit.gemm(a, b, c, beta=1.0, algo="blocked_gemm")
                assert rel_l2(c, want) <= tolerance(BLOCKED, dtype), (m, n, k, t)
                got.append(c)
            if k <= g["KC"]:
                assert np.array_equal(got[0], got[1]), (m, n, k)
    finally:
        dnnkit.set_num_threads(previous)
