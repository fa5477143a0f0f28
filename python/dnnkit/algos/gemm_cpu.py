"""CPU GEMM algorithms.

blocked_gemm: the Goto/BLIS GEMM of csrc/gemm (packing, cache blocking, register-blocked
micro-kernel per ISA, OpenMP), with bias and activation fused into the tile store. Every shape.
gemm_small_m: few rows times a transposed B (a fully-connected layer at small batch): dot products of
contiguous rows with no packing, so the weight is read once instead of packed and re-read.
gemm_wt_direct: a batch of rows (a tile's worth, 64 on AVX-512) times a transposed B, computed as
C^T = W A^T by a micro-kernel that reads W where it lies; only the small A is packed."""
from __future__ import annotations

import functools
import math

import numpy as np

from ..backends.cpu import ext as _cpu
from .._config import get_num_threads
from .base import Algorithm, cpu_float_reason

ACTIVATION_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}


PACKED_REASON = "b is a weight packed by dnnkit.pack_weight, which gemm_prepacked reads"


def _gemm_reason(p) -> str | None:
    """Why a CPU GEMM on arrays cannot run p, or None."""
    return cpu_float_reason(p) or (PACKED_REASON if p.packed else None)


def _linear_layout_reason(p) -> str | None:
    """Why a kernel for a linear layer's layout (op(a) = a, op(b) = b.T) cannot run p, or None."""
    reason = _gemm_reason(p)
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


# ----------------------------------------------------------------------------------------- cost model
# The blocked GEMM's share of the peak, fitted to ResNet-50's products at batch 1 and 8 (bench/autotune.py,
# bench/cost_model.py; docs/algorithms.md, "The cost model"): lower for narrow N, short K and few rows.
_GEMM_EFFICIENCY = 0.62
# The row-contiguous kernels (gemm_small_m, gemm_wt_direct, the streamed products) are bound by reading
# the large operand once; their arithmetic runs at this share of the peak.
STREAM_EFFICIENCY = 0.5
WT_DIRECT_EFFICIENCY = 0.62  # B never packed: at full tiles the blocked GEMM's best share
# The tiles' float32 products (six bfloat16 ones, and the split of both operands) against the FMA kernels
# at the same shape, on the shapes the tiles take (bench/log/2026-11-27-sapphire-rapids.md: tiles
# against the FMA kernels).
AMX_SPEEDUP = 1.4


@functools.lru_cache(maxsize=None)
def _ukernel(isa: str, itemsize: int) -> tuple:
    """(MR, NR, MC) of the ISA's micro-kernel (csrc/gemm/blocking.h)."""
    info = _cpu.ukernel_info(isa, itemsize)
    return info[1], info[2], info[3]


def micro_rows(itemsize: int = 4) -> int:
    """MR of the active ISA's GEMM micro-kernel for this element size."""
    return _ukernel(_cpu.active_isa(), itemsize)[0]


def gemm_mc(itemsize: int = 4) -> int:
    """MC of the active ISA's blocking: rows of A per packed block (B is packed once per block)."""
    return _ukernel(_cpu.active_isa(), itemsize)[2]


def transposes(m: int, n: int) -> bool:
    """csrc/gemm/gemm.cpp's transposing_helps: few, badly filled columns and many more rows."""
    nr = _ukernel(_cpu.active_isa(), 4)[1]
    if n >= 4 * nr or m <= 2 * n:
        return False
    return m / (math.ceil(m / nr) * nr) > n / (math.ceil(n / nr) * nr) + 0.1


# Columns of C from which the blocked GEMM's efficiency no longer grows with n (gemm_efficiency).
FULL_WIDTH_COLUMNS = 384


def gemm_efficiency(m: int, n: int, k: int, may_transpose: bool = True) -> float:
    """Fraction of the peak the blocked GEMM reaches on an m x n x k product (solved as C^T = B^T A^T
    where that fills the micro-kernel better and may_transpose)."""
    if min(m, n, k) <= 0:
        return 1.0
    if may_transpose and transposes(m, n):
        return 0.75 * gemm_efficiency(n, m, k, False)  # C written through its strides
    rows_used = min(1.0, m / micro_rows())  # fewer rows than MR stream B for less work
    return (_GEMM_EFFICIENCY * min(1.0, n / FULL_WIDTH_COLUMNS) ** 0.4 * depth_efficiency(m, n, k)
            * min(1.0, m / 64) ** 0.3 * rows_used)


# The depth law of depth_efficiency: each micro-tile's fixed work (C loaded and stored, the loop entered)
# costs as much as SHORT_DEPTH steps of depth, and more in products of fewer than SMALL_PRODUCT elements
# of C, whose operands' packing is shared by fewer tiles (by the square root of the shortfall, at most
# SMALL_PRODUCT_FACTOR times).
SHORT_DEPTH = 16
SMALL_PRODUCT = 1 << 18
SMALL_PRODUCT_FACTOR = 4
FULL_DEPTH = 256  # the depth the efficiency is stated at (a KC block)


def depth_efficiency(m: int, n: int, k: int) -> float:
    """The share of its full-depth speed an m x n product of depth k runs at: k / (k + k0) over the same at
    FULL_DEPTH, k0 the fixed work in steps of depth; above 1 for deeper products."""
    if k <= 0:
        return 1.0  # nothing to multiply: no time to scale
    k0 = SHORT_DEPTH * min(SMALL_PRODUCT_FACTOR, max(1.0, SMALL_PRODUCT / max(1, m * n)) ** 0.5)
    return k / (k + k0) * (FULL_DEPTH + k0) / FULL_DEPTH


def wt_direct_efficiency(itemsize: int, rows: int) -> float:
    """gemm_wt_direct's share of the peak on `rows` batch rows: its tiles' empty rows are computed too."""
    width = max(1, _cpu.gemm_wt_direct_width(itemsize, rows))
    return WT_DIRECT_EFFICIENCY * (rows / (math.ceil(rows / width) * width) if rows else 1.0)


def _flops(p) -> float:
    return 2.0 * p.m * p.n * p.k


def _streamed(p, c, efficiency: float) -> float:
    """A product bound by one pass over its operands and C (read when beta may be nonzero, written)."""
    moved = (p.m * p.k + p.k * p.n + 2 * p.m * p.n) * p.itemsize
    return max(moved / c.bandwidth, _flops(p) / (c.peak(p) * efficiency))


class BlockedGemm(Algorithm):
    name = "blocked_gemm"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        return _gemm_reason(p)

    def rule(self, p) -> str | None:
        """Every product the row-contiguous kernels' rules do not take (the rules partition the products:
        the cost model never overrides a measured rule)."""
        return _taken_before(p, len(_RULED_ORDER))

    def workspace_bytes(self, p) -> int:
        return int(_cpu.gemm_workspace_bytes(p.m, p.n, p.k, p.itemsize, get_num_threads()))

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """out := act(alpha * a @ b + beta * out + bias); a is M x K and b is K x N as given (transposes
        are views), out is M x N; all of p.dtype. out is not read when beta == 0."""
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0)
        return out

    def cost(self, p, c) -> float:
        """The best of the paths the kernel chooses among: the streamed product where it takes the shape,
        else the Goto/BLIS product (on the operands exchanged where that fills the micro-kernel better)."""
        if _cpu.gemm_stream_takes(p.m, p.n, p.k) and not p.trans_b:
            return _streamed(p, c, STREAM_EFFICIENCY)
        return _flops(p) / (c.peak(p) * gemm_efficiency(p.m, p.n, p.k))


_PATH_RULE = "a path blocked_gemm takes where its own rule would; the tuner times it, algo= names it"


class _BlockedPath(BlockedGemm):
    """One of blocked_gemm's paths alone (the gemm kernel's `path` argument), so that the tuner can time it
    against blocked_gemm's choice and algo= can name it."""

    path = 0

    def rule(self, p) -> str | None:
        return _PATH_RULE

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        _cpu.gemm(a, b, out, alpha, beta, bias, ACTIVATION_CODES[p.activation], 0, self.path)
        return out


class GotoGemm(_BlockedPath):
    """The Goto/BLIS path of blocked_gemm alone, the operands as given: no streamed product, no AMX tiles,
    no exchange of the operands' roles."""

    name = "gemm_goto"
    path = 1

    def cost(self, p, c) -> float:
        return _flops(p) / (c.peak(p) * gemm_efficiency(p.m, p.n, p.k, may_transpose=False))


class StreamGemm(_BlockedPath):
    """blocked_gemm's streamed products alone: at most 4 rows of A against a B with contiguous rows over a
    depth of two chunks of 256 or more (dX = dY W at batch 1-4), or a depth of at most 8 into 16 or more
    rows of C (dW = dY^T X at batch 1-8); each thread reads contiguous runs of B's rows or C's rows front
    to back (csrc/gemm/gemm_stream.cpp). Where a caller's strides do not let it run, the product runs as
    blocked_gemm runs it."""

    name = "gemm_stream"
    path = 2

    def supports(self, p) -> str | None:
        reason = _gemm_reason(p)
        if reason:
            return reason
        if p.trans_b:
            return "needs op(b) = b (B's rows contiguous)"
        if not _cpu.gemm_stream_takes(p.m, p.n, p.k):
            return (f"m = {p.m}, n = {p.n}, k = {p.k}: needs 16 or more columns and either at most 4 rows over a "
                    f"depth of 512 or more, or a depth of at most 8 over 16 or more rows")
        return None

    def cost(self, p, c) -> float:
        return _streamed(p, c, STREAM_EFFICIENCY)


class AmxGemm(_BlockedPath):
    """blocked_gemm's AMX path alone: float32 products split into three bfloat16 parts on the tile unit
    (csrc/gemm/amx.cpp), at float32's accuracy; where an operand does not split exactly (the check runs
    on the values), the product runs as gemm_goto runs it."""

    name = "gemm_amx"
    path = 3

    def supports(self, p) -> str | None:
        reason = _gemm_reason(p)
        if reason:
            return reason
        if p.dtype != "float32":
            return "float32 only (the tiles multiply bfloat16 parts of float32 values)"
        if not _cpu.amx_takes_shape(p.m, p.n, p.k):
            if not _cpu.amx_enabled():
                return "needs AMX-BF16 tiles, which this CPU (or dnnkit.set_amx, DNNKIT_ISA) does not offer"
            return (f"m = {p.m}, n = {p.n}, k = {p.k}: the tiles take 192 rows and columns or more and a depth of "
                    "128 or more (192 under 512 columns)")
        return None

    def cost(self, p, c) -> float:
        """The blocked GEMM's schedule at AMX_SPEEDUP times the FMA kernels' speed (a tuned machine's fitted
        correction takes over)."""
        return _flops(p) / (c.peak(p) * AMX_SPEEDUP * gemm_efficiency(p.m, p.n, p.k, may_transpose=False))


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
                and WtDirectGemm().supports(p) is None and WtDirectGemm().own_rule(p) is None):
            return f"m = {p.m} is {self.DIRECT_FROM} or more and gemm_wt_direct runs this depth; it is faster there"
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """As BlockedGemm.run. a must be row-contiguous and b the transpose of a row-contiguous matrix;
        other layouts are copied (a is small; b is copied only when it is not a transposed weight)."""
        return _run_rows(_cpu.gemm_small_m, p, a, b, out, alpha, beta, bias)

    def cost(self, p, c) -> float:
        """Dot products of A's rows with B's columns: B read once, no packing."""
        return _streamed(p, c, STREAM_EFFICIENCY)


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
        return _taken_before(p, 1) or self.own_rule(p)

    def own_rule(self, p) -> str | None:
        """The rule on its own (rule() also leaves gemm_small_m what its rule takes)."""
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

    def cost(self, p, c) -> float:
        """B read once where it lies, the batch in tiles of the kernel's width (the empty rows computed)."""
        return _streamed(p, c, wt_direct_efficiency(p.itemsize, p.m))


class PrepackedGemm(Algorithm):
    """A linear layer's product on a weight packed once by dnnkit.pack_weight (W^T in the micro-kernel's
    panels, and on AMX-enabled CPUs a second time in bfloat16 parts): only A is packed per call."""

    name = "gemm_prepacked"
    op = "gemm"
    backend = "cpu"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        return cpu_float_reason(p) or (None if p.packed else "needs b packed by dnnkit.pack_weight")

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None):
        """out := act(a @ W.T + bias), a (m x k) any strides, b the PackedWeight of W, out m x n C-contiguous;
        alpha 1 and beta 0 (a linear layer's product)."""
        if alpha != 1.0 or beta != 0.0:
            raise ValueError("gemm_prepacked: computes a linear layer's product (alpha 1, beta 0)")
        return _cpu.linear_prepacked(a, b, bias, ACTIVATION_CODES[p.activation], out)

    def cost(self, p, c) -> float:
        """The blocked GEMM's arithmetic without B's packing."""
        return _flops(p) / (c.peak(p) * gemm_efficiency(p.m, p.n, p.k, may_transpose=False))


# The rules' order: each takes a product that no earlier one takes (blocked_gemm all the rest).
_RULED_ORDER = [SmallMGemm(), WtDirectGemm()]


def _taken_before(p, count: int) -> str | None:
    """Which of the first `count` algorithms of _RULED_ORDER runs p and whose rule takes it, as a reason."""
    for other in _RULED_ORDER[:count]:
        if other.supports(p) is None and other.rule(p) is None:
            return f"{other.name}'s rule takes this product"
    return None


# The registry's GEMM algorithms, in order of preference (algos/__init__.py registers them).
ALGORITHMS = [SmallMGemm(), WtDirectGemm(), BlockedGemm(), GotoGemm(), StreamGemm(), AmxGemm(), PrepackedGemm()]

# The kernel of _cpu.linear_run that does what each of these algorithms' run does for a linear layer.
LINEAR_RUN_KINDS = {BlockedGemm: 0, SmallMGemm: 1, WtDirectGemm: 2}


# The fully-connected layer's kernels that the API calls with no dispatch of their own: a call already
# dispatched to one of the algorithms above in LINEAR_RUN_KINDS, or to gemm_prepacked (output allocated
# and kernel run in one C++ call); the activation and its gradient apart from the product (a saved
# preactivation); the bias gradient (column sums of the output gradient).
linear_run = _cpu.linear_run                    # (x, w, bias, activation code, kind) -> y
linear_prepacked = _cpu.linear_prepacked        # (x, packed weight, bias, activation code) -> y
activation_forward = _cpu.activation_forward    # (z, y, activation code): y = act(z)
activation_backward = _cpu.activation_backward  # (gy, z or None, y or None, gz, activation code)
column_sums = _cpu.column_sums                  # (g, into or None) -> g summed over rows
PackedWeightKernel = _cpu.PackedWeight          # a weight packed for the micro-kernel (dnnkit.PackedWeight's base)
