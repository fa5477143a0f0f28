"""CPU GEMM algorithms.

blocked_gemm: the Goto/BLIS GEMM of csrc/gemm (packing, cache blocking, register-blocked
micro-kernel per ISA, OpenMP), with bias and activation fused into the tile store. Every shape.
gemm_small_m: few rows times a transposed B (a fully-connected layer at small batch): dot products of
contiguous rows with no packing, so the weight is read once instead of packed and re-read."""
from __future__ import annotations

import numpy as np

from .. import _cpu
from .._config import get_num_threads
from .base import Algorithm, cpu_float_reason

ACTIVATION_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}


class BlockedGemm(Algorithm):
    name = "blocked_gemm"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5
    trusted = True

    def supports(self, p) -> str | None:
        return cpu_float_reason(p)

    def workspace_bytes(self, p) -> int:
        return int(_cpu.gemm_workspace_bytes(p.m, p.n, p.k, p.itemsize, get_num_threads()))

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """out := act(alpha * a @ b + beta * out + bias); a is M x K and b is K x N as given (transposes
        are views), out is M x N; all of p.dtype. out is not read when beta == 0."""
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
        return out


class SmallMGemm(Algorithm):
    name = "gemm_small_m"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5
    MAX_M = 16  # above this the blocked GEMM wins (measured: m = 32 is a tie, m = 16 a 1.5-2.5x win)

    def supports(self, p) -> str | None:
        reason = cpu_float_reason(p)
        if reason:
            return reason
        if p.trans_a or not p.trans_b:
            return "needs op(a) = a and op(b) = b.T (the layout of a linear layer)"
        if p.m > self.MAX_M:
            return f"m = {p.m} is over {self.MAX_M}; the blocked GEMM is faster there"
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """As BlockedGemm.run. a must be row-contiguous and b the transpose of a row-contiguous matrix;
        other layouts are copied (a is small; b is copied only when it is not a transposed weight)."""
        if p.m == 0 or p.n == 0:
            return out  # nothing to write; NumPy gives empty arrays zero strides, which the layout check rejects
        item = a.dtype.itemsize
        if p.k > 1 and a.strides[1] != item:
            a = np.ascontiguousarray(a)
        if p.k > 1 and b.strides[0] != item:
            b = np.ascontiguousarray(b.T).T
        _cpu.gemm_small_m(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
        return out
