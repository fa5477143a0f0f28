"""The element-wise half of an RNN step's backward on the GPU: from the gradient reaching h_t (the output's,
dy, plus the next step's, dh_next) and what the forward saved, the gradients of the step's gate
pre-activations (dG, one row of B x G*H a step, which whole-sequence GEMMs turn into dW, db and dx after
the time loop) and the part of dh_{t-1} (dc_{t-1}) that does not go through W_hh. One thread a (batch row,
hidden unit); launch as kernels/rnn.py's steps.
  LSTM: dh = dy + dh_next; do = dh tanh(c) o(1-o); dc = dc_next + dh o (1 - tanh(c)^2);
        di = dc g i(1-i); df = dc c_prev f(1-f); dg = dc i (1-g^2); dc_prev = dc f
  GRU:  dn = dh (1-z); dz = dh (h_prev - n) z(1-z); dn_pre = dn (1-n^2); dr = dn_pre hn r(1-r);
        dGx = (dr, dz, dn_pre), dGh = (dr, dz, dn_pre r); dh_prev = dh z + dGh W_hh
  RNN:  dpre = dh (1 - h^2) (tanh) or dh [h > 0] (relu)
"""
from __future__ import annotations

import functools

from ._jit import DTYPES, int32, kernel, math
from .rnn import STEP_X, STEP_Y, unit


@functools.lru_cache(maxsize=None)
def lstm_step_backward(dtype: str):
    """kernel(dy, dh_next, dc, save, c_prev, dg, B, H): save (B, 5H) the step's i, f, g, o, c; c_prev (B, H);
    dc (B, H) holds dc_next and receives dc_prev; dg (B, 4H) receives the gates' gradients."""
    one = DTYPES[dtype](1.0)

    def lstm_bwd(dy, dh_next, dc, save, c_prev, dg, B, H):
        b, j = unit()
        h32 = int32(H)
        if b < int32(B) and j < h32:
            dh = dy[b, j] + dh_next[b, j]
            i = save[b, j]
            f = save[b, j + h32]
            g = save[b, j + 2 * h32]
            o = save[b, j + 3 * h32]
            tc = math.tanh(save[b, j + 4 * h32])
            dcell = dc[b, j] + dh * o * (one - tc * tc)
            dg[b, j] = dcell * g * i * (one - i)
            dg[b, j + h32] = dcell * c_prev[b, j] * f * (one - f)
            dg[b, j + 2 * h32] = dcell * i * (one - g * g)
            dg[b, j + 3 * h32] = dh * tc * o * (one - o)
            dc[b, j] = dcell * f

    lstm_bwd.__name__ = lstm_bwd.__qualname__ = f"lstm_step_backward_{dtype}"
    return kernel(lstm_bwd, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def gru_step_backward(dtype: str):
    """kernel(dy, dh_next, save, h_prev, dgx, dgh, dh_out, B, H): save (B, 4H) the step's r, z, n, hn;
    dgx, dgh (B, 3H) receive the gradients of the input's and the recurrent part's pre-activations;
    dh_out (B, H) receives dh z (the GEMM then adds dgh W_hh); it may be dh_next."""
    one = DTYPES[dtype](1.0)

    def gru_bwd(dy, dh_next, save, h_prev, dgx, dgh, dh_out, B, H):
        b, j = unit()
        h32 = int32(H)
        if b < int32(B) and j < h32:
            dh = dy[b, j] + dh_next[b, j]
            r = save[b, j]
            z = save[b, j + h32]
            n = save[b, j + 2 * h32]
            hn = save[b, j + 3 * h32]
            dn_pre = dh * (one - z) * (one - n * n)
            dz_pre = dh * (h_prev[b, j] - n) * z * (one - z)
            dr_pre = dn_pre * hn * r * (one - r)
            dgx[b, j] = dr_pre
            dgx[b, j + h32] = dz_pre
            dgx[b, j + 2 * h32] = dn_pre
            dgh[b, j] = dr_pre
            dgh[b, j + h32] = dz_pre
            dgh[b, j + 2 * h32] = dn_pre * r
            dh_out[b, j] = dh * z

    gru_bwd.__name__ = gru_bwd.__qualname__ = f"gru_step_backward_{dtype}"
    return kernel(gru_bwd, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def rnn_step_backward(dtype: str, relu: bool):
    """kernel(dy, dh_next, h, dg, B, H): h (B, H) the step's output; dg (B, H) receives the pre-activation's
    gradient."""
    zero, one = DTYPES[dtype](0.0), DTYPES[dtype](1.0)

    def rnn_bwd(dy, dh_next, h, dg, B, H):
        b, j = unit()
        if b < int32(B) and j < int32(H):
            dh = dy[b, j] + dh_next[b, j]
            v = h[b, j]
            if relu:
                dg[b, j] = dh if v > zero else zero
            else:
                dg[b, j] = dh * (one - v * v)

    rnn_bwd.__name__ = rnn_bwd.__qualname__ = f"rnn_{'relu' if relu else 'tanh'}_step_backward_{dtype}"
    return kernel(rnn_bwd, launch_bounds=(STEP_X * STEP_Y,))
