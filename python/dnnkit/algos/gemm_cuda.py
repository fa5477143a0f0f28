"""GPU GEMM algorithms (Numba-CUDA kernels of dnnkit.kernels.gemm), and the fully-connected layers'
element-wise backward kernels.

gemm_tiled_<bm>x<bn>: a block a bm x bn tile of C, each thread an 8x8 or 4x4 tile of it in registers,
double-buffered shared-memory operand tiles; bias and activation fused into the store. Three tile sizes:
untuned, the rules take the largest whose tiles fill the GPU; the tuner times them all.
gemm_tf32: the tensor cores on float32 operands rounded to TF32, opt-in (dnnkit.set_allow_tf32).
gemm_splitk: the 64x64 kernel over slices of the depth, the slices' sums added in order by a second
kernel that applies the epilogue: for products too small in M x N to fill the GPU whose K is long.

The kernels are compiled on first use (one per tile, dtype, operand layout, bias and activation), so
importing this module imports neither Numba nor the kernels.
"""
from __future__ import annotations

import numpy as np

from ..backends import cuda as _cuda
from .base import Algorithm

ACTIVATION_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}
# Operands' elements, and so each of m, n and k, under this: the kernels' index arithmetic is int32, and a
# tile's loads reach up to a tile's rows and depth past the last (tested, not read).
_INT32 = 2**31 - 1 - 256
_GRID_Y = 65535
DEFAULT_SMS = 132  # an H100 SXM's SM count, for rules when no GPU is present (the simulator)


def _kernels():
    from dnnkit.kernels import _jit, eltwise, gemm

    return _jit, gemm, eltwise


def sm_count() -> int:
    s = _cuda.status()
    return s["devices"][0]["sm_count"] if s["available"] and s["devices"] and not _cuda.simulator() else DEFAULT_SMS


def gpu_float_reason(p) -> str | None:
    if p.device != "cuda":
        return f"runs on the GPU, the problem is on {p.device}"
    if p.dtype not in ("float32", "float64"):
        return f"dtype {p.dtype} is not float32 or float64"
    return None


def _as_stored(x, trans: bool):
    """(array, transposed) for the operand op(x) = x given as a view: the kernel's loader walks the
    operand's contiguous dimension, so a view whose first stride is the smaller is passed as its transpose."""
    s0, s1 = x.strides
    if x.shape[0] > 1 and x.shape[1] > 1 and s0 < s1:
        return _cuda.transposed(x), True
    return x, False


def _tiles(m: int, n: int, tile) -> int:
    return -(-m // tile.bm) * -(-n // tile.bn)


# ----------------------------------------------------------------------------------------- cost model
# A kernel launched from Python costs this much host time before the GPU starts it.
LAUNCH_S = 10e-6
# Per tile kernel: the share of an SM's peak its loop reaches with the SM full of its blocks (the main
# loop's FMA share, bench/RESULTS.md "GPU kernels: what they compile to", less the latency its
# occupancy leaves exposed).
TILE_EFFICIENCY = {"128x128": 0.7, "64x64": 0.45, "32x32": 0.25, "tf32": 0.45}


def tile_cost(p, c, bm: int, bn: int, depth: int, blocks: int, peak: float, efficiency: float) -> float:
    """Seconds for `blocks` blocks of bm x bn tiles over `depth` on an SM-wide peak: the busiest SM runs
    ceil(blocks / SMs) of them one after another (the wave quantization), each at the tile's efficiency;
    no faster than the operands and C through DRAM once."""
    sms = sm_count()
    compute = -(-blocks // sms) * 2.0 * bm * bn * depth / (peak / sms * efficiency)
    dram = (p.m * p.k + p.k * p.n + 2 * p.m * p.n) * p.itemsize / c.bytes_per_s
    return max(compute, dram)


class TiledGemm(Algorithm):
    op = "gemm"
    backend = "cuda"
    tolerance = 1e-5

    def __init__(self, tile_name: str, bm: int, bn: int):
        self.tile_name = tile_name
        self.name = f"gemm_tiled_{tile_name}"
        self.bm, self.bn = bm, bn

    def tile(self):
        return _kernels()[1].TILES[self.tile_name]

    def supports(self, p) -> str | None:
        reason = gpu_float_reason(p)
        if reason:
            return reason
        if max(p.m * p.k, p.k * p.n, p.m * p.n) > _INT32:
            return "an operand of 2^31 - 256 elements or more (its index arithmetic is int32)"
        if -(-p.m // self.bm) > _GRID_Y:
            return f"m = {p.m} needs more than {_GRID_Y} row blocks of {self.bm}"
        return None

    def rule(self, p) -> str | None:
        return _taken_before(p, self) or self.own_rule(p)

    def own_rule(self, p) -> str | None:
        sms = sm_count()
        if self.tile_name == "128x128" and -(-p.m // 128) * -(-p.n // 128) < sms:
            return f"fewer 128x128 tiles of C than the GPU's {sms} SMs; a smaller tile keeps them all busy"
        if self.tile_name == "64x64" and -(-p.m // 64) * -(-p.n // 64) * 2 < sms:
            return f"fewer 64x64 tiles of C than half the GPU's {sms} SMs; the 32x32 tile (or split-K) keeps more busy"
        return None

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None, stream=None):
        """out := act(alpha * a @ b + beta * out + bias) on the GPU; a (m x k), b (k x n) and out (m x n)
        Numba device arrays (any strides), bias n values or None; on stream (default: the default stream)."""
        _jit, gemm, _ = _kernels()
        tile = gemm.TILES[self.tile_name]
        if p.m == 0 or p.n == 0:
            return out
        sa, ta = _as_stored(a, False)
        sb, tb = _as_stored(b, False)
        k = gemm.gemm_kernel(tile, p.dtype, ta, tb, False, bias is not None, ACTIVATION_CODES[p.activation])
        grid = (_jit.cdiv(p.n, tile.bn), _jit.cdiv(p.m, tile.bm), 1)
        t = np.dtype(p.dtype).type  # scalars of the operands' dtype: a float32 kernel never computes in float64
        _cuda.launch(k, grid, tile.threads, stream, sa, sb, out, out[0] if bias is None else bias,
                     p.m, p.n, p.k, t(alpha), t(beta), p.k)
        return out

    def cost(self, p, c) -> float:
        blocks = -(-p.m // self.bm) * -(-p.n // self.bn)
        return LAUNCH_S + tile_cost(p, c, self.bm, self.bn, p.k, blocks, c.peak(p), TILE_EFFICIENCY[self.tile_name])


class SplitKGemm(Algorithm):
    name = "gemm_splitk"
    op = "gemm"
    backend = "cuda"
    tolerance = 1e-5
    TILE = "64x64"
    MIN_SLICE = 256  # depth a slice at least: below, the second kernel's pass costs more than it saves
    MAX_SPLITS = 32
    RULE_MIN_K = 2048

    def splits(self, p) -> int:
        tiles = -(-p.m // 64) * -(-p.n // 64)
        want = max(2, -(-sm_count() // max(tiles, 1)))
        return max(1, min(self.MAX_SPLITS, want, p.k // self.MIN_SLICE))

    def supports(self, p) -> str | None:
        reason = gpu_float_reason(p)
        if reason:
            return reason
        if p.k < 2 * self.MIN_SLICE:
            return f"k = {p.k}: fewer than two slices of {self.MIN_SLICE}"
        if max(p.m * p.k, p.k * p.n, p.m * p.n * self.MAX_SPLITS) > _INT32:
            return "an operand or the workspace of 2^31 - 256 elements or more (its index arithmetic is int32)"
        if -(-p.m // 64) > _GRID_Y:
            return f"m = {p.m} needs more than {_GRID_Y} row blocks of 64"
        return None

    def rule(self, p) -> str | None:
        return _taken_before(p, self) or self.own_rule(p)

    def own_rule(self, p) -> str | None:
        if -(-p.m // 64) * -(-p.n // 64) * 2 > sm_count():
            return "the 64x64 tiles of C alone fill half the GPU or more"
        if p.k < self.RULE_MIN_K:
            return f"k = {p.k} is under {self.RULE_MIN_K}: the second pass costs more than the blocks it adds save"
        return None

    def workspace_bytes(self, p) -> int:
        return self.splits(p) * p.m * p.n * p.itemsize

    def cost(self, p, c) -> float:
        """The slices' blocks side by side, then the reduction reading every slice's partial C."""
        splits = self.splits(p)
        blocks = -(-p.m // 64) * -(-p.n // 64) * splits
        slices = tile_cost(p, c, 64, 64, -(-p.k // splits), blocks, c.peak(p), TILE_EFFICIENCY[self.TILE])
        return 2 * LAUNCH_S + slices + (splits + 2) * p.m * p.n * p.itemsize / c.bytes_per_s

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None, stream=None):
        _jit, gemm, _ = _kernels()
        tile = gemm.TILES[self.TILE]
        if p.m == 0 or p.n == 0:
            return out
        splits = self.splits(p)
        chunk = _jit.cdiv(_jit.cdiv(p.k, splits), tile.bk) * tile.bk
        splits = _jit.cdiv(p.k, chunk)
        ws = _cuda.scratch((splits, p.m, p.n), p.dtype, stream)
        sa, ta = _as_stored(a, False)
        sb, tb = _as_stored(b, False)
        k = gemm.gemm_kernel(tile, p.dtype, ta, tb, True)
        t = np.dtype(p.dtype).type
        _cuda.launch(k, (_jit.cdiv(p.n, tile.bn), _jit.cdiv(p.m, tile.bm), splits), tile.threads, stream,
                     sa, sb, ws, ws[0, 0], p.m, p.n, p.k, t(alpha), t(beta), chunk)
        r = gemm.splitk_reduce(p.dtype, bias is not None, ACTIVATION_CODES[p.activation])
        _cuda.launch(r, _jit.cdiv(p.m * p.n, gemm.REDUCE_THREADS), gemm.REDUCE_THREADS, stream,
                     ws, out, ws[0, 0] if bias is None else bias, p.m, p.n, splits, t(alpha), t(beta))
        return out


class Tf32Gemm(Algorithm):
    """The tensor cores in TF32 (kernels/gemm_tf32.py): float32 operands rounded to 10 mantissa bits,
    products by mma.sync m16n8k8, sums in float32; a 128x128 tile of C a block of 8 warps. Opt-in
    (dnnkit.set_allow_tf32, DNNKIT_ALLOW_TF32=1, or algo="gemm_tf32"); its error against float64 is
    TF32's, about 1e-4 to 1e-3 relative (the tolerance the tuner holds it to: 2e-3)."""

    name = "gemm_tf32"
    op = "gemm"
    backend = "cuda"
    tolerance = 2e-3
    tf32 = True
    BM = BN = 128  # kernels/gemm_tf32.py TILE

    def supports(self, p) -> str | None:
        reason = gpu_float_reason(p)
        if reason:
            return reason
        if p.dtype != "float32":
            return f"dtype {p.dtype}: TF32 is for float32 operands"
        if max(p.m * p.k, p.k * p.n, p.m * p.n) > _INT32:
            return "an operand of 2^31 - 256 elements or more (its index arithmetic is int32)"
        if -(-p.m // self.BM) > _GRID_Y:
            return f"m = {p.m} needs more than {_GRID_Y} row blocks of {self.BM}"
        return None

    def own_rule(self, p) -> str | None:
        return None  # where allowed, every float32 product

    def run(self, p, a, b, *, out, alpha=1.0, beta=0.0, bias=None, stream=None):
        from dnnkit.kernels import _jit, gemm_tf32

        if p.m == 0 or p.n == 0:
            return out
        sa, ta = _as_stored(a, False)
        sb, tb = _as_stored(b, False)
        k = gemm_tf32.gemm_tf32_kernel(ta, tb, bias is not None, ACTIVATION_CODES[p.activation])
        _cuda.launch(k, (_jit.cdiv(p.n, self.BN), _jit.cdiv(p.m, self.BM)), gemm_tf32.TILE.threads, stream, sa, sb, out,
                     out[0] if bias is None else bias, p.m, p.n, p.k, np.float32(alpha), np.float32(beta), p.k)
        return out

    def cost(self, p, c) -> float | None:
        if not c.tf32_flops:
            return None
        blocks = -(-p.m // self.BM) * -(-p.n // self.BN)
        return LAUNCH_S + tile_cost(p, c, self.BM, self.BN, p.k, blocks, c.tf32_flops, TILE_EFFICIENCY["tf32"])


def _eltwise_grid(total: int) -> tuple:
    """(grid, block) of the grid-stride element-wise kernels over `total` elements: at most 32 blocks an
    SM; one block of eltwise.threads(total) below a full block's elements."""
    _, _, eltwise = _kernels()
    return max(1, min(-(-total // eltwise.ELTWISE_THREADS), 32 * sm_count())), eltwise.threads(total)


def activation_forward(z, y, act: str, stream) -> None:
    """y = act(z) over m x n device arrays."""
    _, _, eltwise = _kernels()
    m, n = z.shape
    k = eltwise.activation_forward(_cuda.dtype_name(z), ACTIVATION_CODES[act])
    _cuda.launch(k, *_eltwise_grid(m * n), stream, z, y, m, n)


def activation_backward(gy, v, gz, act: str, v_is_z: bool, stream) -> None:
    """gz = gy * act'(z) over m x n device arrays, v being z (v_is_z) or the forward's output."""
    _, _, eltwise = _kernels()
    m, n = gy.shape
    k = eltwise.activation_backward(_cuda.dtype_name(gy), ACTIVATION_CODES[act], bool(v_is_z))
    _cuda.launch(k, *_eltwise_grid(m * n), stream, gy, v, gz, m, n)


def multiply(x, y, out, stream) -> None:
    """out = x * y, element by element, over C-contiguous device arrays of one shape (dropout's masks)."""
    _, _, eltwise = _kernels()
    n = 1
    for d in x.shape:
        n *= int(d)
    k = eltwise.multiply(_cuda.dtype_name(x))
    _cuda.launch(k, *_eltwise_grid(n), stream, x.reshape(n), y.reshape(n), out.reshape(n), n)


def column_sums(x, out, accumulate: bool, stream) -> None:
    """out[j] (+)= sum_i x[i, j] over an m x n device array, summed in float64."""
    _jit, _, eltwise = _kernels()
    m, n = x.shape
    k = eltwise.column_sums(_cuda.dtype_name(x), bool(accumulate))
    _cuda.launch(k, _jit.cdiv(n, eltwise.SUM_COLUMNS), eltwise.sum_block(m, n), stream, x, out, m, n)


def _taken_before(p, algo) -> str | None:
    """Which of the tile kernels that need no workspace, before algo in the rules' order, runs p and whose
    rule takes it, as a reason: their rules partition the products, so the cost model never overrides
    them (split-K, which needs workspace a limit may deny, stands beside the 32x32 tile where its rule
    takes a product)."""
    from .._config import get_allow_tf32

    for other in ALGORITHMS:
        if other.name == algo.name:
            break
        if other.name == SplitKGemm.name:
            continue
        if other.supports(p) is None and (get_allow_tf32() or not other.tf32) and other.own_rule(p) is None:
            return f"{other.name}'s rule takes this product"
    return None


# In the order the rules are tried: TF32 where allowed, then the largest tile that fills the GPU, then
# split-K for a small C over a long depth, then the small tile (every shape).
ALGORITHMS = [Tf32Gemm(), TiledGemm("128x128", 128, 128), TiledGemm("64x64", 64, 64), SplitKGemm(),
              TiledGemm("32x32", 32, 32)]
