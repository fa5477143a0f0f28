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
from dnnkit.reference import (
    gru_cell_ref, lstm_cell_ref, rel_l2, rnn_cell_ref, rnn_sequence_backward_ref, rnn_sequence_ref,
)
from helpers import DTYPES, central_differences
from rnn_cases import (
    BWD_TOL32, FWD_TOL32, GATES, MODES, SeqCase, from_user, make_seq, param_names, run_backward, run_forward,
    seq_cases, to_user, tol,
)

pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


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
    ("lstm: input has 2 features but weights[0] (weight_ih_l0) of shape (12, 5) takes 5",
     ValueError, lambda: dnnkit.lstm(X, None, None, [np.zeros((12, 5), np.float32)] + _w()[1:])),
    ("lstm: weights[0] (weight_ih_l0) must have shape (12, 2), got (8, 2)",
     ValueError, lambda: dnnkit.lstm(X, None, None, [np.zeros((8, 2), np.float32)] + _w()[1:])),
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
    ("lstm_cell: hx must hold both h and c (or be None for zeros), got hx[1] None", TypeError,
     lambda: dnnkit.lstm_cell(X[0], (S[0], None), *_w())),
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
        "fused", "fused_units", "fused_rows", "fused_wavefront", "fused_cell_direct", "fused_cell_dots",
        "fused_cell_gemm", "fused_amx"]
    assert [a.name for a in dnnkit.algos.algorithms("lstm_bwd", "cpu")] == ["fused", "fused_units", "fused_rows"]
    e = dnnkit.explain("lstm_l2t5mb3slc4sic6_bidir")
    assert e.problem.op == "lstm_fwd" and e[0].chosen and e[0].workspace_bytes > 0
    reasons = {c.algorithm: c.reason for c in e}
    assert "batch rows a thread" in reasons["fused_rows"] or "threads" in reasons["fused_rows"]
    assert "unidirectional stack" in reasons["fused_wavefront"]
    assert "a single step" in reasons["fused_cell_gemm"]
    assert dnnkit.explain("gru_l1t5mb3slc4sic6", direction="bwd").problem.op == "gru_bwd"


def test_explain_takes_the_rnn_calls():
    """explain("lstm", <lstm's arguments>) and the others: the problem the call would run, its candidates,
    the call's own argument errors; the backward from the forward's reserve."""
    rng = np.random.default_rng(3)
    T, B, I, H = 5, 3, 4, 6
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    lstm_w = [rng.standard_normal(s).astype(np.float32)
              for fan in (I, I, 2 * H, 2 * H) for s in [(4 * H, fan), (4 * H, H), (4 * H,), (4 * H,)]]
    e = dnnkit.explain("lstm", x, None, None, lstm_w, num_layers=2, bidirectional=True, batch_first=True,
                       train=True)
    assert e.problem == dnnkit.RnnProblem("lstm", T, B, I, H, layers=2, dirs=2) and e.note is None
    assert sum(c.chosen for c in e) == 1 and "lstm_l2t5mb3slc4sic6_bidir" in str(e)
    # Dropout between layers (or recompute) in training: the call runs one-layer problems, and says so.
    e = dnnkit.explain("lstm", x, None, None, lstm_w, num_layers=2, bidirectional=True, batch_first=True,
                       train=True, dropout=0.5)
    assert e.problem == dnnkit.RnnProblem("lstm", T, B, I, H, dirs=2) and "one-layer problems" in str(e)
    assert "wavefront" not in [c.algorithm for c in e if c.reason is None]
    out, _, stacked = dnnkit.lstm(x, None, None, lstm_w, num_layers=2, bidirectional=True, batch_first=True,
                                  train=True, recompute=True)
    e = dnnkit.explain("lstm_backward", out, None, None, stacked)
    assert e.problem == dnnkit.RnnProblem("lstm", T, B, I, H, dirs=2, direction="bwd") and "in reverse" in e.note
    gru_w = [w[:3 * H] for w in lstm_w[:2]]
    assert dnnkit.explain("gru", x[0], None, gru_w).problem == dnnkit.RnnProblem("gru", T, 1, I, H, bias=False)
    rnn_w = [w[:H] for w in lstm_w[:4]]
    e = dnnkit.explain("rnn", x, None, rnn_w, nonlinearity="relu", algo="fused_units")
    assert e.problem.mode == "rnn_relu" and [c.algorithm for c in e if c.chosen] == ["fused_units"]
    e = dnnkit.explain("lstm_cell", x[:, 0], None, *lstm_w[:4])
    assert e.problem == dnnkit.RnnProblem("lstm", 1, B, I, H) and "fused_cell_gemm" in str(e)
    assert dnnkit.explain("gru_cell", x[0, 0], None, *gru_w).problem == dnnkit.RnnProblem("gru", 1, 1, I, H, bias=False)
    assert dnnkit.explain("rnn_relu_cell", x[:, 0], None, *rnn_w).problem.mode == "rnn_relu"
    assert dnnkit.explain("rnn_tanh_cell", x[:, 0], None, *rnn_w).problem.mode == "rnn_tanh"
    out, _, reserve = dnnkit.lstm(x, None, None, lstm_w[:4], batch_first=True, train=True)
    e = dnnkit.explain("lstm_backward", out, None, None, reserve)
    assert e.problem == dnnkit.RnnProblem("lstm", T, B, I, H, direction="bwd") and e.problem.op == "lstm_bwd"
    h, reserve = dnnkit.gru_cell(x[:, 0], None, *gru_w, train=True)
    assert dnnkit.explain("gru_cell_backward", h, reserve).problem.direction == "bwd"
    with pytest.raises(ValueError, match=r"^rnn_backward: reserve comes from gru_cell"):
        dnnkit.explain("rnn_backward", h, None, reserve)
    with pytest.raises(ValueError, match=r"^gru_cell_backward: grad_h must have shape \(3, 6\)"):
        dnnkit.explain("gru_cell_backward", h[:1], reserve)
    with pytest.raises(ValueError, match=r"^lstm_backward: grad_output must have shape \(3, 5, 6\)"):
        dnnkit.explain("lstm_backward", out[:1], None, None, dnnkit.lstm(x, None, None, lstm_w[:4], batch_first=True,
                                                                          train=True)[2])
    with pytest.raises(ValueError, match=r"^lstm: weights has 3 entries"):
        dnnkit.explain("lstm", x, None, None, lstm_w[:3])
    with pytest.raises(ValueError, match=r"^rnn: nonlinearity must be 'tanh' or 'relu'"):
        dnnkit.explain("rnn", x, None, rnn_w, nonlinearity="sigmoid")
    with pytest.raises(TypeError, match=r"^explain: lstm\(\): got an unexpected keyword argument 'bogus'"):
        dnnkit.explain("lstm", x, None, None, lstm_w[:4], bogus=1)
    with pytest.raises(TypeError, match=r"^explain: gru\(\): missing a required argument: 'weights'"):
        dnnkit.explain("gru", x, None)
    with pytest.raises(TypeError, match=r"^lstm_cell: hx must be a pair"):
        dnnkit.explain("lstm_cell", x[:, 0], 3, *lstm_w[:4])


def test_repeated_sequence_calls_skip_the_checks_only_for_arrays_alike():
    """A sequence call repeated on arrays of the same shapes, dtypes and layout reuses what the first call's
    checks found; anything else (values aside) takes the checks again."""
    rng = np.random.default_rng(11)
    T, B, I, H = 4, 3, 5, 6
    names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]

    def weights():
        return [rng.standard_normal(s).astype(np.float32) * 0.5 for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]

    for _ in range(3):  # new values each time, the same shapes: every result its own
        w, x = weights(), rng.standard_normal((T, B, I)).astype(np.float32)
        h0, c0 = (rng.standard_normal((1, B, H)).astype(np.float32) for _ in range(2))
        want, want_h, want_c = rnn_sequence_ref("lstm", x, h0, c0, w, 1, False)
        for ws in (w, dict(zip(names, w))):
            out, (h_n, c_n) = dnnkit.lstm(x, h0, c0, ws)
            assert rel_l2(want, out) < 1e-5 and rel_l2(want_h, h_n) < 1e-5 and rel_l2(want_c, c_n) < 1e-5
        out, _ = dnnkit.lstm(np.ascontiguousarray(x.transpose(1, 0, 2)), h0, c0, w, batch_first=True)
        assert rel_l2(want, out.transpose(1, 0, 2)) < 1e-5
        out, _ = dnnkit.lstm(np.asfortranarray(x), h0, c0, w)  # another layout: checked, then the same result
        assert rel_l2(want, out) < 1e-5
    w1 = [a[:H] for a in w]  # one gate: the tanh and ReLU RNNs, alike in all but their cell
    for nonlinearity in ("tanh", "relu", "tanh"):
        want, _, _ = rnn_sequence_ref("rnn_" + nonlinearity, x, h0, None, w1, 1, False)
        assert rel_l2(want, dnnkit.rnn(x, h0, w1, nonlinearity=nonlinearity)[0]) < 1e-5
    bad = weights()
    bad[1] = bad[1].astype(np.float64)
    with pytest.raises(TypeError, match=r"^lstm: weights\[1\] \(weight_hh_l0\) has dtype float64"):
        dnnkit.lstm(x, h0, c0, bad)
    with pytest.raises(ValueError, match=r"^lstm: h0 must have shape \(1, 3, 6\)"):
        dnnkit.lstm(x, h0[:, :2], c0, w)
    with pytest.raises(ValueError, match=r"^lstm: weights for num_layers=1"):
        dnnkit.lstm(x, h0, c0, dict(zip(names[:3], w)))


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
