"""CPU RNN algorithms (csrc/rnn).

The whole sequence runs in C++: every step's input projection of a layer in one GEMM (summed bias fused),
W_hh packed once per call and reused at every step, each step's recurrent products and the fused
element-wise pass ("post-GEMM") on the same thread while its tiles are in cache; the two directions of a
bidirectional layer at once. Backward through time reverses the loop, then computes the weight gradients
as whole-sequence GEMMs. One step (a cell) skips the packing. The scratch (projections, packed weights,
gate gradients) is the kernel's own; workspace_bytes() reports its size.

The algorithms differ in how the threads share the time loop (csrc/rnn/rnn.h RnnSchedule):
fused:           the kernel's rule: rows where W_hh fits a core's L2 and each thread gets 4 rows or more,
                 a wavefront for stacks of small layers at few rows, units otherwise;
fused_units:     the threads of a direction share each step's hidden units, one barrier a step;
fused_rows:      each thread runs its own batch rows through every step, no barrier, all of W_hh each;
fused_wavefront: a stack's layers pipelined, one thread a layer, in chunks of steps (forward only).
"""
from __future__ import annotations

from .._config import get_num_threads
from ..backends.cpu import ext as _cpu
from ..problem import RNN_MODES
from .base import Algorithm, cpu_float_reason

_CELL_CODES = {"lstm": 0, "gru": 1, "rnn_tanh": 2, "rnn_relu": 3}
SCHEDULES = {"fused": 0, "fused_units": 1, "fused_rows": 2, "fused_wavefront": 3}  # RnnSchedule
ROW_SPLIT_MIN_ROWS = 4  # csrc/rnn/rnn.cpp kRowSplitMinRows: batch rows each thread of a direction needs


def shape_tuple(p, schedule: int = 0) -> tuple:
    """The kernels' shape: (cell code, T, B, I, H, L, D, P, schedule)."""
    return (_CELL_CODES[p.mode], p.seq, p.batch, p.input, p.hidden, p.layers, p.dirs, p.proj, schedule)


class FusedRnn(Algorithm):
    backend = "cpu"
    tolerance = 2e-5  # relative L2, float32: GEMM rounding compounded over steps and layers

    def __init__(self, mode: str, direction: str, name: str = "fused"):
        self.mode, self.direction, self.name = mode, direction, name
        self.op = f"{mode}_{direction}"
        self.schedule = SCHEDULES[name]
        if direction == "bwd":
            self.tolerance = 1e-4

    def supports(self, p) -> str | None:
        reason = cpu_float_reason(p)
        if reason or self.schedule in (SCHEDULES["fused"], SCHEDULES["fused_units"]):
            return reason
        threads = get_num_threads()
        if p.seq < 2:
            return "needs a time loop (2 steps or more); one step runs as a cell"
        if self.schedule == SCHEDULES["fused_rows"]:
            group = threads // 2 if p.dirs == 2 else threads
            if group < 2:
                return f"needs 2 threads or more a direction ({threads} thread(s), {p.dirs} direction(s))"
            if p.batch < ROW_SPLIT_MIN_ROWS * group:
                return f"needs {ROW_SPLIT_MIN_ROWS} batch rows a thread ({ROW_SPLIT_MIN_ROWS * group} or more)"
            return None
        if p.direction != "fwd":
            return "forward only (backward runs the layers one after another)"
        if p.dirs != 1 or p.layers < 2 or p.proj:
            return "needs a unidirectional stack of 2 layers or more without projection"
        if threads < 2:
            return "needs 2 threads or more"
        return None

    def workspace_bytes(self, p) -> int:
        gh, tb, d, s = p.gates * p.hidden, p.seq * p.batch, p.dirs, p.state
        proj = s * p.hidden if p.proj else 0  # W_hr packed
        if self.direction == "fwd":
            elems = d * (tb * gh + gh * s + p.batch * gh + proj)
        else:
            elems = d * (tb * gh * (2 if p.mode == "gru" else 1) + gh * s + proj + (tb * s if p.proj else 0))
            if p.layers > 1:
                elems += min(p.layers - 1, 2) * tb * d * s
        return elems * p.itemsize

    def run(self, p, *arrays, out=None, **params):
        """fwd: (x, h0, c0, weights) with out = the layer outputs [y_0 .. y_{L-1}] and params h_n, c_n,
        reserve; bwd: (x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n) with out = (dx, dh0, dc0, grads) and
        param accumulate (add the weight gradients to grads rather than overwrite them).
        Arrays as the _cpu.rnn_forward / rnn_backward bindings take them (None where optional)."""
        shape = shape_tuple(p, self.schedule)
        if self.direction == "fwd":
            x, h0, c0, weights = arrays
            _cpu.rnn_forward(shape, x, h0, c0, weights, out, params["h_n"], params["c_n"], params["reserve"])
        else:
            x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n = arrays
            dx, dh0, dc0, grads = out
            _cpu.rnn_backward(shape, x, h0, c0, weights, ys, reserve, dy, dh_n, dc_n, dx, dh0, dc0, grads,
                              params.get("accumulate", False))
        return out


def all_fused() -> list:
    """Every schedule of every mode and direction, the kernel's rule first (the default where nothing
    else decides)."""
    return [FusedRnn(mode, direction, name) for mode in RNN_MODES for direction in ("fwd", "bwd")
            for name in SCHEDULES if not (name == "fused_wavefront" and direction == "bwd")]


ALGORITHMS = all_fused()  # the registry's RNN algorithms (algos/__init__.py registers them)

reserve_elems = _cpu.rnn_reserve_elems  # (kernel shape) -> elements of the forward's saved gates for backward
