"""GPU RNN sequences: LSTM, GRU and tanh/ReLU RNN, multi-layer and bidirectional, the inference forward.

gpu_steps (Appleyard et al.'s structure, as cuDNN's): per layer and direction, the input projection of all
T steps is one GEMM (x W_ih^T + b_ih, T*B rows); then per step one GEMM adds h_{t-1} W_hh^T + b_hh into
that step's rows (a GRU keeps it apart: r scales its n part) and one kernel does the whole gate pass
(kernels/rnn.py), writing h_t straight into its slice of the output, which the next step reads as its A
operand: nothing is copied between steps. The GEMMs are the GPU GEMM algorithms, planned by the caller
(dispatch: the tuning cache, else the rules) per shape.
"""
from __future__ import annotations

import numpy as np

from ..backends import cuda as _cuda
from ..problem import RNN_MODES, GemmProblem
from .base import Algorithm
from .gemm_cuda import _INT32, LAUNCH_S, multiply

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
SAVED = {"lstm": 5, "gru": 4, "rnn_tanh": 0, "rnn_relu": 0}  # per unit a step: LSTM i, f, g, o, c; GRU r, z, n, hn
# The reason gpu_persistent and gpu_wavefront give when untuned dispatch takes gpu_steps instead.
STEPS_RULE = "gpu_steps is the rule where nothing measured decides; tuning times this one"


def _kernels():
    from dnnkit.kernels import rnn

    return rnn


def _gemm_s(c, m: int, n: int, k: int, dtype: str) -> float:
    """The predicted seconds of the fastest float GPU GEMM algorithm (no TF32) on an m x n x k product."""
    from .gemm_cuda import ALGORITHMS as gemms

    g = GemmProblem(m, n, k, trans_b=True, dtype=dtype, device="cuda")
    times = [a.cost(g, c) for a in gemms if not a.tf32 and a.supports(g) is None]
    return min(t for t in times if t is not None)


def _sequence_cost(p, c, backward: bool) -> float:
    """Per layer and direction: the input projection as one GEMM, then per step the recurrent GEMM (and
    the projection's), and the gate kernel, each a launch; backward runs the loop's GEMM and kernel once
    more and dx, dW_ih and dW_hh as whole-sequence GEMMs."""
    G, H, T, B = _GATES[p.mode], p.hidden, p.seq, p.batch
    S = p.proj or H
    gates = LAUNCH_S + 4 * B * G * H * p.itemsize / c.bytes_per_s
    step = _gemm_s(c, B, G * H, S, p.dtype) + gates + (_gemm_s(c, B, S, H, p.dtype) if p.proj else 0.0)
    total = 0.0
    for layer in range(p.layers):
        feats = p.input if layer == 0 else p.dirs * S
        once = _gemm_s(c, T * B, G * H, feats, p.dtype)
        if backward:
            once += (_gemm_s(c, T * B, feats, G * H, p.dtype) + _gemm_s(c, G * H, feats, T * B, p.dtype)
                     + _gemm_s(c, G * H, S, T * B, p.dtype))
        total += p.dirs * (once + T * step * (2 if backward else 1))
    return total


def _launcher(stream):
    """launch(kernel, *args) for the element-wise step kernels on stream: a thread a (row, column) of the
    array the kernel's last two arguments (rows, columns) describe."""
    kr = _kernels()

    def launch(k, *args):
        _cuda.launch(k, *kr.step_grid(args[-2], args[-1]), stream, *args)

    return launch


class GpuSteps(Algorithm):
    name = "gpu_steps"
    backend = "cuda"
    tolerance = 1e-5

    def __init__(self, mode: str):
        self.mode = mode
        self.op = f"{mode}_fwd"

    def supports(self, p) -> str | None:
        if p.device != "cuda":
            return f"runs on the GPU, the problem is on {p.device}"
        if p.dtype not in ("float32", "float64"):
            return f"dtype {p.dtype} is not float32 or float64"
        width = max(p.input, p.dirs * p.hidden)
        if p.seq * p.batch * max(_GATES[p.mode] * p.hidden, width) > _INT32:
            return "a projection of 2^31 - 256 elements or more (the kernels' index arithmetic is int32)"
        return None

    def cost(self, p, c) -> float:
        return _sequence_cost(p, c, backward=False)

    def workspace_bytes(self, p) -> int:
        """The projections of one layer-direction (T*B x G*H), a GRU's recurrent part (B x 3H), the state
        when none is given (B x H, twice for an LSTM), and between layers two outputs (T x B x D*H)."""
        G, H, T, B, D = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs
        elems = T * B * G * H + (B * G * H if p.mode == "gru" else 0) + 2 * B * H
        if p.layers > 1:
            elems += min(p.layers - 1, 2) * T * B * D * H
        return elems * p.itemsize

    def _loop(self, p, has_bias: bool, gemm_plan, stream):
        """loop(k, d, gx, h_prev, c, y, save, w, batch_first, m, steps=None) -> h_T: the time loop of
        layer-direction k (direction d) of a layer whose input projections are in gx (T*B, G*H); h_prev its
        h_{-1}, c its cell state (LSTM: updated in place), y the layer's output (h_t into its direction's
        columns), save the training save or None, w its weights (w_ih, w_hh, b_ih, b_hh[, w_hr]), m the
        projection's m_t buffer (inference with a projection); steps: the loop's steps (a range of them;
        default all T). Returns the view of y that holds the last step's h."""
        kr = _kernels()
        G, H, T, B, P, dt = _GATES[p.mode], p.hidden, p.seq, p.batch, p.proj, p.dtype
        S = P or H
        launch = _launcher(stream)
        rec = gemm_plan(GemmProblem(B, G * H, S, trans_b=True, bias=has_bias, dtype=dt, device="cuda"))
        out_proj = gemm_plan(GemmProblem(B, S, H, trans_b=True, dtype=dt, device="cuda")) if P else None
        gh = _cuda.scratch((B, G * H), dt, stream) if p.mode == "gru" else None

        def loop(k, d, gx, h_prev, c, y, save_k, w, batch_first, m, steps=None):
            train = save_k is not None
            step = kr.lstm_step(dt, train) if p.mode == "lstm" else kr.gru_step(dt, train) if p.mode == "gru" else \
                kr.rnn_step(dt, p.mode == "rnn_relu")
            # the recurrent weights as the products read them (views, made once for every step)
            w_hh, b_hh = _cuda.transposed(w[1]), w[3]
            w_hr = _cuda.transposed(w[4]) if P else None
            gx3 = gx.reshape((B, T, G * H) if batch_first else (T, B, G * H))
            for s in range(T) if steps is None else steps:
                ti = s if d == 0 else T - 1 - s
                g = gx3[:, ti, :] if batch_first else gx3[ti]
                h_out = y[:, ti, d * S:(d + 1) * S] if batch_first else y[ti, :, d * S:(d + 1) * S]
                save = save_k[ti] if train and p.mode in ("lstm", "gru") else g
                if p.mode == "gru":
                    rec.run(h_prev, w_hh, out=gh, bias=b_hh, stream=stream)
                    launch(step, g, gh, h_prev, h_out, save, B, H)
                else:
                    rec.run(h_prev, w_hh, out=g, beta=1.0, bias=b_hh, stream=stream)
                    if p.mode == "lstm" and P:
                        m_t = save[:, 5 * H:6 * H] if train else m
                        launch(step, g, c, m_t, save, B, H)
                        out_proj.run(m_t, w_hr, out=h_out, stream=stream)
                    elif p.mode == "lstm":
                        launch(step, g, c, h_out, save, B, H)
                    else:
                        launch(step, g, h_out, B, H)
                h_prev = h_out
            return h_prev

        return loop

    def run(self, p, x, h0, c0, weights, *, out, h_n, c_n=None, batch_first=False, stream=None, gemm_plan, ys=None,
            saves=None, masks=None, dropped=None):
        """x (T, B, I), or (B, T, I) with batch_first, a C-contiguous device array; h0 (L*D, B, S), c0
        (L*D, B, H) or None (zeros), S = H, or P with a projection; weights the flat list, 4 a
        layer-direction (w_ih, w_hh, b_ih or None, b_hh or None; w_hr fifth with a projection); out
        (T, B, D*S) (batch_first: (B, T, D*S)), h_n (L*D, B, S) and c_n (L*D, B, H): device arrays written.
        gemm_plan(GemmProblem) -> Plan: how the products run (the caller's dispatch.plan).
        Training: ys, every layer's output (out the last), kept; saves, per layer-direction (T, B, n*H)
        arrays that receive what the backward reads (n = SAVED[mode], one more with a projection: m);
        masks (dropout: one per layer but the last, in the outputs' layout) and dropped, arrays that
        receive each such layer's output times its mask, which the next layer reads."""
        kr = _kernels()
        G, H, T, B, D, L, P = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs, p.layers, p.proj
        S, per = P or H, 5 if P else 4
        if B == 0:
            return out
        dt = p.dtype
        launch = _launcher(stream)

        t = np.dtype(dt).type
        gx = _cuda.scratch((T * B, G * H), dt, stream)
        m = _cuda.scratch((B, H), dt, stream) if P and saves is None else None  # o tanh(c), before W_hr
        zeros = None
        if h0 is None or (p.mode == "lstm" and c0 is None):
            zeros = _cuda.scratch((B, H), dt, stream)
            launch(kr.fill(dt), zeros, t(0.0), B, H)
        between = [] if ys is not None else [_cuda.scratch(out.shape, dt, stream) for _ in range(min(L - 1, 2))]
        train = saves is not None
        inp = x
        for layer in range(L):
            y = ys[layer] if ys is not None else out if layer == L - 1 else between[layer % 2]
            feats = inp.shape[2]
            x2 = inp.reshape(T * B, feats)
            has_bias = weights[per * layer * D + 2] is not None
            proj = gemm_plan(GemmProblem(T * B, G * H, feats, trans_b=True, bias=has_bias, dtype=dt, device="cuda"))
            loop = self._loop(p, has_bias, gemm_plan, stream)
            for d in range(D):
                k = layer * D + d
                w_ih, b_ih = weights[per * k], weights[per * k + 2]
                proj.run(x2, _cuda.transposed(w_ih), out=gx, bias=b_ih, stream=stream)
                h_prev = (zeros[:, :S] if P else zeros) if h0 is None else h0[k]
                c = None
                if p.mode == "lstm":
                    c = c_n[k]
                    launch(kr.copy(dt), zeros if c0 is None else c0[k], c, B, H)
                h_prev = loop(k, d, gx, h_prev, c, y, saves[k] if train else None, weights[per * k:per * (k + 1)],
                              batch_first, m)
                launch(kr.copy(dt), h_prev, h_n[k], B, S)
            inp = y
            if masks is not None and layer < L - 1:
                multiply(y, masks[layer], dropped[layer], stream)
                inp = dropped[layer]
        return out


class GpuWavefront(GpuSteps):
    """gpu_steps with the layers of a stack pipelined on streams (Appleyard et al.'s wavefront, as cuDNN's):
    each layer runs on its own stream, a chunk of steps at a time; layer l's chunk c (its input projection,
    one GEMM over the chunk's rows, then the chunk's recurrent GEMMs and gate kernels) waits only on an
    event after layer l - 1's chunk c. Chunks are issued in wavefront order (chunk c of every layer before
    chunk c + 1), so layer l's chunk c runs beside layer l + 1's chunk c - 1: up to L chunks at once where
    a single step's kernels leave most of the GPU idle. The caller's stream waits for every layer's at the
    end. Dropout between layers is applied a chunk at a time, as the layer above reads it. One direction,
    two layers or more."""

    name = "gpu_wavefront"
    CHUNKS = 8  # chunks a sequence is cut into: the pipeline's depth against the projections' size

    def supports(self, p) -> str | None:
        why = GpuSteps.supports(self, p)
        if why is not None:
            return why
        if p.layers < 2:
            return "one layer: nothing to pipeline"
        if p.dirs == 2:
            return "bidirectional: a layer's output at step t needs its reverse direction's, which comes last"
        return None

    def rule(self, p) -> str | None:
        return STEPS_RULE

    def cost(self, p, c) -> float:
        """gpu_steps' launches and products, the per-chunk projections (CHUNKS GEMMs a layer above the
        first, each with T*B/CHUNKS rows), the layers overlapped: one layer's time lines, plus a chunk's
        worth of each other layer's (the pipeline's fill and drain)."""
        G, H, T, B = _GATES[p.mode], p.hidden, p.seq, p.batch
        S = p.proj or H
        chunk = -(-T // self.CHUNKS)
        chunks = -(-T // chunk)
        step = _gemm_s(c, B, G * H, S, p.dtype) + LAUNCH_S + 4 * B * G * H * p.itemsize / c.bytes_per_s \
            + (_gemm_s(c, B, S, H, p.dtype) if p.proj else 0.0)
        layer = [(_gemm_s(c, T * B, G * H, p.input, p.dtype) if l == 0 else
                  chunks * _gemm_s(c, chunk * B, G * H, S, p.dtype)) + T * step for l in range(p.layers)]
        return max(layer) + sum(layer) / chunks - max(layer) / chunks

    def workspace_bytes(self, p) -> int:
        """Every layer's projections and output (the layers run at once)."""
        G, H, T, B = _GATES[p.mode], p.hidden, p.seq, p.batch
        per_layer = T * B * G * H + (B * G * H if p.mode == "gru" else 0) + 2 * B * H + T * B * (p.proj or H)
        return p.layers * per_layer * p.itemsize

    def run(self, p, x, h0, c0, weights, *, out, h_n, c_n=None, batch_first=False, stream=None, gemm_plan, ys=None,
            saves=None, masks=None, dropped=None):
        """As GpuSteps.run."""
        kr = _kernels()
        G, H, T, B, L, P = _GATES[p.mode], p.hidden, p.seq, p.batch, p.layers, p.proj
        S, per = P or H, 5 if P else 4
        if B == 0:
            return out
        dt = p.dtype
        chunk = -(-T // self.CHUNKS)
        bounds = [(t0, min(T, t0 + chunk)) for t0 in range(0, T, chunk)]
        streams = _cuda.fork(stream, L)
        zeros = None
        if h0 is None or (p.mode == "lstm" and c0 is None):
            zeros = _cuda.scratch((B, H), dt, streams[0])
            _launcher(streams[0])(kr.fill(dt), zeros, np.dtype(dt).type(0.0), B, H)
        zeroed = _cuda.signal(streams[0])  # every layer's stream may read zeros from here on
        for st in streams[1:]:
            _cuda.wait(zeroed, st)
        train = saves is not None
        outs = ys if ys is not None else [_cuda.scratch(out.shape, dt, streams[l]) for l in range(L - 1)] + [out]
        state = []
        for layer in range(L):
            st = streams[layer]
            has_bias = weights[per * layer + 2] is not None
            w = weights[per * layer:per * (layer + 1)]
            inp = x if layer == 0 else dropped[layer - 1] if masks is not None else outs[layer - 1]
            feats = inp.shape[2]
            gx = _cuda.scratch((T * B, G * H), dt, st)
            launch = _launcher(st)
            c = None
            if p.mode == "lstm":
                c = c_n[layer]
                launch(kr.copy(dt), zeros if c0 is None else c0[layer], c, B, H)
            m = _cuda.scratch((B, H), dt, st) if P and not train else None
            state.append(dict(st=st, launch=launch, w=w, inp=inp, feats=feats, gx=gx, c=c, m=m, has_bias=has_bias,
                              loop=self._loop(p, has_bias, gemm_plan, st), events=[],
                              h=((zeros[:, :S] if P else zeros) if h0 is None else h0[layer])))
        first = state[0]  # layer 0's input is all there: its projections as one GEMM
        gemm_plan(GemmProblem(T * B, G * H, first["feats"], trans_b=True, bias=first["has_bias"], dtype=dt,
                              device="cuda")).run(x.reshape(T * B, first["feats"]), _cuda.transposed(first["w"][0]), out=first["gx"],
                                                  bias=first["w"][2], stream=first["st"])
        for c_idx, (s0, s1) in enumerate(bounds):
            for layer, ls in enumerate(state):
                st = ls["st"]
                if layer > 0:
                    _cuda.wait(state[layer - 1]["events"][c_idx], st)
                    if masks is not None:
                        self._drop(p, outs[layer - 1], masks[layer - 1], dropped[layer - 1], s0, s1, batch_first, st)
                    self._project(p, ls, s0, s1, batch_first, gemm_plan)
                ls["h"] = ls["loop"](layer, 0, ls["gx"], ls["h"], ls["c"], outs[layer],
                                     saves[layer] if train else None, ls["w"], batch_first, ls["m"],
                                     steps=range(s0, s1))
                ls["events"].append(_cuda.signal(st))
        for layer, ls in enumerate(state):
            ls["launch"](kr.copy(dt), ls["h"], h_n[layer], B, S)
        _cuda.join(streams, stream)
        return out

    @staticmethod
    def _drop(p, y, mask, dropped, s0: int, s1: int, batch_first: bool, stream):
        """dropped = y * mask over steps [s0, s1): one kernel over the chunk's contiguous rows (time-major),
        or one a step on strided rows (batch_first)."""
        if not batch_first:
            multiply(y[s0:s1], mask[s0:s1], dropped[s0:s1], stream)
            return
        kr = _kernels()
        launch = _launcher(stream)
        for t in range(s0, s1):
            launch(kr.mul(p.dtype), y[:, t, :], mask[:, t, :], dropped[:, t, :], p.batch, int(y.shape[2]))

    @staticmethod
    def _project(p, ls, s0: int, s1: int, batch_first: bool, gemm_plan):
        """The input projections of steps [s0, s1) of a layer above the first, from the layer below's output
        (time-major: one GEMM over the chunk's rows; batch_first: one a step, on strided rows)."""
        G, H, T, B, dt = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dtype
        w_ih, b_ih, feats, inp, gx = ls["w"][0], ls["w"][2], ls["feats"], ls["inp"], ls["gx"]
        if not batch_first:
            plan = gemm_plan(GemmProblem((s1 - s0) * B, G * H, feats, trans_b=True, bias=ls["has_bias"], dtype=dt,
                                         device="cuda"))
            plan.run(inp[s0:s1].reshape((s1 - s0) * B, feats), _cuda.transposed(w_ih), out=gx[s0 * B:s1 * B], bias=b_ih,
                     stream=ls["st"])
            return
        gx3 = gx.reshape(B, T, G * H)
        plan = gemm_plan(GemmProblem(B, G * H, feats, trans_b=True, bias=ls["has_bias"], dtype=dt, device="cuda"))
        w_ih_t = _cuda.transposed(w_ih)
        for t in range(s0, s1):
            plan.run(inp[:, t, :], w_ih_t, out=gx3[:, t, :], bias=b_ih, stream=ls["st"])


# A grid barrier between persistent steps: every block's arrival through an atomic in L2 and its release
# (nominal, as LAUNCH_S: unfitted until measured on a GPU).
GRID_SYNC_S = 1.5e-6
# Warp instructions an SM issues a clock (its four schedulers).
ISSUE_PER_CLOCK = 4


def persistent_layout(p, blocks: int, shared_limit: int):
    """How gpu_persistent lays p out on a grid of at most `blocks` resident blocks with shared_limit
    bytes of shared memory each: (units a block U, blocks, rows a lane, batch tile, shared bytes), or
    the reason it cannot."""
    from dnnkit.kernels import rnn_persistent as kp

    G, H = _GATES[p.mode], p.hidden
    units = -(-H // blocks)
    rt = -(-(G * units) // 32)
    if rt > kp.MAX_RT:
        return (f"a block would hold {G * units} rows of W_hh (units {units} x {G} gates on {blocks} blocks), "
                f"more than the {32 * kp.MAX_RT} its lanes take")
    bt = kp.batch_tile(p.batch)
    shared = kp.shared_elems(G * units, H, rt, bt) * p.itemsize
    if shared + kp.static_elems(bt) * p.itemsize > shared_limit:
        return (f"W_hh does not fit the GPU's shared memory: {shared + kp.static_elems(bt) * p.itemsize} bytes "
                f"a block on {blocks} blocks, {shared_limit} available")
    return units, -(-H // units), rt, bt, shared


class GpuPersistent(GpuSteps):
    """gpu_steps' structure with the time loop in one launch a layer-direction (kernels/rnn_persistent.py):
    W_hh resident in the blocks' shared memory across the steps, a grid barrier between them. The input
    projections stay one GEMM before the loop. For W_hh that fits the GPU's shared memory (float32 LSTM
    up to H of about 1280 on an H100), without a projection; what small batches, whose steps are launch-
    and weight-bound, gain from."""

    name = "gpu_persistent"

    def supports(self, p) -> str | None:
        why = GpuSteps.supports(self, p)
        if why is not None:
            return why
        if p.proj:
            return "an LSTM projection (proj_size): the persistent kernel has no projection step"
        if p.batch * p.hidden > _INT32 or p.hidden * _GATES[p.mode] * p.hidden > _INT32:
            return "W_hh or a step's state of 2^31 - 256 elements or more"
        layout = persistent_layout(p, *_cuda.resident_limits())
        return layout if isinstance(layout, str) else None

    def rule(self, p) -> str | None:
        return STEPS_RULE

    def cost(self, p, c) -> float:
        """Per layer-direction the input projection's GEMM, one launch, and per step: the block's k-loop
        (per batch tile, H depth steps of its warps' RT + BT shared loads and RT x BT FMAs, issued four
        warp instructions a clock) and the grid barrier. W_hh is read from DRAM once."""
        sms, shared_limit = _cuda.resident_limits()
        layout = persistent_layout(p, sms, shared_limit)
        if isinstance(layout, str):
            return None
        _, _, rt, bt, _ = layout
        G, H, T, B = _GATES[p.mode], p.hidden, p.seq, p.batch
        clock = c.peak_flops / (2.0 * 128 * sms)
        tiles = -(-B // bt)
        step = tiles * H * (rt + bt + rt * bt) / (ISSUE_PER_CLOCK * clock) + GRID_SYNC_S
        total = 0.0
        for layer in range(p.layers):
            feats = p.input if layer == 0 else p.dirs * H
            weights = G * H * H * p.itemsize / c.bytes_per_s
            total += p.dirs * (_gemm_s(c, T * B, G * H, feats, p.dtype) + LAUNCH_S + weights + T * step)
        return total

    def workspace_bytes(self, p) -> int:
        from dnnkit.kernels import rnn_persistent as kp

        return GpuSteps.workspace_bytes(self, p) + (p.seq * kp.hseq_row(p.batch, p.hidden, p.itemsize)
                                                    + _GATES[p.mode] * p.hidden) * p.itemsize

    def _loop(self, p, has_bias: bool, gemm_plan, stream):
        from dnnkit.kernels import rnn_persistent as kp

        G, H, T, B, dt = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dtype
        units, blocks, rt, bt, shared = persistent_layout(p, *_cuda.resident_limits())
        hseq = _cuda.scratch((T, kp.hseq_row(B, H, p.itemsize)), dt, stream)
        launch = _launcher(stream)
        kr = _kernels()
        zero_bias = None
        if not has_bias:
            zero_bias = _cuda.scratch((1, G * H), dt, stream)
            launch(kr.fill(dt), zero_bias, np.dtype(dt).type(0.0), 1, G * H)
        counters = _cuda.upload(np.zeros(p.layers * p.dirs, np.uint32), stream)

        def loop(k, d, gx, h_prev, c, y, save_k, w, batch_first, m):
            train = save_k is not None
            kern = kp.persistent_kernel(p.mode, dt, rt, bt, train)
            bias = w[3] if has_bias else zero_bias[0]
            save = save_k if train else hseq.reshape((T, 1, hseq.shape[1]))
            _cuda.launch(kern, blocks, kp.THREADS, stream, gx, w[1], bias, h_prev, c if c is not None else h_prev,
                         y, save, hseq, counters[k:k + 1], B, H, units, T, d * H, d, int(batch_first), 0, T,
                         shared_bytes=shared)
            last = T - 1 if d == 0 else 0
            return y[:, last, d * H:(d + 1) * H] if batch_first else y[last, :, d * H:(d + 1) * H]

        return loop


class GpuStepsBackward(Algorithm):
    """The backward through time of gpu_steps' training forward: per layer (top first) and direction, the
    time loop in reverse runs one element-wise kernel a step (kernels/rnn_backward.py: the gates'
    gradients dG_t into a whole-sequence buffer, dc_{t-1}) and one GEMM, dh_{t-1} = dG_t W_hh; after it,
    whole-sequence GEMMs give dx = dG W_ih (both directions summed), dW_ih = dG^T x, dW_hh = dG^T h_{t-1}
    (the previous outputs gathered into one matrix) and column sums the biases' gradients."""

    name = "gpu_steps"
    backend = "cuda"
    tolerance = 1e-5

    def __init__(self, mode: str):
        self.mode = mode
        self.op = f"{mode}_bwd"

    def supports(self, p) -> str | None:
        return GpuSteps(self.mode).supports(p)

    def cost(self, p, c) -> float:
        return _sequence_cost(p, c, backward=True)

    def workspace_bytes(self, p) -> int:
        G, H, T, B, D = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs
        elems = T * B * G * H * (2 if p.mode == "gru" else 1) + T * B * H + 4 * B * H + 2 * T * B * D * H
        return elems * p.itemsize

    def run(self, p, x, h0, c0, weights, ys, saves, dy, dh_n, dc_n, *, dx, dh0, dc0, dweights, batch_first=False,
            stream=None, gemm_plan, accumulate=False, masks=None, dropped=None):
        """x, h0, c0, weights, ys, saves: the training forward's (GpuSteps.run); dy (the top output's layout),
        dh_n, dc_n: the incoming gradients or None (zeros); dx (x's shape), dh0 (L*D, B, S), dc0 (L*D, B,
        H) and dweights (as weights: dW_ih, dW_hh, db_ih, db_hh, the biases' None without biases, dW_hr
        with a projection): device arrays written (accumulate: the weights' gradients added to them).
        With a projection (h = W_hr m, m = o tanh(c)) each step also takes dm = dh W_hr, and
        dW_hr = dh^T m over the sequence."""
        from dnnkit.kernels import rnn_backward as kb

        from .gemm_cuda import column_sums

        kr = _kernels()
        G, H, T, B, D, L, P = _GATES[p.mode], p.hidden, p.seq, p.batch, p.dirs, p.layers, p.proj
        S, per = P or H, 5 if P else 4
        dt = p.dtype
        launch = _launcher(stream)

        def fill_zero(a2):
            launch(kr.fill(dt), a2, np.dtype(dt).type(0.0), *a2.shape)

        def step_view(a3, t):  # a step's (B, .) rows of a (T, B, .) array, or of (B, T, .) with batch_first
            return a3[:, t, :] if batch_first else a3[t]

        seq3 = (B, T) if batch_first else (T, B)
        zeros = _cuda.scratch((B, H), dt, stream)
        fill_zero(zeros)
        dgx = _cuda.scratch((T * B, G * H), dt, stream)
        dgh = _cuda.scratch((T * B, G * H), dt, stream) if p.mode == "gru" else dgx
        dgx3, dgh3 = dgx.reshape(seq3 + (G * H,)), dgh.reshape(seq3 + (G * H,))
        hprev = _cuda.scratch((T * B, S), dt, stream)
        hprev3 = hprev.reshape(seq3 + (S,))
        dh_next = _cuda.scratch((B, S), dt, stream)
        dc = _cuda.scratch((B, H), dt, stream) if p.mode == "lstm" else None
        if P:  # the gradients reaching h (dh_t, P wide) and the m_t they multiply, over the sequence; dm
            dhp, mall, dm = (_cuda.scratch((T * B, P), dt, stream), _cuda.scratch((T * B, H), dt, stream),
                             _cuda.scratch((B, H), dt, stream))
            dhp3, mall3 = dhp.reshape(seq3 + (P,)), mall.reshape(seq3 + (H,))
        if dy is None:
            dy = _cuda.scratch(ys[-1].shape, dt, stream)
            fill_zero(dy.reshape(T * B, D * S))
        copy = kr.copy(dt)
        for layer in reversed(range(L)):
            inp = x if layer == 0 else (dropped[layer - 1] if masks is not None else ys[layer - 1])
            feats = inp.shape[2]
            x2 = inp.reshape(T * B, feats)
            dinp = dx if layer == 0 else _cuda.scratch(inp.shape, dt, stream)
            dinp2 = dinp.reshape(T * B, feats)
            y = ys[layer]
            rec = gemm_plan(GemmProblem(B, S, G * H, dtype=dt, device="cuda"))
            back_proj = gemm_plan(GemmProblem(B, H, P, dtype=dt, device="cuda")) if P else None
            for d in range(D):
                k = layer * D + d
                w_ih, w_hh = weights[per * k], weights[per * k + 1]
                dw_ih, dw_hh, db_ih, db_hh = dweights[per * k:per * k + 4]
                launch(copy, (zeros[:, :S] if P else zeros) if dh_n is None else dh_n[k], dh_next, B, S)
                if dc is not None:
                    launch(copy, zeros if dc_n is None else dc_n[k], dc, B, H)
                order = list(range(T)) if d == 0 else list(range(T - 1, -1, -1))
                units = slice(d * S, (d + 1) * S)
                for idx in reversed(range(T)):
                    t = order[idx]
                    tp = order[idx - 1] if idx > 0 else None
                    dy_t = step_view(dy, t)[:, units]
                    h_prev = ((zeros[:, :S] if P else zeros) if h0 is None else h0[k]) if tp is None else \
                        step_view(y, tp)[:, units]
                    launch(copy, h_prev, step_view(hprev3, t), B, S)
                    dg_t = step_view(dgx3, t)
                    if P:  # h = W_hr m: dh_t into the sequence's buffer, dm = dh_t W_hr, then m's gates
                        dhp_t = step_view(dhp3, t)
                        launch(kr.add(dt), dy_t, dh_next, dhp_t, B, P)
                        launch(copy, saves[k][t][:, 5 * H:6 * H], step_view(mall3, t), B, H)
                        back_proj.run(dhp_t, weights[per * k + 4], out=dm, stream=stream)
                        c_prev = (zeros if c0 is None else c0[k]) if tp is None else saves[k][tp][:, 4 * H:5 * H]
                        launch(kb.lstm_step_backward(dt), dm, zeros, dc, saves[k][t], c_prev, dg_t, B, H)
                        rec.run(dg_t, w_hh, out=dh_next, stream=stream)
                    elif p.mode == "lstm":
                        c_prev = (zeros if c0 is None else c0[k]) if tp is None else saves[k][tp][:, 4 * H:5 * H]
                        launch(kb.lstm_step_backward(dt), dy_t, dh_next, dc, saves[k][t], c_prev, dg_t, B, H)
                        rec.run(dg_t, w_hh, out=dh_next, stream=stream)
                    elif p.mode == "gru":
                        dgh_t = step_view(dgh3, t)
                        launch(kb.gru_step_backward(dt), dy_t, dh_next, saves[k][t], h_prev, dg_t, dgh_t, dh_next, B, H)
                        rec.run(dgh_t, w_hh, out=dh_next, beta=1.0, stream=stream)
                    else:
                        launch(kb.rnn_step_backward(dt, p.mode == "rnn_relu"), dy_t, dh_next,
                               step_view(y, t)[:, units], dg_t, B, H)
                        rec.run(dg_t, w_hh, out=dh_next, stream=stream)
                launch(copy, dh_next, dh0[k], B, S)
                if dc is not None:
                    launch(copy, dc, dc0[k], B, H)
                gemm_plan(GemmProblem(T * B, feats, G * H, dtype=dt, device="cuda")).run(
                    dgx, w_ih, out=dinp2, beta=0.0 if d == 0 else 1.0, stream=stream)
                beta = 1.0 if accumulate else 0.0
                gemm_plan(GemmProblem(G * H, feats, T * B, trans_a=True, dtype=dt, device="cuda")).run(
                    _cuda.transposed(dgx), x2, out=dw_ih, beta=beta, stream=stream)
                gemm_plan(GemmProblem(G * H, S, T * B, trans_a=True, dtype=dt, device="cuda")).run(
                    _cuda.transposed(dgh), hprev, out=dw_hh, beta=beta, stream=stream)
                if P:
                    gemm_plan(GemmProblem(P, H, T * B, trans_a=True, dtype=dt, device="cuda")).run(
                        _cuda.transposed(dhp), mall, out=dweights[per * k + 4], beta=beta, stream=stream)
                if db_ih is not None:
                    column_sums(dgx, db_ih, accumulate, stream)
                    column_sums(dgh, db_hh, accumulate, stream)
            if masks is not None and layer > 0:
                multiply(dinp, masks[layer - 1], dinp, stream)  # through the dropout below this layer
            dy = dinp
        return dx


ALGORITHMS = ([GpuSteps(mode) for mode in RNN_MODES] + [GpuPersistent(mode) for mode in RNN_MODES]
              + [GpuWavefront(mode) for mode in RNN_MODES]
              + [GpuStepsBackward(mode) for mode in RNN_MODES])
