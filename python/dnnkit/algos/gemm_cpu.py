"""blocked_gemm: the Goto/BLIS GEMM of csrc/gemm (packing, cache blocking, register-blocked
micro-kernel per ISA, OpenMP), with bias and activation fused into the tile store."""
from __future__ import annotations

from .. import _cpu
from .._config import get_num_threads
from .base import Algorithm

ACTIVATION_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}


class BlockedGemm(Algorithm):
    name = "blocked_gemm"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        if p.device != "cpu":
            return f"runs on the CPU, the problem is on {p.device}"
        if p.dtype not in ("float32", "float64"):
            return f"dtype {p.dtype} is not float32 or float64"
        return None

    def workspace_bytes(self, p) -> int:
        return int(_cpu.gemm_workspace_bytes(p.m, p.n, p.k, p.itemsize, get_num_threads()))

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """out := act(alpha * a @ b + beta * out + bias); a is M x K and b is K x N as given (transposes
        are views), out is M x N; all of p.dtype. out is not read when beta == 0."""
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
        return out
