"""GPU RNN sequences: LSTM, GRU and tanh/ReLU RNN, multi-layer and bidirectional, the inference forward.

gpu_steps (Appleyard et al.'s structure, as cuDNN's): per layer and direction, the input projection of all
T steps is one GEMM (x W_ih^T + b_ih, T*B rows); then per step one GEMM adds h_{t-1} W_hh^T + b_hh into
that step's rows (a GRU keeps it apart: r scales its n part) and one kernel does the whole gate pass
(kernels/rnn.py), writing h_t straight into its slice of the output, which the next step reads as its A
operand: nothing is copied between steps. The GEMMs are the GPU GEMM algorithms, planned by the caller
(dispatch: the tuning cache, else the rules) per shape.
"""
from __future__ import annotations

import numpy as np

from ..backends import cuda as _cuda
from ..problem import RNN_MODES, GemmProblem
from .base import Algorithm

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
_INT32 = 2**31 - 1


def _kernels():
    from dnnkit.kernels import _jit, rnn

    return _jit, rnn


class GpuSteps(Algorithm):
    name = "gpu_steps"
    backend = "cuda"
    tolerance = 1e-5

    def __init__(self, mode: str):
        self.mode = mode
        self.op = f"{mode}_fwd"

    def supports(self, p) -> str | None:
        if p.device != "cuda":
            return f"runs on the GPU, the problem is on {p.device}"
        if p.dtype not in ("float32", "float64"):
            return f"dtype {p.dtype} is not float32 or float64"
        if p.proj:
            return "LSTM projections (proj_size) have no GPU kernel yet"
        width = max(p.input, p.dirs * p.hidden)
        if p.seq * p.batch * max(_GATES[p.mode] * p.hidden, width) > _INT32:
            return "a projection of 2^31 elements or more (the kernels' index arithmetic is int32)"
        return None

    def workspace_bytes(self, p) -> int:
        """The projections of one layer-direction (T*B x G*H), a GRU's recurrent part (B x 3H), the state
        when none is given (B x H, twice for an LSTM), and between layers two outputs (T x B x D*H)."""
        G, H, T, B, D = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs
        elems = T * B * G * H + (B * G * H if p.mode == "gru" else 0) + 2 * B * H
        if p.layers > 1:
            elems += min(p.layers - 1, 2) * T * B * D * H
        return elems * p.itemsize

    def run(self, p, x, h0, c0, weights, *, out, h_n, c_n=None, batch_first=False, stream=None, gemm_plan):
        """x (T, B, I), or (B, T, I) with batch_first, a C-contiguous device array; h0, c0 (L*D, B, H) or
        None (zeros); weights the flat list, 4 a layer-direction (w_ih, w_hh, b_ih or None, b_hh or None);
        out (T, B, D*H) (batch_first: (B, T, D*H)), h_n and c_n (L*D, B, H): device arrays written.
        gemm_plan(GemmProblem) -> Plan: how the products run (the caller's dispatch.plan)."""
        _jit, kr = _kernels()
        G, H, T, B, D, L = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs, p.layers
        if B == 0:
            return out
        dt = p.dtype
        grid = (_jit.cdiv(H, kr.STEP_X), _jit.cdiv(B, kr.STEP_Y))
        block = (kr.STEP_X, kr.STEP_Y)

        def launch(k, *args):
            _cuda.launch(k, grid, block, stream, *args)

        t = np.dtype(dt).type
        gx = _cuda.scratch((T * B, G * H), dt, stream)
        gx3 = gx.reshape((B, T, G * H) if batch_first else (T, B, G * H))
        gh = _cuda.scratch((B, G * H), dt, stream) if p.mode == "gru" else None
        zeros = None
        if h0 is None or (p.mode == "lstm" and c0 is None):
            zeros = _cuda.scratch((B, H), dt, stream)
            launch(kr.fill(dt), zeros, t(0.0), B, H)
        between = [_cuda.scratch(out.shape, dt, stream) for _ in range(min(L - 1, 2))]
        step = kr.lstm_step(dt) if p.mode == "lstm" else kr.gru_step(dt) if p.mode == "gru" else \
            kr.rnn_step(dt, p.mode == "rnn_relu")
        inp = x
        for layer in range(L):
            y = out if layer == L - 1 else between[layer % 2]
            feats = inp.shape[2]
            x2 = inp.reshape(T * B, feats)
            has_bias = weights[4 * layer * D + 2] is not None
            proj = gemm_plan(GemmProblem(T * B, G * H, feats, trans_b=True, bias=has_bias, dtype=dt, device="cuda"))
            rec = gemm_plan(GemmProblem(B, G * H, H, trans_b=True, bias=has_bias, dtype=dt, device="cuda"))
            for d in range(D):
                k = layer * D + d
                w_ih, w_hh, b_ih, b_hh = weights[4 * k:4 * k + 4]
                proj.run(x2, w_ih.T, out=gx, bias=b_ih, stream=stream)
                h_prev = zeros if h0 is None else h0[k]
                c = None
                if p.mode == "lstm":
                    c = c_n[k]
                    launch(kr.copy(dt), zeros if c0 is None else c0[k], c, B, H)
                for s in range(T):
                    ti = s if d == 0 else T - 1 - s
                    g = gx3[:, ti, :] if batch_first else gx3[ti]
                    h_out = y[:, ti, d * H:(d + 1) * H] if batch_first else y[ti, :, d * H:(d + 1) * H]
                    if p.mode == "gru":
                        rec.run(h_prev, w_hh.T, out=gh, bias=b_hh, stream=stream)
                        launch(step, g, gh, h_prev, h_out, B, H)
                    else:
                        rec.run(h_prev, w_hh.T, out=g, beta=1.0, bias=b_hh, stream=stream)
                        if p.mode == "lstm":
                            launch(step, g, c, h_out, B, H)
                        else:
                            launch(step, g, h_out, B, H)
                    h_prev = h_out
                launch(kr.copy(dt), h_prev, h_n[k], B, H)
            inp = y
        return out


ALGORITHMS = [GpuSteps(mode) for mode in RNN_MODES]
