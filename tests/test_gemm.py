"""dnnkit.gemm against the float64 reference, for every registered algorithm x ISA x thread count x dtype:
zero-size and one-element shapes, tails that are not multiples of MR/NR, k beyond KC, m beyond MC, n beyond
NC, all transposes, strided/negative/Fortran layouts, alpha/beta, NaN-poisoned outputs, NaN/Inf inputs,
and concurrent callers."""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.algos.gemm_cpu import WtDirectGemm
from dnnkit.problem import GemmProblem
from dnnkit.reference import gemm_ref, rel_l2
from helpers import DTYPES, LAYOUTS, SENTINEL, tolerance, ukernel_geometry, untouched_outside, with_layout

SCALARS = st.one_of(st.sampled_from([1.0, -1.0, 0.5]), st.floats(-2.0, 2.0, allow_nan=False, width=32))
BETAS = st.one_of(st.sampled_from([1.0, -1.5]), st.floats(-2.0, 2.0, allow_nan=False, width=32))


@dataclass
class GemmCase:
    m: int
    n: int
    k: int
    dtype: type
    trans_a: bool
    trans_b: bool
    alpha: float
    beta: float
    with_c: bool
    layouts: tuple  # (a, b, c)
    seed: int


@st.composite
def gemm_cases(draw, dims=None, dtype=None):
    if dims is None:
        # Mostly small sizes (fast, and the tails of every tile); about one example in eight up to 300,
        # past MC and several MR x NR tiles in both directions; now and then one dimension is 0.
        big = draw(st.integers(0, 7)) == 7
        dim = st.integers(1, 300) if big else st.one_of(st.integers(1, 9), st.integers(1, 64))
        dims = [dim, dim, dim]
        if draw(st.integers(0, 9)) == 9:
            dims[draw(st.integers(0, 2))] = st.just(0)
    m, n, k = (draw(d) for d in dims)
    # beta == 0 with c (poisoned with NaN: must not be read), beta == 0 without c, or beta != 0.
    mode = draw(st.sampled_from(["beta0", "no_c", "beta"]))
    beta = 0.0 if mode != "beta" else draw(BETAS.filter(lambda v: v != 0.0))
    return GemmCase(
        m=m, n=n, k=k, dtype=dtype or draw(st.sampled_from(DTYPES)), trans_a=draw(st.booleans()),
        trans_b=draw(st.booleans()), alpha=draw(SCALARS), beta=beta, with_c=mode != "no_c",
        layouts=tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(3)), seed=draw(st.integers(0, 2**32 - 1)),
    )


def unsupported(algo, m, n, k, trans_a, trans_b, dtype):
    """Why algo cannot run this GEMM (None when it can)."""
    return algo.supports(GemmProblem(m, n, k, trans_a=trans_a, trans_b=trans_b, dtype=np.dtype(dtype).name))


BLOCKED = dnnkit.algos.get("gemm", "cpu", "blocked_gemm")


def check_gemm(algo, case: GemmCase):
    """Runs one case through dnnkit.gemm(algo=algo.name) and checks it against gemm_ref. When algo does
    not support the case, checks that asking for it is a ValueError naming it and the reason instead."""
    rng = np.random.default_rng(case.seed)
    m, n, k, dtype = case.m, case.n, case.k, case.dtype
    a0 = rng.standard_normal((k, m) if case.trans_a else (m, k)).astype(dtype)  # stored shape of a
    b0 = rng.standard_normal((n, k) if case.trans_b else (k, n)).astype(dtype)  # stored shape of b
    c0 = rng.standard_normal((m, n)).astype(dtype)
    la, lb, lc = case.layouts
    a, _ = with_layout(a0, la)  # memory around strided inputs is NaN: reading it poisons the result
    b, _ = with_layout(b0, lb)
    c = cbuf = None
    if case.with_c:
        # beta == 0: c must not be read, so it is poisoned with NaN; memory around it holds a sentinel.
        c, cbuf = with_layout(c0 if case.beta != 0.0 else np.full_like(c0, np.nan), lc, fill=SENTINEL)
    expected = gemm_ref(a0, b0, c0, case.alpha, case.beta, case.trans_a, case.trans_b)
    reason = unsupported(algo, m, n, k, case.trans_a, case.trans_b, dtype)
    if reason is not None:
        with pytest.raises(ValueError, match=f"gemm: .*{re.escape(algo.name)}.*{re.escape(reason)}"):
            dnnkit.gemm(a, b, c, alpha=case.alpha, beta=case.beta, trans_a=case.trans_a, trans_b=case.trans_b,
                        algo=algo.name)
        return

    out = dnnkit.gemm(a, b, c, alpha=case.alpha, beta=case.beta, trans_a=case.trans_a, trans_b=case.trans_b,
                      algo=algo.name)

    assert isinstance(out, np.ndarray) and out.shape == (m, n) and out.dtype == dtype
    if c is not None:
        assert out is c, "gemm must return the c it was given, updated in place"
    assert not np.isnan(out).any(), "NaN in the output: an element was not written, or c was read with beta == 0"
    err = rel_l2(out, expected)
    assert err <= tolerance(algo, dtype), f"relative L2 error {err:.3g} for {case}"
    assert np.array_equal(a, a0) and np.array_equal(b, b0), "gemm modified its inputs"
    if c is not None:
        assert untouched_outside(c, cbuf, SENTINEL), "gemm wrote outside c"


@settings(max_examples=80)  # the core property, and cheap: more examples than the profile's default
@given(case=gemm_cases())
def test_gemm_matches_reference(isa, num_threads, gemm_algo, case):
    check_gemm(gemm_algo, case)


@settings(max_examples=10)
@given(data=st.data())
def test_gemm_k_beyond_kc(isa, num_threads, gemm_algo, data):
    """k spanning two and three KC blocks: the first block applies beta, the later ones accumulate."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    g = ukernel_geometry(isa, dtype)
    dims = (st.integers(1, 2 * g["MR"] + 1), st.integers(1, 2 * g["NR"] + 1),
            st.integers(g["KC"] - 1, 2 * g["KC"] + 3))
    case = data.draw(gemm_cases(dims=dims, dtype=dtype), label="case")
    check_gemm(gemm_algo, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_tile_tails(isa, num_threads, gemm_algo, dtype):
    """Every combination of m and n just below, at and just above one micro-tile."""
    g = ukernel_geometry(isa, dtype)
    seed = 0
    for m in (1, g["MR"] - 1, g["MR"], g["MR"] + 1, 2 * g["MR"] + 1):
        for n in (1, g["NR"] - 1, g["NR"], g["NR"] + 1, 2 * g["NR"] + 1):
            for k in (1, 7):
                seed += 1
                check_gemm(gemm_algo, GemmCase(m, n, k, dtype, False, True, 1.5, 0.0, True, ("C", "C", "C"), seed))
                check_gemm(gemm_algo, GemmCase(m, n, k, dtype, True, False, -1.0, 0.5, True, ("C", "F", "C"), seed))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_beyond_mc_and_nc(isa, num_threads, gemm_algo, dtype):
    """m past one MC block and n past one NC block (the outer loops of the driver), with tails. The
    reported NC is that of a full KC block (shallower products take wider blocks, up to the table's), so
    the cases past NC have depth KC."""
    g = ukernel_geometry(isa, dtype)
    for (m, n, k), trans_b, beta in [
        ((g["MR"] + 1, g["NC"] + g["NR"] + 3, g["KC"]), True, 0.0),
        ((g["MR"] + 1, g["NC"] + g["NR"] + 3, g["KC"]), False, 1.0),
        ((g["MR"] + 1, 2 * g["NC"] + 5, 5), False, 0.0),
        ((g["MC"] + g["MR"] + 1, 2 * g["NR"] + 1, 9), False, 0.0),
        ((g["MC"] + 3, g["NC"] + 1, g["KC"]), True, -0.5),
    ]:
        check_gemm(gemm_algo, GemmCase(m, n, k, dtype, False, trans_b, 1.0, beta, True, ("C", "C", "C"), m + n))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_wide_products_split_by_columns(isa, num_threads, dtype):
    """Wide products, whose threads each take an equal share of the column panels (in blocks of at most
    NC) and, from 512 columns a thread, each pack their own copy of the A block: shares that are not a
    whole number of panels, several A blocks (m past MC) and depth blocks, beta 0 and 1."""
    g = ukernel_geometry(isa, dtype)
    for (m, n, k), beta in [((2 * g["MR"] + 1, 1043, g["KC"] + 5), 0.0), ((g["MC"] + 7, 1043, 9), 1.0),
                            ((g["MR"] + 2, 2 * g["NC"] + 3 * g["NR"] + 1, 3), 1.0), ((5, 1024 + 1, 2), 0.0)]:
        check_gemm(BLOCKED, GemmCase(m, n, k, dtype, False, False, 1.0, beta, True, ("C", "C", "C"), m + n))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_b_outer_products(isa, num_threads, dtype, no_amx):
    """Products of 512 rows and more, which the ISAs whose blocking enables it run B-outer (each thread its
    share of the columns in B blocks that fit L3, A blocks in L2): row tails past every A block and
    micro-panel, column shares that are not whole panels, several B blocks and depth blocks, a transposed A, strided operands, alpha and beta, a bias
    and an activation; and a weight packed by pack_weight, read in place, gives the unpacked product's
    bits."""
    rng = np.random.default_rng(17)
    # Columns past a B block's (a KC x NC float64 block fills at most a quarter of L3 on two threads).
    wide = min(4096, dnnkit._cpu.l3_cache_bytes() // (2 * 512 * 8) * 3 // 2 + 5)
    for (m, n, k), trans_a, beta in [((517, 1041, 1100), False, 0.0), ((530, 1100, 137), True, -0.5),
                                     ((601, 75, 300), False, 1.0), ((520, wide, 600), False, 0.0)]:
        check_gemm(BLOCKED, GemmCase(m, n, k, dtype, trans_a, False, 1.0, beta, True, ("C", "C", "C"), m + n))
        check_gemm(BLOCKED, GemmCase(m, n, k, dtype, trans_a, True, 0.75, beta, True, ("C", "F", "strided"), m))
    x = rng.standard_normal((515, 700)).astype(dtype)
    w = (rng.standard_normal((1030, 700)) / 20).astype(dtype)
    b = rng.standard_normal(1030).astype(dtype)
    y = dnnkit.linear(x, w, b, activation="tanh", algo="blocked_gemm")
    assert rel_l2(y, np.tanh(x.astype(np.float64) @ w.T.astype(np.float64) + b)) <= tolerance(BLOCKED, dtype)
    assert np.array_equal(dnnkit.linear(x, dnnkit.pack_weight(w), b, activation="tanh"), y)
    tall = dnnkit.gemm(w[:, :515], x)  # 1030 x 700 over 515
    assert rel_l2(tall, w[:, :515].astype(np.float64) @ x.astype(np.float64)) <= tolerance(BLOCKED, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("m, n, k", [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0), (0, 5, 0), (1, 1, 0), (1, 1, 1)])
@pytest.mark.parametrize("beta, with_c", [(0.0, True), (0.0, False), (2.0, True)], ids=["beta0", "no_c", "beta2"])
def test_gemm_zero_size(isa, gemm_algo, dtype, m, n, k, beta, with_c):
    """m, n or k of 0: an empty result, or (k == 0) beta * c, or zeros when beta == 0 (c unread)."""
    for trans_b in (False, True):
        for layout in LAYOUTS:
            check_gemm(gemm_algo, GemmCase(m, n, k, dtype, False, trans_b, 1.0, beta, with_c, (layout,) * 3, 7))
    if k == 0 and m and n and not unsupported(gemm_algo, m, n, k, False, True, dtype):
        c = np.full((m, n), 3.0, dtype=dtype)
        out = dnnkit.gemm(np.zeros((m, 0), dtype), np.zeros((n, 0), dtype), c, beta=beta, trans_b=True,
                          algo=gemm_algo.name)
        assert np.array_equal(out, np.full((m, n), 3.0 * beta, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("beta, with_c", [(0.0, True), (0.0, False), (1.0, True), (-0.5, True)])
def test_gemm_alpha_zero_reads_neither_a_nor_b(gemm_algo, dtype, beta, with_c):
    """alpha == 0: C = beta * C, as BLAS, which does not read a and b (their NaN and Inf do not reach C);
    beta == 0 does not read c either."""
    if unsupported(gemm_algo, 5, 4, 3, False, True, dtype):
        pytest.skip(f"{gemm_algo.name} does not run this product")
    a = np.full((5, 3), np.nan, dtype)
    b = np.full((4, 3), np.inf, dtype)
    c = np.arange(20, dtype=dtype).reshape(5, 4) if beta else np.full((5, 4), np.nan, dtype)
    want = np.zeros((5, 4), dtype) if not with_c or beta == 0.0 else c * dtype(beta)
    out = dnnkit.gemm(a, b, c.copy() if with_c else None, alpha=0.0, beta=beta, trans_b=True,
                      algo=gemm_algo.name)
    assert np.array_equal(out, want)


@given(data=st.data())
def test_gemm_propagates_nan_and_inf(isa, gemm_algo, data):
    """NaN and Inf in a, b (and c when beta != 0) propagate as in a float64 NumPy computation."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    m, n, k = (data.draw(st.integers(1, 12), label=s) for s in "mnk")
    trans_a, trans_b = data.draw(st.booleans(), label="trans_a"), data.draw(st.booleans(), label="trans_b")
    alpha = data.draw(st.sampled_from([1.0, -2.0, 0.5]), label="alpha")
    beta = data.draw(st.sampled_from([0.0, 1.0, -0.5]), label="beta")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    # Uniform in [-1, 1]: no overflow in float32, so every Inf and NaN comes from the injected values.
    a = rng.uniform(-1, 1, (k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.uniform(-1, 1, (m, n)).astype(dtype)
    for _ in range(data.draw(st.integers(1, 4), label="n_special")):
        target = data.draw(st.sampled_from([a, b, c]), label="target")
        index = tuple(data.draw(st.integers(0, s - 1)) for s in target.shape)
        target[index] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), label="value")
    expected = gemm_ref(a, b, c, alpha, beta, trans_a, trans_b)
    c_in = c.copy() if beta != 0.0 else np.full_like(c, np.nan)  # beta == 0: c must not be read
    if unsupported(gemm_algo, m, n, k, trans_a, trans_b, dtype):
        return  # the rejection itself is checked by test_gemm_matches_reference

    out = dnnkit.gemm(a, b, c_in, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, algo=gemm_algo.name)

    assert np.array_equal(np.isnan(out), np.isnan(expected)), "NaN positions differ from NumPy's"
    assert np.array_equal(np.isinf(out), np.isinf(expected)), "Inf positions differ from NumPy's"
    assert rel_l2(out, expected) <= tolerance(gemm_algo, dtype)


def test_gemm_default_algo_and_aliasing(isa):
    """algo='auto' dispatches to a registered algorithm; c may be one of the inputs (read before written)."""
    rng = np.random.default_rng(3)
    for dtype in DTYPES:
        a = rng.standard_normal((37, 37)).astype(dtype)
        b = rng.standard_normal((37, 37)).astype(dtype)
        expected = gemm_ref(a, b, a, 1.0, 1.0)
        tol = max(tolerance(alg, dtype) for alg in dnnkit.algos.algorithms("gemm", "cpu"))
        assert rel_l2(dnnkit.gemm(a, b), gemm_ref(a, b)) <= tol
        out = dnnkit.gemm(a, b, a, beta=1.0)  # c is a: a = a @ b + a
        assert out is a
        assert rel_l2(out, expected) <= tol


def test_gemm_accepts_nested_lists():
    out = dnnkit.gemm([[1.0, 2.0], [3.0, 4.0]], [[1.0], [1.0]])
    assert out.dtype == np.float64
    assert np.array_equal(out, np.array([[3.0], [7.0]]))


def test_gemm_concurrent_callers(isa, gemm_algo):
    """Several Python threads calling gemm at once (the GIL is released) each get their own right answer."""
    dnnkit.set_num_threads(2)
    n_threads, calls = 4, 20
    failures = []

    def worker(tid):
        rng = np.random.default_rng(100 + tid)
        try:
            for i in range(calls):
                dtype = DTYPES[(tid + i) % 2]
                for _ in range(1000):  # sizes the algorithm supports
                    m, n, k = (int(v) for v in rng.integers(1, 120, size=3))
                    if not unsupported(gemm_algo, m, n, k, False, True, dtype):
                        break
                else:
                    return  # none on this ISA (gemm_wt_direct has no portable kernel)
                a = rng.standard_normal((m, k)).astype(dtype)
                b = rng.standard_normal((n, k)).astype(dtype)
                c = np.full((m, n), np.nan, dtype=dtype)
                out = dnnkit.gemm(a, b, c, trans_b=True, algo=gemm_algo.name)
                err = rel_l2(out, gemm_ref(a, b, trans_b=True))
                if not err <= tolerance(gemm_algo, dtype):
                    failures.append(f"thread {tid} call {i}: {m}x{n}x{k} {np.dtype(dtype).name} error {err:.3g}")
        except Exception as e:  # noqa: BLE001 - reported below with its thread
            failures.append(f"thread {tid}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a gemm call hung"
    assert not failures, failures


def test_products_around_the_parallel_threshold():
    """With the default threshold (tests otherwise run with 0), products just under it run on one thread
    and just over it on all: both give the reference's result, for the packing GEMM and small_m."""
    previous = dnnkit._cpu.min_parallel_work()
    dnnkit._cpu.set_min_parallel_work(2 ** 17)
    dnnkit.set_num_threads(2)
    try:
        rng = np.random.default_rng(4)
        for m, n, k in ((50, 50, 50), (64, 64, 64), (1, 512, 255), (1, 520, 260), (4, 130, 250)):
            a = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n, k)).astype(np.float32)
            want = a.astype(np.float64) @ w.T.astype(np.float64)
            for kernel in (dnnkit._cpu.gemm, dnnkit._cpu.gemm_small_m):
                c = np.full((m, n), np.nan, np.float32)
                kernel(a, w.T, c)
                assert np.linalg.norm(c - want) <= 1e-5 * np.linalg.norm(want), (kernel.__name__, m, n, k)
    finally:
        dnnkit._cpu.set_min_parallel_work(previous)


def check_epilogue_contract(kernel, data, a, b, rng, c_order):
    """kernel (a _cpu binding of gemm's contract) on a and b against the float64 product: alpha, beta (a
    NaN-filled C when beta is 0, which must not be read), bias, activation, C in order c_order."""
    alpha = data.draw(st.sampled_from([1.0, -0.5]), label="alpha")
    beta = data.draw(st.sampled_from([0.0, 1.0, 0.25]), label="beta")
    act = data.draw(st.sampled_from([0, 1, 2, 3]), label="activation")
    with_bias = data.draw(st.booleans(), label="bias")
    (m, k), n, dtype = a.shape, b.shape[1], a.dtype
    bias = rng.standard_normal(n).astype(dtype) if with_bias else None
    c0 = rng.standard_normal((m, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype) if beta == 0.0 else c0.copy()
    c = np.asfortranarray(c) if c_order == "F" else c
    kernel(a, b, c, alpha, beta, bias, act, 0)
    want = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + (beta * c0 if beta else 0.0)
    if bias is not None:
        want = want + bias
    want = {0: want, 1: np.maximum(want, 0.0), 2: np.tanh(want), 3: 1.0 / (1.0 + np.exp(-want))}[act]
    assert np.all(np.isfinite(c))
    assert rel_l2(c, want) <= (2e-6 if dtype == np.float32 else 1e-13) * max(1.0, np.sqrt(k) / 8)


def check_row_kernel(kernel, data, dtype, m, n, k):
    """kernel (a _cpu binding of gemm's contract for A W^T with rows contiguous along k) against the
    float64 product (check_epilogue_contract), C in either order."""
    c_order = "F" if data.draw(st.booleans(), label="C column-major") else "C"
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    check_epilogue_contract(kernel, data, a, w.T, rng, c_order)


@settings(max_examples=40)
@given(data=st.data())
def test_gemm_wt_direct_kernel_contract(isa, num_threads, data):
    """gemm_wt_direct (C^T = W A^T, W read in place by the strided-A kernel) directly, at every batch size
    from 1 to past four panels and depths past its depth blocks. On an ISA without the kernel it falls
    back to the packing GEMM, with the same result."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    width = max(dnnkit._cpu.gemm_wt_direct_width(np.dtype(dtype).itemsize), 8)
    block = dnnkit._cpu.gemm_wt_direct_depth_block(np.dtype(dtype).itemsize) or 1024
    m = data.draw(st.integers(1, 4 * width + 3), label="m")
    n = data.draw(st.integers(1, 40), label="n")
    k = data.draw(st.sampled_from([0, 1, 2, 17, 255, 1024, block, block + 1, 2 * block + 3]), label="k")
    check_row_kernel(dnnkit._cpu.gemm_wt_direct, data, dtype, m, n, k)


@settings(max_examples=40)
@given(data=st.data())
def test_gemm_small_m_kernel_contract(isa, num_threads, data):
    """gemm_small_m directly, across its blocks: m past its 16-row units and the dot kernel's rows, n
    past its 32-column units, depths with tails; C with unit column stride is written in place, other C
    through a tile."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    m = data.draw(st.integers(1, 40), label="m")
    n = data.draw(st.integers(1, 100), label="n")
    k = data.draw(st.sampled_from([0, 1, 2, 17, 64, 255]), label="k")
    check_row_kernel(dnnkit._cpu.gemm_small_m, data, dtype, m, n, k)


@pytest.mark.parametrize("kernel,m", [("gemm_small_m", 40), ("gemm_wt_direct", 70)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernels_same_result_in_either_direction(isa, num_threads, dtype, kernel, m):
    """gemm_small_m and gemm_wt_direct run their units forwards and backwards on alternate calls with the
    same weights (so that a call starts on what the last one left in cache): every call gives the same
    bits."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, 300)).astype(dtype)
    w = rng.standard_normal((333, 300)).astype(dtype)
    bias = rng.standard_normal(333).astype(dtype)
    outs = []
    for _ in range(4):
        c = np.full((m, 333), np.nan, dtype)
        getattr(dnnkit._cpu, kernel)(a, w.T, c, 1.0, 0.0, bias, 1, 0)
        outs.append(c)
    for c in outs[1:]:
        assert np.array_equal(c, outs[0])
    want = np.maximum(a.astype(np.float64) @ w.T.astype(np.float64) + bias, 0.0)
    assert rel_l2(outs[0], want) <= (2e-6 if dtype == np.float32 else 1e-13) * 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_a_tile_widths_give_the_same_bits(isa, num_threads, dtype):
    """gemm_wt_direct takes the narrowest strided-A tile that holds the batch (AVX-512: 16, 32 or 48
    float32 rows; larger batches in panels of 32): any batch's rows come out bit for bit as they do inside
    a larger batch, so the choice never changes a result. The depth crosses the kernel's depth blocks."""
    if dnnkit._cpu.gemm_wt_direct_width(np.dtype(dtype).itemsize) == 0:
        pytest.skip("no strided-A micro-kernel on this ISA")
    rng = np.random.default_rng(17)
    k = dnnkit._cpu.gemm_wt_direct_depth_block(np.dtype(dtype).itemsize) + 500
    a = rng.standard_normal((130, k)).astype(dtype)
    w = rng.standard_normal((75, k)).astype(dtype)
    bias = rng.standard_normal(75).astype(dtype)
    full = np.empty((130, 75), dtype)
    dnnkit._cpu.gemm_wt_direct(a, w.T, full, 1.0, 0.0, bias, 0, 0)
    widths = set()
    for m in (1, 5, 8, 13, 16, 17, 24, 32, 33, 48, 49, 64, 65, 100):
        widths.add(dnnkit._cpu.gemm_wt_direct_width(np.dtype(dtype).itemsize, m))
        part = np.full((m, 75), np.nan, dtype)
        dnnkit._cpu.gemm_wt_direct(a[:m], w.T, part, 1.0, 0.0, bias, 0, 0)
        assert np.array_equal(part, full[:m]), m
    assert rel_l2(full, a.astype(np.float64) @ w.T.astype(np.float64) + bias) <= (
        1e-6 if dtype == np.float32 else 1e-13)
    if dnnkit._cpu.active_isa() == "avx512":
        assert len(widths) == 3  # every tile width was run


def check_streamed(dtype, m, n, k, data, b_view, c_order):
    """dnnkit._cpu.gemm on one streamed shape (see test_gemm_streamed_products), A in either order, B as
    b_view, against float64 (check_epilogue_contract)."""
    rng = np.random.default_rng(m * 100003 + n * 101 + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    if data.draw(st.booleans(), label="A column-major"):
        a = np.asfortranarray(a)
    wide = rng.standard_normal((k, n + 9)).astype(dtype)
    b = {"contiguous": np.ascontiguousarray(wide[:, :n]), "row stride": wide[:, 5:5 + n],
         "transposed": np.asfortranarray(wide[:, :n])}[b_view]
    check_epilogue_contract(dnnkit._cpu.gemm, data, a, b, rng, c_order)


@settings(max_examples=40)
@given(data=st.data())
def test_gemm_streamed_products(isa, num_threads, data):
    """The products gemm streams (gemm_stream.cpp), through dnnkit._cpu.gemm: few rows (m <= 8) against a
    deep B with rows contiguous, in chunks of B's rows (one or two chunks' worth and many, with tails);
    and few deep (k <= 8) into a C with contiguous rows, in units of rows. The same shapes with B
    transposed, or (few deep) C column-major, go to the blocked GEMM: the same contract either way."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    b_view = data.draw(st.sampled_from(["contiguous", "row stride", "transposed"]), label="B")
    if data.draw(st.booleans(), label="few rows"):
        m = data.draw(st.integers(1, 8), label="m")
        n = data.draw(st.integers(16, 150), label="n")
        k = data.draw(st.sampled_from([511, 512, 513, 700, 1031, 4099]), label="k")
        c_order = data.draw(st.sampled_from("CF"), label="C order")
    else:
        m = data.draw(st.integers(16, 300), label="m")
        n = data.draw(st.integers(16, 150), label="n")
        k = data.draw(st.integers(1, 8), label="k")
        c_order = data.draw(st.sampled_from("CCF"), label="C order")
    check_streamed(dtype, m, n, k, data, b_view, c_order)


def _on_1_and_2_threads(call, times):
    """call()'s results, `times` calls on 1 thread then as many on 2 (the thread count restored)."""
    outs = []
    previous = dnnkit.get_num_threads()
    try:
        for threads in (1, 2):
            dnnkit.set_num_threads(threads)
            outs += [call() for _ in range(times)]
    finally:
        dnnkit.set_num_threads(previous)
    return outs


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("past_caches", [True, False])
def test_gemm_few_deep_past_the_caches(isa, dtype, k, past_caches):
    """A few-deep product into a C only written (beta = 0, no bias), larger than the size from which it
    is stored past the caches (past_caches_bytes, lowered here under C's size) or smaller (plain stores):
    every element written (C starts as NaN), float32's error against float64, alpha applied, rows of odd
    length (each starting off the vectors' alignment), and the same bits on 1 and 2 threads and in either
    direction of the calls."""
    n = 1003
    m = dnnkit._cpu.l2_cache_bytes() // (n * np.dtype(dtype).itemsize) + 37
    if past_caches:
        dnnkit._cpu.set_past_caches_bytes(dnnkit._cpu.l2_cache_bytes())
    rng = np.random.default_rng(k)
    a = rng.standard_normal((k, m)).astype(dtype).T  # a dW's layout: dY^T, rows of A strided
    b = rng.standard_normal((k, n)).astype(dtype)
    def call():
        c = np.full((m, n), np.nan, dtype)
        dnnkit._cpu.gemm(a, b, c, 0.5, 0.0, None, 0, 0)
        return c

    try:
        outs = _on_1_and_2_threads(call, 2)
    finally:
        dnnkit._cpu.set_past_caches_bytes(-1)
    for c in outs[1:]:
        assert np.array_equal(c, outs[0])
    assert rel_l2(outs[0], 0.5 * (a.astype(np.float64) @ b)) <= (1e-6 if dtype == np.float32 else 1e-13)


def test_past_caches_bytes_default():
    """The size from which a written-only output is stored past the caches: the last-level cache's by
    default (L3, else L2), at most 16 L2 caches' worth; any size while a test sets it, the default again on
    a negative value."""
    default = dnnkit._cpu.past_caches_bytes()
    l2, l3 = dnnkit._cpu.l2_cache_bytes(), dnnkit._cpu.l3_cache_bytes()
    assert default == (min(l3, 16 * l2) if l3 > 0 else l2)
    try:
        dnnkit._cpu.set_past_caches_bytes(12345)
        assert dnnkit._cpu.past_caches_bytes() == 12345
    finally:
        dnnkit._cpu.set_past_caches_bytes(-1)
    assert dnnkit._cpu.past_caches_bytes() == default


@pytest.mark.parametrize("m,n,k", [(1, 1000, 3000), (5, 130, 2100), (3000, 300, 1), (400, 77, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_streamed_same_bits_on_any_threads(isa, dtype, m, n, k):
    """A streamed product sums its chunks (few rows) or its depth (few deep) in one order whatever the
    number of threads and the direction of the call (which alternates on the same operands): 1 and 2
    threads, four calls each, give the same bits."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    def call():
        c = c0.copy()
        dnnkit._cpu.gemm(a, b, c, 1.0, 1.0, None, 0, 0)
        return c

    outs = _on_1_and_2_threads(call, 4)
    for c in outs[1:]:
        assert np.array_equal(c, outs[0])
    assert rel_l2(outs[0], a.astype(np.float64) @ b.astype(np.float64) + c0) <= (
        1e-6 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("m,n,k", [(1001, 64, 1300), (997, 40, 200), (3, 64, 700), (500, 96, 64)])
@pytest.mark.parametrize("a_rows", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_a_panel_at_a_time(isa, no_amx, dtype, m, n, k, a_rows):
    """A product whose A micro-panels each meet one B block (few columns) packs each panel just before
    its row of tiles: on 1 and 2 threads, A with contiguous rows or columns, a depth past one depth block
    (beta applied on the first only), row tails of every height, a column bias and relu on the last block,
    and the same bits on either thread count."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(dtype) if a_rows else rng.standard_normal((k, m)).astype(dtype).T
    _check_relu_product(rng, a, rng.standard_normal((k, n)).astype(dtype))


def _check_relu_product(rng, a, b):
    """relu(0.5 A B + 0.25 C + bias) by the extension's gemm on 1 and 2 threads: the same bits on both, and
    within float64's bound."""
    m, n = a.shape[0], b.shape[1]
    bias = rng.standard_normal(n).astype(a.dtype)
    c0 = rng.standard_normal((m, n)).astype(a.dtype)
    def call():
        c = c0.copy()
        dnnkit._cpu.gemm(a, b, c, 0.5, 0.25, bias, 1, 0)
        return c

    outs = _on_1_and_2_threads(call, 1)
    assert np.array_equal(outs[0], outs[1]), a.shape + b.shape
    want = np.maximum(0.5 * (a.astype(np.float64) @ b) + 0.25 * c0 + bias, 0)
    assert rel_l2(outs[0], want) <= (1e-6 if a.dtype == np.float32 else 1e-13), a.shape + b.shape


@pytest.mark.parametrize("b_layout", ["rows", "offset", "4k_rows"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_b_read_in_place(isa, no_amx, dtype, b_layout):
    """A product of few rows of A on a B with contiguous rows reads B where it lies (each A micro-panel
    height, a last panel of B narrower than the kernel's, rows at any alignment, or 4 KiB apart, where B is
    packed instead): every result within float64's bound, beta, a column bias and relu on the last depth
    block, and the same bits on 1 and 2 threads."""
    rng = np.random.default_rng(7)
    for m, n, k in [(1, 200, 300), (5, 515, 300), (13, 200, 1300), (14, 96, 300), (27, 515, 700), (49, 200, 300),
                    (97, 130, 300), (112, 515, 300), (113, 200, 300)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        if b_layout == "4k_rows":
            per_4k = 4096 // np.dtype(dtype).itemsize
            b = rng.standard_normal((k, -(-n // per_4k) * per_4k)).astype(dtype)[:, :n]
        else:
            b = rng.standard_normal((k, n + 1)).astype(dtype)
            b = b[:, 1:] if b_layout == "offset" else np.ascontiguousarray(b[:, :n])
        _check_relu_product(rng, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_half_width_last_panel(isa, no_amx, dtype):
    """A last panel of B of half the kernel's width or less runs on the half-width kernels (UKernel::half,
    where the ISA has them) at every A micro-panel height: last panels of 1 to NR/2 columns and one wider
    (NR/2 + 1), rows in full panels and in tails, one and several depth blocks (beta on the later ones), a
    column bias and relu, over 512 columns as well (where AVX2 packs an A it reads in place below) and in
    both loop orders (AVX2's B-outer from 512 rows); every result within float64's bound and the same bits
    on 1 and 2 threads."""
    rng = np.random.default_rng(11)
    nr = dnnkit.info()["ukernels"][np.dtype(dtype).name]["NR"]
    for m, n, k in [(130, nr + 1, 300), (131, nr + nr // 2, 700), (129, nr + nr // 2 + 1, 300), (41, 2 * nr + 3, 700),
                    (14, nr // 2, 300), (200, 12 * nr + nr // 4, 300), (9, 5, 40),
                    (300, 515, 150), (520, 515, 200)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        _check_relu_product(rng, a, b)


def test_strided_a_batch_rule():
    """The batches gemm_wt_direct is chosen for (the extension's sa_batch_fits, which the RNN code and the
    registry's WtDirectGemm share) on AVX-512 float32: one tile at least 60% full, panels of 32 rows at
    least 75% full, at most 128 rows; each refusal names its reason."""
    if dnnkit._cpu.active_isa() != "avx512":
        pytest.skip("the rule's tile widths are AVX-512's")
    fits = {m: dnnkit._cpu.gemm_wt_direct_fits(4, m) for m in range(0, 140)}
    want = {m: (m > 0 and m <= 128 and (m >= 0.6 * w if (w := next(t for t in (16, 32, 48, 10**9) if m <= t)) <= 48
                                          else m >= 0.75 * 32 * -(-m // 32)))
            for m in range(0, 140)}
    assert fits == want
    assert fits[49] and fits[64] and not fits[65] and fits[72] and fits[128] and not fits[129]
    for m, text in ((65, "68% of its 3 panels of 32 rows"), (129, "not 1 to 128"), (9, "56% of its 16-row tile")):
        rule = WtDirectGemm().own_rule(GemmProblem(m, 1024, 512, trans_b=True))
        assert text in rule, rule
    assert {c.algorithm: c.rule for c in dnnkit.explain("m65n1024k512tb_f32")}["gemm_wt_direct"].startswith(
        "m = 65 fills 68%")


def test_vector_gelu_accuracy(isa):
    """The float32 gelu of the GEMM's epilogue (the vector function rnn_math_test's fn 3 runs), against
    x Phi(x) with Phi from erfc in float64: relative error under 1e-6 from -16 to 16 on AVX2 and AVX-512,
    the negative tail included (where 0.5 x (1 + erf(x / sqrt 2)) cancels), and on the portable ISA (the C
    library's erfc in double). gelu(inf) = inf; gelu(-inf) and gelu(NaN) are NaN, as x Phi(x) is."""
    import math

    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-16, 16, 20001), 3 * rng.standard_normal(20000),
                        [0.0, -0.0, 1e-30, -1e-30, 1.4142135, -1.4142135, 12.727922, -12.727922, 14.142136, -14.142136]]).astype(np.float32)
    ref = np.array([0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2.0)) for v in x])
    y = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(3, x, y)
    big = np.abs(ref) > 1e-30
    rel = np.abs(y[big] - ref[big]) / np.abs(ref[big])
    assert rel.max() <= 1e-6, (rel.max(), x[big][np.argmax(rel)])
    assert np.abs(y[~big]).max() <= 1e-30
    special = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
    out = np.empty_like(special)
    dnnkit._cpu.rnn_math_test(3, special, out)
    assert out[0] == np.inf and np.isnan(out[1]) and np.isnan(out[2])


def test_vector_gelu_derivative_accuracy(isa):
    """gelu'(x) = Phi(x) + x phi(x) as linear's backward computes it (rnn_math_test's fn 4: the vector
    function on AVX2 and AVX-512, the C library's erfc and exp in double on the portable ISA), against
    float64: error under 1e-6 of |Phi| + |x phi| (the sum's own scale; it crosses zero near x = -0.75)
    from -16 to 16 wherever that scale is a normal float32, and under 1e-30 where it is not."""
    import math

    rng = np.random.default_rng(6)
    x = np.concatenate([np.linspace(-16, 16, 20001), 3 * rng.standard_normal(20000),
                        [0.0, -0.0, 1e-30, 1.4142135, -1.4142135, 12.727922, -12.727922, 14.142136, -14.142136]]
                       ).astype(np.float32)
    xd = x.astype(np.float64)
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in xd])
    pdf = np.exp(-0.5 * xd * xd) / math.sqrt(2.0 * math.pi)
    ref, scale = phi + xd * pdf, phi + np.abs(xd * pdf)
    d = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(4, x, d)
    big = scale > 1e-30
    err = np.abs(d[big] - ref[big]) / scale[big]
    assert err.max() <= 1e-6, (err.max(), x[big][np.argmax(err)])
    assert np.abs(d[~big]).max() <= 1e-30
    out = np.empty(1, dtype=np.float32)
    dnnkit._cpu.rnn_math_test(4, np.array([np.nan], dtype=np.float32), out)
    assert np.isnan(out[0])


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "gelu", "relu"])
@pytest.mark.parametrize("m,n", [(37, 45), (300, 20)])
def test_linear_output_same_with_and_without_preactivation(isa, activation, m, n):
    """linear's fused epilogue and the separate activation pass (return_preactivation=True) compute the same
    function, so y is the same either way; 300 x 20 is solved transposed (C^T = W X^T), its tiles' columns
    contiguous."""
    rng = np.random.default_rng(11)
    x = (4 * rng.standard_normal((m, 70))).astype(np.float32)
    w = rng.standard_normal((n, 70)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = dnnkit.linear(x, w, b, activation=activation)
    y2, z = dnnkit.linear(x, w, b, activation=activation, return_preactivation=True)
    assert np.array_equal(y, y2)
    assert np.array_equal(z, dnnkit.linear(x, w, b))


def test_gemm_amx_is_a_path_of_its_own():
    """blocked_gemm's AMX path is a registry entry: where the CPU has the tiles it runs products of 192
    rows and columns or more at float32's accuracy; elsewhere it says why not, and algo= naming it fails
    with that reason."""
    algo = dnnkit.algos.get("gemm", "cpu", "gemm_amx")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    p = dnnkit.GemmProblem(256, 256, 256)
    assert algo.supports(dnnkit.GemmProblem(256, 256, 256, dtype="float64")) is not None
    if not dnnkit._cpu.amx_takes_shape(256, 256, 256):
        assert "AMX" in algo.supports(p)
        with pytest.raises(ValueError, match="gemm: algo 'gemm_amx' cannot run .*AMX"):
            dnnkit.gemm(a, b, algo="gemm_amx")
        return
    assert "192" in algo.supports(dnnkit.GemmProblem(64, 256, 256))
    got = dnnkit.gemm(a, b, algo="gemm_amx")
    assert rel_l2(got, a.astype(np.float64) @ b.astype(np.float64)) <= algo.tolerance


def test_repeated_gemm_calls_reuse_the_dispatch_and_still_check_c():
    """A repeated call signature skips validation and dispatch: results as the first call's, c updated in
    place and read through a copy where it overlaps an input, and every argument the signature does not
    fix (c, alpha, beta, the flags' types) still checked."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((9, 6)).astype(np.float32)
    b = rng.standard_normal((6, 5)).astype(np.float32)
    first = dnnkit.gemm(a, b)
    again = dnnkit.gemm(a, b)
    assert np.array_equal(first, again) and again is not first
    c = rng.standard_normal((9, 5)).astype(np.float32)
    for _ in range(2):
        expected = gemm_ref(a, b, c, 0.5, -1.5)
        out = dnnkit.gemm(a, b, c, alpha=0.5, beta=-1.5)
        assert out is c and rel_l2(out, expected) <= 1e-5
    sq = rng.standard_normal((7, 7)).astype(np.float64)
    for _ in range(2):  # c is a: read before it is written
        s = sq.copy()
        expected = gemm_ref(s, s.T, s, 1.0, 1.0)
        assert rel_l2(dnnkit.gemm(s, s, s, beta=1.0, trans_b=True), expected) <= 1e-12
    with pytest.raises(ValueError, match=r"gemm: c must have shape \(9, 5\)"):
        dnnkit.gemm(a, b, np.zeros((5, 9), np.float32))
    with pytest.raises(TypeError, match="gemm: c must have dtype float32"):
        dnnkit.gemm(a, b, np.zeros((9, 5), np.float64))
    ro = np.zeros((9, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="gemm: c is read-only"):
        dnnkit.gemm(a, b, ro)
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(5, np.float32), (9, 5), (0, 4))
    with pytest.raises(ValueError, match="gemm: c has a zero stride"):
        dnnkit.gemm(a, b, overlapping)
    with pytest.raises(ValueError, match="gemm: beta is nonzero but c is None"):
        dnnkit.gemm(a, b, beta=1.0)
    with pytest.raises(TypeError, match="gemm: trans_a must be a bool"):
        dnnkit.gemm(a, b, trans_a=0)
    zeros = dnnkit.gemm(np.full_like(a, np.nan), b, alpha=0.0)  # alpha 0: a is not read
    assert np.array_equal(zeros, np.zeros((9, 5), np.float32))
    threads = dnnkit.get_num_threads()
    dnnkit.set_num_threads(1)
    try:  # a setting changed between calls: dispatched again
        assert rel_l2(dnnkit.gemm(a, b), gemm_ref(a, b)) <= 1e-5
    finally:
        dnnkit.set_num_threads(threads)
