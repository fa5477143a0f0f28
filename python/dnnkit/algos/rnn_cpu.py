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

A single step from a given h0 (a cell; every layer of a one-step sequence without a projection) computes
its products one of several ways (csrc/rnn/rnn.h RnnCellPath); fused takes the kernel's rule, and these
ask for one path (a call without h0 runs the general path):
fused_cell_direct: both products and the post-GEMM in one pass on the strided-A kernel, [x | h0] packed once;
fused_cell_dots:   the same on dot products of the weights' rows (16 rows or fewer);
fused_cell_gemm:   the input and recurrent products as two GEMMs, then the post-GEMM.

AMX tiles (csrc/rnn/rnn.h RnnTiles), float32 where the CPU has them: fused's rule runs the time loop's
recurrent products on them where each thread's batch rows fill 3/4 of a tile, and a cell where its batch
fills them (64 rows or more); fused_amx runs them on the tiles whatever the batch (forward, no
projection, not ReLU in the loop; values that do not split exactly into bfloat16 parts run on the FMA
kernels); every other entry is the FMA kernels' path alone. The whole-sequence GEMMs follow the blocked
GEMM's rule.
"""
from __future__ import annotations

import dataclasses
import math

from .._config import get_num_threads
from ..backends.cpu import ext as _cpu
from ..problem import RNN_MODES
from .base import Algorithm, cpu_float_reason
from .gemm_cpu import AMX_SPEEDUP, STREAM_EFFICIENCY, gemm_efficiency, wt_direct_efficiency

_CELL_CODES = {"lstm": 0, "gru": 1, "rnn_tanh": 2, "rnn_relu": 3}
SCHEDULES = {"fused": 0, "fused_units": 1, "fused_rows": 2, "fused_wavefront": 3}  # RnnSchedule
CELL_PATHS = {"fused_cell_direct": 1, "fused_cell_dots": 2, "fused_cell_gemm": 3}  # RnnCellPath
TILES = {"fused": 0, "fused_amx": 2}  # RnnTiles: automatic, on; every other entry 1 (off)
ROW_SPLIT_MIN_ROWS = 4  # csrc/rnn/rnn.cpp kRowSplitMinRows: batch rows each thread of a direction needs
SMALL_CELL_ROWS = 16  # csrc/gemm/gemm.h kSmallCellRows: the most batch rows the dot-product cell takes


def shape_tuple(p, schedule: int = 0, cell_path: int = 0, tiles: int = 0) -> tuple:
    """The kernels' shape: (cell code, T, B, I, H, L, D, P, schedule, cell path, tiles)."""
    return (_CELL_CODES[p.mode], p.seq, p.batch, p.input, p.hidden, p.layers, p.dirs, p.proj, schedule, cell_path,
            tiles)


# ----------------------------------------------------------------------------------------- cost model
# Reads of a weight resident in a core's L2 (or the shared L3) run at this many times the streaming copy
# bandwidth (docs/algorithms.md, "The cost model"); the gate pass costs this many float32 FLOPs at the
# peak per gate element (exp, tanh and the products); a step's barrier among a direction's threads.
_L2_READ_FACTOR = 4.0
_L3_READ_FACTOR = 2.0
_GATE_FLOPS = 40.0
_BARRIER_S = 1e-6


def _read_bandwidth(nbytes: float, c) -> float:
    """Bytes a second one thread reads a weight of nbytes at, from the cache level that holds it."""
    if nbytes <= _cpu.l2_cache_bytes():
        return c.bytes_per_s * _L2_READ_FACTOR
    if nbytes <= _cpu.l3_cache_bytes():
        return c.bytes_per_s * _L3_READ_FACTOR
    return c.bytes_per_s


def _layer_inputs(p) -> list:
    """The input width of each layer."""
    return [p.input] + [p.dirs * p.state] * (p.layers - 1)


def _step_time(p, c, rows: int, cols_share: float, threads: int) -> float:
    """One step of one direction on `threads` threads, each `rows` batch rows by `cols_share` of the gate
    columns (and of the projection's): the recurrent product (bound by its arithmetic or by reading its
    share of W_hh and W_hr) and the gate pass."""
    gh, s, item = p.gates * p.hidden, p.state, p.itemsize
    per_thread_peak = c.peak(p) / max(c.threads, 1)
    flops = 2.0 * rows * gh * cols_share * s + (2.0 * rows * s * cols_share * p.hidden if p.proj else 0.0)
    weight = (gh * s + (s * p.hidden if p.proj else 0)) * cols_share * item
    eff = gemm_efficiency(max(rows, 1), max(int(gh * cols_share), 1), s)
    compute = flops / (per_thread_peak * eff)
    memory = weight / _read_bandwidth(weight, c)
    gates = rows * gh * cols_share * _GATE_FLOPS / per_thread_peak
    return max(compute, memory) + gates


def _whole_sequence_gemms(p, c, count_per_layer) -> float:
    """The products over all steps at once: per layer and direction, count_per_layer(input width) GEMMs
    given as (m, n, k) triples."""
    t = 0.0
    for width in _layer_inputs(p):
        for m, n, k in count_per_layer(width):
            t += p.dirs * 2.0 * m * n * k / (c.peak(p) * gemm_efficiency(m, n, k))
    return t


class FusedRnn(Algorithm):
    backend = "cpu"
    tolerance = 2e-5  # relative L2, float32: GEMM rounding compounded over steps and layers

    def __init__(self, mode: str, direction: str, name: str = "fused"):
        self.mode, self.direction, self.name = mode, direction, name
        self.op = f"{mode}_{direction}"
        self.schedule = SCHEDULES.get(name, 0)
        self.cell_path = CELL_PATHS.get(name, 0)
        self.tiles = TILES.get(name, 1)
        if direction == "bwd":
            self.tolerance = 1e-4

    def rule(self, p) -> str | None:
        if self.tiles == TILES["fused_amx"]:
            return "the kernel's rule (fused) takes the tiles where the batch fills them; tuning times this one"
        if self.cell_path:
            return "the kernel's rule (fused) picks a cell's path where nothing measured decides; tuning times this one"
        if self.schedule != SCHEDULES["fused"]:
            return "the kernel's rule (fused) schedules the loop where nothing measured decides; tuning times this one"
        return None

    def _cell_reason(self, p) -> str | None:
        """Why this cell path cannot run p, or None."""
        if p.seq != 1 or p.proj:
            return "a single step without a projection (a cell) only"
        if self.name == "fused_cell_direct" and _cpu.gemm_wt_direct_width(p.itemsize, 1) == 0:
            return f"no strided-A micro-kernel for {_cpu.active_isa()}"
        if self.name == "fused_cell_dots" and p.batch > SMALL_CELL_ROWS:
            return f"batch {p.batch}: the dot-product cell takes {SMALL_CELL_ROWS} rows or fewer"
        return None

    def supports(self, p) -> str | None:
        reason = cpu_float_reason(p)
        if reason is None and self.tiles == TILES["fused_amx"]:
            return self._tile_reason(p)
        if reason is None and self.cell_path:
            return self._cell_reason(p)
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

    @staticmethod
    def _tile_reason(p) -> str | None:
        """Why the tiles cannot run p's products, or None."""
        if p.dtype != "float32":
            return "float32 only (the tiles multiply bfloat16 parts of float32 values)"
        if not _cpu.amx_enabled():
            return "needs AMX-BF16 tiles, which this CPU (or dnnkit.set_amx, DNNKIT_ISA) does not offer"
        if p.proj:
            return "no projection (h_t must be bounded to split exactly)"
        if p.seq > 1 and p.mode == "rnn_relu":
            return "ReLU's h_t is unbounded: its parts would not split exactly in the time loop"
        return None

    def _schedule_for(self, p) -> int:
        """The schedule this algorithm runs p with (for fused: the kernel's rule)."""
        if self.schedule != SCHEDULES["fused"]:
            return self.schedule
        shape = shape_tuple(p)
        if self.direction == "fwd" and _cpu.rnn_uses_wavefront(shape, p.itemsize):
            return SCHEDULES["fused_wavefront"]
        if _cpu.rnn_splits_rows(shape, p.itemsize):
            return SCHEDULES["fused_rows"]
        return SCHEDULES["fused_units"]

    def cost(self, p, c) -> float:
        """Per layer the input projection of all steps as one GEMM, then per step the recurrent product and
        the gate pass, split among the threads as the schedule splits them (units: a share of the gate
        columns each, a barrier a step; rows: a share of the batch rows each, all of W_hh; wavefront: a
        layer each, the layers pipelined); the two directions of a layer on their own threads. Backward:
        the step loop once more (dh = dgates W_hh^T), and dx and the weight gradients as whole-sequence
        GEMMs."""
        if self.tiles == TILES["fused_amx"]:  # the products at the tiles' rate
            c = dataclasses.replace(c, peak_flops=c.peak_flops * AMX_SPEEDUP)
        if self.cell_path:
            return self._cell_cost(p, c, self.name)
        if p.seq == 1 and not p.proj and self.direction == "fwd":  # a cell: the path the kernel's rule takes
            path = _cpu.rnn_cell_path(shape_tuple(p), p.itemsize)
            return self._cell_cost(p, c, next(n for n, code in CELL_PATHS.items() if code == path))
        schedule = self._schedule_for(p)
        threads = max(c.threads, 1)
        tb, gh, s = p.seq * p.batch, p.gates * p.hidden, p.state
        group = max(1, threads // p.dirs)  # threads a direction
        side_by_side = math.ceil(p.dirs / max(1, min(threads, p.dirs)))  # directions one after another
        if schedule == SCHEDULES["fused_wavefront"]:
            one = _step_time(p, c, p.batch, 1.0, 1)
            stages = min(p.layers, threads)
            loop = one * p.layers * (p.seq + stages - 1) / stages
        elif schedule == SCHEDULES["fused_rows"] and group > 1:
            loop = p.layers * p.seq * side_by_side * _step_time(p, c, math.ceil(p.batch / group), 1.0, group)
        else:
            step = _step_time(p, c, p.batch, 1.0 / group, group) + (_BARRIER_S if group > 1 else 0.0)
            loop = p.layers * p.seq * side_by_side * step
        inputs = _whole_sequence_gemms(p, c, lambda width: [(tb, gh, width)])
        if self.direction == "fwd":
            return loop + inputs
        grads = _whole_sequence_gemms(p, c, lambda width: [(tb, width, gh), (gh, width, tb), (gh, s, tb)])
        return 2 * loop + grads

    @staticmethod
    def _cell_cost(p, c, name) -> float:
        """Per layer and direction, the step's two products: the one-pass paths read both weights once
        (the strided-A kernel at its tile's fill, the dot products at the streaming efficiency); the GEMM
        path packs them as the blocked GEMM does; then the gate pass."""
        gh, s, peak = p.gates * p.hidden, p.state, c.peak(p)
        t = 0.0
        for width in _layer_inputs(p):
            depth = width + s
            flops = 2.0 * p.batch * gh * depth
            weights = gh * depth * p.itemsize / c.bandwidth
            if name == "fused_cell_gemm":
                one = sum(2.0 * p.batch * gh * k / (peak * gemm_efficiency(p.batch, gh, k)) for k in (width, s))
            elif name == "fused_cell_dots":
                one = max(weights, flops / (peak * STREAM_EFFICIENCY))
            else:
                one = max(weights, flops / (peak * wt_direct_efficiency(p.itemsize, p.batch)))
            t += p.dirs * (one + p.batch * gh * _GATE_FLOPS / peak)
        return t

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
        shape = shape_tuple(p, self.schedule, self.cell_path, self.tiles)
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
    else decides), and the forward's cell paths."""
    return [FusedRnn(mode, direction, name) for mode in RNN_MODES for direction in ("fwd", "bwd")
            for name in (*SCHEDULES, *CELL_PATHS, "fused_amx")
            if direction == "fwd" or name not in ("fused_wavefront", *CELL_PATHS, "fused_amx")]


ALGORITHMS = all_fused()  # the registry's RNN algorithms (algos/__init__.py registers them)

reserve_elems = _cpu.rnn_reserve_elems  # (kernel shape) -> elements of the forward's saved gates for backward
