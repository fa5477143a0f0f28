"""dnnkit's fused RNNs (LSTM, GRU, tanh/ReLU RNN; cells and sequences; forward and backward through time)
against the float64 references, under every supported ISA and 1 or 2 threads: hidden and input sizes
from 1, zero and one batch rows, one step, several layers, bidirectional, with and without biases,
batch_first, unbatched inputs, both dtypes. The backward reference is checked against finite
differences; PyTorch, when installed, against both. Outputs start as NaN, so an element never written
fails. Also: the accuracy of the post-GEMM's fast exp, sigmoid and tanh, and bad input."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.algos.rnn_cpu import SCHEDULES
from dnnkit.reference import (
    gru_cell_ref, lstm_cell_ref, rel_l2, rnn_cell_ref, rnn_sequence_backward_ref, rnn_sequence_ref,
)
from helpers import DTYPES, FLOAT64_TOL, central_differences, rnn_param_names, rnn_user_layout

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
# Relative L2 bounds for float32: the GEMMs' rounding, compounded through steps and layers.
FWD_TOL32 = 2e-5
BWD_TOL32 = 1e-4


def tol(dtype, f32):
    return f32 if np.dtype(dtype) == np.float32 else FLOAT64_TOL


pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


# ---------------------------------------------------------------------------------------------- cases
@dataclass
class SeqCase:
    mode: str
    T: int
    B: int
    I: int
    H: int
    layers: int
    bidirectional: bool
    bias: bool
    batch_first: bool
    unbatched: bool
    initial: bool  # h0 (and c0) given, or None
    as_dict: bool
    dtype: type
    threads: int
    seed: int

    @property
    def D(self):
        return 2 if self.bidirectional else 1


@st.composite
def seq_cases(draw, max_h=20):
    unbatched = draw(st.booleans()) and draw(st.booleans())
    return SeqCase(
        mode=draw(st.sampled_from(MODES)), T=draw(st.integers(1, 4)), B=1 if unbatched else draw(st.integers(0, 3)),
        I=draw(st.integers(1, 9)),
        H=draw(st.one_of(st.integers(1, max_h), st.sampled_from([33, 70]))),
        layers=draw(st.integers(1, 3)), bidirectional=draw(st.booleans()), bias=draw(st.booleans()),
        batch_first=draw(st.booleans()), unbatched=unbatched, initial=draw(st.booleans()),
        as_dict=draw(st.booleans()), dtype=draw(st.sampled_from(DTYPES)), threads=draw(st.sampled_from([1, 2])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def param_names(c: SeqCase):
    return rnn_param_names(c.layers, c.D, c.bias)


def make_seq(c: SeqCase):
    """x (T, B, I) time-major, h0, c0 (L*D, B, H) or None, the flat weight list; values O(1)."""
    rng = np.random.default_rng(c.seed)
    G, H, D = GATES[c.mode], c.H, c.D
    scale = 1.0 / np.sqrt(H)
    weights = []
    for layer in range(c.layers):
        for _ in range(D):
            in_k = c.I if layer == 0 else D * H
            weights += [scale * rng.standard_normal((G * H, in_k)), scale * rng.standard_normal((G * H, H))]
            if c.bias:
                weights += [0.5 * rng.standard_normal(G * H), 0.5 * rng.standard_normal(G * H)]
    weights = [w.astype(c.dtype) for w in weights]
    x = rng.standard_normal((c.T, c.B, c.I)).astype(c.dtype)
    h0 = rng.standard_normal((c.layers * D, c.B, H)).astype(c.dtype) if c.initial else None
    c0 = rng.standard_normal((c.layers * D, c.B, H)).astype(c.dtype) if c.initial and c.mode == "lstm" else None
    return x, h0, c0, weights


def to_user(c: SeqCase, x, h0, c0, weights):
    """The arrays in the layout the case asks dnnkit for."""
    return rnn_user_layout(c, x, h0, c0, weights, param_names(c))


def from_user(c: SeqCase, out, state):
    """Back to time-major, batched: (T, B, D*H) and (L*D, B, H)."""
    if c.unbatched:
        return out[:, None], state[:, None]
    return (out.transpose(1, 0, 2) if c.batch_first else out), state


def run_forward(c: SeqCase, x, h0, c0, weights, train=False, algo="auto"):
    kw = dict(num_layers=c.layers, bidirectional=c.bidirectional, batch_first=c.batch_first, train=train, algo=algo)
    if c.mode == "lstm":
        return dnnkit.lstm(x, h0, c0, weights, **kw)
    if c.mode == "gru":
        return dnnkit.gru(x, h0, weights, **kw)
    return dnnkit.rnn(x, h0, weights, nonlinearity=c.mode[4:], **kw)


# -------------------------------------------------------------------------------------------- forward
@given(c=seq_cases())
def test_sequence_forward_matches_reference(isa, c):
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make_seq(c)
    result = run_forward(c, *to_user(c, x, h0, c0, weights))
    out, state = result
    h_n, c_n = state if c.mode == "lstm" else (state, None)
    eo, eh, ec = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional)
    t = tol(c.dtype, FWD_TOL32)
    assert out.dtype == h_n.dtype == c.dtype
    out_tm, h_tm = from_user(c, out, h_n)
    assert out_tm.shape == (c.T, c.B, c.D * c.H) and h_tm.shape == (c.layers * c.D, c.B, c.H)
    assert rel_l2(out_tm, eo) <= t
    assert rel_l2(h_tm, eh) <= t
    if c.mode == "lstm":
        assert rel_l2(from_user(c, out, c_n)[1], ec) <= t


@dataclass
class CellCase:
    mode: str
    B: int
    I: int
    H: int
    bias: bool
    state: bool
    unbatched: bool
    dtype: type
    seed: int


@st.composite
def cell_cases(draw):
    unbatched = draw(st.booleans()) and draw(st.booleans())
    return CellCase(
        mode=draw(st.sampled_from(MODES)), B=1 if unbatched else draw(st.sampled_from([0, 1, 2, 5, 17, 20])),
        I=draw(st.integers(1, 12)), H=draw(st.one_of(st.integers(1, 12), st.sampled_from([40, 65]))),
        bias=draw(st.booleans()), state=draw(st.booleans()), unbatched=unbatched,
        dtype=draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 2**32 - 1)),
    )


def make_cell(c: CellCase):
    rng = np.random.default_rng(c.seed)
    G = GATES[c.mode]
    s = 1.0 / np.sqrt(c.H)
    w_ih = (s * rng.standard_normal((G * c.H, c.I))).astype(c.dtype)
    w_hh = (s * rng.standard_normal((G * c.H, c.H))).astype(c.dtype)
    b_ih = (0.5 * rng.standard_normal(G * c.H)).astype(c.dtype) if c.bias else None
    b_hh = (0.5 * rng.standard_normal(G * c.H)).astype(c.dtype) if c.bias else None
    x = rng.standard_normal((c.B, c.I)).astype(c.dtype)
    h = rng.standard_normal((c.B, c.H)).astype(c.dtype)
    cc = rng.standard_normal((c.B, c.H)).astype(c.dtype)
    return x, h, cc, w_ih, w_hh, b_ih, b_hh


def cell_forward(c: CellCase, x, h, cc, w_ih, w_hh, b_ih, b_hh, train=False):
    sq = (lambda a: a[0]) if c.unbatched else (lambda a: a)
    hx = None if not c.state else ((sq(h), sq(cc)) if c.mode == "lstm" else sq(h))
    fn = {"lstm": dnnkit.lstm_cell, "gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell,
          "rnn_relu": dnnkit.rnn_relu_cell}[c.mode]
    return fn(sq(x), hx, w_ih, w_hh, b_ih, b_hh, train=train)


@given(c=cell_cases())
def test_cell_forward_matches_reference(isa, c):
    x, h, cc, w_ih, w_hh, b_ih, b_hh = make_cell(c)
    got = cell_forward(c, x, h, cc, w_ih, w_hh, b_ih, b_hh)
    h_in = h if c.state else np.zeros_like(h)
    c_in = cc if c.state else np.zeros_like(cc)
    t = tol(c.dtype, FWD_TOL32)
    shape = (c.H,) if c.unbatched else (c.B, c.H)
    if c.mode == "lstm":
        eh, ec = lstm_cell_ref(x, h_in, c_in, w_ih, w_hh, b_ih, b_hh)
        assert got[0].shape == got[1].shape == shape and got[0].dtype == c.dtype
        assert rel_l2(got[0], eh.reshape(shape)) <= t
        assert rel_l2(got[1], ec.reshape(shape)) <= t
    else:
        ref = gru_cell_ref(x, h_in, w_ih, w_hh, b_ih, b_hh) if c.mode == "gru" else \
            rnn_cell_ref(x, h_in, w_ih, w_hh, b_ih, b_hh, nonlinearity=c.mode[4:])
        assert got.shape == shape and got.dtype == c.dtype
        assert rel_l2(got, ref.reshape(shape)) <= t


# ------------------------------------------------------------------------------------------- backward
def seq_loss_ref(c: SeqCase, x, h0, c0, weights, go, gh, gc):
    out, h_n, c_n = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional)
    loss = np.sum(go * out) + np.sum(gh * h_n)
    return loss + (np.sum(gc * c_n) if c_n is not None else 0.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bidirectional,bias", [(1, False, True), (2, True, True), (2, False, False)])
def test_backward_reference_matches_finite_differences(mode, layers, bidirectional, bias):
    """rnn_sequence_backward_ref is the derivative of rnn_sequence_ref: central differences of
    L = sum(go * output) + sum(gh * h_n) + sum(gc * c_n) for every input, state, weight and bias."""
    c = SeqCase(mode, 3, 2, 2, 2, layers, bidirectional, bias, False, False, True, False, np.float64, 1, seed=7)
    x, h0, c0, weights = make_seq(c)
    rng = np.random.default_rng(1)
    out, h_n, c_n = rnn_sequence_ref(mode, x, h0, c0, weights, layers, bidirectional)
    go, gh = rng.standard_normal(out.shape), rng.standard_normal(h_n.shape)
    gc = rng.standard_normal(h_n.shape) if mode == "lstm" else None
    gx, gh0, gc0, gw = rnn_sequence_backward_ref(mode, x, h0, c0, weights, go, gh, gc, layers, bidirectional)
    step = 1e-6
    args = [x, h0] + ([c0] if mode == "lstm" else []) + weights
    grads = [gx, gh0] + ([gc0] if mode == "lstm" else []) + gw

    def loss():
        k = 3 if mode == "lstm" else 2
        return seq_loss_ref(c, args[0], args[1], args[2] if mode == "lstm" else None, args[k:], go, gh, gc)

    for a, g in zip(args, grads):
        assert g.shape == a.shape
        assert rel_l2(g, central_differences(loss, a, step)) <= 1e-6


def run_backward(c: SeqCase, go, gh, gc, reserve):
    if c.mode == "lstm":
        return dnnkit.lstm_backward(go, gh, gc, reserve)
    if c.mode == "gru":
        dx, dh0, dw = dnnkit.gru_backward(go, gh, reserve)
    else:
        dx, dh0, dw = dnnkit.rnn_backward(go, gh, reserve)
    return dx, dh0, None, dw


@given(c=seq_cases(max_h=12), data=st.data())
@settings(max_examples=30)
def test_sequence_backward_matches_reference(isa, c, data):
    dnnkit.set_num_threads(c.threads)
    which = data.draw(st.sampled_from(["all", "output_only", "state_only"]), label="grads")
    x, h0, c0, weights = make_seq(c)
    ux, uh0, uc0, uw = to_user(c, x, h0, c0, weights)
    out, state, reserve = run_forward(c, ux, uh0, uc0, uw, train=True)
    assert isinstance(reserve, dnnkit.RnnReserve)
    per_dir = {"lstm": 5, "gru": 4}.get(c.mode, 0) * c.T * c.B * c.H
    assert reserve.reserve_bytes == per_dir * c.layers * c.D * np.dtype(c.dtype).itemsize
    rng = np.random.default_rng(c.seed + 1)
    go = rng.standard_normal((c.T, c.B, c.D * c.H)).astype(c.dtype) if which != "state_only" else None
    gh = rng.standard_normal((c.layers * c.D, c.B, c.H)).astype(c.dtype) if which != "output_only" else None
    gc = rng.standard_normal(gh.shape).astype(c.dtype) if gh is not None and c.mode == "lstm" else None
    u_go = None if go is None else (go[:, 0] if c.unbatched else (go.transpose(1, 0, 2) if c.batch_first else go))
    u_gh = None if gh is None else (gh[:, 0] if c.unbatched else gh)
    u_gc = None if gc is None else (gc[:, 0] if c.unbatched else gc)
    dx, dh0, dc0, dw = run_backward(c, u_go, u_gh, u_gc, reserve)

    zeros_out = np.zeros((c.T, c.B, c.D * c.H))
    ex, eh0, ec0, ew = rnn_sequence_backward_ref(c.mode, x, h0, c0, weights, zeros_out if go is None else go, gh,
                                                 gc, c.layers, c.bidirectional)
    t = tol(c.dtype, BWD_TOL32)
    if c.unbatched:
        dx, dh0 = dx[:, None], dh0[:, None]
        dc0 = None if dc0 is None else dc0[:, None]
    elif c.batch_first:
        dx = dx.transpose(1, 0, 2)
    assert dx.shape == x.shape and dx.dtype == c.dtype
    assert rel_l2(dx, ex) <= t
    assert rel_l2(dh0, eh0) <= t
    if c.mode == "lstm":
        assert rel_l2(dc0, ec0) <= t
    names = param_names(c)
    if c.as_dict:
        assert isinstance(dw, dict) and list(dw) == names
        dw = [dw[k] for k in names]
    assert len(dw) == len(weights)
    for g, e, w in zip(dw, ew, weights):
        assert g.shape == w.shape and g.dtype == c.dtype
        assert rel_l2(g, e) <= t


@given(c=cell_cases())
@settings(max_examples=30)
def test_cell_backward_matches_reference(isa, c):
    x, h, cc, w_ih, w_hh, b_ih, b_hh = make_cell(c)
    _, reserve = cell_forward(c, x, h, cc, w_ih, w_hh, b_ih, b_hh, train=True)
    rng = np.random.default_rng(c.seed + 1)
    gh = rng.standard_normal((c.B, c.H)).astype(c.dtype)
    gc = rng.standard_normal((c.B, c.H)).astype(c.dtype)
    sq = (lambda a: a[0]) if c.unbatched else (lambda a: a)
    if c.mode == "lstm":
        got = dnnkit.lstm_cell_backward(sq(gh), sq(gc), reserve)
    elif c.mode == "gru":
        got = dnnkit.gru_cell_backward(sq(gh), reserve)
    else:
        got = dnnkit.rnn_cell_backward(sq(gh), reserve)
    weights = [w_ih, w_hh] + ([b_ih, b_hh] if c.bias else [])
    h0 = h[None] if c.state else None
    c0 = cc[None] if c.state and c.mode == "lstm" else None
    ex, eh, ec, ew = rnn_sequence_backward_ref(c.mode, x[None], h0, c0, weights, gh[None], None,
                                               gc[None] if c.mode == "lstm" else None)
    expected = [ex[0], eh[0]] + ([ec[0]] if c.mode == "lstm" else []) + ew + ([] if c.bias else [None, None])
    t = tol(c.dtype, BWD_TOL32)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
            continue
        e = e.reshape(g.shape) if c.unbatched and e.ndim == 2 else e
        assert g.dtype == c.dtype and g.shape == e.shape
        assert rel_l2(g, e) <= t


@given(c=cell_cases())
@settings(max_examples=30)
def test_cell_on_packed_weights_matches_reference(isa, num_threads, c):
    """The cells on weights packed once (dnnkit.pack_weight, under the ISA the fixture set): forward
    against the float64 references, and the backward of a train=True call, which multiplies by the
    arrays the packings came from, as on plain weights."""
    x, h, cc, w_ih, w_hh, b_ih, b_hh = make_cell(c)
    p_ih, p_hh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
    got = cell_forward(c, x, h, cc, p_ih, p_hh, b_ih, b_hh)
    got = got if isinstance(got, tuple) else (got,)
    h_in = h if c.state else np.zeros_like(h)
    c_in = cc if c.state else np.zeros_like(cc)
    if c.mode == "lstm":
        expected = lstm_cell_ref(x, h_in, c_in, w_ih, w_hh, b_ih, b_hh)
    elif c.mode == "gru":
        expected = (gru_cell_ref(x, h_in, w_ih, w_hh, b_ih, b_hh),)
    else:
        expected = (rnn_cell_ref(x, h_in, w_ih, w_hh, b_ih, b_hh, nonlinearity=c.mode[4:]),)
    for g, e in zip(got, expected):
        assert g.dtype == c.dtype and g.shape == ((c.H,) if c.unbatched else (c.B, c.H))
        assert rel_l2(g, e.reshape(g.shape)) <= tol(c.dtype, FWD_TOL32)
    _, r_packed = cell_forward(c, x, h, cc, p_ih, p_hh, b_ih, b_hh, train=True)
    _, r_plain = cell_forward(c, x, h, cc, w_ih, w_hh, b_ih, b_hh, train=True)
    gh = np.random.default_rng(c.seed).standard_normal((c.B, c.H)).astype(c.dtype)
    gh = gh[0] if c.unbatched else gh
    backward = {"lstm": lambda r: dnnkit.lstm_cell_backward(gh, gh, r), "gru": lambda r: dnnkit.gru_cell_backward(gh, r)}
    run = backward.get(c.mode, lambda r: dnnkit.rnn_cell_backward(gh, r))
    for g, e in zip(run(r_packed), run(r_plain)):
        if e is None:
            assert g is None
        else:
            assert rel_l2(g, e) <= tol(c.dtype, BWD_TOL32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,I,H", [(64, 256, 256), (300, 20, 30), (1, 300, 200), (16, 100, 70)])
def test_cells_on_packed_weights_at_larger_sizes(num_threads, mode, B, I, H):
    """Packed cells beyond hypothesis's sizes: a full tile of batch rows, more rows than one block of the
    packed product (256), one row of a wide layer; the remembered fast path on a repeated call."""
    rng = np.random.default_rng(B + I + H)
    G = GATES[mode]
    x = rng.standard_normal((B, I)).astype(np.float32)
    h = rng.standard_normal((B, H)).astype(np.float32)
    c = rng.standard_normal((B, H)).astype(np.float32)
    w_ih = (rng.standard_normal((G * H, I)) / np.sqrt(I)).astype(np.float32)
    w_hh = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(np.float32)
    b_ih, b_hh = rng.standard_normal(G * H).astype(np.float32), rng.standard_normal(G * H).astype(np.float32)
    p_ih, p_hh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
    if mode == "lstm":
        expected = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
        calls = [dnnkit.lstm_cell(x, (h, c), p_ih, p_hh, b_ih, b_hh) for _ in range(2)]
    elif mode == "gru":
        expected = (gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh),)
        calls = [(dnnkit.gru_cell(x, h, p_ih, p_hh, b_ih, b_hh),) for _ in range(2)]
    else:
        fn = dnnkit.rnn_tanh_cell if mode == "rnn_tanh" else dnnkit.rnn_relu_cell
        expected = (rnn_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity=mode[4:]),)
        calls = [(fn(x, h, p_ih, p_hh, b_ih, b_hh),) for _ in range(2)]
    for got in calls:
        for g, e in zip(got, expected):
            assert rel_l2(g, e) <= FWD_TOL32


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,I,H", [(16, 40, 96), (40, 200, 192), (3, 7, 48), (252, 30, 96)])
def test_packed_cells_by_blocks_of_hidden_units(isa, num_threads, mode, B, I, H):
    """Packed cells whose hidden size is whole panels of the micro-kernel (H a multiple of NR on every
    ISA's kernel) run each block of hidden units' products and post-GEMM together: with and without the
    initial state, in both dtypes, forward against the float64 references and the backward of a
    train=True call against the one on plain weights."""
    rng = np.random.default_rng(B + I + H)
    G = GATES[mode]
    for dtype in DTYPES:
        x = rng.standard_normal((B, I)).astype(dtype)
        h = rng.standard_normal((B, H)).astype(dtype)
        c = rng.standard_normal((B, H)).astype(dtype)
        w_ih = (rng.standard_normal((G * H, I)) / np.sqrt(I)).astype(dtype)
        w_hh = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(dtype)
        b_ih, b_hh = rng.standard_normal(G * H).astype(dtype), rng.standard_normal(G * H).astype(dtype)
        p_ih, p_hh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
        t = tol(dtype, FWD_TOL32)
        for state in (True, False):
            hs, cs = (h, c) if state else (np.zeros_like(h), np.zeros_like(c))
            if mode == "lstm":
                call = lambda w1, w2, **kw: dnnkit.lstm_cell(x, (h, c) if state else None, w1, w2, b_ih, b_hh, **kw)
                expected = lstm_cell_ref(x, hs, cs, w_ih, w_hh, b_ih, b_hh)
                backward = lambda r, g: dnnkit.lstm_cell_backward(g, g, r)
            elif mode == "gru":
                call = lambda w1, w2, **kw: dnnkit.gru_cell(x, h if state else None, w1, w2, b_ih, b_hh, **kw)
                expected = (gru_cell_ref(x, hs, w_ih, w_hh, b_ih, b_hh),)
                backward = lambda r, g: dnnkit.gru_cell_backward(g, r)
            else:
                fn = dnnkit.rnn_tanh_cell if mode == "rnn_tanh" else dnnkit.rnn_relu_cell
                call = lambda w1, w2, **kw: fn(x, h if state else None, w1, w2, b_ih, b_hh, **kw)
                expected = (rnn_cell_ref(x, hs, w_ih, w_hh, b_ih, b_hh, nonlinearity=mode[4:]),)
                backward = lambda r, g: dnnkit.rnn_cell_backward(g, r)
            got = call(p_ih, p_hh)
            got = got if isinstance(got, tuple) else (got,)
            for g, e in zip(got, expected):
                assert rel_l2(g, e) <= t
            g_h = rng.standard_normal((B, H)).astype(dtype)
            for g, e in zip(backward(call(p_ih, p_hh, train=True)[1], g_h), backward(call(w_ih, w_hh, train=True)[1], g_h)):
                assert (g is None and e is None) or rel_l2(g, e) <= tol(dtype, BWD_TOL32)


def test_packed_cell_weights_are_checked_by_name():
    x, h = np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)
    w_ih, w_hh = np.zeros((16, 3), np.float32), np.zeros((16, 4), np.float32)
    p_ih, p_hh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
    with pytest.raises(ValueError, match=r"^lstm_cell: w_ih and w_hh must both be packed"):
        dnnkit.lstm_cell(x, (h, h), p_ih, w_hh)
    with pytest.raises(ValueError, match=r"^lstm_cell: w_ih must have shape \(16, 5\)"):
        dnnkit.lstm_cell(np.zeros((2, 5), np.float32), (h, h), p_ih, p_hh)
    with pytest.raises(ValueError, match=r"^gru_cell: w_hh must have shape \(3\*hidden_size"):
        dnnkit.gru_cell(x, h, p_ih, p_hh)
    with pytest.raises(TypeError, match=r"^lstm_cell: w_ih has dtype float32 but input has float64"):
        dnnkit.lstm_cell(x.astype(np.float64), None, p_ih, p_hh)
    with pytest.raises(TypeError, match=r"^lstm: weights\[0\] \(weight_ih_l0\) is a packed weight"):
        dnnkit.lstm(np.zeros((1, 2, 3), np.float32), None, None, [p_ih, p_hh])


# ---------------------------------------------------------------------------------------- PyTorch
TORCH_CASES = [(m, layers, bi, bias, bf) for m in MODES for (layers, bi, bias, bf) in
               [(1, False, True, False), (2, True, True, True), (3, False, False, False), (2, True, False, True)]]


@pytest.mark.parametrize("mode,layers,bidirectional,bias,batch_first", TORCH_CASES)
def test_sequence_matches_torch(mode, layers, bidirectional, bias, batch_first):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    T, B, I, H = 5, 3, 6, 7
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode)
    kw = dict(num_layers=layers, bidirectional=bidirectional, bias=bias, batch_first=batch_first)
    module = (cls(I, H, **kw) if cls else torch.nn.RNN(I, H, nonlinearity=mode[4:], **kw)).double()
    D = 2 if bidirectional else 1
    x = torch.randn((B, T, I) if batch_first else (T, B, I), dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    out, state = module(x, (h0, c0) if mode == "lstm" else h0)
    go = torch.randn_like(out)
    gh = torch.randn(layers * D, B, H, dtype=torch.float64)
    gc = torch.randn(layers * D, B, H, dtype=torch.float64)
    loss = (out * go).sum() + ((state[0] * gh).sum() + (state[1] * gc).sum() if mode == "lstm" else
                               (state * gh).sum())
    loss.backward()

    named = {k: v.detach().numpy() for k, v in module.named_parameters()}
    args = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, train=True)
    xn, h0n, c0n = x.detach().numpy(), h0.detach().numpy(), c0.detach().numpy()
    if mode == "lstm":
        o, (hn, cn), res = dnnkit.lstm(xn, h0n, c0n, named, **args)
        dx, dh0, dc0, dw = dnnkit.lstm_backward(go.numpy(), gh.numpy(), gc.numpy(), res)
        assert rel_l2(cn, state[1].detach().numpy()) <= 1e-12
        assert rel_l2(dc0, c0.grad.numpy()) <= 1e-12
    elif mode == "gru":
        o, hn, res = dnnkit.gru(xn, h0n, named, **args)
        dx, dh0, dw = dnnkit.gru_backward(go.numpy(), gh.numpy(), res)
    else:
        o, hn, res = dnnkit.rnn(xn, h0n, named, nonlinearity=mode[4:], **args)
        dx, dh0, dw = dnnkit.rnn_backward(go.numpy(), gh.numpy(), res)
    h_ref = state[0] if mode == "lstm" else state
    assert rel_l2(o, out.detach().numpy()) <= 1e-12
    assert rel_l2(hn, h_ref.detach().numpy()) <= 1e-12
    assert rel_l2(dx, x.grad.numpy()) <= 1e-12
    assert rel_l2(dh0, h0.grad.numpy()) <= 1e-12
    assert list(dw) == list(named)
    for k, p in module.named_parameters():
        assert rel_l2(dw[k], p.grad.numpy()) <= 1e-12, k


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cells_match_torch(mode, dtype):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    B, I, H = 4, 5, 6
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    if mode == "lstm":
        cell = torch.nn.LSTMCell(I, H).to(tdt)
    elif mode == "gru":
        cell = torch.nn.GRUCell(I, H).to(tdt)
    else:
        cell = torch.nn.RNNCell(I, H, nonlinearity=mode[4:]).to(tdt)
    x = torch.randn(B, I, dtype=tdt, requires_grad=True)
    h = torch.randn(B, H, dtype=tdt, requires_grad=True)
    c = torch.randn(B, H, dtype=tdt, requires_grad=True)
    out = cell(x, (h, c)) if mode == "lstm" else cell(x, h)
    gh, gc = torch.randn(B, H, dtype=tdt), torch.randn(B, H, dtype=tdt)
    loss = (out[0] * gh).sum() + (out[1] * gc).sum() if mode == "lstm" else (out * gh).sum()
    loss.backward()
    w = [p.detach().numpy() for p in cell.parameters()]
    t = tol(dtype, BWD_TOL32)
    n = lambda a: a.detach().numpy()  # noqa: E731
    if mode == "lstm":
        (h2, c2), res = dnnkit.lstm_cell(n(x), (n(h), n(c)), *w, train=True)
        assert rel_l2(h2, n(out[0])) <= t and rel_l2(c2, n(out[1])) <= t
        grads = dnnkit.lstm_cell_backward(gh.numpy(), gc.numpy(), res)
        expected = [x.grad, h.grad, c.grad] + [p.grad for p in cell.parameters()]
    else:
        fn = {"gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell, "rnn_relu": dnnkit.rnn_relu_cell}[mode]
        h2, res = fn(n(x), n(h), *w, train=True)
        assert rel_l2(h2, n(out)) <= t
        bwd = dnnkit.gru_cell_backward if mode == "gru" else dnnkit.rnn_cell_backward
        grads = bwd(gh.numpy(), res)
        expected = [x.grad, h.grad] + [p.grad for p in cell.parameters()]
    for g, e in zip(grads, expected):
        assert rel_l2(g, e.numpy()) <= t


# ------------------------------------------------------------------------------ fast math, edge cases
def test_fast_math_accuracy(isa):
    """The post-GEMM's float32 exp, sigmoid and tanh (each ISA's vector code, the portable loops on ref):
    relative error <= 2e-7 (about 2 ulp) from ln of the smallest normal float (-87.3365) up; NaN passes."""
    x = np.concatenate([np.linspace(-87.3365, 88, 400001), np.linspace(-87.3365, -87, 10001), np.logspace(-30, 1, 20001), -np.logspace(-30, 1, 20001),
                        [0.0, 0.625, -0.625, np.nextafter(0.625, 0), 9.0, 20.0, -20.0]]).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = {0: np.exp(x64), 1: 1.0 / (1.0 + np.exp(-x64)), 2: np.tanh(x64)}
    for fn, e in expected.items():
        y = np.full_like(x, np.nan)
        dnnkit._cpu.rnn_math_test(fn, x, y)
        err = np.abs(y.astype(np.float64) - e) / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
        assert err.max() <= 2e-7, (fn, x[err.argmax()], err.max())
        nan = np.array([np.nan], np.float32)
        out = np.zeros(1, np.float32)
        dnnkit._cpu.rnn_math_test(fn, nan, out)
        assert np.isnan(out[0])
    assert np.array_equal(np.sign(y), np.sign(x))  # tanh keeps the sign, and tanh(0) == 0
    y64 = np.empty_like(x64)
    dnnkit._cpu.rnn_math_test(2, x64, y64)
    assert np.max(np.abs(y64 - np.tanh(x64))) <= 1e-15


def test_fast_math_large_magnitudes(isa):
    """tanh and sigmoid of large inputs: tanh is +-1 exactly past |x| = 10 and sigmoid 1 above x = 88; below
    x = -87.34, where sigmoid(x) is smaller than every normal float, sigmoid is 0 (as with flush to zero).
    No output is denormal (denormals cost the cores microcode assists)."""
    mags = np.concatenate([np.linspace(10, 200, 20001), np.logspace(2, 38, 200), [np.inf]]).astype(np.float32)
    x = np.concatenate([mags, -mags])
    tanh = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(2, x, tanh)
    assert np.array_equal(tanh, np.sign(x))
    sig = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(1, x, sig)
    assert np.all(sig[x >= 88] == 1.0)
    assert np.all(sig[x <= -87.34] == 0)
    for y in (tanh, sig):
        assert not np.any((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny))


def test_fast_math_float64_accuracy(isa):
    """The post-GEMM's float64 exp, sigmoid and tanh (each ISA's vector code, the C library on ref), against
    80-bit references: within 4 units in the last place, from ln of the smallest normal double up (exp to
    709.7, past which it is inf), tiny arguments included; tanh is exactly +-1 past |x| = 20 and keeps
    the sign of 0; sigmoid is 1 above 37 and at most the smallest normal double below -708.4; NaN passes."""
    rng = np.random.default_rng(8)
    lo = -708.3964185322641  # ln of the smallest normal double
    x = np.concatenate([np.linspace(lo, 709.7, 200001), np.linspace(-40, 40, 100001),
                        np.logspace(-300, 1, 20001), -np.logspace(-300, 1, 20001), rng.uniform(-1, 1, 20000),
                        [0.0, -0.0, np.log(2) / 2, -np.log(2) / 2, 19.06, -19.06]])
    xl = x.astype(np.longdouble)
    refs = {0: np.exp(xl), 1: 1 / (1 + np.exp(-xl)), 2: np.tanh(xl)}
    for fn, ref in refs.items():
        y = np.full_like(x, np.nan)
        dnnkit._cpu.rnn_math_test(fn, x, y)
        ulps = np.abs(y.astype(np.longdouble) - ref) / np.spacing(np.abs(ref).astype(np.float64))
        assert ulps.max() <= 4, (fn, x[ulps.argmax()], ulps.max())
        out = np.zeros(1)
        dnnkit._cpu.rnn_math_test(fn, np.array([np.nan]), out)
        assert np.isnan(out[0])
    big = np.concatenate([np.linspace(20, 800, 10001), [1e300, np.inf]])
    special = np.concatenate([big, -big, [0.0, -0.0]])
    for fn in (1, 2):
        y = np.empty_like(special)
        dnnkit._cpu.rnn_math_test(fn, special, y)
        if fn == 2:
            assert np.array_equal(y, np.sign(special)) and np.array_equal(np.signbit(y), np.signbit(special))
        else:
            assert np.all(y[special >= 37] == 1.0) and np.all(y[special <= -708.4] <= np.finfo(np.float64).tiny)
    y = np.empty(4)
    dnnkit._cpu.rnn_math_test(0, np.array([710.0, np.inf, -746.0, -np.inf]), y)
    assert np.array_equal(y, [np.inf, np.inf, 0.0, 0.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_math_vector_tails(isa, dtype):
    """Arrays of every length up to three vectors: the masked tail gives what a full vector gives, reads
    and writes nothing past the end, and NaN or inf in any lane stays in that lane."""
    rng = np.random.default_rng(5)
    base = rng.uniform(-12, 12, 48).astype(dtype)
    for fn in range(3):
        full = np.empty_like(base)
        dnnkit._cpu.rnn_math_test(fn, base, full)
        for n in range(1, 49):
            out = np.full(n + 3, -7.0, dtype)
            dnnkit._cpu.rnn_math_test(fn, base[:n], out[:n])
            assert np.array_equal(out[:n], full[:n]), (fn, n)
            assert np.all(out[n:] == -7.0), (fn, n)
        special = base[:19].copy()
        special[[3, 17]] = np.nan
        special[5], special[18] = np.inf, -np.inf
        out = np.empty_like(special)
        dnnkit._cpu.rnn_math_test(fn, special, out)
        assert np.isnan(out[[3, 17]]).all()
        # exp saturates at its range's ends (0 and inf with AVX-512; the smallest normal float and exp(88)
        # elsewhere)
        assert out[5] == 1.0 if fn else out[5] > 1e38
        assert out[18] == -1.0 if fn == 2 else 0 <= out[18] < 1e-37
        keep = np.isfinite(special)
        assert np.array_equal(out[keep], full[:19][keep])


def test_repeated_cell_calls_take_the_remembered_path():
    """A cell stepped in a loop reuses its first call's checks and dispatch: every step still matches the
    reference, a transposed (non-contiguous) weight or a wrong shape in the same loop is handled as on a
    first call, and the remembered decisions stay keyed by signature."""
    from dnnkit import recurrent
    rng = np.random.default_rng(11)
    H, I, B = 6, 4, 3
    w_ih, w_hh = rng.standard_normal((4 * H, I)).astype(np.float32), rng.standard_normal((4 * H, H)).astype(np.float32)
    b_ih, b_hh = rng.standard_normal(4 * H).astype(np.float32), rng.standard_normal(4 * H).astype(np.float32)
    h, c = np.zeros((B, H), np.float32), np.zeros((B, H), np.float32)
    recurrent._cell_calls.clear()
    for step in range(4):
        x = rng.standard_normal((B, I)).astype(np.float32)
        eh, ec = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
        h, c = dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        assert rel_l2(h, eh) <= FWD_TOL32 and rel_l2(c, ec) <= FWD_TOL32
    assert len(recurrent._cell_calls) == 1
    w_t = np.asfortranarray(w_ih)  # same shape and dtype, not C-contiguous
    eh, ec = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
    got = dnnkit.lstm_cell(x, (h, c), w_t, w_hh, b_ih, b_hh)
    assert rel_l2(got[0], eh) <= FWD_TOL32
    with pytest.raises(ValueError, match="lstm_cell: hx\\[0\\] must have shape"):
        dnnkit.lstm_cell(x, (h[:, :-1].copy(), c), w_ih, w_hh, b_ih, b_hh)
    with pytest.raises(TypeError, match="lstm_cell: train must be a bool"):
        dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh, train=1)


def test_sequence_state_is_continued():
    """Running a sequence in two halves, the second from the first's (h_n, c_n), equals running it whole."""
    c = SeqCase("lstm", 6, 2, 3, 5, 2, False, True, False, False, True, False, np.float64, 2, seed=3)
    x, h0, c0, w = make_seq(c)
    out, (hn, cn) = dnnkit.lstm(x, h0, c0, w, num_layers=2)
    o1, (h1, c1) = dnnkit.lstm(x[:3], h0, c0, w, num_layers=2)
    o2, (h2, c2) = dnnkit.lstm(x[3:], h1, c1, w, num_layers=2)
    assert rel_l2(np.concatenate([o1, o2]), out) <= 1e-14
    assert rel_l2(h2, hn) <= 1e-14 and rel_l2(c2, cn) <= 1e-14


# ----------------------------------------------------------------------------------------- bad input
def _w(G=4, H=3, I=2, layers=1, D=1, bias=True, dtype=np.float32):
    ws = []
    for layer in range(layers):
        for _ in range(D):
            ws += [np.zeros((G * H, I if layer == 0 else D * H), dtype), np.zeros((G * H, H), dtype)]
            if bias:
                ws += [np.zeros(G * H, dtype), np.zeros(G * H, dtype)]
    return ws


X = np.zeros((4, 2, 2), np.float32)
S = np.zeros((1, 2, 3), np.float32)
BAD_INPUTS = [
    ("lstm: weights has 3 entries but num_layers=1, bidirectional=False needs 4 (or 2 without biases)",
     ValueError, lambda: dnnkit.lstm(X, None, None, _w()[:3])),
    ("lstm: weights has 6 entries but num_layers=2, bidirectional=False needs 8 (or 4 without biases)",
     ValueError, lambda: dnnkit.lstm(X, None, None, _w() + _w()[:2], num_layers=2)),
    ("lstm: weights[2] (weight_ih_l1) must have shape (12, 3), got (12,)",
     ValueError, lambda: dnnkit.lstm(X, None, None, _w(), num_layers=2)),
    ("gru: weights has 6 entries but num_layers=1, bidirectional=True needs 8 (or 4 without biases)",
     ValueError, lambda: dnnkit.gru(X, None, _w(G=3) + _w(G=3)[:2], bidirectional=True)),
    ("lstm: weights[1] (weight_hh_l0) must be 2-D of shape (4*hidden_size, hidden_size)",
     ValueError, lambda: dnnkit.lstm(X, None, None, [_w()[0], np.zeros((12, 4), np.float32)] + _w()[2:])),
    ("lstm: weights[0] (weight_ih_l0) must have shape (12, 2)",
     ValueError, lambda: dnnkit.lstm(X, None, None, [np.zeros((12, 5), np.float32)] + _w()[1:])),
    ("gru: weights['bias_hh_l0'] must have shape (9,)",
     ValueError, lambda: dnnkit.gru(X, None, {"weight_ih_l0": np.zeros((9, 2), np.float32),
                                              "weight_hh_l0": np.zeros((9, 3), np.float32),
                                              "bias_ih_l0": np.zeros(9, np.float32),
                                              "bias_hh_l0": np.zeros(8, np.float32)})),
    ("gru: weights for num_layers=1, bidirectional=False (biases absent) must have the keys",
     ValueError, lambda: dnnkit.gru(X, None, {"weight_ih_l0": np.zeros((9, 2), np.float32)})),
    ("lstm: h0 must have shape (1, 2, 3), got (1, 3, 3)",
     ValueError, lambda: dnnkit.lstm(X, np.zeros((1, 3, 3), np.float32), None, _w())),
    ("lstm: c0 must have shape (1, 2, 3), got (2, 2, 3)",
     ValueError, lambda: dnnkit.lstm(X, S, np.zeros((2, 2, 3), np.float32), _w())),
    ("rnn: h0 has dtype float64 but input has float32",
     TypeError, lambda: dnnkit.rnn(X, S.astype(np.float64), _w(G=1))),
    ("lstm: weights[2] (bias_ih_l0) has dtype float64 but input has float32",
     TypeError, lambda: dnnkit.lstm(X, None, None, _w()[:2] + [np.zeros(12), np.zeros(12, np.float32)])),
    ("lstm: input must have dtype float32 or float64, got int64",
     TypeError, lambda: dnnkit.lstm(X.astype(np.int64), None, None, _w())),
    ("lstm: input must be 2-D or 3-D", ValueError, lambda: dnnkit.lstm(X[0, 0], None, None, _w())),
    ("lstm: input must have a sequence length >= 1", ValueError, lambda: dnnkit.lstm(X[:0], None, None, _w())),
    ("gru: input must have a feature size (its last dimension) >= 1, got shape (2, 2, 0)", ValueError,
     lambda: dnnkit.gru(np.ones((2, 2, 0), np.float32), None, [np.ones((9, 0), np.float32)] + _w(G=3)[1:])),
    ("gru_cell: input must have a feature size (its last dimension) >= 1, got shape (2, 0)", ValueError,
     lambda: dnnkit.gru_cell(np.ones((2, 0), np.float32), None, np.ones((9, 0), np.float32), *_w(G=3)[1:])),
    ("rnn: nonlinearity must be 'tanh' or 'relu'", ValueError,
     lambda: dnnkit.rnn(X, None, _w(G=1), nonlinearity="sigmoid")),
    ("lstm: num_layers must be >= 1", ValueError, lambda: dnnkit.lstm(X, None, None, _w(), num_layers=0)),
    ("lstm: bidirectional must be a bool", TypeError, lambda: dnnkit.lstm(X, None, None, _w(), bidirectional=1)),
    ("lstm: weights must be a list or a dict", TypeError, lambda: dnnkit.lstm(X, None, None, 5)),
    ("lstm_cell: w_ih must have shape (12, 2)", ValueError,
     lambda: dnnkit.lstm_cell(X[0], None, np.zeros((12, 3), np.float32), _w()[1])),
    ("lstm_cell: hx[1] must have shape (2, 3), got (2, 4)", ValueError,
     lambda: dnnkit.lstm_cell(X[0], (S[0], np.zeros((2, 4), np.float32)), *_w())),
    ("gru_cell: hx has dtype float64 but input has float32", TypeError,
     lambda: dnnkit.gru_cell(X[0], S[0].astype(np.float64), *_w(G=3))),
    ("gru_cell: w_hh must have shape (3*hidden_size, hidden_size)", ValueError,
     lambda: dnnkit.gru_cell(X[0], None, np.zeros((9, 2), np.float32), np.zeros((12, 3), np.float32))),
    ("rnn_tanh_cell: b_ih and b_hh must both be given or both be None", ValueError,
     lambda: dnnkit.rnn_tanh_cell(X[0], None, *_w(G=1)[:3])),
    ("lstm_cell: hx must be a pair (h, c) or None", TypeError,
     lambda: dnnkit.lstm_cell(X[0], S[0], *_w())),
]


@pytest.mark.parametrize("message,exc,call", BAD_INPUTS, ids=[m.split(":")[0] + ":" + str(i)
                                                               for i, (m, _, _) in enumerate(BAD_INPUTS)])
def test_bad_input(message, exc, call):
    with pytest.raises(exc) as info:
        call()
    assert message in str(info.value)


def test_bad_backward_input():
    x, h0, c0, w = make_seq(SeqCase("lstm", 3, 2, 2, 3, 1, False, True, False, False, True, False, np.float32, 1, 0))
    out, _, res = dnnkit.lstm(x, h0, c0, w, train=True)
    with pytest.raises(ValueError, match=r"lstm_backward: grad_output must have shape \(3, 2, 3\), got \(3, 2, 4\)"):
        dnnkit.lstm_backward(np.zeros((3, 2, 4), np.float32), None, None, res)
    with pytest.raises(TypeError, match="lstm_backward: grad_h_n has dtype float64 but the forward ran in float32"):
        dnnkit.lstm_backward(None, np.zeros((1, 2, 3)), None, res)
    with pytest.raises(ValueError, match="gru_backward: reserve comes from lstm, not from a matching forward"):
        dnnkit.gru_backward(out, None, res)
    with pytest.raises(TypeError, match="lstm_backward: reserve must be the RnnReserve"):
        dnnkit.lstm_backward(out, None, None, {})
    _, cres = dnnkit.lstm_cell(x[0], None, *w, train=True)
    with pytest.raises(ValueError, match="lstm_backward: reserve comes from lstm_cell"):
        dnnkit.lstm_backward(out, None, None, cres)


# ---------------------------------------------------------------------------- problem, registry, explain
def test_rnn_problem_descriptor_round_trip():
    from dnnkit.problem import RnnProblem, parse_descriptor

    for p in (RnnProblem("lstm", 50, 16, 512, 512, layers=2, dirs=2),
              RnnProblem("rnn_relu", 1, 0, 3, 4, bias=False, dtype="float64", direction="bwd")):
        assert RnnProblem.parse(p.descriptor(), direction=p.direction) == p
        assert parse_descriptor(p.descriptor(), direction=p.direction) == p
    p = RnnProblem("gru", 10, 4, 8, 16)
    assert p.op == "gru_fwd" and p.flops == 2 * 10 * 4 * 3 * 16 * (8 + 16)
    for bad in ("lstm_l0t5mb1slc1sic1", "lstm_l1t5mb1slc1sic1_tridir", "sru_l1t1mb1slc1sic1"):
        with pytest.raises(ValueError):
            RnnProblem.parse(bad)


def test_rnn_goes_through_the_registry_and_explain():
    assert [a.name for a in dnnkit.algos.algorithms("lstm_fwd", "cpu")] == [
        "fused", "fused_units", "fused_rows", "fused_wavefront"]
    assert [a.name for a in dnnkit.algos.algorithms("lstm_bwd", "cpu")] == ["fused", "fused_units", "fused_rows"]
    e = dnnkit.explain("lstm_l2t5mb3slc4sic6_bidir")
    assert e.problem.op == "lstm_fwd" and e[0].chosen and e[0].workspace_bytes > 0
    reasons = {c.algorithm: c.reason for c in e}
    assert "batch rows a thread" in reasons["fused_rows"] or "threads" in reasons["fused_rows"]
    assert "unidirectional stack" in reasons["fused_wavefront"]
    assert dnnkit.explain("gru_l1t5mb3slc4sic6", direction="bwd").problem.op == "gru_bwd"


def test_rnn_workspace_limit_is_reported_by_name():
    x = np.zeros((2, 1, 3), np.float32)
    w = [np.zeros((16, 3), np.float32), np.zeros((16, 4), np.float32)]
    dnnkit.set_workspace_limit(0)
    with pytest.raises(ValueError, match=r"^lstm: .*over the limit"):
        dnnkit.lstm(x, None, None, w)


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh", "rnn_relu", "gru"])
@pytest.mark.parametrize("B,I,H", [(64, 200, 150), (60, 320, 40), (128, 100, 300), (53, 160, 160), (40, 200, 150), (24, 300, 100),
                                   (1, 300, 200), (3, 40, 50), (8, 384, 384), (48, 200, 200), (32, 100, 120)])
def test_cells_at_a_tile_of_batch_rows(isa, num_threads, mode, B, I, H):
    """Cells at batches that fill the strided-A kernel's tiles, with I + H of 192 or more, and at a few
    rows: LSTM and the plain RNN cells then run x W_ih^T + h W_hh^T + bias as one product over both
    weights in place, on the strided-A kernel or as dot products (8 rows of a 4.7 MB LSTM weight: more
    rows than one dot-kernel call takes); GRU runs its r and z gates so where I or H alone is under 192
    and I + H is 320 or more, and gate n's products apart. Both dtypes match the float64 references, with
    and without biases, and the GRU cell's backward from what that forward saved matches too."""
    rng = np.random.default_rng(B + I + H)
    G = {"lstm": 4, "gru": 3}.get(mode, 1)
    for dtype in DTYPES:
        for bias in (True, False):
            x = rng.standard_normal((B, I)).astype(dtype)
            h = rng.standard_normal((B, H)).astype(dtype)
            c = rng.standard_normal((B, H)).astype(dtype)
            w_ih = (rng.standard_normal((G * H, I)) / np.sqrt(I)).astype(dtype)
            w_hh = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(dtype)
            b_ih = rng.standard_normal(G * H).astype(dtype) if bias else None
            b_hh = rng.standard_normal(G * H).astype(dtype) if bias else None
            t = 2e-5 if dtype == np.float32 else 1e-12
            if mode == "lstm":
                oh, oc = dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
                eh, ec = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
                assert rel_l2(oh, eh) <= t and rel_l2(oc, ec) <= t
            elif mode == "gru":
                out = dnnkit.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
                assert rel_l2(out, gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh)) <= t
                out, reserve = dnnkit.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh, train=True)
                assert rel_l2(out, gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh)) <= t
                gh = rng.standard_normal((B, H)).astype(dtype)
                got = dnnkit.gru_cell_backward(gh, reserve)
                weights = [w_ih, w_hh] + ([b_ih, b_hh] if bias else [])
                ex, eh, _, ew = rnn_sequence_backward_ref("gru", x[None], h[None], None, weights, gh[None], None, None)
                for g, e in zip(got, [ex[0], eh[0]] + ew):
                    assert rel_l2(g, e) <= tol(dtype, BWD_TOL32)
            else:
                fn = dnnkit.rnn_tanh_cell if mode == "rnn_tanh" else dnnkit.rnn_relu_cell
                out = fn(x, h, w_ih, w_hh, b_ih, b_hh)
                assert rel_l2(out, rnn_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity=mode[4:])) <= t


@pytest.mark.parametrize("dtype", DTYPES)
def test_gru_cell_one_pass_across_depth_blocks(isa, num_threads, dtype):
    """A GRU cell whose batch fills the strided-A kernel's tiles runs all its products in one pass
    (gemm_wt_direct_cell: r and z over [x | h], gate n's input and hidden products apart). With I + H past
    one of the kernel's depth blocks, the depth runs in two blocks, gate n's input rows ending and its
    hidden rows starting inside the second: each group still starts from zero, takes its bias once and
    matches the reference, with and without biases, at a batch of one tile and of several panels."""
    block = dnnkit._cpu.gemm_wt_direct_depth_block(np.dtype(dtype).itemsize) or 1024
    rng = np.random.default_rng(31)
    I, H = block + 300, 45
    for B in (16, 70):
        x = rng.standard_normal((B, I)).astype(dtype)
        h = rng.standard_normal((B, H)).astype(dtype)
        w_ih = (rng.standard_normal((3 * H, I)) / np.sqrt(I)).astype(dtype)
        w_hh = (rng.standard_normal((3 * H, H)) / np.sqrt(H)).astype(dtype)
        for b_ih, b_hh in ((None, None), (rng.standard_normal(3 * H).astype(dtype), rng.standard_normal(3 * H).astype(dtype))):
            out = dnnkit.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
            assert rel_l2(out, gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh)) <= (2e-5 if dtype == np.float32 else 1e-12)


def check_sequence_and_gradients(c: SeqCase):
    """A training forward (outputs and final states), an inference forward and the backward from what the
    training forward saved, all against the float64 references."""
    x, h0, c0, weights = make_seq(c)
    mode = c.mode
    out, state, reserve = run_forward(c, x, h0, c0, weights, train=True)
    h_n = state[0] if mode == "lstm" else state
    eo, eh, ec = rnn_sequence_ref(mode, x, h0, c0, weights, c.layers, c.bidirectional)
    t = tol(c.dtype, FWD_TOL32)
    assert rel_l2(out, eo) <= t and rel_l2(h_n, eh) <= t
    if mode == "lstm":
        assert rel_l2(state[1], ec) <= t
    inference = run_forward(c, x, h0, c0, weights)
    i_h = inference[1][0] if mode == "lstm" else inference[1]
    assert rel_l2(inference[0], eo) <= t and rel_l2(i_h, eh) <= t
    if mode == "lstm":
        assert rel_l2(inference[1][1], ec) <= t
    rng = np.random.default_rng(c.seed + 1)
    go = rng.standard_normal(out.shape).astype(c.dtype)
    gh = rng.standard_normal(h_n.shape).astype(c.dtype)
    gc = rng.standard_normal(h_n.shape).astype(c.dtype) if mode == "lstm" else None
    dx, dh0, dc0, dw = run_backward(c, go, gh, gc, reserve)
    ex, eh0, ec0, ew = rnn_sequence_backward_ref(mode, x, h0, c0, weights, go, gh, gc, c.layers, c.bidirectional)
    t = tol(c.dtype, BWD_TOL32)
    assert rel_l2(dx, ex) <= t and rel_l2(dh0, eh0) <= t
    if mode == "lstm":
        assert rel_l2(dc0, ec0) <= t
    for g, e in zip(dw, ew):
        assert rel_l2(g, e) <= t


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("B,H,bidirectional", [(15, 70, False), (30, 40, True), (64, 100, False)])
def test_sequences_over_several_micro_panels_of_rows(isa, num_threads, mode, B, H, bidirectional):
    """Batches of several micro-panels of h_{t-1} against several panels of hidden units, so that a step's
    work units (a micro-panel of rows against a panel of units) are shared between the threads: the
    outputs, final states and every gradient match the float64 references, in both dtypes."""
    for dtype in DTYPES:
        check_sequence_and_gradients(SeqCase(mode=mode, T=4, B=B, I=11, H=H, layers=2, bidirectional=bidirectional,
                                             bias=True, batch_first=False, unbatched=False, initial=True,
                                             as_dict=False, dtype=dtype, threads=num_threads, seed=B * 7 + H))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,H,layers,bidirectional", [(16, 100, 2, True), (64, 136, 2, False), (40, 70, 1, True)])
def test_one_step_sequences_with_initial_states(isa, num_threads, mode, B, H, layers, bidirectional):
    """A sequence of one step from given initial states, whose batch fills the strided-A kernel's tiles
    with I + H of 192 or more, runs each layer and direction as a cell: the products of every gate and
    the post-GEMM in blocks of hidden units, a block's post-GEMM and final states on the thread that
    computed its pre-activations (H not a multiple of the blocks, several layers, two directions). The
    outputs, final states and, from what that forward saved, every gradient match the float64 references
    in both dtypes."""
    for dtype in DTYPES:
        check_sequence_and_gradients(SeqCase(mode=mode, T=1, B=B, I=200, H=H, layers=layers,
                                             bidirectional=bidirectional, bias=True, batch_first=False,
                                             unbatched=False, initial=True, as_dict=False, dtype=dtype,
                                             threads=num_threads, seed=B + H + layers))


@pytest.mark.parametrize("nt,panels", [(1, 7), (2, 1), (2, 3), (2, 16), (3, 10), (4, 33)])
def test_step_work_sharing_runs_every_panel_once(nt, panels):
    """The threads sharing an RNN step take panels from their own ranges and then from the others': over
    many steps, with one thread four times slower than the rest, every panel runs exactly once a step,
    and the fast threads do take over some of the slow one's panels."""
    errors, stolen = dnnkit._cpu.rnn_panel_share_test(nt, panels, 300, 3000)
    assert errors == 0
    if nt > 1 and panels >= 2 * nt:
        assert stolen > 0
    if nt == 1:
        assert stolen == 0


# ------------------------------------------------------------------------------------------ wavefront
WAVE_CASES = [
    # (mode, T, B, I, H, layers, initial): chunk boundaries (16 chunks), layers > threads, h0 or not
    ("lstm", 2, 1, 3, 5, 2, True),
    ("lstm", 17, 5, 7, 33, 3, False),
    ("gru", 33, 2, 4, 40, 2, True),
    ("rnn_tanh", 20, 3, 6, 9, 4, True),
    ("rnn_relu", 5, 1, 2, 3, 2, False),
    ("lstm", 4, 16, 400, 48, 2, True),  # 64 rows of depth 400: the first layer's projections by gemm_wt_direct
]


def assert_same_schedules(c, schedule, rule):
    """Runs c's forward (training and inference) and backward with algo "fused_units" and then `schedule`
    (backward: "fused_rows" where that is the schedule, else "fused_units") on c.threads threads, checks that
    `rule` (a _cpu predicate of the kernel's shape and itemsize) says no for the first and yes for the
    second, and that both runs give exactly the same outputs, final states and gradients, and outputs near
    the reference."""
    x, h0, c0, weights = make_seq(c)
    shape = (["lstm", "gru", "rnn_tanh", "rnn_relu"].index(c.mode), c.T, c.B, c.I, c.H, c.layers, c.D, 0)
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(c.threads)
    runs = {}
    try:
        for algo in ("fused_units", schedule):
            code = SCHEDULES[algo]
            assert rule(shape + (code,), np.dtype(c.dtype).itemsize) == (algo == schedule)
            out, state, reserve = run_forward(c, x, h0, c0, weights, train=True, algo=algo)
            inference, _ = run_forward(c, x, h0, c0, weights, algo=algo)
            rng = np.random.default_rng(1)
            gy = rng.standard_normal(out.shape).astype(c.dtype)
            bwd = algo if algo != "fused_wavefront" else "fused_units"
            if c.mode == "lstm":
                gh, gc = (rng.standard_normal(a.shape).astype(c.dtype) for a in state)
                grads = dnnkit.lstm_backward(gy, gh, gc, reserve, algo=bwd)
                state = state[0], state[1]
            else:
                gh = rng.standard_normal(state.shape).astype(c.dtype)
                backward = dnnkit.gru_backward if c.mode == "gru" else dnnkit.rnn_backward
                grads = backward(gy, gh, reserve, algo=bwd)
                state = (state,)
            runs[algo] = (out, inference, state, grads)
    finally:
        dnnkit.set_num_threads(previous)
    (o0, i0, s0, g0), (o1, i1, s1, g1) = runs["fused_units"], runs[schedule]
    assert np.array_equal(o0, o1) and np.array_equal(i0, i1) and np.array_equal(o1, i1)
    for a, b in zip(s0, s1):
        assert np.array_equal(a, b)
    flat = lambda g: [a for v in g for a in (v if isinstance(v, (list, tuple)) else [v]) if a is not None]
    assert len(flat(g0)) == len(flat(g1)) > 0
    for a, b in zip(flat(g0), flat(g1)):
        assert np.array_equal(a, b)
    eo, _, _ = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional)
    assert rel_l2(o1, eo) <= tol(c.dtype, FWD_TOL32)


@pytest.mark.parametrize("case", WAVE_CASES, ids=lambda c: f"{c[0]}-T{c[1]}-L{c[5]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_wavefront_pipeline_matches_layer_by_layer(case, dtype):
    """The pipelined multi-layer forward (one thread per layer, chunks of steps) gives exactly the
    layer-by-layer driver's outputs, states and saved activations, so backward agrees too."""
    mode, T, B, I, H, layers, initial = case
    c = SeqCase(mode=mode, T=T, B=B, I=I, H=H, layers=layers, bidirectional=False, bias=True, initial=initial,
                batch_first=False, unbatched=False, as_dict=False, dtype=dtype, threads=2, seed=T * 31 + H)
    assert_same_schedules(c, "fused_wavefront", dnnkit._cpu.rnn_uses_wavefront)


ROW_SPLIT_CASES = [
    # (mode, T, B, I, H, layers, bidirectional, threads, initial): rows shared evenly and not, layers that
    # would otherwise run as a wavefront, three threads, two threads a direction, H off the panel width
    ("lstm", 5, 16, 7, 40, 1, False, 2, True),
    ("lstm", 3, 17, 5, 33, 2, False, 2, False),
    ("gru", 4, 37, 6, 70, 1, False, 3, True),
    ("rnn_tanh", 6, 24, 3, 20, 3, False, 2, True),
    ("rnn_relu", 2, 16, 4, 9, 1, False, 2, False),
    ("lstm", 3, 9, 4, 30, 1, False, 2, True),  # 4 and 5 rows
    ("lstm", 4, 32, 8, 48, 2, True, 4, True),
    ("gru", 3, 16, 5, 64, 1, True, 4, False),
]


@pytest.mark.parametrize("case", ROW_SPLIT_CASES, ids=lambda c: f"{c[0]}-B{c[2]}-L{c[5]}-nt{c[7]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_time_loop_split_by_rows_matches_split_by_units(case, dtype):
    """Threads that each run their own batch rows through every step (no barrier) give exactly what threads
    sharing each step's hidden units give: outputs, final states, and every gradient of backward."""
    mode, T, B, I, H, layers, bidirectional, threads, initial = case
    c = SeqCase(mode=mode, T=T, B=B, I=I, H=H, layers=layers, bidirectional=bidirectional, bias=True,
                initial=initial, batch_first=False, unbatched=False, as_dict=False, dtype=dtype, threads=threads,
                seed=B * 7 + H)
    assert_same_schedules(c, "fused_rows", dnnkit._cpu.rnn_splits_rows)


def test_time_loop_split_by_rows_rule():
    """Rows are split where W_hh fits a core's L2 and every thread of a direction gets 4 rows or more; a
    stack of small layers runs as a wavefront below 8 rows a thread."""
    previous = dnnkit.get_num_threads()
    l2 = dnnkit._cpu.l2_cache_bytes()
    try:
        dnnkit.set_num_threads(2)
        H = int(np.sqrt(l2 / 16)) // 2  # an LSTM whose float32 W_hh is a quarter of L2
        assert dnnkit._cpu.rnn_splits_rows((0, 50, 8, H, H, 1, 1), 4)
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 7, H, H, 1, 1), 4)  # 3 rows for one thread
        small = (0, 50, 8, 32, 32, 2, 1)  # two layers of W_hh 16 KiB
        assert dnnkit._cpu.rnn_splits_rows(small, 4) and dnnkit._cpu.rnn_uses_wavefront(small, 4)
        small = (0, 50, 16, 32, 32, 2, 1)
        assert dnnkit._cpu.rnn_splits_rows(small, 4) and not dnnkit._cpu.rnn_uses_wavefront(small, 4)
        assert not dnnkit._cpu.rnn_splits_rows((0, 1, 64, H, H, 1, 1), 4)  # one step: no time loop
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, 4 * H, 4 * H, 1, 1), 4)  # W_hh 4x L2
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, H, H, 1, 2), 4)  # a thread a direction already
        dnnkit.set_num_threads(1)
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, H, H, 1, 1), 4)
    finally:
        dnnkit.set_num_threads(previous)


# -------------------------------------------------------------------------------------------- dropout
def test_backward_reference_with_dropout_masks_matches_finite_differences():
    """The references with dropout masks between layers: the backward is the forward's derivative."""
    for mode in MODES:
        c = SeqCase(mode, 3, 2, 2, 2, 3, True, True, False, False, True, False, np.float64, 1, seed=11)
        x, h0, c0, weights = make_seq(c)
        rng = np.random.default_rng(2)
        masks = [(rng.random((3, 2, 4)) >= 0.4) / 0.6 for _ in range(2)]
        out, h_n, c_n = rnn_sequence_ref(mode, x, h0, c0, weights, 3, True, dropout_masks=masks)
        go, gh = rng.standard_normal(out.shape), rng.standard_normal(h_n.shape)
        gx, gh0, _, gw = rnn_sequence_backward_ref(mode, x, h0, c0, weights, go, gh, None, 3, True,
                                                  dropout_masks=masks)

        def loss():
            o, hn, _ = rnn_sequence_ref(mode, x, h0, c0, weights, 3, True, dropout_masks=masks)
            return np.sum(go * o) + np.sum(gh * hn)

        for a, g in [(x, gx), (h0, gh0), (weights[0], gw[0]), (weights[4], gw[4]), (weights[9], gw[9])]:
            assert rel_l2(g, central_differences(loss, a)) <= 1e-6


@given(c=seq_cases(), p=st.sampled_from([0.0, 0.25, 0.5, 1.0]), data=st.data())
@settings(max_examples=40)
def test_sequence_dropout_matches_reference(isa, c, p, data):
    """Training with dropout between layers: the output and every gradient match the float64 references
    run with the masks the forward drew (RnnReserve.dropout_masks), which keep about 1 - p of the
    elements and scale them by 1/(1-p); the same generator seed draws the same masks."""
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make_seq(c)
    ux, uh0, uc0, uw = to_user(c, x, h0, c0, weights)
    seed = data.draw(st.integers(0, 2**32 - 1), label="generator seed")
    kw = dict(num_layers=c.layers, bidirectional=c.bidirectional, batch_first=c.batch_first, train=True, dropout=p,
              generator=seed)
    fwd = {"lstm": lambda: dnnkit.lstm(ux, uh0, uc0, uw, **kw), "gru": lambda: dnnkit.gru(ux, uh0, uw, **kw)}.get(
        c.mode, lambda: dnnkit.rnn(ux, uh0, uw, nonlinearity=c.mode[4:], **kw))
    out, state, reserve = fwd()
    masks = reserve.dropout_masks
    assert len(masks) == (c.layers - 1 if p > 0 else 0)
    for m in masks:
        assert m.shape == (c.T, c.B, c.D * c.H) and m.dtype == c.dtype
        assert set(np.unique(m)) <= ({0.0} if p == 1 else {0.0, np.float64(c.dtype(1 / (1 - p)))})
    again = fwd()[2].dropout_masks
    assert all(np.array_equal(a, b) for a, b in zip(masks, again))
    h_n = state[0] if c.mode == "lstm" else state
    eo, eh, _ = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional, dropout_masks=masks or None)
    out_tm, h_tm = from_user(c, out, h_n)
    t = tol(c.dtype, FWD_TOL32)
    assert rel_l2(out_tm, eo) <= t and rel_l2(h_tm, eh) <= t

    rng = np.random.default_rng(c.seed + 3)
    go = rng.standard_normal((c.T, c.B, c.D * c.H)).astype(c.dtype)
    gh = rng.standard_normal((c.layers * c.D, c.B, c.H)).astype(c.dtype)
    u_go = go[:, 0] if c.unbatched else (go.transpose(1, 0, 2) if c.batch_first else go)
    dx, dh0, dc0, dw = run_backward(c, u_go, gh[:, 0] if c.unbatched else gh, None, reserve)
    ex, eh0, ec0, ew = rnn_sequence_backward_ref(c.mode, x, h0, c0, weights, go, gh, None, c.layers, c.bidirectional,
                                                 dropout_masks=masks or None)
    if c.unbatched:
        dx, dh0 = dx[:, None], dh0[:, None]
        dc0 = None if dc0 is None else dc0[:, None]
    elif c.batch_first:
        dx = dx.transpose(1, 0, 2)
    t = tol(c.dtype, BWD_TOL32)
    assert rel_l2(dx, ex) <= t and rel_l2(dh0, eh0) <= t
    if c.mode == "lstm":
        assert rel_l2(dc0, ec0) <= t
    if c.as_dict:
        dw = [dw[k] for k in param_names(c)]
    assert len(dw) == len(weights)
    for g, e in zip(dw, ew):
        assert rel_l2(g, e) <= t


def test_dropout_keeps_the_expected_fraction_and_is_off_in_inference():
    rng = np.random.default_rng(5)
    T, B, H = 20, 8, 32
    w = [0.2 * rng.standard_normal(s).astype(np.float32) for s in [(4 * H, H), (4 * H, H), (4 * H,), (4 * H,)] * 2]
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    _, _, r = dnnkit.lstm(x, None, None, w, num_layers=2, train=True, dropout=0.3, generator=np.random.default_rng(0))
    (mask,) = r.dropout_masks
    assert abs(np.mean(mask > 0) - 0.7) < 0.03
    assert r.reserve_bytes == (2 * 5 * T * B * H + T * B * H) * 4
    plain = dnnkit.lstm(x, None, None, w, num_layers=2)
    inference = dnnkit.lstm(x, None, None, w, num_layers=2, dropout=0.3)  # dropout only acts in training
    assert np.array_equal(plain[0], inference[0])
    trained = dnnkit.lstm(x, None, None, w, num_layers=2, train=True, dropout=0.0)
    assert np.array_equal(plain[0], trained[0]) and trained[2].dropout_masks == []


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(dropout=-0.1), ValueError, "lstm: dropout must be a probability in [0, 1]"),
    (dict(dropout=1.5), ValueError, "lstm: dropout must be a probability in [0, 1]"),
    (dict(dropout="0.2"), TypeError, "lstm: dropout must be a number"),
    (dict(dropout=True), TypeError, "lstm: dropout must be a number"),
    (dict(dropout=0.2, train=True, generator="seed"), TypeError, "lstm: generator must be None"),
])
def test_bad_dropout_arguments(kw, exc, msg):
    w = [np.zeros(s, np.float32) for s in [(8, 2), (8, 2), (8,), (8,)] * 2]
    with pytest.raises(exc) as e:
        dnnkit.lstm(np.zeros((3, 1, 2), np.float32), None, None, w, num_layers=2, **kw)
    assert msg in str(e.value)


# ------------------------------------------------------------------------------------------ recompute
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bidirectional,dropout", [(1, False, 0.0), (3, False, 0.0), (2, True, 0.0),
                                                          (3, True, 0.4)])
def test_recompute_gives_the_gradients_of_the_saving_forward(mode, layers, bidirectional, dropout):
    """recompute=True saves no gate activations (reserve_bytes counts only dropout masks) and its
    backward, which recomputes them layer by layer, returns what the saving path returns."""
    c = SeqCase(mode, 7, 3, 5, 6, layers, bidirectional, True, False, False, True, False, np.float32, 2, seed=21)
    x, h0, c0, weights = make_seq(c)
    kw = dict(num_layers=layers, bidirectional=bidirectional, train=True, dropout=dropout, generator=3)
    fwd = {"lstm": lambda **k: dnnkit.lstm(x, h0, c0, weights, **kw, **k),
           "gru": lambda **k: dnnkit.gru(x, h0, weights, **kw, **k)}.get(
        mode, lambda **k: dnnkit.rnn(x, h0, weights, nonlinearity=mode[4:], **kw, **k))
    go = np.random.default_rng(4).standard_normal((7, 3, c.D * 6)).astype(np.float32)
    results = []
    for recompute in (False, True):
        out, state, reserve = fwd(recompute=recompute)
        masks = reserve.dropout_masks
        expect_bytes = sum(m.nbytes for m in masks)
        if recompute:
            assert reserve.reserve_bytes == expect_bytes
        else:
            assert reserve.reserve_bytes > expect_bytes or mode.startswith("rnn_")
        results.append((out, run_backward(c, go, None, None, reserve)))
    (o0, g0), (o1, g1) = results
    assert np.array_equal(o0, o1)
    flat = lambda g: [a for v in g for a in (v if isinstance(v, list) else [v]) if a is not None]
    for a, b in zip(flat(g0), flat(g1)):
        assert a.shape == b.shape
        assert rel_l2(b, a) <= 1e-6
