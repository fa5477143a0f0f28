"""CPU GEMM algorithms.

blocked_gemm: the Goto/BLIS GEMM of csrc/gemm (packing, cache blocking, register-blocked
micro-kernel per ISA, OpenMP), with bias and activation fused into the tile store. Every shape.
gemm_small_m: few rows times a transposed B (a fully-connected layer at small batch): dot products of
contiguous rows with no packing, so the weight is read once instead of packed and re-read.
gemm_wt_direct: a batch of rows (a tile's worth, 64 on AVX-512) times a transposed B, computed as
C^T = W A^T by a micro-kernel that reads W where it lies; only the small A is packed."""
from __future__ import annotations

import numpy as np

from ..backends.cpu import ext as _cpu
from .._config import get_num_threads
from .base import Algorithm, cpu_float_reason

ACTIVATION_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}


def _linear_layout_reason(p) -> str | None:
    """Why a kernel for a linear layer's layout (op(a) = a, op(b) = b.T) cannot run p, or None."""
    reason = cpu_float_reason(p)
    if reason:
        return reason
    if p.trans_a or not p.trans_b:
        return "needs op(a) = a and op(b) = b.T (the layout of a linear layer)"
    return None


def _run_rows(kernel, p, a, b, out, alpha, beta, bias):
    """Runs a kernel that needs a's rows and b's columns contiguous (a linear layer's x and W^T), copying
    an operand laid out otherwise (a is small; b is copied only when it is not a transposed weight)."""
    if p.m == 0 or p.n == 0:
        return out  # nothing to write; NumPy gives empty arrays zero strides, which the layout check rejects
    item = a.dtype.itemsize
    if p.k > 1 and a.strides[1] != item:
        a = np.ascontiguousarray(a)
    if p.k > 1 and b.strides[0] != item:
        b = np.ascontiguousarray(b.T).T
    kernel(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
    return out


class BlockedGemm(Algorithm):
    name = "blocked_gemm"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        return cpu_float_reason(p)

    def workspace_bytes(self, p) -> int:
        return int(_cpu.gemm_workspace_bytes(p.m, p.n, p.k, p.itemsize, get_num_threads()))

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """out := act(alpha * a @ b + beta * out + bias); a is M x K and b is K x N as given (transposes
        are views), out is M x N; all of p.dtype. out is not read when beta == 0."""
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
        return out


class GotoGemm(BlockedGemm):
    """The Goto/BLIS path of blocked_gemm alone, the operands as given: no streamed product, no AMX tiles,
    no exchange of the operands' roles (so that the tuner can time it against blocked_gemm's choice)."""

    name = "gemm_goto"

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0, 1)
        return out


class StreamGemm(BlockedGemm):
    """blocked_gemm's streamed products alone: at most 4 rows of A against a B with contiguous rows over a
    depth of two chunks of 256 or more (dX = dY W at batch 1-4), or a depth of at most 8 into 16 or more
    rows of C (dW = dY^T X at batch 1-8); each thread reads contiguous runs of B's rows or C's rows front
    to back (csrc/gemm/gemm_stream.cpp). Where a caller's strides do not let it run, the product runs as
    blocked_gemm runs it."""

    name = "gemm_stream"

    def supports(self, p) -> str | None:
        reason = cpu_float_reason(p)
        if reason:
            return reason
        if p.trans_b:
            return "needs op(b) = b (B's rows contiguous)"
        if not _cpu.gemm_stream_takes(p.m, p.n, p.k):
            return (f"m = {p.m}, n = {p.n}, k = {p.k}: needs 16 or more columns and either at most 4 rows over a "
                    f"depth of 512 or more, or a depth of at most 8 over 16 or more rows")
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0, 2)
        return out


class SmallMGemm(Algorithm):
    name = "gemm_small_m"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5
    MAX_M = 16  # the rule: above this the blocked GEMM wins (bench/gemm.py's linear rows)
    # From here the strided-A kernel, where its rule takes the product in a tile of at most 16 rows
    # (AVX-512), is faster; AVX2's 24-row tile is left to the dot kernels.
    DIRECT_FROM = 13

    def supports(self, p) -> str | None:
        return _linear_layout_reason(p)

    def rule(self, p) -> str | None:
        if p.m > self.MAX_M:
            return f"m = {p.m} is over {self.MAX_M}; the blocked GEMM is faster there"
        if (p.m >= self.DIRECT_FROM and _cpu.gemm_wt_direct_width(p.itemsize, p.m) <= 16
                and WtDirectGemm().supports(p) is None and WtDirectGemm().rule(p) is None):
            return f"m = {p.m} is {self.DIRECT_FROM} or more and gemm_wt_direct runs this depth; it is faster there"
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """As BlockedGemm.run. a must be row-contiguous and b the transpose of a row-contiguous matrix;
        other layouts are copied (a is small; b is copied only when it is not a transposed weight)."""
        return _run_rows(_cpu.gemm_small_m, p, a, b, out, alpha, beta, bias)


class WtDirectGemm(Algorithm):
    name = "gemm_wt_direct"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5
    # The batch must fill the kernel's tiles well enough (the extension's rule, sa_batch_fits: one tile,
    # the narrowest of 16, 32 or 48 rows that holds the batch on AVX-512 float32, at least 60% full;
    # panels of 32 rows at least 75% full, up to 128 rows; AVX2: 24-row tiles, two at most, 80% full);
    # below that the blocked GEMM is faster.

    def supports(self, p) -> str | None:
        reason = _linear_layout_reason(p)
        if reason:
            return reason
        if _cpu.gemm_wt_direct_width(p.itemsize, 1) == 0:
            return f"no strided-A micro-kernel for {_cpu.active_isa()}"
        return None

    def rule(self, p) -> str | None:
        width = _cpu.gemm_wt_direct_width(p.itemsize, p.m)  # the tile for this batch (the narrowest that holds it)
        min_k = _cpu.gemm_wt_direct_min_depth(p.itemsize)  # AVX-512 192, AVX2 320 (the extension's measurements)
        if p.k < min_k:
            return f"k = {p.k} is under {min_k}; the blocked GEMM is faster there"
        if not _cpu.gemm_wt_direct_fits(p.itemsize, p.m):
            max_rows = _cpu.gemm_wt_direct_max_rows(p.itemsize)
            if p.m == 0 or p.m > max_rows:
                return f"m = {p.m} is not 1 to {max_rows}; the blocked GEMM is faster there"
            tiles = -(-p.m // width)
            where = f"its {width}-row tile" if tiles == 1 else f"its {tiles} panels of {width} rows"
            return f"m = {p.m} fills {p.m / (tiles * width):.0%} of {where}; other kernels are faster there"
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """As SmallMGemm.run, on the strided-A kernel."""
        return _run_rows(_cpu.gemm_wt_direct, p, a, b, out, alpha, beta, bias)


# The registry's GEMM algorithms, in order of preference (algos/__init__.py registers them).
ALGORITHMS = [SmallMGemm(), WtDirectGemm(), BlockedGemm(), GotoGemm(), StreamGemm()]

# The kernel of _cpu.linear_run that does what each of these algorithms' run does for a linear layer.
LINEAR_RUN_KINDS = {BlockedGemm: 0, SmallMGemm: 1, WtDirectGemm: 2}


# The fully-connected layer's kernels that the API calls with no dispatch of their own: a call already
# dispatched to one of the algorithms above in LINEAR_RUN_KINDS (output allocated and kernel run in one
# C++ call); a weight packed by pack_weight; the activation and its gradient apart from the product (a
# saved preactivation); the bias gradient (column sums of the output gradient).
linear_run = _cpu.linear_run                    # (x, w, bias, activation code, kind) -> y
linear_prepacked = _cpu.linear_prepacked        # (x, packed weight, bias, activation code) -> y
activation_forward = _cpu.activation_forward    # (z, y, activation code): y = act(z)
activation_backward = _cpu.activation_backward  # (gy, z or None, y or None, gz, activation code)
column_sums = _cpu.column_sums                  # (g, into or None) -> g summed over rows
PackedWeightKernel = _cpu.PackedWeight          # a weight packed for the micro-kernel (dnnkit.PackedWeight's base)
