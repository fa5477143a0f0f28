"""Weights packed once (dnnkit.pack_weight): linear on them against the float64 reference under every
supported ISA and thread count (shapes crossing the micro-kernel's tiles and the product's 256-row
blocks, every activation, strided operands, both dtypes), repacking, concurrent use from Python threads,
and the errors of bad input. The cells on packed weights are tested in test_rnn.py."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit.reference import linear_backward_ref, linear_ref, rel_l2
from helpers import DTYPES, dtype_tolerance

ACTIVATIONS = (None, "relu", "tanh", "sigmoid", "gelu")


@st.composite
def packed_cases(draw):
    lead = draw(st.sampled_from([(), (0,), (1,), (2, 3)]) | st.tuples(st.integers(0, 300)))
    return dict(lead=lead, in_f=draw(st.integers(0, 70)), out_f=draw(st.integers(1, 90)),
                dtype=draw(st.sampled_from(DTYPES)), bias=draw(st.booleans()),
                activation=draw(st.sampled_from(ACTIVATIONS)), strided=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


def make(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.standard_normal(c["lead"] + (c["in_f"],)).astype(c["dtype"])
    w = (rng.standard_normal((c["out_f"], c["in_f"])) / np.sqrt(max(c["in_f"], 1))).astype(c["dtype"])
    b = rng.standard_normal(c["out_f"]).astype(c["dtype"]) if c["bias"] else None
    if c["strided"]:
        x = np.repeat(x, 2, axis=-1)[..., ::2]
        w = np.asfortranarray(w)  # packed from a column-major weight
        b = None if b is None else np.repeat(b, 3)[::3]
    return x, w, b


@given(c=packed_cases())
def test_linear_on_a_packed_weight_matches_reference(isa, num_threads, c):
    x, w, b = make(c)
    pw = dnnkit.pack_weight(w)
    assert pw.shape == w.shape and pw.dtype == w.dtype and pw.weight is w
    tol = dtype_tolerance(c["dtype"])
    y = dnnkit.linear(x, pw, b, activation=c["activation"])
    assert y.shape == c["lead"] + (c["out_f"],) and y.dtype == c["dtype"]
    assert rel_l2(y, linear_ref(x, w, b, c["activation"])) <= tol
    y2, z = dnnkit.linear(x, pw, b, activation=c["activation"], return_preactivation=True)
    assert rel_l2(y2, linear_ref(x, w, b, c["activation"])) <= tol
    assert rel_l2(z, linear_ref(x, w, b, None)) <= tol and not np.shares_memory(y2, z)
    # The backward takes the packed weight too (it multiplies by the array it was packed from).
    gy = np.random.default_rng(c["seed"] + 1).standard_normal(y.shape).astype(c["dtype"])
    got = dnnkit.linear_backward(gy, x, pw, bias=c["bias"], activation=c["activation"], preactivation=z)
    expected = linear_backward_ref(gy, x, w, c["bias"], c["activation"], z)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if g is not None:
            assert rel_l2(g, e) <= 10 * tol


@pytest.mark.parametrize("m,n,k", [(64, 1024, 512), (257, 40, 700), (520, 33, 9), (1, 2000, 300), (16, 100, 1)])
def test_linear_on_a_packed_weight_at_larger_sizes(num_threads, m, n, k):
    """Tiles of batch rows, more than two 256-row blocks with a tail, depths over one k block, one row."""
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    pw = dnnkit.pack_weight(w)
    for act in (None, "relu"):
        assert rel_l2(dnnkit.linear(x, pw, b, activation=act), linear_ref(x, w, b, act)) <= 1e-5


@pytest.mark.parametrize("n,k", [(229, 700), (64, 9), (1000, 2048), (17, 300)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_one_row_on_a_packed_weight_sums_as_the_tiles_do(isa, num_threads, n, k, dtype, bias):
    """One row runs several panels at once where the ISA has a kernel for it (UKernel::row_panels): every
    output is the same sum, in the same order, as a tile of two rows gives its first row (groups of
    panels and the panels left over, depths over one k block, a ragged last panel)."""
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((2, k)).astype(dtype)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if bias else None
    pw = dnnkit.pack_weight(w)
    for act in (None, "relu"):
        one = dnnkit.linear(x[:1], pw, b, activation=act)
        assert np.array_equal(one, dnnkit.linear(x, pw, b, activation=act)[:1])
        assert rel_l2(one, linear_ref(x[:1], w, b, act)) <= dtype_tolerance(dtype)


@pytest.mark.parametrize("num_threads", [1], indirect=True)
@pytest.mark.parametrize("m", [200, 300])
def test_one_thread_on_an_output_past_l2_packed_and_unpacked_agree_exactly(isa, num_threads, m, no_amx):
    """(The FMA kernels: with AMX tiles on, the unpacked product of 200 rows takes them and the packed
    weight's own driver does not.) On one thread, with an output larger than L2, the GEMM cuts k into deeper blocks (1000 in one
    block on AVX-512 float32, not two of 504); a packed weight's product cuts it the same way, through
    its own driver on a block of rows (252 or fewer) and the blocked GEMM over more: the same bits, and
    the reference's values."""
    n = dnnkit._cpu.l2_cache_bytes() // (4 * m) + 96
    k = 1000
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = dnnkit.linear(x, w, b, algo="blocked_gemm")
    assert np.array_equal(dnnkit.linear(x, dnnkit.pack_weight(w), b), y)
    assert rel_l2(y, linear_ref(x, w, b)) <= 1e-5


@pytest.mark.parametrize("m,n,k", [(253, 70, 40), (300, 1100, 700), (1100, 96, 1500)])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_many_rows_on_a_packed_weight_match_the_unpacked_product_exactly(isa, num_threads, m, n, k, activation):
    """Over one block of rows, linear on a packed weight runs the blocked GEMM on the packed panels in
    place: the same k blocks, bias and epilogue as the unpacked product, so the same bits; with the ISA
    changed after packing (the panels fit another micro-kernel), the packed weight's own kernel, close."""
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    pw = dnnkit.pack_weight(w)
    assert np.array_equal(dnnkit.linear(x, pw, b, activation=activation),
                          dnnkit.linear(x, w, b, activation=activation, algo="blocked_gemm"))
    previous = dnnkit._cpu.active_isa()
    try:
        dnnkit._cpu.set_isa("ref" if previous != "ref" else previous)
        assert rel_l2(dnnkit.linear(x, pw, b, activation=activation), linear_ref(x, w, b, activation)) <= 1e-5
    finally:
        dnnkit._cpu.set_isa(previous)


def test_nan_and_inf_propagate_through_a_packed_weight():
    x = np.ones((3, 4), np.float32)
    w = np.ones((5, 4), np.float32)
    w[1, 2] = np.nan
    w[3, 0] = np.inf
    y = dnnkit.linear(x, dnnkit.pack_weight(w))
    assert np.isnan(y[:, 1]).all() and np.isposinf(y[:, 3]).all() and (y[:, [0, 2, 4]] == 4).all()


def test_repack_takes_in_place_updates():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    pw = dnnkit.pack_weight(w)
    before = dnnkit.linear(x, pw)
    w *= 2  # the packing is a copy: it keeps the old values until repacked
    assert np.array_equal(dnnkit.linear(x, pw), before)
    assert pw.repack() is pw
    assert rel_l2(dnnkit.linear(x, pw), linear_ref(x, w)) <= 1e-6
    w2 = rng.standard_normal((5, 6)).astype(np.float32)
    pw.repack(w2)
    assert pw.weight is w2 and rel_l2(dnnkit.linear(x, pw), linear_ref(x, w2)) <= 1e-6
    assert pw.nbytes >= w.nbytes and "PackedWeight(shape=(5, 6)" in repr(pw)


def test_a_packed_weight_pickles_and_copies_as_its_weight():
    import copy
    import pickle

    rng = np.random.default_rng(2)
    w = rng.standard_normal((7, 5))
    x = rng.standard_normal((3, 5))
    pw = dnnkit.pack_weight(w)
    for other in (pickle.loads(pickle.dumps(pw)), copy.deepcopy(pw), copy.copy(pw)):
        assert isinstance(other, dnnkit.PackedWeight) and other.shape == (7, 5) and other.dtype == np.float64
        assert np.array_equal(other.weight, w)
        assert np.array_equal(dnnkit.linear(x, other), dnnkit.linear(x, pw))


def test_a_packed_weight_is_shared_by_threads_while_it_is_repacked():
    """Python threads multiply by one packed weight while another thread repacks it with the same
    values: every result is the right one (a product holds the packing it started on)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    x = rng.standard_normal((32, 200)).astype(np.float32)
    pw = dnnkit.pack_weight(w)
    expected = dnnkit.linear(x, pw)
    errors = []

    def use():
        for _ in range(30):
            if not np.array_equal(dnnkit.linear(x, pw), expected):
                errors.append("mismatch")

    def repack():
        for _ in range(30):
            pw.repack(w.copy())

    threads = [threading.Thread(target=use) for _ in range(3)] + [threading.Thread(target=repack)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bad_input_is_named():
    w = np.zeros((5, 4), np.float32)
    pw = dnnkit.pack_weight(w)
    with pytest.raises(TypeError, match=r"^pack_weight: weight must have dtype float32 or float64, got int64"):
        dnnkit.pack_weight(np.zeros((3, 3), np.int64))
    with pytest.raises(ValueError, match=r"^pack_weight: weight must be 2-D"):
        dnnkit.pack_weight(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match=r"^pack_weight: weight must be an array, got None"):
        dnnkit.pack_weight(None)
    with pytest.raises(ValueError, match=r"^pack_weight: repack needs a weight of shape \(5, 4\)"):
        pw.repack(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"^pack_weight: repack needs .* dtype float32"):
        pw.repack(np.zeros((5, 4), np.float64))
    with pytest.raises(TypeError, match=r"^linear: weight has dtype float32 but input has float64"):
        dnnkit.linear(np.zeros((2, 4)), pw)
    with pytest.raises(ValueError, match=r"^linear: input has 3 features .* packed weight \(5, 4\) expects 4"):
        dnnkit.linear(np.zeros((2, 3), np.float32), pw)
    with pytest.raises(ValueError, match=r"^linear: bias must have 5 elements"):
        dnnkit.linear(np.zeros((2, 4), np.float32), pw, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"^linear: activation must be None or one of"):
        dnnkit.linear(np.zeros((2, 4), np.float32), pw, activation="swish")
    with pytest.raises(ValueError, match=r"^linear: algo 'blocked_gemm' cannot run .* packed by dnnkit.pack_weight"):
        dnnkit.linear(np.zeros((2, 4), np.float32), pw, algo="blocked_gemm")
    with pytest.raises(ValueError, match=r"^linear: input must have at least 1 dimension"):
        dnnkit.linear(np.float32(1.0), pw)
    # The kernel binding checks what it relies on, for direct callers.
    with pytest.raises(TypeError, match=r"^linear: input must have the packed weight's dtype"):
        dnnkit._cpu.linear_prepacked(np.zeros((2, 4)), pw)
    with pytest.raises(ValueError, match=r"^linear: input has the wrong number of features"):
        dnnkit._cpu.linear_prepacked(np.zeros((2, 3), np.float32), pw)


def test_a_packed_weight_goes_through_the_registry(tmp_path, monkeypatch):
    """linear on a packed weight is a GEMM problem with a packed b: explain() lists gemm_prepacked as the
    one algorithm that can run it (the others say why not), algo= names it, and the tuner checks and times
    it like any other."""
    from dnnkit.autotune import find

    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    pw = dnnkit.pack_weight(w)
    e = dnnkit.explain("linear", x, pw, activation="relu")
    assert e.problem.packed and e.problem.descriptor() == "m5n24k40tb_packed_relu_f32"
    rows = {c.algorithm: c for c in e}
    assert rows["gemm_prepacked"].chosen and rows["gemm_prepacked"].predicted_s > 0
    assert all(not c.supported and "pack_weight" in c.reason for name, c in rows.items() if name != "gemm_prepacked")
    expected = np.maximum(x @ w.T, 0)
    assert np.allclose(dnnkit.linear(x, pw, activation="relu", algo="gemm_prepacked"), expected, atol=1e-5)
    result = find(e.problem, store=False, budget=0.02)
    assert [r.algorithm for r in result if r.ok] == ["gemm_prepacked"]
    assert dnnkit.GemmProblem.parse(e.problem.descriptor()) == e.problem
