"""dnnkit.linear and dnnkit.linear_backward against the float64 reference (torch.nn.functional.linear
semantics, x of shape (..., in)), under every supported ISA: 1-D, 2-D and 3-D inputs with zero and one
batch, with and without bias, every activation, both dtypes; plus a finite-difference check of the
backward pass against the forward."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit.reference import linear_backward_ref, linear_ref, rel_l2
from helpers import DTYPES, central_differences, dtype_tolerance

ACTIVATIONS = (None, "relu", "tanh", "sigmoid", "gelu")


@dataclass
class LinearCase:
    lead: tuple  # the leading dimensions of x: () for 1-D x
    in_f: int
    out_f: int
    dtype: type
    bias: bool
    activation: str | None
    strided: bool  # x, weight and bias as non-contiguous views
    seed: int


@st.composite
def linear_cases(draw):
    ndim = draw(st.sampled_from([1, 2, 3]))
    return LinearCase(
        lead=tuple(draw(st.integers(0, 5)) for _ in range(ndim - 1)),
        in_f=draw(st.integers(0, 40)), out_f=draw(st.integers(1, 40)), dtype=draw(st.sampled_from(DTYPES)),
        bias=draw(st.booleans()), activation=draw(st.sampled_from(ACTIVATIONS)), strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def make_inputs(case: LinearCase):
    """x (lead + (in,)), weight (out, in), bias (out,) or None; scaled so preactivations are O(1)."""
    rng = np.random.default_rng(case.seed)
    scale = 1.0 / np.sqrt(max(case.in_f, 1))
    x = rng.standard_normal(case.lead + (case.in_f,)).astype(case.dtype)
    w = (scale * rng.standard_normal((case.out_f, case.in_f))).astype(case.dtype)
    b = rng.standard_normal(case.out_f).astype(case.dtype) if case.bias else None
    if case.strided:
        x = np.repeat(x, 2, axis=-1)[..., ::2]  # same values, last-dimension stride 2
        w = np.asfortranarray(w)  # column-major weight: w.T is the contiguous one
        b = None if b is None else np.repeat(b, 3)[::3]
    return x, w, b


@given(case=linear_cases())
def test_linear_matches_reference(isa, case):
    x, w, b = make_inputs(case)
    tol = dtype_tolerance(case.dtype)
    expected = linear_ref(x, w, b, case.activation)
    expected_z = linear_ref(x, w, b, None)

    y = dnnkit.linear(x, w, b, activation=case.activation)
    again = dnnkit.linear(x, w, b, activation=case.activation)  # a repeated signature: the one-call path

    assert isinstance(y, np.ndarray) and y.shape == case.lead + (case.out_f,) and y.dtype == case.dtype
    assert rel_l2(y, expected) <= tol
    assert again is not y and again.shape == y.shape and again.dtype == y.dtype
    assert np.array_equal(again, y, equal_nan=True)
    y2, z = dnnkit.linear(x, w, b, activation=case.activation, return_preactivation=True)
    assert y2.shape == z.shape == y.shape and y2.dtype == z.dtype == case.dtype
    assert rel_l2(y2, expected) <= tol
    assert rel_l2(z, expected_z) <= tol
    assert not np.shares_memory(y2, z)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("lead", [(), (0,), (1,), (3,), (0, 4), (1, 1), (2, 3)], ids=repr)
def test_linear_shapes(isa, dtype, activation, lead):
    """Every activation and dtype on 1-D, zero-batch, one-batch and 3-D inputs."""
    case = LinearCase(lead, 7, 5, dtype, True, activation, False, seed=len(lead))
    x, w, b = make_inputs(case)
    y, z = dnnkit.linear(x, w, b, activation=activation, return_preactivation=True)
    assert y.shape == z.shape == lead + (5,)
    assert rel_l2(y, linear_ref(x, w, b, activation)) <= dtype_tolerance(dtype)
    assert rel_l2(z, linear_ref(x, w, b, None)) <= dtype_tolerance(dtype)


def saved_tensors(activation):
    """What the backward may be given: relu/tanh/sigmoid need the output or the preactivation, gelu the
    preactivation; the identity needs neither."""
    if activation is None:
        return ["none", "output"]
    if activation == "gelu":
        return ["preactivation", "both"]
    return ["output", "preactivation", "both"]


@given(case=linear_cases(), data=st.data())
def test_linear_backward_matches_reference(isa, case, data):
    saved = data.draw(st.sampled_from(saved_tensors(case.activation)), label="saved")
    x, w, b = make_inputs(case)
    y, z = dnnkit.linear(x, w, b, activation=case.activation, return_preactivation=True)
    grad_y = np.random.default_rng(case.seed + 1).standard_normal(y.shape).astype(case.dtype)
    kwargs = {}
    if saved in ("output", "both"):
        kwargs["output"] = y
    if saved in ("preactivation", "both"):
        kwargs["preactivation"] = z

    grad_x, grad_w, grad_b = dnnkit.linear_backward(grad_y, x, w, bias=case.bias, activation=case.activation,
                                                    **kwargs)

    # The reference differentiates at dnnkit's own z, so both sides agree on which side of relu's kink
    # every element lies.
    ex, ew, eb = linear_backward_ref(grad_y, x, w, bias=case.bias, activation=case.activation, preactivation=z)
    tol = dtype_tolerance(case.dtype)
    assert grad_x.shape == x.shape and grad_x.dtype == case.dtype
    assert grad_w.shape == w.shape and grad_w.dtype == case.dtype
    assert rel_l2(grad_x, ex) <= tol
    assert rel_l2(grad_w, ew) <= tol
    if case.bias:
        assert grad_b.shape == (case.out_f,) and grad_b.dtype == case.dtype
        assert rel_l2(grad_b, eb) <= tol
    else:
        assert grad_b is None


def _inputs_away_from_kinks(x_shape, out_f, margin=0.25):
    """float64 x, w, b whose preactivations all have |z| >= margin (no relu kink within reach of a
    finite-difference step), found by trying seeds in order."""
    in_f = x_shape[-1]
    for seed in range(1000):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(x_shape)
        w = rng.standard_normal((out_f, in_f))
        b = rng.standard_normal(out_f)
        if np.abs(linear_ref(x, w, b, None)).min() >= margin:
            return x, w, b
    raise AssertionError("no seed gives preactivations away from 0")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("x_shape", [(3,), (2, 3), (2, 2, 3)], ids=repr)
def test_linear_backward_finite_differences(isa, activation, x_shape):
    """linear_backward is the derivative of linear: central differences of L = sum(G * linear(x, w, b))."""
    out_f, h = 4, 1e-6
    x, w, b = _inputs_away_from_kinks(x_shape, out_f)
    G = np.random.default_rng(99).standard_normal(x_shape[:-1] + (out_f,))

    def loss():
        return float(np.sum(G * dnnkit.linear(x, w, b, activation=activation)))

    y, z = dnnkit.linear(x, w, b, activation=activation, return_preactivation=True)
    grads = dnnkit.linear_backward(G, x, w, bias=True, activation=activation, output=y, preactivation=z)
    for which, name in enumerate(("grad_input", "grad_weight", "grad_bias")):
        err = rel_l2(grads[which], central_differences(loss, (x, w, b)[which], h))
        assert err <= 1e-6, f"{name}: relative L2 error {err:.3g} against finite differences"


def test_backward_bias_none_and_packed_weights_elsewhere():
    """linear_backward(bias=None) is a forward without a bias; an array there, or a packed weight given to
    gemm, is an error that says what the argument is."""
    x, w, gy = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones((2, 4), np.float32)
    gx, gw, gb = dnnkit.linear_backward(gy, x, w, bias=None)
    assert gb is None and np.array_equal(gx, gy @ w) and np.array_equal(gw, gy.T @ x)
    with pytest.raises(TypeError, match=r"^linear_backward: bias is whether the forward had a bias"):
        dnnkit.linear_backward(gy, x, w, bias=np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"^gemm: b is a packed weight \(dnnkit.pack_weight\)"):
        dnnkit.gemm(x, dnnkit.pack_weight(w), trans_b=True)


def test_repeated_calls_reuse_the_dispatch_and_still_check_their_inputs():
    """A repeated call signature skips validation and dispatch: its results are the first call's, and
    arrays that differ in shape, dtype, bias or activation still go through every check."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((7, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    first = dnnkit.linear(x, w, b, activation="relu")
    again = dnnkit.linear(x, w, b, activation="relu")
    assert np.array_equal(first, again) and again is not first
    x2 = np.asfortranarray(rng.standard_normal((3, 5)).astype(np.float32))  # same signature, other strides
    assert rel_l2(dnnkit.linear(x2, w, b, activation="relu"), linear_ref(x2, w, b, "relu")) <= 1e-5
    assert dnnkit.linear(x[0], w).shape == (7,) and dnnkit.linear(x[0], w).shape == (7,)
    with pytest.raises(ValueError, match="linear: bias must have 7 elements"):
        dnnkit.linear(x, w, b[:6], activation="relu")
    with pytest.raises(TypeError, match="linear: .*dtype"):
        dnnkit.linear(x.astype(np.float64), w, b, activation="relu")
    with pytest.raises(ValueError, match="linear: activation"):
        dnnkit.linear(x, w, b, activation="swish")
    with pytest.raises(ValueError, match="linear: input has 4 features"):
        dnnkit.linear(x[:, :4], w, b, activation="relu")
    y, z = dnnkit.linear(x, w, b, activation="relu", return_preactivation=True)
    assert np.array_equal(y, first) and rel_l2(z, linear_ref(x, w, b)) <= 1e-5


@pytest.mark.parametrize("algo", ["auto", "blocked_gemm", "gemm_small_m"])
def test_repeated_calls_on_views(algo):
    """The repeated-signature path reads inputs of any layout: leading dimensions that do not flatten
    to one stride, negative strides, a strided last dimension, a weight with columns contiguous."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 2, 2, 10)).astype(np.float32)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    views = [
        base[..., :5].transpose(1, 0, 2, 3),  # leading dimensions out of order
        base[::-1, :, ::-1, 5:],              # negative strides
        base[:, 1:2, :, ::2],                 # a size-1 dimension and a last-dimension stride of 2
        base[:2, 0, 0, :5],                   # leading rows 120 elements apart
    ]
    for x in views:
        expected = linear_ref(x, w, b, "tanh")
        for weight in (w, np.asfortranarray(w)):
            for _ in range(2):
                y = dnnkit.linear(x, weight, b, activation="tanh", algo=algo)
                assert y.shape == x.shape[:-1] + (6,) and y.flags.c_contiguous
                assert rel_l2(y, expected) <= 1e-5


def test_repeated_calls_on_the_strided_a_kernel():
    """The repeated-signature path of a batch that gemm_wt_direct takes, on a strided input."""
    if dnnkit._cpu.gemm_wt_direct_width(4) == 0:
        pytest.skip("no strided-A micro-kernel on this ISA")
    rng = np.random.default_rng(5)
    m = next(m for m in range(60, 0, -1) if dnnkit._cpu.gemm_wt_direct_fits(4, m))  # a batch its tiles take
    x = rng.standard_normal((m, 800)).astype(np.float32)[:, ::2]
    w = (rng.standard_normal((70, 400)) / 20).astype(np.float32)
    b = rng.standard_normal(70).astype(np.float32)
    expected = linear_ref(x, w, b, "sigmoid")
    for _ in range(2):
        assert rel_l2(dnnkit.linear(x, w, b, activation="sigmoid", algo="gemm_wt_direct"), expected) <= 1e-5


def test_linear_run_checks_its_arguments():
    """The one-call binding behind repeated calls refuses what it cannot run rather than reading out of
    bounds."""
    run = dnnkit._cpu.linear_run
    x = np.ones((2, 3), np.float32)
    w = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="linear"):
        run(x, w.astype(np.float64), None, 0, 1)
    with pytest.raises(TypeError, match="linear"):
        run(x.astype(np.int32), w, None, 0, 1)
    with pytest.raises(ValueError, match="linear"):
        run(np.array(1.0, np.float32), w, None, 0, 0)
    with pytest.raises(ValueError, match="linear"):
        run(x, np.ones((4, 2), np.float32), None, 0, 0)
    with pytest.raises(ValueError, match="linear: bias"):
        run(x, w, np.ones(3, np.float32), 0, 0)
    with pytest.raises(ValueError, match="kind"):
        run(x, w, None, 0, 3)
    with pytest.raises(ValueError, match="activation"):
        run(x, w, None, 9, 0)
    assert np.array_equal(run(x, w, np.ones(4, np.float32), 1, 1), np.full((2, 4), 4, np.float32))


@pytest.mark.parametrize("m,n", [(0, 5), (3, 0), (1, 1), (7, 33), (300, 1100), (2, 4099), (513, 17)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sums_behind_the_bias_gradients(num_threads, dtype, m, n):
    """The bias gradients' column sums (linear's and the RNNs') over stripes of columns, with widths
    that leave partial stripes and more columns than one stripe holds: the float64 sums of NumPy."""
    x = np.random.default_rng(m * 7 + n).standard_normal((m, n)).astype(dtype)
    got = dnnkit._cpu.column_sums(x)
    assert got.shape == (n,) and got.dtype == dtype
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=0), rtol=1e-6 if dtype == np.float32 else 1e-13,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("m,n", [(0, 5), (7, 33), (300, 1100), (513, 17)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sums_added_into_an_array(num_threads, dtype, m, n):
    """column_sums(x, into) adds the sums to `into` (in double, rounded once) and returns it."""
    r = np.random.default_rng(m + n)
    x = r.standard_normal((m, n)).astype(dtype)
    start = r.standard_normal(n).astype(dtype)
    into = start.copy()
    got = dnnkit._cpu.column_sums(x, into)
    assert got is into or np.shares_memory(got, into)
    np.testing.assert_allclose(into, start.astype(np.float64) + x.astype(np.float64).sum(axis=0),
                               rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-5 if dtype == np.float32 else 1e-12)
    with pytest.raises(ValueError, match="column_sums: into must be a writable contiguous 1-D array"):
        dnnkit._cpu.column_sums(x, np.zeros(n + 1, dtype))
    with pytest.raises(TypeError, match="column_sums: into must be an array of x's dtype"):
        dnnkit._cpu.column_sums(x, np.zeros(n, np.float64 if dtype == np.float32 else np.float32))


@given(case=linear_cases())
def test_linear_backward_adds_into_the_given_arrays(isa, case):
    """accumulate_into: the weight and bias gradients are added to the caller's arrays, which come back
    as grad_weight and grad_bias; grad_input is as without it."""
    x, w, b = make_inputs(case)
    y, z = dnnkit.linear(x, w, b, activation=case.activation, return_preactivation=True)
    grad_y = np.random.default_rng(case.seed + 1).standard_normal(y.shape).astype(case.dtype)
    kw = dict(bias=case.bias, activation=case.activation, preactivation=z)
    gx, gw, gb = dnnkit.linear_backward(grad_y, x, w, **kw)
    r = np.random.default_rng(case.seed + 2)
    start_w = r.standard_normal(w.shape).astype(case.dtype)
    start_b = r.standard_normal(w.shape[0]).astype(case.dtype) if case.bias else None
    into = (start_w.copy(), None if start_b is None else start_b.copy())
    ax, aw, ab = dnnkit.linear_backward(grad_y, x, w, accumulate_into=into, **kw)
    np.testing.assert_array_equal(ax, gx)
    assert aw is into[0]
    tol = dict(rtol=1e-5, atol=1e-5) if case.dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(aw, start_w + gw, **tol)
    if case.bias:
        assert ab is into[1]
        np.testing.assert_allclose(ab, start_b + gb, **tol)
    else:
        assert ab is None


@pytest.mark.parametrize("into,exc,msg", [
    ("abc", TypeError, r"accumulate_into must be a pair \(grad_weight, grad_bias\)"),
    ((np.zeros((4, 3), np.float32),), TypeError, "accumulate_into must be a pair"),
    ((np.zeros((3, 4), np.float32), np.zeros(4, np.float32)), ValueError, r"accumulate_into\[0\] must have shape"),
    ((np.zeros((4, 3)), np.zeros(4, np.float32)), TypeError, r"accumulate_into\[0\] has dtype float64"),
    ((np.zeros((4, 3), np.float32), None), TypeError, r"accumulate_into\[1\] must be a NumPy array"),
    ((np.zeros((4, 3), np.float32), np.zeros(5, np.float32)), ValueError, r"accumulate_into\[1\] must have shape"),
    ((np.zeros((3, 4), np.float32).T, np.zeros(4, np.float32)), ValueError,
     r"accumulate_into\[0\] must be C-contiguous and writable"),
])
def test_bad_linear_accumulate_targets(into, exc, msg):
    x, w, g = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones((2, 4), np.float32)
    with pytest.raises(exc, match="linear_backward: " + msg):
        dnnkit.linear_backward(g, x, w, accumulate_into=into)
    with pytest.raises(ValueError, match=r"linear_backward: accumulate_into\[1\] must be None when bias is False"):
        dnnkit.linear_backward(g, x, w, bias=False, accumulate_into=(np.zeros((4, 3), np.float32), np.zeros(4, np.float32)))


def test_linear_accumulate_targets_apart_from_the_inputs():
    """grad_weight accumulated into the weight, the input or grad_output (or grad_bias into grad_weight's
    memory) would be read after it is written: refused by name, nothing written."""
    r = np.random.default_rng(0)
    x, w, g = (r.standard_normal(s).astype(np.float32) for s in ((4, 3), (4, 3), (4, 4)))
    for into, other in (((w, None), "weight"), ((x, None), "input")):
        before = into[0].copy()
        with pytest.raises(ValueError, match=rf"linear_backward: accumulate_into\[0\] shares memory with {other}"):
            dnnkit.linear_backward(g, x, w, bias=False, accumulate_into=into)
        np.testing.assert_array_equal(into[0], before)
    gw = np.zeros((4, 3), np.float32)  # grad_output (2 x 4) is a view of its first 8 elements
    with pytest.raises(ValueError, match=r"accumulate_into\[0\] shares memory with grad_output"):
        dnnkit.linear_backward(gw.reshape(3, 4)[:2], np.ones((2, 3), np.float32), w, bias=False,
                               accumulate_into=(gw, None))
    gw = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"accumulate_into\[1\] shares memory with accumulate_into\[0\]"):
        dnnkit.linear_backward(g, x, w, accumulate_into=(gw[:4], gw.reshape(-1)[:4]))


@pytest.mark.parametrize("activation", ["identity", "relu", "tanh", "sigmoid", "gelu"])
@pytest.mark.parametrize("n", [0, 1, 37, 2048, 2049, 70001])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_activation_backward_elementwise(isa, num_threads, dtype, activation, n):
    """The activations' backward pass (what linear_backward applies to grad_output) element by element
    against the float64 derivative, from z, from y, or from both, across its blocks of 2048 values and
    its threads (past 65536 values); NaN in z or grad_y propagates."""
    from dnnkit.algos.gemm_cpu import ACTIVATION_CODES
    from dnnkit.reference import activation_grad_ref, activation_ref

    rng = np.random.default_rng(n)
    z = (4 * rng.standard_normal(n)).astype(dtype)
    gy = rng.standard_normal(n).astype(dtype)
    if n > 1:
        z[n // 2] = np.nan
        gy[n // 3] = np.nan
    y = activation_ref(z, activation).astype(dtype)
    want = gy.astype(np.float64) * activation_grad_ref(z, activation)
    if activation != "identity":
        want[np.isnan(z)] = np.nan
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for saved in ("z", "y", "both"):
        if saved == "y" and activation == "gelu":
            continue
        gz = np.full(n, 7.0, dtype=dtype)
        dnnkit._cpu.activation_backward(gy, None if saved == "y" else z, None if saved == "z" else y, gz,
                                        ACTIVATION_CODES[activation])
        if saved == "y" and activation in ("tanh", "sigmoid"):
            # the derivative from y (rounded to dtype) differs from it at z by y's rounding
            assert np.allclose(gz, want, rtol=4 * tol, atol=4 * tol, equal_nan=True), saved
        else:
            assert np.allclose(gz, want, rtol=tol, atol=tol, equal_nan=True), saved


@pytest.mark.parametrize("activation", ["identity", "relu", "tanh", "sigmoid", "gelu"])
@pytest.mark.parametrize("n", [0, 1, 37, 4097, 70001])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_activation_forward_elementwise(isa, num_threads, dtype, activation, n):
    """The activations' forward pass (linear's with return_preactivation=True) element by element against
    the float64 reference, across its blocks and its threads (past 65536 values); NaN, infinities and
    signed zeros pass as in the reference (relu keeps NaN and -0.0, maps -inf to 0)."""
    from dnnkit.algos.gemm_cpu import ACTIVATION_CODES
    from dnnkit.reference import activation_ref

    rng = np.random.default_rng(n + 3)
    z = (4 * rng.standard_normal(n)).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
    if n > 2 * len(special):
        z[n // 2:n // 2 + len(special)] = special
    y = np.full(n, 7.0, dtype=dtype)
    dnnkit._cpu.activation_forward(z, y, ACTIVATION_CODES[activation])
    with np.errstate(invalid="ignore"):  # gelu(-inf) = -inf * 0 = NaN
        want = activation_ref(z, activation)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    assert np.allclose(y, want, rtol=tol, atol=tol, equal_nan=True)
    if activation in ("identity", "relu"):  # exact, signs of zeros included
        assert np.array_equal(np.signbit(y), np.signbit(want.astype(dtype))) and np.array_equal(y, want, equal_nan=True)
