"""The element-wise half of an RNN step on the GPU: one kernel a step does the whole gate pass (every gate's
nonlinearity, the cell update, the new hidden state), one thread a (batch row, hidden unit).

The products are GEMMs (kernels/gemm.py): the input projection of all steps at once before the time
loop, and per step the recurrent product h_{t-1} W_hh^T, added into the step's rows of the projection
(LSTM, RNN: the gate pre-activations arrive summed, both biases in them) or kept apart (GRU: r scales
the recurrent part of the n gate, W_hn h + b_hn). Gate order and formulas are torch.nn.LSTM / GRU / RNN's:
  LSTM (i, f, g, o): c' = s(f) c + s(i) tanh(g), h' = s(o) tanh(c')
  GRU (r, z, n):     r = s(x_r + h_r), z = s(x_z + h_z), n = tanh(x_n + r h_n), h' = (1 - z) n + z h
  RNN:               h' = tanh(pre) or relu(pre)
Arguments are 2-D arrays of any row stride (a step's rows of the projection, a slice of the output), so
no step copies anything. Launch: step_grid(rows, columns), the kernel's last two arguments.
"""
from __future__ import annotations

import functools

from ._jit import DTYPES, cdiv, cuda, device, int32, kernel, math

STEP_X = 32   # hidden units a block: a warp's loads of a gate row are contiguous
STEP_Y = 8    # batch rows a block


def step_grid(rows: int, cols: int) -> tuple:
    """(grid, block) of an element-wise kernel over rows x cols, a thread an element: blocks of STEP_X x
    STEP_Y threads, narrower or shorter where one block covers the whole width or height, so that no
    block holds threads past the array in a dimension it spans alone. unit()'s arithmetic with the full
    STEP_X and STEP_Y holds for either (a shrunk dimension has one block)."""
    return ((cdiv(cols, STEP_X), cdiv(rows, STEP_Y)), (max(1, min(STEP_X, cols)), max(1, min(STEP_Y, rows))))


@device
def unit():
    """(batch row, hidden unit) of this thread: the grid's y covers the rows, x the units."""
    return (int32(cuda.blockIdx.y) * int32(STEP_Y) + int32(cuda.threadIdx.y),
            int32(cuda.blockIdx.x) * int32(STEP_X) + int32(cuda.threadIdx.x))


@functools.lru_cache(maxsize=None)
def _sigmoid(dtype: str):
    one = DTYPES[dtype](1.0)

    @device
    def sigmoid(v):
        return one / (one + math.exp(-v))

    return sigmoid


@functools.lru_cache(maxsize=None)
def lstm_step(dtype: str, train: bool = False):
    """kernel(gates, c, h_out, save, B, H): gates (B, 4H) the pre-activations (i, f, g, o); c (B, H) the cell
    state, updated in place; h_out (B, H) receives h'. train: save (B, 5H) receives the activated gates
    and c' (what the backward reads); else save is not touched."""
    sig = _sigmoid(dtype)

    def lstm(gates, c, h_out, save, B, H):
        b, j = unit()
        h32 = int32(H)
        if b < int32(B) and j < h32:
            i = sig(gates[b, j])
            f = sig(gates[b, j + h32])
            g = math.tanh(gates[b, j + 2 * h32])
            o = sig(gates[b, j + 3 * h32])
            cn = f * c[b, j] + i * g
            c[b, j] = cn
            h_out[b, j] = o * math.tanh(cn)
            if train:
                save[b, j] = i
                save[b, j + h32] = f
                save[b, j + 2 * h32] = g
                save[b, j + 3 * h32] = o
                save[b, j + 4 * h32] = cn

    lstm.__name__ = lstm.__qualname__ = f"lstm_step_{dtype}{'_train' if train else ''}"
    return kernel(lstm, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def gru_step(dtype: str, train: bool = False):
    """kernel(gx, gh, h_prev, h_out, save, B, H): gx (B, 3H) = x W_ih^T + b_ih, gh (B, 3H) = h W_hh^T + b_hh
    for the gates (r, z, n); h_prev (B, H); h_out (B, H) receives h' (it may be h_prev: each thread reads
    its unit before writing it). train: save (B, 4H) receives r, z, n and gh's n part."""
    sig = _sigmoid(dtype)
    one = DTYPES[dtype](1.0)

    def gru(gx, gh, h_prev, h_out, save, B, H):
        b, j = unit()
        h32 = int32(H)
        if b < int32(B) and j < h32:
            r = sig(gx[b, j] + gh[b, j])
            z = sig(gx[b, j + h32] + gh[b, j + h32])
            hn = gh[b, j + 2 * h32]
            n = math.tanh(gx[b, j + 2 * h32] + r * hn)
            h_out[b, j] = (one - z) * n + z * h_prev[b, j]
            if train:
                save[b, j] = r
                save[b, j + h32] = z
                save[b, j + 2 * h32] = n
                save[b, j + 3 * h32] = hn

    gru.__name__ = gru.__qualname__ = f"gru_step_{dtype}{'_train' if train else ''}"
    return kernel(gru, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def rnn_step(dtype: str, relu: bool):
    """kernel(pre, h_out, B, H): h_out = tanh(pre) (relu: max(pre, 0), NaN kept)."""
    zero = DTYPES[dtype](0.0)

    def rnn(pre, h_out, B, H):
        b, j = unit()
        if b < int32(B) and j < int32(H):
            v = pre[b, j]
            if relu:
                h_out[b, j] = zero if v < zero else v
            else:
                h_out[b, j] = math.tanh(v)

    rnn.__name__ = rnn.__qualname__ = f"rnn_{'relu' if relu else 'tanh'}_step_{dtype}"
    return kernel(rnn, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def copy(dtype: str):
    """kernel(src, dst, R, C): dst[:R, :C] = src[:R, :C], either of any strides (a step's h into h_n)."""
    def copy_(src, dst, R, C):
        b, j = unit()
        if b < int32(R) and j < int32(C):
            dst[b, j] = src[b, j]

    copy_.__name__ = copy_.__qualname__ = f"copy_{dtype}"
    return kernel(copy_, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def add(dtype: str):
    """kernel(x, y, out, R, C): out[:R, :C] = x + y, any strides (a step's incoming gradients summed)."""
    def add_(x, y, out, R, C):
        b, j = unit()
        if b < int32(R) and j < int32(C):
            out[b, j] = x[b, j] + y[b, j]

    add_.__name__ = add_.__qualname__ = f"add_{dtype}"
    return kernel(add_, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def mul(dtype: str):
    """kernel(x, y, out, R, C): out[:R, :C] = x * y, any strides (a step's output times its dropout mask)."""
    def mul_(x, y, out, R, C):
        b, j = unit()
        if b < int32(R) and j < int32(C):
            out[b, j] = x[b, j] * y[b, j]

    mul_.__name__ = mul_.__qualname__ = f"mul_{dtype}"
    return kernel(mul_, launch_bounds=(STEP_X * STEP_Y,))


@functools.lru_cache(maxsize=None)
def fill(dtype: str):
    """kernel(x, value, R, C): x[:R, :C] = value. Launch as the steps (R rows, C columns)."""
    def fill_(x, value, R, C):
        b, j = unit()
        if b < int32(R) and j < int32(C):
            x[b, j] = value

    fill_.__name__ = fill_.__qualname__ = f"fill_{dtype}"
    return kernel(fill_, launch_bounds=(STEP_X * STEP_Y,))
