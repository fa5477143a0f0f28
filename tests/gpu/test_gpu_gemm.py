"""GPU GEMM: every kernel variant (tile, dtype, operand layout, split-K) and dnnkit.gemm on device arrays,
against the float64 reference, on tiny odd shapes that reach every edge path: a partial last row block
and column block, a partial last depth step and at least two double-buffered steps; outputs poisoned
with NaN where they must not be read."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
from hypothesis import given, settings, strategies as st  # noqa: E402

import dnnkit  # noqa: E402
from dnnkit import reference as ref  # noqa: E402
from dnnkit.kernels import gemm as kg  # noqa: E402
from dnnkit.kernels._jit import cdiv  # noqa: E402
from gpu_helpers import close, dev, host, rand  # noqa: E402

LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
ACTS = ["identity", "relu", "tanh", "sigmoid", "gelu"]


def _edge_shape(tile):
    """Two row blocks (the second one row), a partial column block, three depth steps (the last partial)."""
    return tile.bm + 1, tile.bn - 3, 2 * tile.bk + 5


def _launch(tile, dtype, ta, tb, a, b, c, m, n, k, alpha, beta, bias=None, act=0):
    kern = kg.gemm_kernel(tile, dtype, ta, tb, False, bias is not None, act)
    t = np.dtype(dtype).type
    kern[(cdiv(n, tile.bn), cdiv(m, tile.bm), 1), tile.threads](
        a, b, c, c[0] if bias is None else bias, m, n, k, t(alpha), t(beta), k)


@pytest.mark.parametrize("tile_name", list(kg.TILES))
@pytest.mark.parametrize("ta, tb", LAYOUTS, ids=["nn", "nt", "tn", "tt"])
def test_tile_variants_float32(tile_name, ta, tb):
    """Every tile and operand layout; beta = 0 with C full of NaN: C is not read."""
    tile = kg.TILES[tile_name]
    m, n, k = _edge_shape(tile)
    rng = np.random.default_rng(hash((tile_name, ta, tb)) % 2**32)
    A, B = rand(rng, (m, k)), rand(rng, (k, n))
    a, b = (A.T.copy() if ta else A), (B.T.copy() if tb else B)
    c = dev(np.full((m, n), np.nan, np.float32))
    _launch(tile, "float32", ta, tb, dev(a), dev(b), c, m, n, k, 1.0, 0.0)
    got = host(c)
    assert np.isfinite(got).all()
    assert close(got, ref.gemm_ref(A, B), np.float32)


@pytest.mark.parametrize("tile_name", list(kg.TILES))
def test_tile_variants_float64_with_epilogue(tile_name):
    """float64, alpha and beta, bias and an activation fused into the store."""
    tile = kg.TILES[tile_name]
    m, n, k = _edge_shape(tile)
    rng = np.random.default_rng(7)
    A, B, C, bias = rand(rng, (m, k), np.float64), rand(rng, (k, n), np.float64), rand(rng, (m, n), np.float64), \
        rand(rng, (n,), np.float64)
    c = dev(C)
    _launch(tile, "float64", False, True, dev(A), dev(B.T.copy()), c, m, n, k, 0.5, -2.0, dev(bias), 2)
    expected = np.tanh(0.5 * (A @ B) - 2.0 * C + bias)
    assert close(host(c), expected, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_k_kernels(dtype):
    """The split kernel's raw sums over three depth slices (the last short), then the ordered reduction
    with the epilogue."""
    tile = kg.TILES["64x64"]
    m, n, k, chunk = 5, 67, 3 * tile.bk * 2 - 3, 2 * tile.bk
    splits = cdiv(k, chunk)
    rng = np.random.default_rng(3)
    A, B, C, bias = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype), rand(rng, (n,), dtype)
    ws = dev(np.full((splits, m, n), np.nan, dtype))
    t = np.dtype(dtype).type
    kg.gemm_kernel(tile, np.dtype(dtype).name, False, False, True)[(cdiv(n, 64), 1, splits), tile.threads](
        dev(A), dev(B), ws, ws[0, 0], m, n, k, t(1.0), t(0.0), chunk)
    c = dev(C)
    kg.splitk_reduce(np.dtype(dtype).name, True, 1)[cdiv(m * n, kg.REDUCE_THREADS), kg.REDUCE_THREADS](
        ws, c, dev(bias), m, n, splits, t(1.5), t(1.0))
    assert close(host(c), np.maximum(1.5 * (A.astype(np.float64) @ B) + C + bias, 0.0), dtype)


@pytest.mark.parametrize("algo", ["gemm_tiled_32x32", "gemm_tiled_64x64", "gemm_tiled_128x128", "gemm_splitk"])
def test_gemm_each_algorithm(algo, monkeypatch):
    from dnnkit.algos import gemm_cuda

    # split-K with slices of 8 (not 256) here: five slices over a depth of 40 in the simulator's time
    monkeypatch.setattr(gemm_cuda.SplitKGemm, "MIN_SLICE", 8)
    dnnkit.dispatch._plans.clear()
    rng = np.random.default_rng(5)
    m, n, k = (3, 5, 40) if algo == "gemm_splitk" else (33, 17, 19)
    a, b = rand(rng, (k, m)), rand(rng, (k, n))
    c = dnnkit.gemm(dev(a), dev(b), trans_a=True, algo=algo)
    assert close(host(c), ref.gemm_ref(a, b, trans_a=True), np.float32)


@settings(max_examples=8)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 24), ta=st.booleans(), tb=st.booleans(),
       alpha=st.sampled_from([1.0, -0.5]), beta=st.sampled_from([0.0, 1.0, 0.25]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_gemm_public(m, n, k, ta, tb, alpha, beta, dtype):
    """dnnkit.gemm on device arrays: transposes as flags, alpha and beta, C updated in place and returned."""
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rand(rng, (k, m) if ta else (m, k), dtype)
    b = rand(rng, (n, k) if tb else (k, n), dtype)
    c0 = rand(rng, (m, n), dtype)
    c = dev(c0)
    out = dnnkit.gemm(dev(a), dev(b), c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, algo="gemm_tiled_32x32")
    assert out is c
    assert close(host(c), ref.gemm_ref(a, b, c0, alpha, beta, ta, tb), dtype)


def test_gemm_transposed_views_and_default_choice():
    """A transposed view is read where it lies (no copy); the default plan (the rules) runs."""
    rng = np.random.default_rng(11)
    a, b = rand(rng, (21, 9)), rand(rng, (13, 21))
    c = dnnkit.gemm(dev(a).T, dev(b).T)
    assert close(host(c), a.T.astype(np.float64) @ b.T, np.float32)


def test_gemm_alpha_zero_and_empty_depth_do_not_read_the_operands():
    a = np.full((4, 3), np.nan, np.float32)
    b = np.full((3, 5), np.inf, np.float32)
    c = dev(np.ones((4, 5), np.float32))
    dnnkit.gemm(dev(a), dev(b), c, alpha=0.0, beta=2.0)
    assert (host(c) == 2.0).all()
    z = dnnkit.gemm(dev(np.ones((4, 0), np.float32)), dev(np.ones((0, 5), np.float32)))
    assert (host(z) == 0.0).all()
    e = dnnkit.gemm(dev(np.ones((0, 3), np.float32)), dev(b))
    assert host(e).shape == (0, 5)


def test_gemm_nan_propagates():
    a = np.ones((3, 4), np.float32)
    a[1, 2] = np.nan
    c = host(dnnkit.gemm(dev(a), dev(np.ones((4, 2), np.float32))))
    assert np.isnan(c[1]).all() and np.isfinite(c[[0, 2]]).all()


def test_gemm_errors_name_the_argument():
    g = dev(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match=r"gemm: arrays on different devices \(b on the host; a on the GPU"):
        dnnkit.gemm(g, np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="gemm: b has dtype float64 but a has float32"):
        dnnkit.gemm(g, dev(np.ones((3, 2))))
    with pytest.raises(ValueError, match="gemm: inner dimensions differ: op.a. is 2x3, op.b. is 2x2"):
        dnnkit.gemm(g, dev(np.ones((2, 2), np.float32)))
    with pytest.raises(ValueError, match=r"gemm: c must have shape \(2, 2\)"):
        dnnkit.gemm(g, dev(np.ones((3, 2), np.float32)), dev(np.ones((2, 3), np.float32)), beta=1.0)
    with pytest.raises(ValueError, match="gemm: algo 'gemm_splitk' cannot run"):
        dnnkit.gemm(g, dev(np.ones((3, 2), np.float32)), algo="gemm_splitk")
    with pytest.raises(TypeError, match="gemm: stream is for GPU arrays"):
        dnnkit.gemm(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), stream=0)


def test_explain_lists_the_gpu_algorithms():
    e = dnnkit.explain("gemm", dev(np.ones((2, 3), np.float32)), dev(np.ones((3, 2), np.float32)))
    assert e.problem.device == "cuda"
    names = [c.algorithm for c in e]
    assert names == ["gemm_tf32", "gemm_tiled_128x128", "gemm_tiled_64x64", "gemm_splitk", "gemm_tiled_32x32"]
    assert sum(c.chosen for c in e) == 1 and "simulator" in str(e) or "compute capability" in str(e)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (257, 1000, 2048), (64, 4096, 1024), (8, 16, 65536)])
def test_gemm_real_sizes(shape):
    m, n, k = shape
    rng = np.random.default_rng(0)
    a, b = rand(rng, (m, k)), rand(rng, (n, k))
    for algo in ["gemm_tiled_128x128", "gemm_tiled_64x64", "gemm_tiled_32x32", "gemm_splitk"]:
        c = dnnkit.gemm(dev(a), dev(b), trans_b=True, algo=algo)
        assert ref.rel_l2(host(c), ref.gemm_ref(a, b, trans_b=True)) <= 1e-5, algo


@pytest.mark.parametrize("ta, tb", [(True, False)], ids=["tn"])  # nn runs in test_tf32_is_opt_in
def test_tf32_kernel(ta, tb):
    """The tensor-core kernel (the simulator's mma: the same fragment layout and TF32 rounding): equal to
    the float64 product of the TF32-rounded operands to float32's accuracy, and within TF32's of the
    exact one; two column blocks, a partial depth step, bias fused, C full of NaN not read."""
    from dnnkit.kernels import gemm_tf32

    m, n, k = 17, gemm_tf32.TILE.bn + 2, 19
    rng = np.random.default_rng(2)
    A, B, bias = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (n,))
    a, b = (A.T.copy() if ta else A), (B.T.copy() if tb else B)
    c = dev(np.full((m, n), np.nan, np.float32))
    tile = gemm_tf32.TILE
    gemm_tf32.gemm_tf32_kernel(ta, tb, True, 0)[(cdiv(n, tile.bn), cdiv(m, tile.bm)), tile.threads](
        dev(a), dev(b), c, dev(bias), m, n, k, np.float32(1.0), np.float32(0.0), k)
    got = host(c)
    rounded = np.vectorize(gemm_tf32.tf32)
    assert ref.rel_l2(got, rounded(A).astype(np.float64) @ rounded(B) + bias) <= 2e-6
    assert ref.rel_l2(got, A.astype(np.float64) @ B + bias) <= 2e-3


def test_tf32_is_opt_in():
    """gemm_tf32 runs when named; auto takes it only where TF32 is allowed."""
    rng = np.random.default_rng(4)
    a, b = rand(rng, (9, 12)), rand(rng, (12, 5))
    c = dnnkit.gemm(dev(a), dev(b), algo="gemm_tf32")
    assert ref.rel_l2(host(c), ref.gemm_ref(a, b)) <= 2e-3
    e = dnnkit.explain("gemm", dev(a), dev(b))
    assert not e[0].supported and "set_allow_tf32" in e[0].reason
    dnnkit.set_allow_tf32(True)
    try:
        assert [x.algorithm for x in dnnkit.explain("gemm", dev(a), dev(b)) if x.chosen] == ["gemm_tf32"]
    finally:
        dnnkit.set_allow_tf32(False)
