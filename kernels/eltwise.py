"""Element-wise and reduction kernels of the fully-connected layers' backward pass.

multiply: out = x * y (dropout's masks); activation_forward: y = act(z); activation_backward: grad_z = grad_y * act'(z) from z or the output y (epilogue.activation_grad), one
thread an element, grid-stride.
column_sums: out[j] (+)= sum_i x[i, j], summed in float64 and rounded once, as the CPU does: a block
takes 32 columns; its 8 warps' lanes each sum a strided share of the rows of one column (reads coalesced
along the row), and the 8 partial sums of a column are added in shared memory in a fixed order, so the
result does not depend on timing.
Blocks narrower than these where one block covers the whole array (threads(), sum_block()): no thread of a
lone block lies past the array, and the kernels' index arithmetic with the full sizes holds.
"""
from __future__ import annotations

import functools

from ._jit import DTYPES, cuda, int32, kernel
from .epilogue import activation, activation_grad

ELTWISE_THREADS = 256
SUM_COLUMNS = 32
SUM_ROWS = 8


def threads(total: int) -> int:
    """The threads of a block of the grid-stride kernels over `total` elements."""
    return max(1, min(ELTWISE_THREADS, total))


def sum_block(m: int, n: int) -> tuple:
    """The block of column_sums over an m x n array."""
    return (max(1, min(SUM_COLUMNS, n)), max(1, min(SUM_ROWS, m)))


@functools.lru_cache(maxsize=None)
def activation_backward(dtype: str, act: int, v_is_z: bool):
    """kernel(grad_y, v, grad_z, m, n): grad_z = grad_y * act'(.) over m x n arrays; v is z (v_is_z) or y.
    Launch: any grid of ELTWISE_THREADS-thread blocks (grid-stride)."""
    grad = activation_grad(dtype)

    def act_bwd(gy, v, gz, m, n):
        n32 = int32(n)
        total = int32(m) * n32
        e = int32(cuda.blockIdx.x) * int32(ELTWISE_THREADS) + int32(cuda.threadIdx.x)
        step = int32(cuda.gridDim.x) * int32(ELTWISE_THREADS)
        while e < total:
            r = e // n32
            c = e - r * n32
            gz[r, c] = grad(gy[r, c], v[r, c], act, v_is_z)
            e += step

    act_bwd.__name__ = act_bwd.__qualname__ = f"activation_backward_{dtype}_act{act}_{'z' if v_is_z else 'y'}"
    return kernel(act_bwd, launch_bounds=(ELTWISE_THREADS,))


@functools.lru_cache(maxsize=None)
def column_sums(dtype: str, accumulate: bool):
    """kernel(x, out, m, n): out[j] = sum_i x[i, j] (accumulate: out[j] += it). Launch: grid
    cdiv(n, SUM_COLUMNS), block sum_block(m, n)."""
    f64 = DTYPES["float64"]
    t = DTYPES[dtype]

    def colsum(x, out, m, n):
        part = cuda.shared.array((SUM_ROWS, SUM_COLUMNS), f64)
        lane = int32(cuda.threadIdx.x)
        row = int32(cuda.threadIdx.y)
        col = int32(cuda.blockIdx.x) * int32(SUM_COLUMNS) + lane
        s = f64(0.0)
        if col < int32(n):
            i = row
            while i < int32(m):
                s += f64(x[i, col])
                i += int32(SUM_ROWS)
        part[row, lane] = s
        cuda.syncthreads()
        if row == 0 and col < int32(n):
            total = part[0, lane]
            for r in range(1, int32(cuda.blockDim.y)):
                total += part[r, lane]
            if accumulate:
                total += f64(out[col])
            out[col] = t(total)

    colsum.__name__ = colsum.__qualname__ = f"column_sums_{dtype}{'_acc' if accumulate else ''}"
    return kernel(colsum, launch_bounds=(SUM_COLUMNS * SUM_ROWS,))


@functools.lru_cache(maxsize=None)
def activation_forward(dtype: str, act: int):
    """kernel(z, y, m, n): y = act(z) over m x n arrays. Launch: any grid of ELTWISE_THREADS-thread blocks."""
    fn = activation(dtype)

    def act_fwd(z, y, m, n):
        n32 = int32(n)
        total = int32(m) * n32
        e = int32(cuda.blockIdx.x) * int32(ELTWISE_THREADS) + int32(cuda.threadIdx.x)
        step = int32(cuda.gridDim.x) * int32(ELTWISE_THREADS)
        while e < total:
            r = e // n32
            c = e - r * n32
            y[r, c] = fn(z[r, c], act)
            e += step

    act_fwd.__name__ = act_fwd.__qualname__ = f"activation_forward_{dtype}_act{act}"
    return kernel(act_fwd, launch_bounds=(ELTWISE_THREADS,))


@functools.lru_cache(maxsize=None)
def multiply(dtype: str):
    """kernel(x, y, out, n): out = x * y over n elements of 1-D arrays (dropout's masks). Launch: any grid of
    ELTWISE_THREADS-thread blocks (grid-stride)."""
    def mul(x, y, out, n):
        e = int32(cuda.blockIdx.x) * int32(ELTWISE_THREADS) + int32(cuda.threadIdx.x)
        step = int32(cuda.gridDim.x) * int32(ELTWISE_THREADS)
        while e < int32(n):
            out[e] = x[e] * y[e]
            e += step

    mul.__name__ = mul.__qualname__ = f"multiply_{dtype}"
    return kernel(mul, launch_bounds=(ELTWISE_THREADS,))
