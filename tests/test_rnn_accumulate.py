"""Weight gradients added into the caller's arrays (accumulate_into) by every RNN backward: the arrays come
back holding what they held plus the gradients the call returns without it, every other output is the
same, a cell stepped over time in a Python loop sums to the sequence's gradients, and bad targets are
refused by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.reference import rel_l2
from test_rnn import (
    MODES, SeqCase, cell_cases, cell_forward, make_cell, make_seq, param_names, run_forward, seq_cases,
    to_user,
)

pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


def close(dtype):
    # The GEMM adds its product to C (beta = 1) where the plain call writes it (beta = 0): the sum rounds
    # once in one and twice in the other.
    return dict(rtol=1e-5, atol=1e-5) if np.dtype(dtype) == np.float32 else dict(rtol=1e-12, atol=1e-12)


def seq_backward(c: SeqCase, go, reserve, **kw):
    if c.mode == "lstm":
        return dnnkit.lstm_backward(go, None, None, reserve, **kw)
    if c.mode == "gru":
        dx, dh0, dw = dnnkit.gru_backward(go, None, reserve, **kw)
    else:
        dx, dh0, dw = dnnkit.rnn_backward(go, None, reserve, **kw)
    return dx, dh0, None, dw


def cell_backward(mode, gh, gc, reserve, **kw):
    if mode == "lstm":
        return dnnkit.lstm_cell_backward(gh, gc, reserve, **kw)
    if mode == "gru":
        return dnnkit.gru_cell_backward(gh, reserve, **kw)
    return dnnkit.rnn_cell_backward(gh, reserve, **kw)


@given(c=seq_cases(max_h=12), dropout=st.sampled_from([0.0, 0.5]), recompute=st.booleans())
@settings(max_examples=30)
def test_sequence_backward_adds_into_the_given_arrays(isa, c, dropout, recompute):
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make_seq(c)
    ux, uh0, uc0, uw = to_user(c, x, h0, c0, weights)
    kw = {}
    if dropout or recompute:  # the stack of one-layer reserves: each layer's slice of the targets
        kw = dict(dropout=dropout if c.layers > 1 else 0.0, generator=5, recompute=recompute)
    fwd = {"lstm": lambda: dnnkit.lstm(ux, uh0, uc0, uw, num_layers=c.layers, bidirectional=c.bidirectional,
                                       batch_first=c.batch_first, train=True, **kw),
           "gru": lambda: dnnkit.gru(ux, uh0, uw, num_layers=c.layers, bidirectional=c.bidirectional,
                                     batch_first=c.batch_first, train=True, **kw)}.get(
        c.mode, lambda: dnnkit.rnn(ux, uh0, uw, num_layers=c.layers, bidirectional=c.bidirectional,
                                   batch_first=c.batch_first, nonlinearity=c.mode[4:], train=True, **kw))
    out, _, reserve = fwd()
    go = np.random.default_rng(c.seed + 1).standard_normal(out.shape).astype(c.dtype)
    plain = seq_backward(c, go, reserve)
    rng = np.random.default_rng(c.seed + 2)
    names = param_names(c)
    start = [rng.standard_normal(w.shape).astype(c.dtype) for w in weights]
    into = dict(zip(names, [a.copy() for a in start])) if c.as_dict else [a.copy() for a in start]
    got = seq_backward(c, go, reserve, accumulate_into=into)
    for a, b in zip(plain[:3], got[:3]):
        if a is not None:
            np.testing.assert_array_equal(a, b)
    if c.as_dict:
        assert list(got[3]) == names and all(got[3][k] is into[k] for k in names)
        got_w, plain_w = [got[3][k] for k in names], [plain[3][k] for k in names]
    else:
        assert len(got[3]) == len(into) and all(g is t for g, t in zip(got[3], into))
        got_w, plain_w = got[3], plain[3]
    for g, p, s in zip(got_w, plain_w, start):
        np.testing.assert_allclose(g, s + p, **close(c.dtype))


@given(c=cell_cases())
@settings(max_examples=30)
def test_cell_backward_adds_into_the_given_arrays(isa, c):
    x, h, cc, w_ih, w_hh, b_ih, b_hh = make_cell(c)
    _, reserve = cell_forward(c, x, h, cc, w_ih, w_hh, b_ih, b_hh, train=True)
    rng = np.random.default_rng(c.seed + 1)
    sq = (lambda a: a[0]) if c.unbatched else (lambda a: a)
    gh = sq(rng.standard_normal((c.B, c.H)).astype(c.dtype))
    gc = sq(rng.standard_normal((c.B, c.H)).astype(c.dtype))
    plain = cell_backward(c.mode, gh, gc, reserve)
    start = [None if w is None else rng.standard_normal(w.shape).astype(c.dtype) for w in (w_ih, w_hh, b_ih, b_hh)]
    into = tuple(None if s is None else s.copy() for s in start)
    got = cell_backward(c.mode, gh, gc, reserve, accumulate_into=into)
    n = len(got) - 4
    for a, b in zip(plain[:n], got[:n]):
        np.testing.assert_array_equal(a, b)
    for g, p, s, t in zip(got[n:], plain[n:], start, into):
        if s is None:
            assert g is None and p is None
            continue
        assert g is t
        np.testing.assert_allclose(g, s + p, **close(c.dtype))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cells_stepped_in_a_loop_sum_to_the_sequence_gradients(mode, dtype):
    """Backward through time by hand: a cell stepped over T steps forward, then backward in reverse with
    the weight gradients accumulated into one set of arrays, gives the sequence's gradients."""
    T, B, I, H = 6, 5, 7, 33
    c = SeqCase(mode, T, B, I, H, 1, False, True, False, False, True, False, dtype, 2, seed=11)
    x, h0, c0, weights = make_seq(c)
    out, _, reserve = run_forward(c, x, h0, c0, weights, train=True)
    go = np.random.default_rng(3).standard_normal(out.shape).astype(dtype)
    dx_seq, dh0_seq, _, dw_seq = seq_backward(c, go, reserve)

    fn = {"lstm": dnnkit.lstm_cell, "gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell,
          "rnn_relu": dnnkit.rnn_relu_cell}[mode]
    h, cs = h0[0], (c0[0] if mode == "lstm" else None)
    reserves = []
    for t in range(T):
        res = fn(x[t], (h, cs) if mode == "lstm" else h, *weights, train=True)
        state, r = res
        reserves.append(r)
        h, cs = state if mode == "lstm" else (state, None)
    into = [np.zeros_like(w) for w in weights]
    dh = np.zeros((B, H), dtype)
    dc = np.zeros((B, H), dtype) if mode == "lstm" else None
    dx = np.empty_like(x)
    for t in reversed(range(T)):
        g = cell_backward(mode, go[t] + dh, dc, reserves[t], accumulate_into=into)
        dx[t], dh = g[0], g[1]
        if mode == "lstm":
            dc = g[2]
    t32 = 1e-4 if dtype == np.float32 else 1e-10
    assert rel_l2(dx, dx_seq) <= t32
    assert rel_l2(dh, dh0_seq[0]) <= t32
    for a, b in zip(into, dw_seq):
        assert rel_l2(a, b) <= t32


def _cell_reserve(bias=True, dtype=np.float32):
    r = np.random.default_rng(0)
    w = [r.standard_normal(s).astype(dtype) for s in ((12, 3), (12, 3), (12,), (12,))]
    if not bias:
        w[2] = w[3] = None
    x, h = r.standard_normal((2, 3)).astype(dtype), r.standard_normal((2, 3)).astype(dtype)
    _, res = dnnkit.lstm_cell(x, (h, h), *w, train=True)
    return w, np.ones((2, 3), dtype), res


def _targets(w):
    return [None if a is None else np.zeros_like(a) for a in w]


@pytest.mark.parametrize("make,exc,msg", [
    (lambda w: _targets(w)[:3], ValueError, "accumulate_into must hold 4 entries"),
    (lambda w: "abc", TypeError, "accumulate_into must be a list or tuple"),
    (lambda w: {"grad_w_ih": 0}, TypeError, "accumulate_into must be a list or tuple of arrays .* got dict"),
    (lambda w: [np.zeros((12, 4), np.float32)] + _targets(w)[1:], ValueError, r"accumulate_into\[0\] must have shape"),
    (lambda w: _targets(w)[:1] + [np.zeros((12, 3))] + _targets(w)[2:], TypeError,
     r"accumulate_into\[1\] has dtype float64"),
    (lambda w: _targets(w)[:2] + [[0.0] * 12] + _targets(w)[3:], TypeError, r"accumulate_into\[2\] must be a NumPy"),
    (lambda w: _targets(w)[:1] + [np.zeros((3, 12), np.float32).T] + _targets(w)[2:], ValueError,
     r"accumulate_into\[1\] must be C-contiguous and writable"),
    (lambda w: _targets(w)[:3] + [None], ValueError, r"accumulate_into\[3\] must be None exactly where"),
])
def test_bad_accumulate_targets_are_refused_by_name(make, exc, msg):
    w, g, res = _cell_reserve()
    with pytest.raises(exc, match="lstm_cell_backward: " + msg):
        dnnkit.lstm_cell_backward(g, None, res, accumulate_into=make(w))


def test_bad_accumulate_targets_without_biases_and_read_only():
    w, g, res = _cell_reserve(bias=False)
    with pytest.raises(ValueError, match=r"accumulate_into\[2\] must be None exactly where"):
        dnnkit.lstm_cell_backward(g, None, res, accumulate_into=_targets(w)[:2] + [np.zeros(12, np.float32), None])
    t = _targets(w)
    t[0].flags.writeable = False
    with pytest.raises(ValueError, match=r"accumulate_into\[0\] must be C-contiguous and writable"):
        dnnkit.lstm_cell_backward(g, None, res, accumulate_into=t)
    # Nothing was written by the refused calls, and a good call adds.
    t[0].flags.writeable = True
    assert not any(a.any() for a in t if a is not None)
    got = dnnkit.lstm_cell_backward(g, None, res, accumulate_into=t)
    np.testing.assert_allclose(t[0], dnnkit.lstm_cell_backward(g, None, res)[3], rtol=1e-6)
    assert got[3] is t[0] and got[5] is None


def test_sequence_targets_by_name():
    r = np.random.default_rng(0)
    H, I = 4, 3
    w = {"weight_ih_l0": r.standard_normal((4 * H, I)).astype(np.float32),
         "weight_hh_l0": r.standard_normal((4 * H, H)).astype(np.float32)}
    x = r.standard_normal((2, 1, I)).astype(np.float32)
    out, _, res = dnnkit.lstm(x, None, None, w, train=True)
    g = np.ones_like(out)
    with pytest.raises(ValueError, match=r"lstm_backward: accumulate_into must have exactly the keys"):
        dnnkit.lstm_backward(g, None, None, res, accumulate_into={"weight_ih_l0": np.zeros((4 * H, I), np.float32)})
    with pytest.raises(ValueError, match=r"lstm_backward: accumulate_into\['weight_hh_l0'\] must have shape"):
        dnnkit.lstm_backward(g, None, None, res, accumulate_into={"weight_ih_l0": np.zeros((4 * H, I), np.float32),
                                                                  "weight_hh_l0": np.zeros((H, H), np.float32)})
    wl = list(w.values())
    _, _, res = dnnkit.lstm(x, None, None, wl, train=True)
    with pytest.raises(TypeError, match="lstm_backward: accumulate_into must be a list or tuple .* got dict"):
        dnnkit.lstm_backward(g, None, None, res, accumulate_into=dict(w))
    with pytest.raises(ValueError, match="lstm_backward: accumulate_into must hold 2 entries"):
        dnnkit.lstm_backward(g, None, None, res, accumulate_into=[np.zeros((4 * H, I), np.float32)])


def test_targets_sharing_memory_with_what_the_backward_reads_are_refused():
    """A target that is (or overlaps) a forward weight, the saved input, a gradient input or another target
    would be read after it is written: refused by name, and nothing is written."""
    w, g, res = _cell_reserve()
    t = _targets(w)
    with pytest.raises(ValueError, match=r"lstm_cell_backward: accumulate_into\[1\] shares memory with the "
                                         r"forward's weight 1"):
        dnnkit.lstm_cell_backward(g, None, res, accumulate_into=[t[0], w[1], t[2], t[3]])
    both = np.zeros((2, 12), np.float32)  # two bias targets, one array
    with pytest.raises(ValueError, match=r"accumulate_into\[3\] shares memory with accumulate_into\[2\]"):
        dnnkit.lstm_cell_backward(g, None, res, accumulate_into=[t[0], t[1], both[0], both[0]])
    big = np.zeros((12, 3), np.float32)
    with pytest.raises(ValueError, match=r"accumulate_into\[0\] shares memory with grad_h"):
        dnnkit.lstm_cell_backward(big[:2], None, res, accumulate_into=[big, t[1], t[2], t[3]])
    assert not any(a.any() for a in t) and not big.any()
    r = np.random.default_rng(1)
    wl = [r.standard_normal(s).astype(np.float32) for s in ((16, 3), (16, 4))]
    x = r.standard_normal((2, 1, 3)).astype(np.float32)
    out, _, res = dnnkit.lstm(x, None, None, wl, train=True)
    with pytest.raises(ValueError, match=r"lstm_backward: accumulate_into\[0\] shares memory with the forward's "
                                         r"weight 0"):
        dnnkit.lstm_backward(np.ones_like(out), None, None, res, accumulate_into=wl)


@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_projection_weights_are_added_into_too(layers, bidirectional):
    """LSTM with proj_size: weight_hr's gradient (its own GEMM) is added like the others."""
    r = np.random.default_rng(2)
    T, B, I, H, P = 4, 3, 5, 8, 3
    D = 2 if bidirectional else 1
    w = []
    for layer in range(layers):
        for _ in range(D):
            il = I if layer == 0 else D * P
            w += [0.3 * r.standard_normal((4 * H, il)), 0.3 * r.standard_normal((4 * H, P)), r.standard_normal(4 * H),
                  r.standard_normal(4 * H), 0.3 * r.standard_normal((P, H))]
    w = [a.astype(np.float32) for a in w]
    x = r.standard_normal((T, B, I)).astype(np.float32)
    out, _, res = dnnkit.lstm(x, None, None, w, num_layers=layers, bidirectional=bidirectional, proj_size=P,
                              train=True)
    g = r.standard_normal(out.shape).astype(np.float32)
    plain = dnnkit.lstm_backward(g, None, None, res)[3]
    start = [r.standard_normal(a.shape).astype(np.float32) for a in plain]
    into = [a.copy() for a in start]
    got = dnnkit.lstm_backward(g, None, None, res, accumulate_into=into)[3]
    for a, t, s, p in zip(got, into, start, plain):
        assert a is t
        np.testing.assert_allclose(a, s + p, **close(np.float32))
