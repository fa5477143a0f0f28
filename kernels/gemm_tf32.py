"""GEMM on the tensor cores in TF32: C := act(alpha * op(A) op(B) + beta * C + bias), float32 in and out.

The operands are rounded to TF32 (10 explicit mantissa bits, cvt.rna: to nearest, ties away from zero)
and multiplied by mma.sync.m16n8k8 (SASS HMMA.1688.F32.TF32), accumulating in float32. A block computes a
128x128 tile of C with 8 warps, each a 64x32 part of it as 4 x 4 tiles of 16x8, 64 accumulators a lane:
each A fragment a lane loads from shared memory feeds 4 mma's, each B fragment 4 (the fragments' loads,
not the tensor cores, bound a warp tile that is smaller). The depth advances 16 at a time through two
shared-memory buffers (gemm.py's loaders and their order: the next step's global loads before the
products, their stores after; rows padded by 8 so that a warp's fragment loads fall in 32 distinct
banks); the operands are rounded to TF32 as they are stored there. Fragments follow the PTX ISA's layout for
m16n8k8 .tf32 (lane = 4 * group + t):
  A (16 x 8, row): a0 (group, t), a1 (group + 8, t), a2 (group, t + 4), a3 (group + 8, t + 4)
  B (8 x 8, col):  b0 (t, group), b1 (t + 4, group)
  C (16 x 8):      c0 (group, 2t), c1 (group, 2t + 1), c2 (group + 8, 2t), c3 (group + 8, 2t + 1)
Under the CUDA simulator the mma is a stand-in with the same fragment layout and rounding: the warp's
lanes pass their fragments through shared memory, and each lane computes its four sums from them.
"""
from __future__ import annotations

import functools

import numpy as np

from ._jit import ALIGN16, DTYPES, SIMULATOR, cuda, int32, kernel, uint32, uint64
from .epilogue import activation
from .gemm import Tile, _loads, _store

TILE = Tile(128, 128, 16, 8, 8)  # the block's tile of C and the loaders' geometry: 256 threads (8 warps)
WARPS_N = 4                      # warps across the tile's columns, and 2 down its rows
WM, WN = TILE.bm // (TILE.threads // 32 // WARPS_N), TILE.bn // WARPS_N  # a warp's tile of C: 64 x 32
MI, NI = WM // 16, WN // 8       # its m16n8 mma tiles: 4 x 4, 64 accumulators a lane
# Elements that pad each depth's row of a shared tile: a row 8 banks from the last, so that a warp's
# fragment loads (4 depths x 8 rows) fall in 32 distinct banks.
PAD = 8
# One resident block an SM (8 warps): a thread takes about 150 registers. Two blocks would cap it at 128,
# which sm_80's code exceeds by a spilled register.
LAUNCH_BOUNDS = (TILE.threads,)


def _mma_hardware():
    """(mma_tf32, to_tf32): the mma.sync of operands already in TF32, and the rounding of a float32 to
    TF32 (cvt.rna.tf32.f32, the result's low 13 bits zero), applied once a value as it enters shared
    memory rather than at each of the mma's that read it."""
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def to_tf32(typingctx, x):
        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            cvt = ir.InlineAsm(ir.FunctionType(i32, [f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.bitcast(builder.call(cvt, [args[0]]), f32)

        return types.float32(types.float32), codegen

    @intrinsic
    def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        f = types.float32
        sig = types.UniTuple(f, 4)(f, f, f, f, f, f, f, f, f, f)

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            ops = [builder.bitcast(v, i32) for v in args[:6]]
            asm = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, "
                   "{$8, $9}, {$10, $11, $12, $13};")
            fn = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4), asm,
                              "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3")
            res = builder.call(fn, ops + list(args[6:]))
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen

    return mma_tf32, to_tf32


def tf32(x) -> np.float32:
    """x rounded to TF32 as cvt.rna.tf32.f32 does (nearest, ties away from zero; NaN and Inf kept)."""
    bits = np.array(x, np.float32).view(np.uint32)
    if (bits & 0x7F800000) == 0x7F800000:
        return np.float32(x)
    return np.array((int(bits) + 0x1000) & 0xFFFFE000, np.uint32).view(np.float32)[()]


def mma_simulated(xa, xb, warp, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """The simulator's mma.sync: the warp's fragments exchanged through shared memory (xa, xb), each lane's
    four sums of TF32 products accumulated in float32. Every lane of the block calls it together."""
    xa[warp, lane, 0], xa[warp, lane, 1], xa[warp, lane, 2], xa[warp, lane, 3] = a0, a1, a2, a3
    xb[warp, lane, 0], xb[warp, lane, 1] = b0, b1
    cuda.syncthreads()
    g, t = lane // 4, lane % 4
    out = []
    for row, col, acc in ((g, 2 * t, c0), (g, 2 * t + 1, c1), (g + 8, 2 * t, c2), (g + 8, 2 * t + 1, c3)):
        s = np.float32(acc)
        for k in range(8):
            a = xa[warp, (row % 8) * 4 + k % 4, (1 if row >= 8 else 0) + (2 if k >= 4 else 0)]
            b = xb[warp, col * 4 + k % 4, 1 if k >= 4 else 0]
            s = np.float32(s + np.float32(tf32(a) * tf32(b)))
        out.append(s)
    cuda.syncthreads()
    return out[0], out[1], out[2], out[3]


def kernel_name(trans_a: bool, trans_b: bool, bias: bool = False, act: int = 0) -> str:
    return (f"gemm_tf32_{TILE.bm}x{TILE.bn}_{'t' if trans_a else 'n'}{'t' if trans_b else 'n'}"
            f"{'_bias' if bias else ''}{f'_act{act}' if act else ''}")


def _source(trans_a: bool, trans_b: bool, bias: bool, act: int, name: str) -> str:
    BM, BN, BK, T = TILE.bm, TILE.bn, TILE.bk, TILE.threads
    acc = {(mi, ni): [f"c{mi}_{ni}_{q}" for q in range(4)] for mi in range(MI) for ni in range(NI)}
    body = [
        "sA = cuda.shared.array((2, %d, %d), t%s)" % (BK, BM + PAD, ALIGN16),
        "sB = cuda.shared.array((2, %d, %d), t%s)" % (BK, BN + PAD, ALIGN16),
        "tid = int32(cuda.threadIdx.x)",
        "lane = tid % int32(32)", "warp = tid // int32(32)", "gq = lane // int32(4)", "tq = lane % int32(4)",
        f"wm = (warp // int32({WARPS_N})) * int32({WM})", f"wn = (warp % int32({WARPS_N})) * int32({WN})",
        f"bm = int32(cuda.blockIdx.y) * int32({BM})", f"bn = int32(cuda.blockIdx.x) * int32({BN})",
        "m32 = int32(m)", "n32 = int32(n)", "kbeg = int32(0)", "kend = int32(k)",
        " = ".join(x for v in acc.values() for x in v) + " = zero",
        f"steps = int32((kend - kbeg + int32({BK - 1})) // int32({BK}))", "k0 = kbeg",
    ]
    if SIMULATOR:
        body += [f"xa = cuda.shared.array(({T // 32}, 32, 4), t)", f"xb = cuda.shared.array(({T // 32}, 32, 2), t)"]
    cv = "" if SIMULATOR else "to_tf32"  # the simulator's mma rounds its operands itself
    body += (_loads(TILE, "a", trans_a, "fetch") + _loads(TILE, "b", trans_b, "fetch")
             + _loads(TILE, "a", trans_a, "put", "0", cv) + _loads(TILE, "b", trans_b, "put", "0", cv))
    # The fragments' shared-memory indices: this lane's first depth, A row and B column, to which each
    # fragment adds a constant. In 64 bits, so that the constants become the loads' address offsets.
    body += ["tq64 = u64(tq)", "ar64 = u64(wm + gq)", "bc64 = u64(wn + gq)"]
    body += ["cuda.syncthreads()",
             "s = int32(0)",
             "while s < steps:",
             "    cur64 = u64(s & int32(1))",
             "    s = int32(s + int32(1))",
             f"    k0 = int32(kbeg + s * int32({BK}))"]
    body += ["    " + x for x in _loads(TILE, "a", trans_a, "fetch") + _loads(TILE, "b", trans_b, "fetch")]
    call = "mma_simulated(xa, xb, warp, lane, " if SIMULATOR else "mma_tf32("
    for kq in range(BK // 8):
        inner = []
        lo, hi = f"tq64 + u64({kq * 8})", f"tq64 + u64({kq * 8 + 4})"
        # B's fragments, then A's a row of mma tiles at a time (fewer fragments live at once).
        for ni in range(NI):
            col = f"bc64 + u64({ni * 8})"
            inner += [f"b{kq}_{ni}_0 = sB[cur64, {lo}, {col}]", f"b{kq}_{ni}_1 = sB[cur64, {hi}, {col}]"]
        for mi in range(MI):
            r0, r8 = f"ar64 + u64({mi * 16})", f"ar64 + u64({mi * 16 + 8})"
            inner += [f"a{kq}_{mi}_0 = sA[cur64, {lo}, {r0}]", f"a{kq}_{mi}_1 = sA[cur64, {lo}, {r8}]",
                      f"a{kq}_{mi}_2 = sA[cur64, {hi}, {r0}]", f"a{kq}_{mi}_3 = sA[cur64, {hi}, {r8}]"]
            for ni in range(NI):
                cs = acc[mi, ni]
                frags = ", ".join([f"a{kq}_{mi}_{x}" for x in range(4)] + [f"b{kq}_{ni}_{x}" for x in range(2)])
                inner += [f"{', '.join(cs)} = {call}{frags}, {', '.join(cs)})"]
        body += ["    " + x for x in inner]
    body += ["    nxt = cur64 ^ u64(1)"]
    body += ["    " + x for x in (_loads(TILE, "a", trans_a, "put", "nxt", cv)
                                  + _loads(TILE, "b", trans_b, "put", "nxt", cv))]
    body += ["    cuda.syncthreads()"]
    for (mi, ni), cs in acc.items():
        for q, cname in enumerate(cs):
            body += [f"r = bm + wm + int32({mi * 16 + (8 if q >= 2 else 0)}) + gq",
                     f"col = bn + wn + int32({ni * 8 + (q & 1)}) + int32(2) * tq",
                     "if r < m32 and col < n32:"]
            body += ["    " + x for x in _store(cname, False, bias, act)]
    return (f"def {name}(a, b, c, bias, m, n, k, alpha, beta, k_chunk):\n"
            + "\n".join("    " + x for x in body) + "\n")


@functools.lru_cache(maxsize=None)
def gemm_tf32_kernel(trans_a: bool, trans_b: bool, bias: bool = False, act: int = 0):
    """The kernel for one layout and epilogue; arguments as gemm.gemm_kernel's (float32 only, k_chunk
    unused). Launch: grid (cdiv(n, TILE.bn), cdiv(m, TILE.bm)), block TILE.threads (256)."""
    name = kernel_name(trans_a, trans_b, bias, act)
    t = DTYPES["float32"]
    scope = {"cuda": cuda, "int32": int32, "u32": uint32, "u64": uint64, "t": t, "zero": t(0.0),
             "act_fn": activation("float32")}
    if SIMULATOR:
        scope["mma_simulated"] = cuda.jit(device=True)(mma_simulated)
    else:
        scope["mma_tf32"], scope["to_tf32"] = _mma_hardware()
    code = compile(_source(trans_a, trans_b, bias, act, name), f"<dnnkit.kernels.gemm_tf32:{name}>", "exec")
    exec(code, scope)  # noqa: S102 - the source is generated above from constants alone
    return kernel(scope[name], launch_bounds=LAUNCH_BOUNDS)

