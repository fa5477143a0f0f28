"""Every public CPU operator called with random arguments: mostly calls that are valid (one floating dtype,
shapes that agree) in every layout an array can have (reversed, transposed, broadcast with a zero stride,
Fortran-ordered, strided, read-only, NaN-filled), and now and then one argument of another dtype or
shape, or no array at all, or a bad setting. Whatever the call, the process survives and any error is a
TypeError, ValueError or MemoryError that names the operator. Every registered algorithm is drawn as
algo=, so a new one is called here without an edit. The examples are derandomized: every run tries the
same calls."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dnnkit

DIMS = st.sampled_from([1, 2, 3, 5, 7, 8, 16, 17, 33, 0])
FLOATS = st.sampled_from([np.float32, np.float32, np.float64])
OTHER_DTYPES = st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.bool_, np.complex64])
LAYOUTS = st.sampled_from(["C"] * 6 + ["reversed", "T", "broadcast", "F", "strided", "readonly", "nan"])
NOT_ARRAYS = st.sampled_from([None, 3, 2.5, "x", [[1.0, 2.0]], ()])
ERRORS = (TypeError, ValueError, MemoryError)


@st.composite
def arrays(draw, shape, dtype, odd=50):
    """An array of `shape` and `dtype` in a random layout; now and then (3 times in `odd`: hypothesis draws
    the first of a list most) another dtype or shape, or not an array."""
    kind = draw(st.sampled_from(["as asked"] * (odd - 3) + ["dtype", "shape", "none"]))
    if kind == "none":
        return draw(NOT_ARRAYS)
    if kind == "dtype":
        dtype = draw(OTHER_DTYPES)
    elif kind == "shape":
        shape = tuple(draw(DIMS) for _ in range(draw(st.integers(1, 4))))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    a = (2 * rng.standard_normal(shape)).astype(dtype)
    layout = draw(LAYOUTS)
    if layout == "reversed" and a.ndim and a.shape[-1]:
        a = a[..., ::-1]
    elif layout == "T":
        a = np.ascontiguousarray(a.T).T  # the same shape, its strides reversed
    elif layout == "broadcast" and a.ndim and a.shape[-1]:
        a = np.broadcast_to(a[..., :1], a.shape)
    elif layout == "F":
        a = np.asfortranarray(a)
    elif layout == "strided" and a.ndim and a.size:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        a = wide[..., ::2]
    elif layout == "readonly":
        a.flags.writeable = False
    elif layout == "nan" and a.dtype.kind == "f":
        a[...] = np.nan
    return a


def names(op: str) -> list:
    """The registered CPU algorithms of op (the registry's operator names): each is drawn as algo=."""
    return [a.name for a in dnnkit.algos.algorithms(op, "cpu")]


def survives(op: str, call) -> None:
    """Runs call(); an error must be one of ERRORS and name op."""
    try:
        call()
    except ERRORS as e:
        assert op in str(e), (type(e).__name__, str(e))


FUZZ = settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def _small_tuning(monkeypatch, tmp_path):
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))


@FUZZ
@given(data=st.data())
def test_gemm_and_linear_survive_any_arguments(data):
    d = data.draw
    f = d(FLOATS)
    m, n, k = d(DIMS), d(DIMS), d(DIMS)
    ta, tb = d(st.booleans()), d(st.booleans())
    a, b = d(arrays((k, m) if ta else (m, k), f)), d(arrays((n, k) if tb else (k, n), f))
    c = d(arrays((m, n), f)) if d(st.booleans()) else None
    survives("gemm", lambda: dnnkit.gemm(
        a, b, c, alpha=d(st.sampled_from([1.0, 0.0, -2.0, float("nan")])),
        beta=d(st.sampled_from([0.0, 1.0])) if c is not None else 0.0, trans_a=ta, trans_b=tb,
        algo=d(st.sampled_from(["auto"] * 4 + names("gemm") + ["none"]))))
    lead = d(st.sampled_from([(), (d(DIMS),), (d(DIMS), d(DIMS))]))
    x, w, bias = d(arrays(lead + (k,), f)), d(arrays((n, k), f)), d(arrays((n,), f)) if d(st.booleans()) else None
    act = d(st.sampled_from([None, "relu", "tanh", "gelu", "sigmoid", "bad"]))
    if d(st.booleans()):
        try:
            w = dnnkit.pack_weight(w)
        except ERRORS as e:
            assert "pack_weight" in str(e)
    survives("linear", lambda: dnnkit.linear(x, w, bias, activation=act, return_preactivation=d(st.booleans())))
    act = d(st.sampled_from([None, "relu", "tanh"]))
    survives("linear_backward", lambda: dnnkit.linear_backward(
        d(arrays((m, n), f)), d(arrays((m, k), f)), d(arrays((n, k), f)), bias=d(st.booleans()), activation=act,
        output=d(arrays((m, n), f)) if act else None))


@FUZZ
@given(data=st.data())
def test_convolutions_survive_any_arguments(data):
    d = data.draw
    k = d(st.sampled_from([3, 1, 2, 5]))
    groups, depthwise = d(st.sampled_from([1, 1, 2, 3])), d(st.sampled_from([False, False, True]))
    cpg, opg = (1, d(st.sampled_from([1, 2]))) if depthwise else (d(DIMS), d(DIMS))
    n, c, o = d(DIMS), cpg * groups, opg * groups
    h, w = d(DIMS) + d(st.sampled_from([k, 4, 9, 0])), d(DIMS) + k
    f = d(FLOATS)
    x, wt = d(arrays((n, c, h, w), f)), d(arrays((o, cpg, k, k), f))
    geometry = (d(st.sampled_from([1, 1, 2, 0, -1, (1, 2)])), d(st.sampled_from([0, 1, "same", "valid", -1, (1, 0)])),
                d(st.sampled_from([1, 1, 2, 0])), groups)
    def algo(direction):
        return d(st.sampled_from(["auto"] * 4 + names(direction) + ["none"]))

    survives("conv2d", lambda: dnnkit.conv2d(x, wt, d(arrays((o,), f)) if d(st.booleans()) else None, *geometry,
                                             algo=algo("conv2d_fwd")))
    try:
        y = dnnkit.conv2d(x, wt, None, *geometry)
    except ERRORS:
        y = d(arrays((n, o, h, w), f))
    x_shape, w_shape = getattr(x, "shape", (1, 1, 1, 1)), getattr(wt, "shape", (1, 1, 1, 1))
    survives("conv2d_backward_data",
             lambda: dnnkit.conv2d_backward_data(x_shape, wt, y, *geometry, algo=algo("conv2d_bwd_data")))
    survives("conv2d_backward_filter",
             lambda: dnnkit.conv2d_backward_filter(x, w_shape, y, *geometry, algo=algo("conv2d_bwd_filter")))


@FUZZ
@given(data=st.data(), mode=st.sampled_from(["lstm", "gru", "rnn"]))
def test_rnns_survive_any_arguments(data, mode):
    d = data.draw
    sizes = st.sampled_from([1, 2, 3, 5, 8, 17])
    t, b, i, h = d(sizes), d(sizes), d(sizes), d(sizes)
    layers, dirs = d(st.sampled_from([1, 1, 2])), d(st.sampled_from([1, 2]))
    proj = d(st.sampled_from([0, 0, 0, 1, 3])) if mode == "lstm" and h > 3 else 0
    g, s_ = {"lstm": 4, "gru": 3, "rnn": 1}[mode], proj or h
    f = d(FLOATS)
    weights = []
    for layer in range(layers):
        for _ in range(dirs):
            inputs = i if layer == 0 else s_ * dirs
            weights += [d(arrays((g * h, inputs), f, 200)), d(arrays((g * h, s_), f, 200)),
                        d(arrays((g * h,), f, 200)), d(arrays((g * h,), f, 200))]
            weights += [d(arrays((proj, h), f, 200))] if proj else []
    x = d(arrays((t, b, i), f))
    h0 = d(arrays((layers * dirs, b, s_), f)) if d(st.booleans()) else None
    c0 = d(arrays((layers * dirs, b, h), f)) if d(st.booleans()) else None
    train = d(st.booleans())
    kw = dict(num_layers=layers, bidirectional=dirs == 2, train=train, dropout=d(st.sampled_from([0.0, 0.5])))
    # One argument in ten made bad.
    bad = d(st.sampled_from([None] * 9 + ["weights", "dropout", "sequence", "layers"]))
    if bad == "weights":
        weights = weights[:-1]
    elif bad == "dropout":
        kw["dropout"] = 1.5
    elif bad == "sequence":
        x = x[:0] if isinstance(x, np.ndarray) else x
    elif bad == "layers":
        kw["num_layers"] = 0
    try:
        if mode == "lstm":
            out = dnnkit.lstm(x, h0, c0, weights, proj_size=proj, **kw)
        elif mode == "gru":
            out = dnnkit.gru(x, h0, weights, **kw)
        else:
            out = dnnkit.rnn(x, h0, weights, nonlinearity=d(st.sampled_from(["tanh", "relu"])), **kw)
    except ERRORS as e:
        assert mode in str(e), str(e)
        return
    if train:
        backward = {"lstm": lambda g_, r: dnnkit.lstm_backward(g_, None, None, r),
                    "gru": lambda g_, r: dnnkit.gru_backward(g_, None, r),
                    "rnn": lambda g_, r: dnnkit.rnn_backward(g_, None, r)}[mode]
        grad = d(arrays(out[0].shape, out[0].dtype))
        survives(f"{mode}_backward", lambda: backward(grad, out[2]))


@FUZZ
@given(data=st.data(), cell=st.sampled_from(["lstm_cell", "gru_cell", "rnn_tanh_cell"]))
def test_cells_survive_any_arguments(data, cell):
    d = data.draw
    b, i, h = d(DIMS), d(DIMS), d(DIMS)
    g = {"lstm_cell": 4, "gru_cell": 3, "rnn_tanh_cell": 1}[cell]
    f = d(FLOATS)
    state = d(arrays((b, h), f))
    biases = (d(arrays((g * h,), f)), d(arrays((g * h,), f))) if d(st.booleans()) else (None, None)
    if cell == "lstm_cell" and d(st.sampled_from([True] * 4 + [False])):
        state = (state, d(arrays((b, h), f)))
    survives(cell, lambda: getattr(dnnkit, cell)(d(arrays((b, i), f)), state, d(arrays((g * h, i), f)),
                                                 d(arrays((g * h, h), f)), *biases, train=d(st.booleans())))
