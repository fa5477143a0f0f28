"""The RNN tests' shared cases: random sequences in torch's layouts, and running dnnkit's forward and
backward on them (test_rnn.py, test_rnn_schedules.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

import dnnkit
from helpers import DTYPES, FLOAT64_TOL, rnn_param_names, rnn_user_layout

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
# Relative L2 bounds for float32: the GEMMs' rounding, compounded through steps and layers.
FWD_TOL32 = 2e-5
BWD_TOL32 = 1e-4


def tol(dtype, f32):
    return f32 if np.dtype(dtype) == np.float32 else FLOAT64_TOL


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



def run_backward(c: SeqCase, go, gh, gc, reserve):
    if c.mode == "lstm":
        return dnnkit.lstm_backward(go, gh, gc, reserve)
    if c.mode == "gru":
        dx, dh0, dw = dnnkit.gru_backward(go, gh, reserve)
    else:
        dx, dh0, dw = dnnkit.rnn_backward(go, gh, reserve)
    return dx, dh0, None, dw
