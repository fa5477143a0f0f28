"""GEMM on the GPU: C := act(alpha * op(A) op(B) + beta * C + bias), float32 and float64.

One kernel per (tile, dtype, trans_a, trans_b, split), built on first use:
- a block computes a BM x BN tile of C; its T = (BM/TM) (BN/TN) threads each hold a TM x TN tile of
  accumulators in registers (2-D register blocking) and run, per step of the depth, TM + TN shared-memory
  loads for TM * TN fused multiply-adds;
- the depth advances BK at a time through two shared-memory buffers, one barrier a step: each thread
  loads its share of step t + 1 from global memory into registers, runs the products of step t (written
  out whole, BK x TM x TN of them), then stores those registers to the other buffer, so that the loads'
  latency passes under the products;
- A's tile is kept depth-major (sA[k][m]) and B's (sB[k][n]), each row padded by 4 elements, the arrays
  16-byte aligned, so that a thread's TM (TN) operands are contiguous and aligned (128-bit shared loads,
  LDS.128) and the transposing stores do not collide in banks;
- global loads are coalesced for either layout of each operand: each thread loads a run of values along
  one row of the operand as stored (_loads), one address and one bounds test for the run inside the
  operand;
- edges: out-of-range operands load as zero, out-of-range outputs are not stored; all trip counts come
  from (m, n, k), never from the grid;
- split: block z of the grid takes the depth range [z * k_chunk, (z + 1) * k_chunk) and stores its raw
  sums to a workspace slice; splitk_reduce sums the slices in order (deterministic) and applies the
  epilogue. For products whose M x N is too small to fill the GPU while K is long.
Index arithmetic is int32 (operands under 2^31 - 256 elements; the algorithm's supports() checks), each
sum cast back to int32 (Numba widens integer arithmetic to 64 bits), and array indices are cast to
unsigned where they are known non-negative, which spares Numba's negative-index wrap.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ._jit import ALIGN16, DTYPES, cuda, int32, kernel, uint32, uint64
from .epilogue import activation


# Elements that pad each depth's row of a shared operand tile: rows stay 16-byte aligned, and a warp's
# stores of the transposing loaders fall in distinct banks.
PAD = 4


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
        return 2 * self.bk * ((self.bm + PAD) + (self.bn + PAD)) * itemsize

    def __post_init__(self):
        t = self.threads
        if self.bm % self.tm or self.bn % self.tn or (self.bm * self.bk) % t or (self.bk * self.bn) % t:
            raise ValueError(f"Tile {self}: the tiles must divide evenly among {t} threads")
        for width in (self.bm, self.bn):  # each thread's loads: one run along the depth or along the rows
            count = width * self.bk // t
            if self.bk % count or width % count:
                raise ValueError(f"Tile {self}: {count} values a thread do not divide the depth step and the rows")

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


def _loads(tile: Tile, operand: str, trans: bool, phase: str, buf: str = "", convert: str = "") -> list[str]:
    """Source lines for one operand's tile of the depth step at k0, each thread's share a run of `count`
    values of one row of the operand as stored (the array's first index fixed, so that their addresses
    differ by constants):
    - depth contiguous (A = a, B = b.T): `count` consecutive depths of one row of the tile;
    - rows contiguous (the transposed cases): one depth, `count` rows `per` apart, where the `per`
      threads of a depth take consecutive rows (each load of a warp coalesced, and its stores to shared
      memory in distinct banks).
    One bounds test for the run where it lies inside the operand, one a value where it does not.
    phase "fetch": the values into registers (va0, va1, ... or vb0, ...), zero outside the operand;
    "put": those registers into shared buffer buf (depth-major: sA[buf, depth, row]), through the function
    named by convert where one is."""
    BM, BN, BK, T = tile.bm, tile.bn, tile.bk, tile.threads
    if operand == "a":
        width, arr, lim, base, src, contiguous_k = BM, "sA", "m32", "bm", "a", not trans
    else:
        width, arr, lim, base, src, contiguous_k = BN, "sB", "n32", "bn", "b", trans
    count = width * BK // T
    vs = [f"v{operand}{l}" for l in range(count)]
    if contiguous_k:
        per = BK // count
        lines = [f"mn = tid // int32({per})", f"kk = (tid % int32({per})) * int32({count})"]
        shared = [(f"u32(kk + int32({l}))", "u32(mn)") for l in range(count)]
        fixed, run, run_lim, stride = ("g", lim), "gk", "kend", 1
    else:
        per = width // count
        lines = [f"kk = tid // int32({per})", f"mn = tid % int32({per})"]
        shared = [("u32(kk)", f"u32(mn + int32({per * l}))") for l in range(count)]
        fixed, run, run_lim, stride = ("gk", "kend"), "g", lim, per
    if phase == "put":
        return lines + [f"{arr}[{buf}, {i}, {j}] = {f'{convert}({v})' if convert else v}"
                        for (i, j), v in zip(shared, vs)]
    lines += [f"g = int32({base} + mn)", "gk = int32(k0 + kk)", " = ".join(vs) + " = zero",
              f"if {fixed[0]} < {fixed[1]}:", f"    row = {src}[u32({fixed[0]})]", f"    ru = u64({run})",
              f"    if int32({run} + int32({stride * (count - 1)})) < {run_lim}:"]
    lines += [f"        {v} = row[ru + u64({stride * l})]" for l, v in enumerate(vs)]
    lines += ["    else:"]
    for l, v in enumerate(vs):
        lines += [f"        if int32({run} + int32({stride * l})) < {run_lim}:",
                  f"            {v} = row[ru + u64({stride * l})]"]
    return lines


def _store(value: str, split: bool, bias: bool, act: int, r: str = "u32(r)", col: str = "u32(col)",
           bias_value: str = "", read_c: str = "beta != zero") -> list[str]:
    """Source lines that store one accumulator at (r, col), inside C: the epilogue act(alpha * v + beta *
    c + bias), c not read unless read_c (beta != 0); or, for a split, the raw sum into the workspace slice
    z. bias_value: the column's bias where the caller has loaded it (else bias[col])."""
    if split:
        return [f"c[z, {r}, {col}] = {value}"]
    lines = [f"v = alpha * {value}", f"if {read_c}:", f"    v += beta * c[{r}, {col}]"]
    lines += [f"v += {bias_value or f'bias[{col}]'}"] if bias else []
    return lines + [f"c[{r}, {col}] = v" if act == 0 else f"c[{r}, {col}] = act_fn(v, {act})"]


def _source(tile: Tile, trans_a: bool, trans_b: bool, split: bool, bias: bool, act: int, name: str) -> str:
    """The kernel's Python source: the depth step's products and a thread's loads written out and its
    accumulators scalars (Numba has no unroll pragma, and a local array indexed in a loop it keeps lives
    in local memory). Written out, the shared loads take constant offsets and no loop counter runs
    inside the step (NVVM unrolls a loop of the 128x128 tile's 64 products a depth only in part)."""
    BM, BN, BK, TM, TN = tile.bm, tile.bn, tile.bk, tile.tm, tile.tn
    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    ind = lambda lines, n: ["    " * n + x for x in lines]  # noqa: E731
    body = [
        "sA = cuda.shared.array((2, %d, %d), t%s)" % (BK, BM + PAD, ALIGN16),
        "sB = cuda.shared.array((2, %d, %d), t%s)" % (BK, BN + PAD, ALIGN16),
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
    body += (_loads(tile, "a", trans_a, "fetch") + _loads(tile, "b", trans_b, "fetch")
             + _loads(tile, "a", trans_a, "put", "0") + _loads(tile, "b", trans_b, "put", "0"))
    body += ["cuda.syncthreads()",
             f"ra = ty * int32({TM})", f"rb = tx * int32({TN})", "rau = u32(ra)", "rbu = u32(rb)",
             # the shared loads' indices, computed once (the fewer temporaries, the faster Numba compiles)
             *[f"d{kk} = u32({kk})" for kk in range(BK)], *[f"ra{i} = rau + u32({i})" for i in range(TM)],
             *[f"rb{j} = rbu + u32({j})" for j in range(TN)], "fma = cuda.fma",
             "for s in range(steps):",
             "    cur = s & 1",
             "    curu = u32(cur)",
             f"    k0 = int32(kbeg + int32(s + 1) * int32({BK}))"]
    body += ind(_loads(tile, "a", trans_a, "fetch") + _loads(tile, "b", trans_b, "fetch"), 1)
    for kk in range(BK):
        body += ind([f"a{kk}_{i} = sA[curu, d{kk}, ra{i}]" for i in range(TM)]
                    + [f"b{kk}_{j} = sB[curu, d{kk}, rb{j}]" for j in range(TN)]
                    + [f"{acc[i][j]} = fma(a{kk}_{i}, b{kk}_{j}, {acc[i][j]})"
                       for i in range(TM) for j in range(TN)], 1)
    body += ["    nxt = curu ^ u32(1)"]
    body += ind(_loads(tile, "a", trans_a, "put", "nxt") + _loads(tile, "b", trans_b, "put", "nxt"), 1)
    body += ["    cuda.syncthreads()", "r0 = bm + ra", "col0 = bn + rb", "read_c = beta != zero"]
    if split:
        body += ["z = cuda.blockIdx.z"]
    # A thread's columns, their bounds tests and biases once, then its rows.
    for j in range(TN):
        body += [f"col{j} = int32(col0 + int32({j}))", f"cu{j} = u32(col{j})", f"ok{j} = col{j} < n32"]
        body += [f"bias{j} = zero", f"if ok{j}:", f"    bias{j} = bias[cu{j}]"] if bias and not split else []
    for i in range(TM):
        body += [f"r = int32(r0 + int32({i}))", "if r < m32:", "    ru = u32(r)"]
        for j in range(TN):
            body += [f"    if ok{j}:"]
            body += ["        " + x for x in _store(acc[i][j], split, bias, act, "ru", f"cu{j}", f"bias{j}", "read_c")]
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
    scope = {"cuda": cuda, "int32": int32, "u32": uint32, "u64": uint64, "t": t, "zero": t(0.0),
             "act_fn": activation(dtype)}
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
