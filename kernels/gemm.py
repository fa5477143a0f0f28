"""GEMM on the GPU: C := act(alpha * op(A) op(B) + beta * C + bias), float32 and float64.

One kernel per (tile, dtype, trans_a, trans_b, split), built on first use:
- a block computes a BM x BN tile of C; its T = (BM/TM) (BN/TN) threads each hold a TM x TN tile of
  accumulators in registers (2-D register blocking) and run, per step of the depth, TM + TN shared-memory
  loads for TM * TN fused multiply-adds;
- the depth advances BK at a time through two shared-memory buffers: the loads of step t + 1 are issued
  before the products of step t, one barrier a step;
- A's tile is kept depth-major (sA[k][m]) and B's (sB[k][n]), each row padded by 4 elements, the arrays
  16-byte aligned, so that a thread's TM (TN) operands are contiguous and aligned (128-bit shared loads,
  LDS.128) and the transposing stores do not collide in banks;
- global loads are coalesced for either layout of each operand: the loader walks the tile along the
  operand's contiguous dimension (k for A = a and B = b.T, m or n for the transposed cases);
- edges: out-of-range operands load as zero, out-of-range outputs are not stored; all trip counts come
  from (m, n, k), never from the grid;
- split: block z of the grid takes the depth range [z * k_chunk, (z + 1) * k_chunk) and stores its raw
  sums to a workspace slice; splitk_reduce sums the slices in order (deterministic) and applies the
  epilogue. For products whose M x N is too small to fill the GPU while K is long.
Index arithmetic is int32 (operands up to 2^31 elements; the algorithm's supports() checks), and array
indices are cast to uint32 where they are known non-negative, which spares Numba's negative-index wrap.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ._jit import ALIGN16, DTYPES, cuda, int32, kernel, uint32
from .epilogue import activation


@dataclass(frozen=True)
class Tile:
    """A block's tile of C (bm x bn), its depth step (bk), and each thread's tile of C (tm x tn)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def shared_bytes(self, itemsize: int) -> int:
        return 2 * self.bk * ((self.bm + 4) + (self.bn + 4)) * itemsize

    def __post_init__(self):
        t = self.threads
        if self.bm % self.tm or self.bn % self.tn or (self.bm * self.bk) % t or (self.bk * self.bn) % t:
            raise ValueError(f"Tile {self}: the tiles must divide evenly among {t} threads")

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"


# The registered variants (algos/gemm_cuda.py names them): a large tile for large products (64
# accumulators a thread, 256 threads), a middle one, and a small one that keeps more blocks in flight
# on small products.
TILES = {
    "128x128": Tile(128, 128, 8, 8, 8),
    "64x64": Tile(64, 64, 8, 4, 4),
    "32x32": Tile(32, 32, 16, 4, 4),
}


def _loads(tile: Tile, operand: str, trans: bool, buf: str) -> list[str]:
    """Source lines that load one operand's tile for the depth step at k0 into shared buffer buf: each
    thread's share, unrolled, walking the tile along the operand's contiguous dimension."""
    BM, BN, BK, T = tile.bm, tile.bn, tile.bk, tile.threads
    lines = []
    if operand == "a":
        width, count, arr, lim = BM, BM * BK // T, "sA", "m32"
        contiguous_k = not trans  # a as stored is m x k (k contiguous) unless trans_a
        base, load = "bm", ("a[u32(gk), u32(g)]" if trans else "a[u32(g), u32(gk)]")
    else:
        width, count, arr, lim = BN, BK * BN // T, "sB", "n32"
        contiguous_k = trans      # b as stored is n x k (k contiguous) when trans_b
        base, load = "bn", ("b[u32(g), u32(gk)]" if trans else "b[u32(gk), u32(g)]")
    for l in range(count):
        idx = f"(tid + int32({l * T}))"
        if contiguous_k:
            lines += [f"kk = {idx} % int32({BK})", f"mn = {idx} // int32({BK})"]
        else:
            lines += [f"mn = {idx} % int32({width})", f"kk = {idx} // int32({width})"]
        lines += [f"g = {base} + mn", "gk = k0 + kk", "v = zero",
                  f"if g < {lim} and gk < kend:", f"    v = {load}", f"{arr}[{buf}, u32(kk), u32(mn)] = v"]
    return lines


def _store(value: str, split: bool, bias: bool, act: int) -> list[str]:
    """Source lines that store one accumulator at (r, col), inside C: the epilogue act(alpha * v + beta *
    c + bias), c not read when beta == 0; or, for a split, the raw sum into the workspace slice z."""
    if split:
        return [f"c[z, u32(r), u32(col)] = {value}"]
    lines = [f"v = alpha * {value}", "if beta != zero:", "    v += beta * c[u32(r), u32(col)]"]
    lines += ["v += bias[u32(col)]"] if bias else []
    return lines + ["c[u32(r), u32(col)] = v" if act == 0 else f"c[u32(r), u32(col)] = act_fn(v, {act})"]


def _source(tile: Tile, trans_a: bool, trans_b: bool, split: bool, bias: bool, act: int, name: str) -> str:
    """The kernel's Python source: its loops over a thread's tile written out and its accumulators
    scalars (Numba has no unroll pragma, and a local array indexed in a loop it keeps lives in local
    memory); the loop over the depth step stays a loop (NVVM unrolls it; Numba's compile time grows
    faster than linearly in the source's length)."""
    BM, BN, BK, TM, TN = tile.bm, tile.bn, tile.bk, tile.tm, tile.tn
    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    ind = lambda lines, n: ["    " * n + x for x in lines]  # noqa: E731
    body = [
        "sA = cuda.shared.array((2, %d, %d), t%s)" % (BK, BM + 4, ALIGN16),
        "sB = cuda.shared.array((2, %d, %d), t%s)" % (BK, BN + 4, ALIGN16),
        "tid = int32(cuda.threadIdx.x)",
        f"tx = tid % int32({BN // TN})",
        f"ty = tid // int32({BN // TN})",
        f"bm = int32(cuda.blockIdx.y) * int32({BM})",
        f"bn = int32(cuda.blockIdx.x) * int32({BN})",
        "m32 = int32(m)", "n32 = int32(n)", "kbeg = int32(0)", "kend = int32(k)",
    ]
    if split:
        body += ["kbeg = int32(cuda.blockIdx.z) * int32(k_chunk)", "kend = min(kend, kbeg + int32(k_chunk))"]
    body += [" = ".join(x for row in acc for x in row) + " = zero",
             f"steps = (kend - kbeg + int32({BK - 1})) // int32({BK})",
             "k0 = kbeg"]
    body += _loads(tile, "a", trans_a, "0") + _loads(tile, "b", trans_b, "0")
    body += ["cuda.syncthreads()",
             f"ra = ty * int32({TM})", f"rb = tx * int32({TN})", "rau = u32(ra)", "rbu = u32(rb)",
             "for s in range(steps):",
             "    cur = s & 1",
             "    curu = u32(cur)",
             "    if s + 1 < steps:",
             f"        k0 = kbeg + int32(s + 1) * int32({BK})",
             "        nxt = cur ^ 1"]
    body += ind(_loads(tile, "a", trans_a, "nxt") + _loads(tile, "b", trans_b, "nxt"), 2)
    body += [f"    for kk in range({BK}):"]
    body += ind([f"a{i} = sA[curu, u32(kk), rau + u32({i})]" for i in range(TM)]
                + [f"b{j} = sB[curu, u32(kk), rbu + u32({j})]" for j in range(TN)]
                + [f"{acc[i][j]} = cuda.fma(a{i}, b{j}, {acc[i][j]})" for i in range(TM) for j in range(TN)], 2)
    body += ["    cuda.syncthreads()", "r0 = bm + ra", "col0 = bn + rb"]
    if split:
        body += ["z = cuda.blockIdx.z"]
    for i in range(TM):
        body += [f"r = r0 + int32({i})", "if r < m32:"]
        for j in range(TN):
            body += [f"    col = col0 + int32({j})", "    if col < n32:"]
            body += ["        " + x for x in _store(acc[i][j], split, bias, act)]
    return (f"def {name}(a, b, c, bias, m, n, k, alpha, beta, k_chunk):\n"
            + "\n".join("    " + x for x in body) + "\n")


def launch_bounds(tile: Tile, dtype: str) -> tuple:
    """The kernel's launch bounds: its threads a block and, for the 128x128 tile in float32, two resident
    blocks an SM (which caps it at 128 registers a thread; it fits them without spilling, and an SM then
    holds 16 warps instead of 8). In float64 its accumulators alone take 128 registers."""
    if tile.bm * tile.bn >= 128 * 128 and dtype == "float32":
        return (tile.threads, 2)
    return (tile.threads,)


def kernel_name(tile: Tile, dtype: str, trans_a: bool, trans_b: bool, split: bool = False, bias: bool = False,
                act: int = 0) -> str:
    tail = "_split" if split else ("_bias" if bias else "") + (f"_act{act}" if act else "")
    return f"gemm_{tile.name}_{dtype}_{'t' if trans_a else 'n'}{'t' if trans_b else 'n'}{tail}"


@functools.lru_cache(maxsize=None)
def gemm_kernel(tile: Tile, dtype: str, trans_a: bool, trans_b: bool, split: bool = False, bias: bool = False,
                act: int = 0):
    """The kernel for one variant. Launch: grid (cdiv(n, bn), cdiv(m, bm), splits), block tile.threads.

    kernel(a, b, c, bias, m, n, k, alpha, beta, k_chunk)
      a: op(a) is m x k (a is k x m when trans_a); b: op(b) is k x n (b is n x k when trans_b);
      c: m x n, read only when beta != 0; bias: n values, read when the kernel is built with bias; act:
      the epilogue's activation code (epilogue.ACTIVATIONS), built in (each store inlines it).
      split: c is the workspace (splits x m x n) and receives raw sums; alpha, beta and bias unused (the
      variant with split ignores bias and act: splitk_reduce applies them).
    """
    if split:
        bias, act = False, 0
    name = kernel_name(tile, dtype, trans_a, trans_b, split, bias, act)
    t = DTYPES[dtype]
    scope = {"cuda": cuda, "int32": int32, "u32": uint32, "t": t, "zero": t(0.0), "act_fn": activation(dtype)}
    code = compile(_source(tile, trans_a, trans_b, split, bias, act, name), f"<dnnkit.kernels.gemm:{name}>", "exec")
    exec(code, scope)  # noqa: S102 - the source is generated above from the tile's integers alone
    return kernel(scope[name], launch_bounds=launch_bounds(tile, dtype))


REDUCE_THREADS = 256


@functools.lru_cache(maxsize=None)
def splitk_reduce(dtype: str, bias: bool = False, act: int = 0):
    """c = act(alpha * sum_z ws[z] + beta * c + bias), the slices summed in order; one thread an element.
    Launch: grid cdiv(m * n, REDUCE_THREADS), block REDUCE_THREADS."""
    t = DTYPES[dtype]
    zero = t(0.0)
    act_fn = activation(dtype)

    def reduce(ws, c, bias, m, n, splits, alpha, beta):
        e = int32(cuda.blockIdx.x) * int32(REDUCE_THREADS) + int32(cuda.threadIdx.x)
        n32 = int32(n)
        if e >= int32(m) * n32:
            return
        r = e // n32
        col = e - r * n32
        s = zero
        for z in range(splits):
            s += ws[z, r, col]
        v = alpha * s
        if beta != zero:
            v += beta * c[r, col]
        if has_bias:
            v += bias[col]
        c[r, col] = act_fn(v, act)

    has_bias = bias
    reduce.__name__ = reduce.__qualname__ = f"splitk_reduce_{dtype}{'_bias' if bias else ''}{f'_act{act}' if act else ''}"
    return kernel(reduce, launch_bounds=(REDUCE_THREADS,))
