"""RNN sequences on the GPU (the inference forward): LSTM, GRU and tanh/ReLU RNN, one and two layers, one
and two directions, batch_first and unbatched, with and without biases and initial states, against the
float64 reference of torch.nn.LSTM/GRU/RNN's semantics; and the errors for what runs on the CPU only."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
from hypothesis import assume, given, settings, strategies as st  # noqa: E402

import dnnkit  # noqa: E402
from dnnkit import reference as ref  # noqa: E402
from gpu_helpers import close, dev, host, rand  # noqa: E402

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _weights(rng, mode, I, H, L, D, bias, dtype, P=0):
    """torch's weight list: per layer and direction W_ih, W_hh, then b_ih, b_hh with biases, then W_hr with
    a projection (P > 0: an LSTM's h is P wide)."""
    G, S, ws = GATES[mode], P or H, []
    for layer in range(L):
        for _ in range(D):
            fan = I if layer == 0 else D * S
            ws += [rand(rng, (G * H, fan), dtype) * 0.5, rand(rng, (G * H, S), dtype) * 0.5]
            if bias:
                ws += [rand(rng, (G * H,), dtype), rand(rng, (G * H,), dtype)]
            if P:
                ws += [rand(rng, (P, H), dtype) * 0.5]
    return ws


def _case_arrays(case, dtype):
    """(rng, x, weights, h0, c0) of a case (mode, T, B, I, H, L, D, bias, states, batch_first), time-major;
    the rng goes on for the case's other arrays."""
    mode, T, B, I, H, L, D, bias, states, _ = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x = rand(rng, (T, B, I), dtype)
    ws = _weights(rng, mode, I, H, L, D, bias, dtype)
    h0 = rand(rng, (L * D, B, H), dtype) if states else None
    c0 = rand(rng, (L * D, B, H), dtype) if states and mode == "lstm" else None
    return rng, x, ws, h0, c0


def _call(mode, x, h0, c0, ws, **kw):
    if mode == "lstm":
        out, (h_n, c_n) = dnnkit.lstm(x, h0, c0, ws, **kw)
        return out, h_n, c_n
    if mode == "gru":
        out, h_n = dnnkit.gru(x, h0, ws, **kw)
    else:
        out, h_n = dnnkit.rnn(x, h0, ws, nonlinearity=mode[4:], **kw)
    return out, h_n, None


CASES = [  # mode, T, B, I, H, L, D, bias, states, batch_first
    ("lstm", 5, 3, 4, 6, 1, 1, True, True, False),
    ("lstm", 2, 2, 3, 5, 2, 2, True, False, True),
    ("lstm", 2, 9, 2, 33, 1, 1, False, True, False),     # a second block of batch rows and of units
    ("gru", 5, 3, 4, 6, 2, 1, True, True, False),
    ("gru", 4, 2, 3, 5, 1, 2, False, False, True),
    ("rnn_tanh", 6, 2, 3, 4, 2, 2, True, True, False),
    ("rnn_relu", 5, 3, 2, 4, 1, 1, True, False, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-L{c[5]}D{c[6]}{'-bf' if c[9] else ''}" for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sequences_match_the_reference(case, dtype):
    mode, T, B, I, H, L, D, bias, states, batch_first = case
    rng, x, ws, h0, c0 = _case_arrays(case, dtype)
    want_out, want_h, want_c = ref.rnn_sequence_ref(mode, x, h0, c0, ws, num_layers=L, bidirectional=D == 2)
    xin = np.ascontiguousarray(x.transpose(1, 0, 2)) if batch_first else x
    out, h_n, c_n = _call(mode, dev(xin), None if h0 is None else dev(h0), None if c0 is None else dev(c0),
                          [dev(w) for w in ws], num_layers=L, bidirectional=D == 2, batch_first=batch_first)
    got = host(out)
    if batch_first:
        got = got.transpose(1, 0, 2)
    assert close(got, want_out, dtype) and close(host(h_n), want_h, dtype)
    if mode == "lstm":
        assert close(host(c_n), want_c, dtype)


def test_unbatched_input():
    rng = np.random.default_rng(9)
    x = rand(rng, (4, 3))
    ws = _weights(rng, "gru", 3, 5, 1, 1, True, np.float32)
    out, h_n = dnnkit.gru(dev(x), None, [dev(w) for w in ws])
    want_out, want_h, _ = ref.rnn_sequence_ref("gru", x[:, None, :], None, None, ws)
    assert tuple(out.shape) == (4, 5) and tuple(h_n.shape) == (1, 5)
    assert close(host(out), want_out[:, 0], np.float32) and close(host(h_n), want_h[:, 0], np.float32)


def test_explain_lists_the_gpu_sequence_algorithms():
    e = dnnkit.explain(dnnkit.problem.RnnProblem("lstm", 10, 4, 8, 16, device="cuda"))
    assert [c.algorithm for c in e] == ["gpu_steps", "gpu_persistent", "gpu_wavefront"] and e[0].chosen
    assert e[1].reason is None and "gpu_steps is the rule" in e[1].rule
    assert "one layer" in e[2].reason
    e = dnnkit.explain(dnnkit.problem.RnnProblem("lstm", 10, 4, 8, 16, layers=2, dirs=2, proj=8, device="cuda"))
    assert "projection" in e[1].reason and "bidirectional" in e[2].reason


def test_explain_takes_gpu_rnn_calls():
    """explain("lstm", <GPU arrays>) and the cells': the GPU problem and algorithms, the call's errors."""
    rng = np.random.default_rng(4)
    x = rand(rng, (5, 3, 4))
    ws = _weights(rng, "lstm", 4, 6, 2, 1, True, np.float32)
    e = dnnkit.explain("lstm", dev(x), None, None, [dev(w) for w in ws], num_layers=2)
    assert e.problem == dnnkit.RnnProblem("lstm", 5, 3, 4, 6, layers=2, device="cuda") and e[0].chosen
    assert [c.algorithm for c in e] == ["gpu_steps", "gpu_persistent", "gpu_wavefront"]
    e = dnnkit.explain("lstm_cell", dev(x[0]), None, *[dev(w) for w in ws[:4]])
    assert e.problem == dnnkit.RnnProblem("lstm", 1, 3, 4, 6, device="cuda")
    with pytest.raises(TypeError, match=r"^lstm: arrays on different devices \(input on the GPU"):
        dnnkit.explain("lstm", dev(x), None, None, ws, num_layers=2)


def test_explain_checks_a_gpu_backward_s_gradients():
    """explain of a backward from a GPU reserve checks the gradients as the backward does: device, dtype,
    shape."""
    rng = np.random.default_rng(5)
    x = rand(rng, (5, 3, 4))
    ws = [dev(w) for w in _weights(rng, "lstm", 4, 6, 1, 1, True, np.float32)]
    out, _, reserve = dnnkit.lstm(dev(x), None, None, ws, train=True)
    gy = dev(rand(rng, (5, 3, 6)))
    assert dnnkit.explain("lstm_backward", gy, None, None, reserve).problem.direction == "bwd"
    with pytest.raises(ValueError, match=r"^lstm_backward: grad_output must have shape \(5, 3, 6\)"):
        dnnkit.explain("lstm_backward", dev(rand(rng, (5, 3, 5))), None, None, reserve)
    with pytest.raises(TypeError, match=r"^lstm_backward: grad_output is on the host"):
        dnnkit.explain("lstm_backward", rand(rng, (5, 3, 6)), None, None, reserve)
    h, reserve = dnnkit.lstm_cell(dev(x[0]), None, *ws, train=True)
    assert dnnkit.explain("lstm_cell_backward", dev(rand(rng, (3, 6))), None, reserve).problem.direction == "bwd"
    with pytest.raises(ValueError, match=r"^lstm_cell_backward: grad_c must have shape \(3, 6\)"):
        dnnkit.explain("lstm_cell_backward", None, dev(rand(rng, (2, 6))), reserve)
    with pytest.raises(TypeError, match=r"^lstm_cell_backward: grad_h has dtype float64"):
        dnnkit.explain("lstm_cell_backward", dev(rand(rng, (3, 6), np.float64)), None, reserve)


@pytest.mark.parametrize("mode, L, P, dropout, batch_first, train", [("gru", 2, 0, 0.3, True, True),
                                                                     ("lstm", 2, 2, 0.0, False, False)])
def test_wavefront(mode, L, P, dropout, batch_first, train):
    """algo="gpu_wavefront" (the layers on streams of their own, a chunk of steps at a time, dropout applied
    a chunk at a time): the outputs, and the training's gradients, of gpu_steps, bit for bit."""
    rng = np.random.default_rng(41)
    T, B, I, H, G = 4, 2, 3, 4, GATES[mode]
    S = P or H
    ws = []
    for layer in range(L):
        ws += [rand(rng, (G * H, I if layer == 0 else S), np.float64), rand(rng, (G * H, S), np.float64),
               rand(rng, (G * H,), np.float64), rand(rng, (G * H,), np.float64)]
        ws += [rand(rng, (P, H), np.float64)] if P else []
    x = rand(rng, (B, T, I) if batch_first else (T, B, I), np.float64)
    h0 = rand(rng, (L, B, S), np.float64)
    gy = rand(rng, (B, T, S) if batch_first else (T, B, S), np.float64)
    results = []
    for algo in ("gpu_steps", "gpu_wavefront"):
        kw = dict(num_layers=L, batch_first=batch_first, train=train, dropout=dropout, generator=3, algo=algo)
        if mode == "lstm":
            r = dnnkit.lstm(dev(x), dev(h0), None, [dev(w) for w in ws], proj_size=P, **kw)
            got = [r[0], *r[1]]
        else:
            r = dnnkit.gru(dev(x), dev(h0), [dev(w) for w in ws], **kw)
            got = [r[0], r[1]]
        if train:
            g = dnnkit.gru_backward(dev(gy), None, r[2])
            got += [g[0], g[1], *g[2]]
        results.append([host(a) for a in got])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_sequences_over_drawn_shapes(data):
    """Drawn modes and shapes (gate rows past one tile's 32, a second block of batch rows), layers,
    directions, biases, initial states, layouts and LSTM projections, on a drawn GPU algorithm that runs
    them: the training forward and the backward through time against the float64 reference."""
    mode = data.draw(st.sampled_from(sorted(GATES)))
    T, B, I = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 10)), data.draw(st.integers(1, 8))
    H, L, D = data.draw(st.sampled_from([1, 2, 5, 9])), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    P = data.draw(st.integers(0, H - 1)) if mode == "lstm" else 0
    bias, states, batch_first = data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans())
    algo = data.draw(st.sampled_from(["gpu_steps", "gpu_persistent", "gpu_wavefront"]))
    S, dtype = P or H, np.float64
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x, ws = rand(rng, (T, B, I), dtype), _weights(rng, mode, I, H, L, D, bias, dtype, P)
    h0 = rand(rng, (L * D, B, S), dtype) if states else None
    c0 = rand(rng, (L * D, B, H), dtype) if states and mode == "lstm" else None
    gy, gh = rand(rng, (T, B, D * S), dtype), rand(rng, (L * D, B, S), dtype)
    bf = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))) if batch_first else (lambda a: a)
    d = (lambda a: None if a is None else dev(a))
    kw = dict(num_layers=L, bidirectional=D == 2, batch_first=batch_first, train=True, algo=algo)
    try:
        if mode == "lstm":
            out, (h_n, c_n), reserve = dnnkit.lstm(dev(bf(x)), d(h0), d(c0), [dev(w) for w in ws], proj_size=P, **kw)
        elif mode == "gru":
            (out, h_n, reserve), c_n = dnnkit.gru(dev(bf(x)), d(h0), [dev(w) for w in ws], **kw), None
        else:
            (out, h_n, reserve), c_n = dnnkit.rnn(dev(bf(x)), d(h0), [dev(w) for w in ws], nonlinearity=mode[4:],
                                                  **kw), None
    except ValueError as e:
        assume(f"algo '{algo}' cannot run" not in str(e))
        raise
    want = ref.rnn_sequence_ref(mode, x, h0, c0, ws, num_layers=L, bidirectional=D == 2)
    assert close(bf(host(out)), want[0], dtype) and close(host(h_n), want[1], dtype)
    if mode == "lstm":
        assert close(host(c_n), want[2], dtype)
    back = {"lstm": lambda: dnnkit.lstm_backward(dev(bf(gy)), dev(gh), None, reserve),
            "gru": lambda: dnnkit.gru_backward(dev(bf(gy)), dev(gh), reserve)}.get(
        mode, lambda: dnnkit.rnn_backward(dev(bf(gy)), dev(gh), reserve))()
    bwant = ref.rnn_sequence_backward_ref(mode, x, h0, c0, ws, gy, gh, None, num_layers=L, bidirectional=D == 2)
    assert close(bf(host(back[0])), bwant[0], dtype)
    if states:
        assert close(host(back[1]), bwant[1], dtype)
        if mode == "lstm":
            assert close(host(back[2]), bwant[2], dtype)
    assert len(back[-1]) == len(ws)
    for g, w in zip(back[-1], bwant[3]):
        assert close(host(g), w, dtype)


PERSISTENT_CASES = [  # as CASES
    ("lstm", 2, 2, 3, 5, 1, 2, True, False, True),
    ("gru", 3, 3, 4, 11, 1, 1, False, True, False),  # no biases: a zero bias of 3H = 33 > STEP_X values
    ("rnn_relu", 2, 3, 2, 4, 2, 1, True, False, False),
]


@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=[c[0] for c in PERSISTENT_CASES])
def test_persistent_sequences(case):
    """algo="gpu_persistent": the time loop in one launch a layer-direction; inference, then training
    (whose saves the backward of gpu_steps reads) with every gradient checked."""
    mode, T, B, I, H, L, D, bias, states, batch_first = case
    dtype = np.float64
    rng, x, ws, h0, c0 = _case_arrays(case, dtype)
    want_out, want_h, want_c = ref.rnn_sequence_ref(mode, x, h0, c0, ws, num_layers=L, bidirectional=D == 2)
    bf = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))) if batch_first else (lambda a: a)
    d = (lambda a: None if a is None else dev(a))
    kw = dict(num_layers=L, bidirectional=D == 2, batch_first=batch_first, algo="gpu_persistent")
    out, h_n, c_n = _call(mode, dev(bf(x)), d(h0), d(c0), [dev(w) for w in ws], **kw)
    assert close(bf(host(out)), want_out, dtype) and close(host(h_n), want_h, dtype)
    if mode == "lstm":
        assert close(host(c_n), want_c, dtype)
    gy, gh = rand(rng, (T, B, D * H), dtype), rand(rng, (L * D, B, H), dtype)
    want = ref.rnn_sequence_backward_ref(mode, x, h0, c0, ws, gy, gh, None, num_layers=L, bidirectional=D == 2)
    dws = [dev(w) for w in ws]
    if mode == "lstm":
        out, _, reserve = dnnkit.lstm(dev(bf(x)), d(h0), d(c0), dws, train=True, **kw)
        gx, gh0, _, gw = dnnkit.lstm_backward(dev(bf(gy)), dev(gh), None, reserve)
    elif mode == "gru":
        out, _, reserve = dnnkit.gru(dev(bf(x)), d(h0), dws, train=True, **kw)
        gx, gh0, gw = dnnkit.gru_backward(dev(bf(gy)), dev(gh), reserve)
    else:
        out, _, reserve = dnnkit.rnn(dev(bf(x)), d(h0), dws, nonlinearity=mode[4:], train=True, **kw)
        gx, gh0, gw = dnnkit.rnn_backward(dev(bf(gy)), dev(gh), reserve)
    assert close(bf(host(out)), want_out, dtype)
    assert close(bf(host(gx)), want[0], dtype) and close(host(gh0), want[1], dtype)
    for g, w in zip(gw, want[3]):
        assert close(host(g), w, dtype)


def test_errors_name_the_argument():
    rng = np.random.default_rng(1)
    x = dev(rand(rng, (3, 2, 4)))
    ws = [dev(w) for w in _weights(rng, "lstm", 4, 5, 1, 1, True, np.float32)]
    host_ws = _weights(rng, "lstm", 4, 5, 1, 1, True, np.float32)
    with pytest.raises(TypeError, match=r"lstm: arrays on different devices"):
        dnnkit.lstm(x, None, None, [ws[0], host_ws[1], ws[2], ws[3]])
    with pytest.raises(ValueError, match=r"lstm: weights\[1\] \(weight_hh_l0\) must be 2-D of shape"):
        dnnkit.lstm(x, None, None, [ws[0], dev(np.ones((20, 4), np.float32)), ws[2], ws[3]])
    with pytest.raises(TypeError, match="lstm: stream is for GPU arrays"):
        dnnkit.lstm(np.ones((3, 2, 4), np.float32), None, None, host_ws, stream=0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, H, B, T", [("lstm", 512, 64, 50), ("gru", 1024, 1, 25), ("lstm", 2048, 16, 25)])
def test_sequences_real_sizes(mode, H, B, T):
    rng = np.random.default_rng(0)
    x = rand(rng, (T, B, H))
    ws = _weights(rng, mode, H, H, 2, 1, True, np.float32)
    ws = [w / np.sqrt(H) for w in ws]
    out, h_n, _ = _call(mode, dev(x), None, None, [dev(w) for w in ws], num_layers=2)
    want_out, want_h, _ = ref.rnn_sequence_ref(mode, x, None, None, ws, num_layers=2)
    assert ref.rel_l2(host(out), want_out) <= 1e-5


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_cells(mode):
    """The cells: one step from a given state (batched) and from zeros (unbatched), without biases too."""
    rng = np.random.default_rng(5)
    B, I, H = 3, 4, 6
    G = GATES[mode]
    x, h, c = rand(rng, (B, I)), rand(rng, (B, H)), rand(rng, (B, H))
    w_ih, w_hh, b_ih, b_hh = rand(rng, (G * H, I)), rand(rng, (G * H, H)), rand(rng, (G * H,)), rand(rng, (G * H,))
    ref_fn = {"lstm": ref.lstm_cell_ref, "gru": ref.gru_cell_ref, "rnn_tanh": ref.rnn_cell_ref,
              "rnn_relu": lambda *a: ref.rnn_cell_ref(*a, nonlinearity="relu")}[mode]
    dw = [dev(w) for w in (w_ih, w_hh, b_ih, b_hh)]
    if mode == "lstm":
        h1, c1 = dnnkit.lstm_cell(dev(x), (dev(h), dev(c)), *dw)
        wh, wc = ref_fn(x, h, c, w_ih, w_hh, b_ih, b_hh)
        assert close(host(h1), wh, np.float32) and close(host(c1), wc, np.float32)
        h0, c0 = dnnkit.lstm_cell(dev(x[0]), None, dw[0], dw[1])
        wh, wc = ref_fn(x[:1], np.zeros((1, H)), np.zeros((1, H)), w_ih, w_hh)
        assert tuple(h0.shape) == (H,) and close(host(h0), wh[0], np.float32) and close(host(c0), wc[0], np.float32)
        return
    fn = {"gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell, "rnn_relu": dnnkit.rnn_relu_cell}[mode]
    assert close(host(fn(dev(x), dev(h), *dw)), ref_fn(x, h, w_ih, w_hh, b_ih, b_hh), np.float32)
    got = fn(dev(x[0]), None, dw[0], dw[1])
    assert tuple(got.shape) == (H,) and close(host(got), ref_fn(x[:1], np.zeros((1, H)), w_ih, w_hh)[0], np.float32)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("bias, unbatched", [(True, False), (False, True)])
def test_cells_training(mode, bias, unbatched):
    """train=True on a cell keeps what its backward reads; the cells' backward gives the one-step
    sequence's gradients of the float64 reference; accumulate_into adds the weights' into given arrays."""
    rng = np.random.default_rng(17)
    B, I, H, G, dtype = 3, 4, 5, GATES[mode], np.float64
    x, h, c = rand(rng, (B, I), dtype), rand(rng, (B, H), dtype), rand(rng, (B, H), dtype)
    ws = [rand(rng, (G * H, I), dtype), rand(rng, (G * H, H), dtype)]
    ws += [rand(rng, (G * H,), dtype), rand(rng, (G * H,), dtype)] if bias else [None, None]
    gh, gc = rand(rng, (B, H), dtype), rand(rng, (B, H), dtype)
    want = ref.rnn_sequence_backward_ref(mode, x[None], h[None], c[None] if mode == "lstm" else None,
                                         [w for w in ws if w is not None], gh[None], None,
                                         gc[None] if mode == "lstm" else None)
    if unbatched:
        x, h, c, gh, gc = x[:1], h[:1], c[:1], gh[:1], gc[:1]
        want = ref.rnn_sequence_backward_ref(mode, x[None], h[None], c[None] if mode == "lstm" else None,
                                             [w for w in ws if w is not None], gh[None], None,
                                             gc[None] if mode == "lstm" else None)
        x, h, c, gh, gc = x[0], h[0], c[0], gh[0], gc[0]
    dws = [None if w is None else dev(w) for w in ws]
    start = [None if w is None else rand(rng, w.shape, dtype) for w in ws]
    into = [None if a is None else dev(a) for a in start]
    if mode == "lstm":
        _, reserve = dnnkit.lstm_cell(dev(x), (dev(h), dev(c)), *dws, train=True)
        gx, gh0, gc0, *gw = dnnkit.lstm_cell_backward(dev(gh), dev(gc), reserve)
        assert close(host(gc0).reshape(-1), want[2].reshape(-1), dtype)
        acc = dnnkit.lstm_cell_backward(dev(gh), dev(gc), reserve, accumulate_into=into)[3:]
    else:
        cell = {"gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell, "rnn_relu": dnnkit.rnn_relu_cell}[mode]
        back = dnnkit.gru_cell_backward if mode == "gru" else dnnkit.rnn_cell_backward
        _, reserve = cell(dev(x), dev(h), *dws, train=True)
        gx, gh0, *gw = back(dev(gh), reserve)
        acc = back(dev(gh), reserve, accumulate_into=into)[2:]
    assert tuple(gx.shape) == x.shape and tuple(gh0.shape) == h.shape
    assert close(host(gx).reshape(-1), want[0].reshape(-1), dtype)
    assert close(host(gh0).reshape(-1), want[1].reshape(-1), dtype)
    present = [i for i, w in enumerate(ws) if w is not None]
    assert [g is None for g in gw] == [w is None for w in ws]
    for i, w in zip(present, want[3]):
        assert close(host(gw[i]), w, dtype)
        assert acc[i] is into[i] and close(host(acc[i]), start[i] + w, dtype)
    with pytest.raises(ValueError, match="the reserve is from a"):
        (dnnkit.lstm_backward(dev(gh[None]), None, None, reserve) if mode == "lstm"
         else dnnkit.gru_backward(dev(gh[None]), None, reserve))


BWD_CASES = [  # mode, T, B, I, H, L, D, bias, states, batch_first
    ("lstm", 3, 3, 5, 6, 2, 2, True, True, False),
    ("lstm", 3, 2, 4, 5, 1, 1, False, False, True),
    ("gru", 4, 3, 5, 6, 2, 1, True, True, False),
    ("gru", 3, 2, 4, 5, 1, 2, True, False, True),
    ("rnn_tanh", 4, 3, 5, 6, 1, 2, True, True, False),
    ("rnn_relu", 4, 3, 5, 6, 2, 1, True, True, False),
]


@pytest.mark.parametrize("case", BWD_CASES, ids=[f"{c[0]}-L{c[5]}D{c[6]}{'-bf' if c[9] else ''}" for c in BWD_CASES])
def test_training_forward_and_backward(case):
    """train=True keeps what the backward reads; the backward through time gives every gradient of the
    float64 reference (grad_output, grad_h_n and grad_c_n all flowing in)."""
    mode, T, B, I, H, L, D, bias, states, batch_first = case
    dtype = np.float64
    rng, x, ws, h0, c0 = _case_arrays(case, dtype)
    gy, gh = rand(rng, (T, B, D * H), dtype), rand(rng, (L * D, B, H), dtype)
    gc = rand(rng, (L * D, B, H), dtype) if mode == "lstm" else None
    want = ref.rnn_sequence_backward_ref(mode, x, h0, c0, ws, gy, gh, gc, num_layers=L, bidirectional=D == 2)
    bf = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))) if batch_first else (lambda a: a)
    kw = dict(num_layers=L, bidirectional=D == 2, batch_first=batch_first, train=True)
    dws = [dev(w) for w in ws]
    d = (lambda a: None if a is None else dev(a))
    if mode == "lstm":
        out, (h_n, c_n), reserve = dnnkit.lstm(dev(bf(x)), d(h0), d(c0), dws, **kw)
        gx, gh0, gc0, gw = dnnkit.lstm_backward(dev(bf(gy)), dev(gh), dev(gc), reserve)
        assert close(host(gc0), want[2], dtype)
    elif mode == "gru":
        out, h_n, reserve = dnnkit.gru(dev(bf(x)), d(h0), dws, **kw)
        gx, gh0, gw = dnnkit.gru_backward(dev(bf(gy)), dev(gh), reserve)
    else:
        out, h_n, reserve = dnnkit.rnn(dev(bf(x)), d(h0), dws, nonlinearity=mode[4:], **kw)
        gx, gh0, gw = dnnkit.rnn_backward(dev(bf(gy)), dev(gh), reserve)
    got_x = host(gx)
    assert close(got_x.transpose(1, 0, 2) if batch_first else got_x, want[0], dtype)
    assert close(host(gh0), want[1], dtype)
    assert len(gw) == len(ws)
    for g, w in zip(gw, want[3]):
        assert close(host(g), w, dtype)
    assert "GpuRnnReserve" in repr(reserve)


@pytest.mark.parametrize("mode, L, D, P, dropout, batch_first", [("lstm", 1, 2, 0, 0.0, False),
                                                             ("gru", 2, 1, 0, 0.3, True)])
def test_recompute(mode, L, D, P, dropout, batch_first):
    """recompute=True keeps no gate activations (a smaller reserve); the backward recomputes them a layer
    at a time with the forward's algorithm, and every gradient is the same, bit for bit."""
    rng = np.random.default_rng(31)
    T, B, I, H, G = 2, 2, 3, 4, GATES[mode]
    S = P or H
    ws = []
    for layer in range(L):
        for _ in range(D):
            fan = I if layer == 0 else D * S
            ws += [rand(rng, (G * H, fan), np.float64), rand(rng, (G * H, S), np.float64),
                   rand(rng, (G * H,), np.float64), rand(rng, (G * H,), np.float64)]
            ws += [rand(rng, (P, H), np.float64)] if P else []
    x = rand(rng, (B, T, I) if batch_first else (T, B, I), np.float64)
    gy = rand(rng, (B, T, D * S) if batch_first else (T, B, D * S), np.float64)
    kw = dict(num_layers=L, bidirectional=D == 2, batch_first=batch_first, train=True, dropout=dropout, generator=5)
    results, sizes = [], []
    for recompute in (False, True):
        if mode == "lstm":
            out, _, r = dnnkit.lstm(dev(x), None, None, [dev(w) for w in ws], recompute=recompute, proj_size=P, **kw)
            g = dnnkit.lstm_backward(dev(gy), None, None, r)
            grads = [g[0], g[1], *g[3]]
        else:
            out, _, r = dnnkit.gru(dev(x), None, [dev(w) for w in ws], recompute=recompute, **kw)
            g = dnnkit.gru_backward(dev(gy), None, r)
            grads = [g[0], g[1], *g[2]]
        results.append([host(a) for a in [out, *grads]])
        sizes.append(r.nbytes)
    assert sizes[1] < sizes[0]
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_training_without_incoming_state_gradients_and_unbatched():
    rng = np.random.default_rng(8)
    x = rand(rng, (4, 3), np.float64)
    ws = _weights(rng, "lstm", 3, 5, 1, 1, True, np.float64)
    out, _, reserve = dnnkit.lstm(dev(x), None, None, [dev(w) for w in ws], train=True)
    gy = rand(rng, (4, 5), np.float64)
    gx, gh0, gc0, gw = dnnkit.lstm_backward(dev(gy), None, None, reserve)
    want = ref.rnn_sequence_backward_ref("lstm", x[:, None, :], None, None, ws, gy[:, None, :])
    assert tuple(gx.shape) == (4, 3) and close(host(gx), want[0][:, 0], np.float64)
    assert close(host(gh0), want[1][:, 0], np.float64) and close(host(gw[1]), want[3][1], np.float64)


def test_backward_accumulates_into_the_given_gradients():
    rng = np.random.default_rng(12)
    x = rand(rng, (3, 2, 4), np.float64)
    ws = _weights(rng, "gru", 4, 5, 1, 1, True, np.float64)
    _, _, reserve = dnnkit.gru(dev(x), None, [dev(w) for w in ws], train=True)
    gy = rand(rng, (3, 2, 5), np.float64)
    start = [rand(rng, w.shape, np.float64) for w in ws]
    into = [dev(a) for a in start]
    _, _, gw = dnnkit.gru_backward(dev(gy), None, reserve, accumulate_into=into)
    want = ref.rnn_sequence_backward_ref("gru", x, None, None, ws, gy)[3]
    assert all(g is t for g, t in zip(gw, into))
    for g, s0, w in zip(gw, start, want):
        assert close(host(g), s0 + w, np.float64)
    with pytest.raises(ValueError, match="gru_backward: accumulate_into must hold 4 entries"):
        dnnkit.gru_backward(dev(gy), None, reserve, accumulate_into=into[:2])


@pytest.mark.parametrize("batch_first", [False, True])
def test_dropout_between_layers(batch_first):
    """Dropout's masks are the CPU's for the same seed; forward and backward go through them."""
    rng = np.random.default_rng(13)
    T, B, I, H, L = 3, 2, 4, 5, 2
    x = rand(rng, (T, B, I), np.float64)
    ws = _weights(rng, "lstm", I, H, L, 1, True, np.float64)
    xin = np.ascontiguousarray(x.transpose(1, 0, 2)) if batch_first else x
    kw = dict(num_layers=L, train=True, dropout=0.4, generator=7, batch_first=batch_first)
    out, _, reserve = dnnkit.lstm(dev(xin), None, None, [dev(w) for w in ws], **kw)
    _, _, host_reserve = dnnkit.lstm(xin, None, None, ws, **kw)
    masks = reserve.dropout_masks
    assert len(masks) == L - 1
    for a, b in zip(masks, host_reserve.dropout_masks):
        assert np.array_equal(a, b)
    want_out = ref.rnn_sequence_ref("lstm", x, None, None, ws, num_layers=L, dropout_masks=masks)[0]
    got = host(out)
    assert close(got.transpose(1, 0, 2) if batch_first else got, want_out, np.float64)
    gy = rand(rng, (T, B, H), np.float64)
    gyin = np.ascontiguousarray(gy.transpose(1, 0, 2)) if batch_first else gy
    gx, _, _, gw = dnnkit.lstm_backward(dev(gyin), None, None, reserve)
    want = ref.rnn_sequence_backward_ref("lstm", x, None, None, ws, gy, num_layers=L, dropout_masks=masks)
    gxh = host(gx)
    assert close(gxh.transpose(1, 0, 2) if batch_first else gxh, want[0], np.float64)
    for g, w in zip(gw, want[3]):
        assert close(host(g), w, np.float64)


@pytest.mark.parametrize("L, D, batch_first", [(1, 2, False), (2, 1, True)])
def test_lstm_projections(L, D, batch_first):
    """proj_size P: h = W_hr (o tanh(c)) is P wide; forward, training forward and backward."""
    rng = np.random.default_rng(21)
    T, B, I, H, P = 2, 2, 4, 6, 3
    x = rand(rng, (T, B, I), np.float64)
    ws = []
    for layer in range(L):
        for _ in range(D):
            fan = I if layer == 0 else D * P
            ws += [rand(rng, (4 * H, fan), np.float64) * 0.5, rand(rng, (4 * H, P), np.float64) * 0.5,
                   rand(rng, (4 * H,), np.float64), rand(rng, (4 * H,), np.float64),
                   rand(rng, (P, H), np.float64) * 0.5]
    h0, c0 = rand(rng, (L * D, B, P), np.float64), rand(rng, (L * D, B, H), np.float64)
    want = ref.rnn_sequence_ref("lstm", x, h0, c0, ws, num_layers=L, bidirectional=D == 2)
    bf = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))) if batch_first else (lambda a: a)
    kw = dict(num_layers=L, bidirectional=D == 2, batch_first=batch_first, proj_size=P)
    out, (h_n, c_n) = dnnkit.lstm(dev(bf(x)), dev(h0), dev(c0), [dev(w) for w in ws], **kw)
    got = host(out)
    assert close(got.transpose(1, 0, 2) if batch_first else got, want[0], np.float64)
    assert close(host(h_n), want[1], np.float64) and close(host(c_n), want[2], np.float64)
    out, _, reserve = dnnkit.lstm(dev(bf(x)), dev(h0), dev(c0), [dev(w) for w in ws], train=True, **kw)
    gy, gh, gc = rand(rng, (T, B, D * P), np.float64), rand(rng, (L * D, B, P), np.float64), \
        rand(rng, (L * D, B, H), np.float64)
    gx, gh0, gc0, gw = dnnkit.lstm_backward(dev(bf(gy)), dev(gh), dev(gc), reserve)
    bwant = ref.rnn_sequence_backward_ref("lstm", x, h0, c0, ws, gy, gh, gc, num_layers=L, bidirectional=D == 2)
    gxh = host(gx)
    assert close(gxh.transpose(1, 0, 2) if batch_first else gxh, bwant[0], np.float64)
    assert close(host(gh0), bwant[1], np.float64) and close(host(gc0), bwant[2], np.float64)
    assert len(gw) == len(ws)
    for g, w in zip(gw, bwant[3]):
        assert close(host(g), w, np.float64)


def test_cells_take_a_gpu_algorithm_by_name():
    rng = np.random.default_rng(23)
    x, h = rand(rng, (2, 3), np.float64), rand(rng, (2, 4), np.float64)
    w_ih, w_hh = rand(rng, (12, 3), np.float64), rand(rng, (12, 4), np.float64)
    got = dnnkit.gru_cell(dev(x), dev(h), dev(w_ih), dev(w_hh), algo="gpu_persistent")
    assert close(host(got), ref.gru_cell_ref(x, h, w_ih, w_hh), np.float64)
    with pytest.raises(ValueError, match=r"gru_cell: algo must be 'auto' or one of \['gpu_steps'"):
        dnnkit.gru_cell(dev(x), dev(h), dev(w_ih), dev(w_hh), algo="fused_cell_direct")
