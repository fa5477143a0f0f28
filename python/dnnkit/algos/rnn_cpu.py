"""CPU RNN algorithms (csrc/rnn).

fused: the whole sequence in C++: every step's input projection of a layer in one GEMM (summed bias
    fused), W_hh packed once per call and reused at every step, each thread owning a block of hidden
    units for both its gates' GEMM columns and the fused element-wise pass ("post-GEMM"), one barrier
    per step; the two directions of a bidirectional layer run at once. Backward through time reverses
    the loop, then computes the weight and input gradients as whole-sequence GEMMs. One step (a cell)
    skips the packing. Its scratch (the projections, packed weights, gate gradients) is allocated by
    the kernel; workspace_bytes() reports its size.
"""
from __future__ import annotations

from ..backends.cpu import ext as _cpu
from ..problem import RNN_MODES
from .base import Algorithm, cpu_float_reason

_CELL_CODES = {"lstm": 0, "gru": 1, "rnn_tanh": 2, "rnn_relu": 3}


def shape_tuple(p) -> tuple:
    """The kernels' shape: (cell code, T, B, I, H, L, D, P)."""
    return (_CELL_CODES[p.mode], p.seq, p.batch, p.input, p.hidden, p.layers, p.dirs, p.proj)


class FusedRnn(Algorithm):
    name = "fused"
    backend = "cpu"
    tolerance = 2e-5  # relative L2, float32: GEMM rounding compounded over steps and layers

    def __init__(self, mode: str, direction: str):
        self.mode, self.direction = mode, direction
        self.op = f"{mode}_{direction}"
        if direction == "bwd":
            self.tolerance = 1e-4

    def supports(self, p) -> str | None:
        return cpu_float_reason(p)

    def workspace_bytes(self, p) -> int:
        gh, tb, d, s = p.gates * p.hidden, p.seq * p.batch, p.dirs, p.state
        proj = s * p.hidden if p.proj else 0  # W_hr packed
        if self.direction == "fwd":
            elems = d * (tb * gh + gh * s + p.batch * gh + proj)
        else:
            elems = d * (tb * gh * (2 if p.mode == "gru" else 1) + gh * s + proj + (tb * s if p.proj else 0))
            if p.layers > 1:
                elems += min(p.layers - 1, 2) * tb * d * s
        return elems * p.itemsize

    def run(self, p, *arrays, out=None, **params):
        """fwd: (x, h0, c0, weights) with out = the layer outputs [y_0 .. y_{L-1}] and params h_n, c_n,
        reserve; bwd: (x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n) with out = (dx, dh0, dc0, grads) and
        param accumulate (add the weight gradients to grads rather than overwrite them).
        Arrays as the _cpu.rnn_forward / rnn_backward bindings take them (None where optional)."""
        if self.direction == "fwd":
            x, h0, c0, weights = arrays
            _cpu.rnn_forward(shape_tuple(p), x, h0, c0, weights, out, params["h_n"], params["c_n"],
                             params["reserve"])
        else:
            x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n = arrays
            dx, dh0, dc0, grads = out
            _cpu.rnn_backward(shape_tuple(p), x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n, dx, dh0, dc0, grads,
                              params.get("accumulate", False))
        return out


def all_fused() -> list:
    return [FusedRnn(mode, direction) for mode in RNN_MODES for direction in ("fwd", "bwd")]


reserve_elems = _cpu.rnn_reserve_elems  # (kernel shape) -> elements of the forward's saved gates for backward
