"""The micro-kernel contract of csrc/gemm/ukernel.h, tested exactly through dnnkit._cpu.ukernel_test.

    a: packed A panel, k*MR elements, a[p*MR + i] = A(i, p);  b: packed B panel, k*NR elements, b[p*NR + j] = B(p, j)
    for i < m <= MR, j < n <= NR:  C(i, j) := beta * C(i, j) + alpha * sum_p A(i, p) B(p, j) [+ bias[j] or bias[i]]
    nothing outside the m x n tile is read or written; with beta == 0, C is never read; k == 0 is allowed.

Every supported ISA, float32 and float64 (the panels have c's dtype); c is a view into a larger buffer
holding a sentinel, with unit, non-unit and negative strides.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit.reference import gemm_ref, rel_l2
from helpers import DTYPES, FLOAT64_TOL, SENTINEL, ukernel_geometry, untouched_outside

TOL = {np.float32: 1e-5, np.float64: FLOAT64_TOL}
C_LAYOUTS = ("rows", "rows_step2", "columns", "reversed")


def tile_view(mr: int, nr: int, layout: str, dtype):
    """(c, buf): an MR x NR view c into a larger buffer buf, every element of which holds SENTINEL."""
    if layout == "rows":  # rs = NR + 5, cs = 1
        buf = np.full((mr + 2, nr + 5), SENTINEL, dtype=dtype)
        c = buf[1:1 + mr, 2:2 + nr]
    elif layout == "rows_step2":  # cs = 2: every other column of a wider buffer
        buf = np.full((mr + 2, 2 * nr + 3), SENTINEL, dtype=dtype)
        c = buf[1:1 + mr, 1:1 + 2 * nr:2]
    elif layout == "columns":  # rs = 1, cs = MR + 2 (column-major tile)
        buf = np.full((nr + 3, mr + 2), SENTINEL, dtype=dtype)
        c = buf.T[1:1 + mr, 2:2 + nr]
    elif layout == "reversed":  # rs < 0, cs < 0
        buf = np.full((mr + 2, nr + 2), SENTINEL, dtype=dtype)
        c = buf[1:1 + mr, 1:1 + nr][::-1, ::-1]
    else:
        raise ValueError(layout)
    assert c.shape == (mr, nr)
    return c, buf


def run_case(isa, dtype, m, n, k, alpha, beta, layout, seed, pad=None, bias=False):
    """Runs the ISA's micro-kernel on random panels and checks the whole contract. pad: a value written
    into the panels' rows i >= m of A and columns j >= n of B, which must not reach the m x n tile.
    bias: True for n per-column values, "rows" for m per-row values (the binding puts NaN past them, which
    must not reach the tile)."""
    g = ukernel_geometry(isa, dtype)
    mr, nr = g["MR"], g["NR"]
    rng = np.random.default_rng(seed)
    a_packed = rng.standard_normal(k * mr).astype(dtype)
    b_packed = rng.standard_normal(k * nr).astype(dtype)
    A = a_packed.reshape(k, mr).T  # (k*MR,) -> (k, MR) -> (MR, k): A(i, p) = a[p*MR + i]
    B = b_packed.reshape(k, nr)  # (k*NR,) -> (k, NR): B(p, j) = b[p*NR + j]
    if pad is not None:
        A[m:, :] = pad  # A is a view: writes the panel
        B[:, n:] = pad
    c0 = rng.standard_normal((m, n)).astype(dtype)
    c, buf = tile_view(mr, nr, layout, dtype)
    c[:m, :n] = c0 if beta != 0.0 else np.nan  # beta == 0: C must not be read

    rows = bias == "rows"
    bias_values = rng.standard_normal(m if rows else n).astype(dtype) if bias else None
    dnnkit._cpu.ukernel_test(isa, a_packed, b_packed, c, alpha, beta, m, n, bias_values, rows)

    got = c[:m, :n].copy()
    expected = gemm_ref(A[:m], B[:, :n], c0, alpha, beta)
    if bias:
        b64 = bias_values.astype(np.float64)
        expected = expected + (b64[:, None] if rows else b64[None, :])
    assert not np.isnan(got).any(), "NaN in the tile: C was read with beta == 0, or padding leaked in"
    err = rel_l2(got, expected)
    assert err <= TOL[dtype], f"{g['name']} m={m} n={n} k={k} alpha={alpha} beta={beta} {layout}: error {err:.3g}"
    assert untouched_outside(c[:m, :n], buf, SENTINEL), "the micro-kernel wrote outside the m x n tile"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_ukernel_contract(isa, dtype, data):
    g = ukernel_geometry(isa, dtype)
    m = data.draw(st.integers(1, g["MR"]), label="m")
    n = data.draw(st.integers(1, g["NR"]), label="n")
    k = data.draw(st.integers(0, 48), label="k")
    alpha = data.draw(st.one_of(st.sampled_from([1.0, -0.5, 0.0]), st.floats(-2, 2, width=32)), label="alpha")
    beta = data.draw(st.one_of(st.sampled_from([0.0, 1.0, -1.25]), st.floats(-2, 2, width=32)), label="beta")
    layout = data.draw(st.sampled_from(C_LAYOUTS), label="layout")
    bias = data.draw(st.sampled_from([False, True, "rows"]), label="bias")
    run_case(isa, dtype, m, n, k, alpha, beta, layout, seed=data.draw(st.integers(0, 2**32 - 1), label="seed"),
             bias=bias)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", C_LAYOUTS)
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.75])
def test_ukernel_full_and_edge_tiles(isa, dtype, layout, beta):
    """The full MR x NR tile (the vector store path when cs == 1) and tiles one short in each direction."""
    g = ukernel_geometry(isa, dtype)
    mr, nr = g["MR"], g["NR"]
    for seed, (m, n) in enumerate([(mr, nr), (mr - 1, nr), (mr, nr - 1), (1, nr), (mr, 1), (1, 1)]):
        if m >= 1 and n >= 1:
            run_case(isa, dtype, m, n, 17, 1.5, beta, layout, seed)
            run_case(isa, dtype, m, n, 17, 1.0, beta, layout, seed, bias=True)
            run_case(isa, dtype, m, n, 17, 1.0, beta, layout, seed, bias="rows")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("beta", [0.0, 2.0])
def test_ukernel_padding_does_not_leak(isa, dtype, beta):
    """Rows of A past m and columns of B past n (zero padding in the driver) do not reach the tile, even
    when they hold NaN or Inf."""
    g = ukernel_geometry(isa, dtype)
    for pad in (np.nan, np.inf):
        for m, n in [(g["MR"] - 1, g["NR"] - 1), (1, 1), (g["MR"] - 1, g["NR"]), (g["MR"], g["NR"] // 2)]:
            for layout in C_LAYOUTS:
                run_case(isa, dtype, m, n, 9, -1.0, beta, layout, seed=m * 100 + n, pad=pad)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ukernel_k_zero(isa, dtype):
    """k == 0: C := beta * C, or exactly 0 when beta == 0 (C unread: NaN there does not survive)."""
    g = ukernel_geometry(isa, dtype)
    empty = np.zeros(0, dtype=dtype)
    for layout in C_LAYOUTS:
        c, _ = tile_view(g["MR"], g["NR"], layout, dtype)
        c[...] = np.nan
        dnnkit._cpu.ukernel_test(isa, empty, empty, c, 1.0, 0.0, g["MR"], g["NR"])
        assert np.array_equal(c, np.zeros_like(c))
        c[...] = 3.0
        dnnkit._cpu.ukernel_test(isa, empty, empty, c, 1.0, -0.5, g["MR"], g["NR"])
        assert np.array_equal(c, np.full_like(c, -1.5))
        run_case(isa, dtype, g["MR"] - 1, 2, 0, 1.0, 2.0, layout, seed=1)
        run_case(isa, dtype, g["MR"], g["NR"], 0, 1.0, 0.0, layout, seed=2, bias=True)
        run_case(isa, dtype, g["MR"], g["NR"], 0, 1.0, 0.0, layout, seed=3, bias="rows")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ukernel_empty_tile_writes_nothing(isa, dtype):
    g = ukernel_geometry(isa, dtype)
    a = np.ones(4 * g["MR"], dtype=dtype)
    b = np.ones(4 * g["NR"], dtype=dtype)
    for m, n in [(0, g["NR"]), (g["MR"], 0), (0, 0)]:
        for beta in (0.0, 1.0):
            c, buf = tile_view(g["MR"], g["NR"], "rows", dtype)
            dnnkit._cpu.ukernel_test(isa, a, b, c, 1.0, beta, m, n)
            assert (buf == SENTINEL).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_ukernel_name_carries_geometry(isa, dtype):
    g = ukernel_geometry(isa, dtype)
    assert g["name"] == f"ukernel_{g['MR']}x{g['NR']}_{isa}"


def test_read_bandwidth_probe():
    """The ceiling bench/rnn.py sets memory-bound cells against: a finite positive rate for any buffer size
    and thread count, forwards and alternating (which is faster is the benchmark's to show, not a test's),
    and bad arguments are refused by name."""
    for nbytes, threads, alternate in ((16 << 10, 1, False), (16 << 20, 1, False), (16 << 20, 1, True),
                                       (3 * 64 + 8, 2, True), (1, 2, False)):  # shares of a line or two
        gbps = dnnkit._cpu.measure_read_gbps(nbytes, threads, 0.01, alternate=alternate)
        assert math.isfinite(gbps) and gbps > 0
    for bad in ((0, 1, 0.1), (1 << 20, 0, 0.1), (1 << 20, 1, 0.0)):
        with pytest.raises(ValueError, match="measure_read_gbps"):
            dnnkit._cpu.measure_read_gbps(*bad)
