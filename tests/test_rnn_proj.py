"""LSTMs with projections (torch.nn.LSTM's proj_size): h_t = W_hr (o * tanh(c_t)), P wide, while the cell
state stays H wide. Forward and backward through time against the float64 references under every ISA and
1 or 2 threads (layers, bidirectional, biases, batch_first, unbatched, initial states, dict weights,
batch 0, one step, P from 1 to H - 1 and sizes around the micro-kernel's NR); the reference's backward
against finite differences; dropout and recompute; PyTorch, when installed; descriptors and bad input.
Every output starts as NaN, so an element never written fails."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.problem import RnnProblem
from dnnkit.reference import rel_l2, rnn_sequence_backward_ref, rnn_sequence_ref
from helpers import FLOAT64_TOL, central_differences, rnn_param_names, rnn_user_layout

FWD_TOL32 = 2e-5
BWD_TOL32 = 1e-4


pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


@dataclass
class ProjCase:
    T: int
    B: int
    I: int
    H: int
    P: int
    layers: int
    bidirectional: bool
    bias: bool
    batch_first: bool
    unbatched: bool
    initial: bool
    as_dict: bool
    dtype: type
    threads: int
    seed: int

    @property
    def D(self):
        return 2 if self.bidirectional else 1


@st.composite
def proj_cases(draw, max_h=40):
    H = draw(st.one_of(st.integers(2, max_h), st.sampled_from([33, 70])))
    P = draw(st.one_of(st.integers(1, H - 1), st.sampled_from([min(32, H - 1), H - 1])))
    unbatched = draw(st.booleans()) and draw(st.booleans())
    return ProjCase(
        T=draw(st.integers(1, 4)), B=1 if unbatched else draw(st.integers(0, 3)), I=draw(st.integers(1, 9)),
        H=H, P=P, layers=draw(st.integers(1, 3)), bidirectional=draw(st.booleans()), bias=draw(st.booleans()),
        batch_first=draw(st.booleans()), unbatched=unbatched, initial=draw(st.booleans()),
        as_dict=draw(st.booleans()), dtype=draw(st.sampled_from([np.float32, np.float64])),
        threads=draw(st.sampled_from([1, 2])), seed=draw(st.integers(0, 2**32 - 1)),
    )


def param_names(c: ProjCase):
    return rnn_param_names(c.layers, c.D, c.bias, proj=True)


def make(c: ProjCase):
    """x (T, B, I), h0 (L*D, B, P), c0 (L*D, B, H) or None, and the flat weight list in torch's order."""
    rng = np.random.default_rng(c.seed)
    H, P, D = c.H, c.P, c.D
    weights = []
    for layer in range(c.layers):
        for _ in range(D):
            in_k = c.I if layer == 0 else D * P
            weights += [rng.standard_normal((4 * H, in_k)) / np.sqrt(in_k), rng.standard_normal((4 * H, P)) / np.sqrt(P)]
            if c.bias:
                weights += [0.5 * rng.standard_normal(4 * H), 0.5 * rng.standard_normal(4 * H)]
            weights.append(rng.standard_normal((P, H)) / np.sqrt(H))
    weights = [w.astype(c.dtype) for w in weights]
    x = rng.standard_normal((c.T, c.B, c.I)).astype(c.dtype)
    h0 = rng.standard_normal((c.layers * D, c.B, P)).astype(c.dtype) if c.initial else None
    c0 = rng.standard_normal((c.layers * D, c.B, H)).astype(c.dtype) if c.initial else None
    return x, h0, c0, weights


def to_user(c: ProjCase, x, h0, c0, weights):
    return rnn_user_layout(c, x, h0, c0, weights, param_names(c))


def to_time_major(c: ProjCase, a, state=False):
    if c.unbatched:
        return a[:, None]
    return a.transpose(1, 0, 2) if c.batch_first and not state else a


def from_time_major(c: ProjCase, a, state=False):
    if c.unbatched:
        return np.ascontiguousarray(a[:, 0])
    return a.transpose(1, 0, 2) if c.batch_first and not state else a


def tol(c, f32):
    return f32 if np.dtype(c.dtype) == np.float32 else FLOAT64_TOL


def forward(c, x, h0, c0, w, **kw):
    return dnnkit.lstm(x, h0, c0, w, num_layers=c.layers, bidirectional=c.bidirectional, batch_first=c.batch_first,
                       proj_size=c.P, **kw)


@given(c=proj_cases())
def test_forward_matches_reference(isa, c):
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make(c)
    out, (h_n, c_n) = forward(c, *to_user(c, x, h0, c0, weights))
    ref_out, ref_h, ref_c = rnn_sequence_ref("lstm", x, h0, c0, weights, c.layers, c.bidirectional)
    assert out.shape == ((c.T, c.D * c.P) if c.unbatched else
                         (c.B, c.T, c.D * c.P) if c.batch_first else (c.T, c.B, c.D * c.P))
    lead = (c.layers * c.D,) if c.unbatched else (c.layers * c.D, c.B)
    assert h_n.shape == lead + (c.P,) and c_n.shape == lead + (c.H,)
    assert out.dtype == h_n.dtype == c_n.dtype == np.dtype(c.dtype)
    bound = tol(c, FWD_TOL32)
    assert rel_l2(to_time_major(c, out), ref_out) <= bound
    assert rel_l2(to_time_major(c, h_n, state=True), ref_h) <= bound
    assert rel_l2(to_time_major(c, c_n, state=True), ref_c) <= bound


@given(c=proj_cases(max_h=24), data=st.data())
@settings(max_examples=30)
def test_backward_matches_reference(isa, c, data):
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make(c)
    out, (h_n, c_n), reserve = forward(c, *to_user(c, x, h0, c0, weights), train=True)
    rng = np.random.default_rng(c.seed ^ 0x5A5A)
    go = rng.standard_normal((c.T, c.B, c.D * c.P)).astype(c.dtype)
    gh = rng.standard_normal((c.layers * c.D, c.B, c.P)).astype(c.dtype) if data.draw(st.booleans()) else None
    gc = rng.standard_normal((c.layers * c.D, c.B, c.H)).astype(c.dtype) if data.draw(st.booleans()) else None
    gx, gh0, gc0, gw = dnnkit.lstm_backward(from_time_major(c, go), None if gh is None else from_time_major(c, gh, True),
                                            None if gc is None else from_time_major(c, gc, True), reserve)
    rx, rh0, rc0, rw = rnn_sequence_backward_ref("lstm", x, h0, c0, weights, go, gh, gc, c.layers, c.bidirectional)
    bound = tol(c, BWD_TOL32)
    assert rel_l2(to_time_major(c, gx), rx) <= bound
    assert rel_l2(to_time_major(c, gh0, True), rh0) <= bound
    assert rel_l2(to_time_major(c, gc0, True), rc0) <= bound
    got = [gw[k] for k in param_names(c)] if c.as_dict else gw
    assert len(got) == len(rw)
    for g, r in zip(got, rw):
        assert g.shape == r.shape
        assert rel_l2(g, r) <= bound


@pytest.mark.parametrize("layers,bidirectional,bias", [(1, False, True), (2, True, True), (2, False, False)])
def test_backward_reference_matches_finite_differences(layers, bidirectional, bias):
    """rnn_sequence_backward_ref with a projection is the derivative of rnn_sequence_ref: central
    differences of sum(go * output) + sum(gh * h_n) + sum(gc * c_n) for every input, state and weight."""
    c = ProjCase(3, 2, 2, 3, 2, layers, bidirectional, bias, False, False, True, False, np.float64, 1, seed=11)
    x, h0, c0, weights = make(c)
    rng = np.random.default_rng(2)
    out, h_n, c_n = rnn_sequence_ref("lstm", x, h0, c0, weights, layers, bidirectional)
    go, gh, gc = rng.standard_normal(out.shape), rng.standard_normal(h_n.shape), rng.standard_normal(c_n.shape)
    gx, gh0, gc0, gw = rnn_sequence_backward_ref("lstm", x, h0, c0, weights, go, gh, gc, layers, bidirectional)
    args, grads = [x, h0, c0] + weights, [gx, gh0, gc0] + gw

    def loss():
        o, h, cc = rnn_sequence_ref("lstm", args[0], args[1], args[2], args[3:], layers, bidirectional)
        return np.sum(go * o) + np.sum(gh * h) + np.sum(gc * cc)

    for a, g in zip(args, grads):
        assert g.shape == a.shape
        assert rel_l2(g, central_differences(loss, a)) <= 1e-6


@pytest.mark.parametrize("layers,bidirectional,dropout", [(2, False, 0.0), (2, True, 0.3), (3, False, 0.5)])
def test_dropout_and_recompute(layers, bidirectional, dropout):
    """With dropout (the layers as a stack of one-layer calls) the result is the reference's with the same
    masks; recompute=True gives the saving forward's gradients."""
    c = ProjCase(6, 3, 5, 40, 9, layers, bidirectional, True, False, False, True, False, np.float32, 2, seed=5)
    x, h0, c0, weights = make(c)
    go = np.random.default_rng(9).standard_normal((c.T, c.B, c.D * c.P)).astype(np.float32)
    results = []
    for recompute in (False, True):
        out, _, reserve = forward(c, x, h0, c0, weights, train=True, dropout=dropout, generator=4,
                                  recompute=recompute)
        masks = reserve.dropout_masks or None
        ref_out, _, _ = rnn_sequence_ref("lstm", x, h0, c0, weights, layers, bidirectional, masks)
        assert rel_l2(out, ref_out) <= FWD_TOL32
        results.append(dnnkit.lstm_backward(go, None, None, reserve))
    rx, _, _, rw = rnn_sequence_backward_ref("lstm", x, h0, c0, weights, go, None, None, layers, bidirectional, masks)
    (gx0, gh0, gc0, gw0), (gx1, gh1, gc1, gw1) = results
    assert rel_l2(gx0, rx) <= BWD_TOL32
    for a, r in zip(gw0, rw):
        assert rel_l2(a, r) <= BWD_TOL32
    for a, b in zip([gx0, gh0, gc0] + gw0, [gx1, gh1, gc1] + gw1):
        assert rel_l2(b, a) <= 1e-6


@pytest.mark.parametrize("layers,bidirectional,bias", [(1, False, True), (2, True, True), (3, False, False)])
def test_matches_torch(layers, bidirectional, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    T, B, I, H, P = 5, 4, 7, 48, 20
    m = torch.nn.LSTM(I, H, num_layers=layers, bidirectional=bidirectional, bias=bias, proj_size=P).double()
    D = 2 if bidirectional else 1
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * D, B, P, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    out, (h_n, c_n) = m(x, (h0, c0))
    go, gh, gc = torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n)
    ((out * go).sum() + (h_n * gh).sum() + (c_n * gc).sum()).backward()
    weights = {name: p.detach().numpy() for name, p in m.named_parameters()}
    o, (h, c), reserve = dnnkit.lstm(x.detach().numpy(), h0.detach().numpy(), c0.detach().numpy(), weights,
                                     num_layers=layers, bidirectional=bidirectional, proj_size=P, train=True)
    for a, b in ((o, out), (h, h_n), (c, c_n)):
        assert rel_l2(a, b.detach().numpy()) <= 1e-12
    gx, gh0, gc0, gw = dnnkit.lstm_backward(go.numpy(), gh.numpy(), gc.numpy(), reserve)
    for a, b in ((gx, x), (gh0, h0), (gc0, c0)):
        assert rel_l2(a, b.grad.numpy()) <= 1e-12
    assert set(gw) == set(weights)
    for name, p in m.named_parameters():
        assert rel_l2(gw[name], p.grad.numpy()) <= 1e-12


@pytest.mark.parametrize("layers,bidirectional,threads", [(1, False, 2), (2, False, 2), (1, True, 4)])
def test_time_loop_split_by_rows(layers, bidirectional, threads):
    """Split by batch rows (each thread projects its own rows of m_t, no barrier), the forward and backward
    give exactly what the split by hidden units gives."""
    c = ProjCase(T=4, B=17 if threads == 2 else 16, I=6, H=40, P=24, layers=layers, bidirectional=bidirectional,
                 bias=True, batch_first=False, unbatched=False, initial=True, as_dict=False, dtype=np.float32,
                 threads=threads, seed=5)
    x, h0, c0, w = make(c)
    shape = (0, c.T, c.B, c.I, c.H, layers, c.D, c.P)
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(threads)
    try:
        runs = []
        for algo, code in (("fused_units", 1), ("fused_rows", 2)):
            assert dnnkit._cpu.rnn_splits_rows(shape + (code,), 4) == (algo == "fused_rows")
            out, (h_n, c_n), reserve = forward(c, x, h0, c0, w, train=True, algo=algo)
            go = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
            gx, gh0, gc0, gw = dnnkit.lstm_backward(go, h_n, c_n, reserve, algo=algo)
            runs.append([out, h_n, c_n, gx, gh0, gc0, *gw])
    finally:
        dnnkit.set_num_threads(previous)
    for a, b in zip(*runs):
        assert np.array_equal(a, b)
    eo, _, _ = rnn_sequence_ref("lstm", x, h0, c0, w, layers, bidirectional)
    assert rel_l2(runs[1][0], eo) <= FWD_TOL32


def test_reserve_and_descriptor():
    c = ProjCase(4, 2, 3, 10, 4, 2, True, True, False, False, False, False, np.float32, 1, seed=1)
    x, h0, c0, weights = make(c)
    _, _, reserve = forward(c, x, h0, c0, weights, train=True)
    # gates (4H), c_t and m_t (H each) per step, batch row, layer and direction
    assert reserve.reserve_bytes == 4 * c.T * c.B * c.H * 6 * c.layers * c.D
    assert "P=4" in repr(reserve)
    p = RnnProblem("lstm", 50, 16, 512, 1024, layers=2, proj=256)
    assert p.descriptor() == "lstm_l2t50mb16slc512sic1024dic256_f32"
    assert RnnProblem.parse(p.descriptor()) == p
    # layer 0: 4H x (I + P) and P x H; layer 1: 4H x (P + P) and P x H; two flops a multiply-add
    assert p.flops == 2 * 50 * 16 * (4 * 1024 * (512 + 256) + 4 * 1024 * (256 + 256) + 2 * 256 * 1024)
    rows = [(c.algorithm, c.supported) for c in dnnkit.explain(p.descriptor())]
    assert rows[:2] == [("fused", True), ("fused_units", True)] and ("fused_wavefront", False) in rows
    with pytest.raises(ValueError, match="proj"):
        RnnProblem("gru", 5, 2, 3, 10, proj=4)
    with pytest.raises(ValueError, match="proj"):
        RnnProblem("lstm", 5, 2, 3, 10, proj=10)


def _bad(**over):
    c = ProjCase(3, 2, 3, 8, 4, 2, False, True, False, False, True, False, np.float32, 1, seed=3)
    x, h0, c0, weights = make(c)
    args = dict(x=x, h0=h0, c0=c0, weights=weights, num_layers=2, proj_size=4)
    args.update(over)
    return lambda: dnnkit.lstm(args.pop("x"), args.pop("h0"), args.pop("c0"), args.pop("weights"), **args)


def _weights_with(index, shape):
    c = ProjCase(3, 2, 3, 8, 4, 2, False, True, False, False, True, False, np.float32, 1, seed=3)
    w = make(c)[3]
    w[index] = np.zeros(shape, np.float32)
    return w


@pytest.mark.parametrize("over,exc,message", [
    (dict(proj_size=-1), ValueError, "lstm: proj_size must be >= 0"),
    (dict(proj_size=2.0), TypeError, "lstm: proj_size must be an int"),
    (dict(proj_size=0), ValueError, "lstm: weights has 10 entries"),
    (dict(proj_size=8), ValueError, r"lstm: weights\[4\] \(weight_hr_l0\) must be 2-D of shape \(proj_size, hidden_size\)"),
    (dict(weights=_weights_with(4, (4, 4))), ValueError, "with hidden_size > proj_size"),
    (dict(weights=_weights_with(1, (32, 8))), ValueError, r"weights\[1\] \(weight_hh_l0\) must have shape \(32, 4\)"),
    (dict(weights=_weights_with(9, (4, 7))), ValueError, r"weights\[9\] \(weight_hr_l1\) must have shape \(4, 8\)"),
    (dict(weights=_weights_with(5, (32, 8))), ValueError, r"weight_ih_l1\) must have shape \(32, 4\)"),
    (dict(h0=np.zeros((2, 2, 8), np.float32)), ValueError, r"lstm: h0 must have shape \(2, 2, 4\)"),
    (dict(c0=np.zeros((2, 2, 4), np.float32)), ValueError, r"lstm: c0 must have shape \(2, 2, 8\)"),
])
def test_bad_input(over, exc, message):
    with pytest.raises(exc, match=message):
        _bad(**over)()


def test_bad_input_dict_and_backward():
    c = ProjCase(3, 2, 3, 8, 4, 1, False, True, False, False, True, True, np.float32, 1, seed=3)
    x, h0, c0, weights = make(c)
    w = dict(zip(param_names(c), weights))
    del w["weight_hr_l0"]
    with pytest.raises(ValueError, match=r"lstm: weights for .*proj_size > 0.* missing \['weight_hr_l0'\]"):
        dnnkit.lstm(x, h0, c0, w, proj_size=4)
    _, _, reserve = dnnkit.lstm(x, h0, c0, weights, proj_size=4, train=True)
    with pytest.raises(ValueError, match=r"lstm_backward: grad_h_n must have shape \(1, 2, 4\)"):
        dnnkit.lstm_backward(None, np.zeros((1, 2, 8), np.float32), None, reserve)
    with pytest.raises(ValueError, match=r"lstm_backward: grad_output must have shape \(3, 2, 4\)"):
        dnnkit.lstm_backward(np.zeros((3, 2, 8), np.float32), None, None, reserve)
    with pytest.raises(TypeError, match="unexpected keyword argument 'proj_size'"):
        dnnkit.gru(x, None, weights[:2], proj_size=2)
