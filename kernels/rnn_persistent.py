"""A persistent recurrent kernel: one launch runs every step of a layer-direction's time loop, each block
holding its share of W_hh in shared memory from the first step to the last (Diamos et al., "Persistent
RNNs", 2016), so the recurrent weights are read from DRAM once a sequence instead of once a step, and no
step pays a launch.

Block z of the grid owns hidden units [z U, z U + U) and, of W_hh, the G U rows of their gates (row
q U + u: gate q of unit u), all H columns, kept in shared memory with an odd row stride (a warp's lanes
read different rows at the same depth without bank conflicts). A step, per tile of BT batch rows:
  - h_{t-1} is staged in shared memory KC columns at a time, depth-major (a depth's BT values in one
    aligned row: 128-bit loads); warp w of the 8 takes depth KC/8 of each
    chunk, lane l the rows l, l + 32, ... (RT of them): RT x BT accumulators in registers, RT + BT
    shared loads (the BT of h broadcast to the warp) for RT x BT fused multiply-adds;
  - the 8 warps' partial sums meet in shared memory and are added in warp order (deterministic);
  - one pass does the gates of the block's units (kernels/rnn.py's formulas, torch's gate order):
    the input projection's row (computed for all steps before the launch, b_ih in it), b_hh, the
    nonlinearities, the cell state (the block's own units: it never leaves the block's threads), and
    writes h_t to the output, to the training save, and to hseq[s], the step's own row of a workspace.
Between steps the grid meets at a barrier (a counter in global memory: each block's thread 0 fences its
block's writes, adds one, and waits until every block has). h_{t-1} is read from hseq[s - 1]: a region no
block has read before, so no SM's L1 can hold a stale copy of it; rows of hseq start 128-byte aligned.
The blocks must all be resident at once: the grid is at most one block an SM (algos/rnn_cuda.py sizes
it from the device). A launch runs steps [t0, t1): with t1 = t0 + 1 the grid needs no barrier at all,
which is how the simulator (one block at a time) runs a grid of several blocks.
"""
from __future__ import annotations

import functools

from ._jit import ALIGN16, DTYPES, cuda, int32, kernel, math, uint32
from .rnn import _sigmoid

THREADS = 256
WARPS = THREADS // 32
KC = 128          # depth of h_{t-1} staged a chunk (KC / WARPS a warp)
KW = KC // WARPS
UNROLL = 4        # depth steps written out in the loop's body
MAX_RT = 4        # rows a lane: a block holds at most 32 * MAX_RT rows of W_hh
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
SAVED = {"lstm": 5, "gru": 4, "rnn_tanh": 0, "rnn_relu": 0}
ALIGN_BYTES = 128


def batch_tile(batch: int) -> int:
    """Batch rows a pass (BT): the power of two at or above the batch, at most 8."""
    bt = 1
    while bt < min(batch, 8):
        bt *= 2
    return bt


def stride(hidden: int) -> int:
    """W_hh's row stride in shared memory: whole chunks of KC (zeros past H, so that every chunk's loop
    runs its full count), plus one: odd, so the lanes' rows fall in different banks."""
    return -(-hidden // KC) * KC + 1


def shared_elems(rows: int, hidden: int, rt: int, bt: int) -> int:
    """Dynamic shared memory a block takes, in elements: its W_hh rows, the warps' partial sums and the
    reduced products (the staged h chunk, KC x bt, is a static array beside them)."""
    return rows * stride(hidden) + WARPS * 32 * rt * bt + 32 * rt * bt


def static_elems(bt: int) -> int:
    return KC * bt


def hseq_row(batch: int, hidden: int, itemsize: int) -> int:
    """Elements a row of hseq holds: B H, rounded up to whole 128-byte lines."""
    per = ALIGN_BYTES // itemsize
    return -(-batch * hidden // per) * per


def _gate_lines(mode: str, train: bool) -> list[str]:
    """The gate pass of one (unit j, batch row b): the gates' pre-activations, the state update, the stores."""
    pre = lambda q: f"sh[pre_off + ({q} * U32 + u) * int32(BT) + bb]"  # noqa: E731
    gx = lambda q: f"gx[u32(grow), u32({q} * H32 + j)]"  # noqa: E731
    bias = lambda q: f"bias[u32({q} * H32 + j)]"  # noqa: E731
    ysto = ["if bf != 0:", "    y[u32(b), u32(ti), u32(col + j)] = hn", "else:",
            "    y[u32(ti), u32(b), u32(col + j)] = hn",
            "hseq[u32(s), u32(b * H32 + j)] = hn"]
    if mode == "lstm":
        lines = [f"ig = sig({gx(0)} + {pre(0)} + {bias(0)})",
                 f"fg = sig({gx(1)} + {pre(1)} + {bias(1)})",
                 f"gg = math.tanh({gx(2)} + {pre(2)} + {bias(2)})",
                 f"og = sig({gx(3)} + {pre(3)} + {bias(3)})",
                 "cn = fg * c[u32(b), u32(j)] + ig * gg",
                 "c[u32(b), u32(j)] = cn",
                 "hn = og * math.tanh(cn)"]
        saved = ["ig", "fg", "gg", "og", "cn"]
    elif mode == "gru":
        lines = [f"rg = sig({gx(0)} + {pre(0)} + {bias(0)})",
                 f"zg = sig({gx(1)} + {pre(1)} + {bias(1)})",
                 f"hng = {pre(2)} + {bias(2)}",
                 f"ng = math.tanh({gx(2)} + rg * hng)",
                 "hp = h0[u32(b), u32(j)] if s == t_first else hseq[u32(s - 1), u32(b * H32 + j)]",
                 "hn = (one - zg) * ng + zg * hp"]
        saved = ["rg", "zg", "ng", "hng"]
    else:
        lines = [f"v = {gx(0)} + {pre(0)} + {bias(0)}"]
        lines += ["hn = zero if v < zero else v"] if mode == "rnn_relu" else ["hn = math.tanh(v)"]
        saved = []
    lines += ysto
    if train:
        lines += [f"save[u32(ti), u32(b), u32({q} * H32 + j)] = {name}" for q, name in enumerate(saved)]
    return lines


def _source(mode: str, rt: int, bt: int, train: bool, name: str) -> str:
    G = GATES[mode]
    acc = [[f"a{i}_{j}" for j in range(bt)] for i in range(rt)]
    ind = lambda lines, n: ["    " * n + x for x in lines]  # noqa: E731
    body = [
        "sh = cuda.shared.array(0, t)",
        f"hs = cuda.shared.array(({KC}, {bt}), t{ALIGN16})",
        "tid = int32(cuda.threadIdx.x)",
        "lane = tid % int32(32)",
        "warp = tid // int32(32)",
        "nb = uint32(cuda.gridDim.x)",
        "B32 = int32(B)", "H32 = int32(H)", "U32 = int32(U)", "T32 = int32(T)",
        f"HS = (H32 + int32({KC - 1})) // int32({KC}) * int32({KC}) + int32(1)",
        "j0 = int32(cuda.blockIdx.x) * U32",
        f"R = int32({G}) * U32",
        f"RP = int32({32 * rt})",
        "red_off = R * HS",
        "pre_off = red_off + int32(WARPS) * RP * int32(BT)",
        # W_hh's rows of this block's units, once for every step (rows of units past H, and columns past
        # it, are zeros)
        "for e in range(tid, R * HS, int32(THREADS)):",
        "    r = e // HS",
        "    k = e - r * HS",
        "    q = r // U32",
        "    jr = j0 + (r - q * U32)",
        "    v = zero",
        "    if jr < H32 and k < H32:",
        "        v = whh[u32(q * H32 + jr), u32(k)]",
        "    sh[u32(r * HS + k)] = v",
    ]
    # a lane's rows; lanes past the block's rows repeat its last row (their sums are never read)
    body += [f"w{i} = u32(min(lane + int32({32 * i}), R - int32(1)) * HS)" for i in range(rt)]
    body += ["kb = u32(warp * int32(KW))",
             "cuda.syncthreads()",
             "for s in range(t0, t1):",
             "    ti = T32 - int32(1) - int32(s) if reverse != 0 else int32(s)",
             "    for b0 in range(int32(0), B32, int32(BT)):"]
    tile = [" = ".join(x for row in acc for x in row) + " = zero",
            "for kc in range(int32(0), H32, int32(KC)):"]
    stage = ["for e in range(tid, int32(BT * KC), int32(THREADS)):",
             "    bq = e // int32(KC)",
             "    kq = e - bq * int32(KC)",
             "    b = b0 + bq",
             "    k = kc + kq",
             "    v = zero",
             "    if b < B32 and k < H32:",
             "        if s == t_first:",
             "            v = h0[u32(b), u32(k)]",
             "        else:",
             "            v = hseq[u32(s - 1), u32(b * H32 + k)]",
             "    hs[u32(kq), u32(bq)] = v",
             "cuda.syncthreads()",
             "kg = u32(kc) + kb",
             f"for kk in range(int32(0), int32(KW), int32({UNROLL})):",
             "    ku = kb + u32(kk)",
             "    kw = kg + u32(kk)"]
    inner = []
    for d in range(UNROLL):  # written out: Numba's loops keep 64-bit trip counts NVVM does not remove
        inner += [f"x{i} = sh[w{i} + kw + u32({d})]" for i in range(rt)]
        inner += [f"hv{j} = hs[ku + u32({d}), u32({j})]" for j in range(bt)]
        inner += [f"{acc[i][j]} = cuda.fma(x{i}, hv{j}, {acc[i][j]})" for i in range(rt) for j in range(bt)]
    stage += ind(inner, 1) + ["cuda.syncthreads()"]
    tile += ind(stage, 1)
    # the warps' partial sums, then their ordered sum: pre[row][bb]
    tile += [f"sh[u32(red_off + (warp * RP + lane + int32({32 * i})) * int32(BT) + int32({j}))] = {acc[i][j]}"
             for i in range(rt) for j in range(bt)]
    tile += ["cuda.syncthreads()",
             "for o in range(tid, R * int32(BT), int32(THREADS)):",
             "    v = zero",
             "    for w in range(WARPS):",
             "        v += sh[u32(red_off + int32(w) * RP * int32(BT) + o)]",
             "    sh[u32(pre_off + o)] = v",
             "cuda.syncthreads()",
             "for e in range(tid, U32 * int32(BT), int32(THREADS)):",
             "    bb = e // U32",
             "    u = e - bb * U32",
             "    j = j0 + u",
             "    b = b0 + bb",
             "    if j < H32 and b < B32:",
             "        grow = b * T32 + ti if bf != 0 else ti * B32 + b"]
    tile += ind(_gate_lines(mode, train), 2)
    tile += ["cuda.syncthreads()"]
    body += ind(tile, 2)
    # the grid barrier between steps
    body += ["    if s + 1 < t1:",
             "        if tid == 0:",
             "            cuda.threadfence()",
             "            cuda.atomic.add(counter, 0, uint32(1))",
             "            target = nb * uint32(s + 1 - t_first)",
             "            while cuda.atomic.add(counter, 0, uint32(0)) < target:",
             "                pass",
             "            cuda.threadfence()",
             "        cuda.syncthreads()"]
    return (f"def {name}(gx, whh, bias, h0, c, y, save, hseq, counter, B, H, U, T, col, reverse, bf, t0, t1):\n"
            "    t_first = t0\n"
            + "\n".join("    " + x for x in body) + "\n")


def kernel_name(mode: str, dtype: str, rt: int, bt: int, train: bool) -> str:
    return f"rnn_persistent_{mode}_{dtype}_r{rt}_b{bt}{'_train' if train else ''}"


@functools.lru_cache(maxsize=None)
def persistent_kernel(mode: str, dtype: str, rt: int, bt: int, train: bool = False):
    """The kernel for one (mode, dtype, rows a lane, batch tile, training). Launch: grid the blocks (each
    owning U units), block THREADS, dynamic shared memory shared_elems(G U, H, rt, bt) elements.

    kernel(gx, whh, bias, h0, c, y, save, hseq, counter, B, H, U, T, col, reverse, bf, t0, t1)
      gx: (T B, G H) the input projections with b_ih, row t B + b (bf: b T + t); whh: (G H, H); bias:
      b_hh (G H) (zeros without biases); h0: (B, H) h_{-1}; c: (B, H) the LSTM cell state, updated in
      place (other modes: not touched); y: (T, B, .) (bf: (B, T, .)) receives h_t in columns [col, col
      + H); save: (T, B, n H) receives what the backward reads (train); hseq: (T, hseq_row) workspace;
      counter: uint32 (1,), zero at launch; steps [t0, t1) of the loop (reverse: step s is time T-1-s);
      h_{t0 - 1} is h0 (the launch of step 0, or the caller's copy of the step before).
    """
    if not 1 <= rt <= MAX_RT or bt not in (1, 2, 4, 8):
        raise ValueError(f"persistent_kernel: rows a lane {rt} or batch tile {bt} out of range")
    name = kernel_name(mode, dtype, rt, bt, train)
    t = DTYPES[dtype]
    scope = {"cuda": cuda, "int32": int32, "u32": uint32, "uint32": uint32, "t": t, "zero": t(0.0),
             "one": t(1.0), "math": math, "sig": _sigmoid(dtype), "BT": bt, "KC": KC, "KW": KW,
             "WARPS": WARPS, "THREADS": THREADS, "min": min}
    code = compile(_source(mode, rt, bt, train, name), f"<dnnkit.kernels.rnn_persistent:{name}>", "exec")
    exec(code, scope)  # noqa: S102 - the source is generated above from integers and the mode's formulas
    return kernel(scope[name], launch_bounds=(THREADS, 1))
