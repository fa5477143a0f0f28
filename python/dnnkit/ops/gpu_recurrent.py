"""The GPU path of the RNN sequences and cells (recurrent.py's lstm, gru, rnn and the cells given GPU
arrays): forward and backward through time, multi-layer and bidirectional, batch_first or not, batched or
not, with torch.nn.LSTM's weights.

Arguments are checked as on the CPU, viewed as Numba device arrays without a copy, and run by the plan
dispatch makes for the RnnProblem on the GPU (algos/rnn_cuda.py). train=True keeps every layer's output
and the gate activations in a GpuRnnReserve, and backward() runs the backward through time from it.
Dropout between layers draws its masks on the host from the same generator, in the same order, as the
CPU does, so one seed gives one set of masks on either. With recompute the forward keeps the layers'
outputs but no gate activations, and the backward recomputes them a layer at a time (_Recomputed).
"""
from __future__ import annotations

import numpy as np

from .. import dispatch
from ..backends import cuda as _cuda, device_of, placement_error
from .._checks import _flag, _new_problem
from ..algos.rnn_cuda import SAVED
from ..problem import RNN_GATES, RnnProblem
from ._rnn_args import _dropout, _flat, _generator, _layers, _proj_size, _shape_error, _weight_label, _weights
from .gpu_dense import _plan, _same_dtype



def _all_arrays(x, h0, c0, weights) -> list:
    ws = list(weights.values()) if isinstance(weights, dict) else list(weights) if isinstance(weights, (list, tuple)) \
        else []
    return [a for a in [x, h0, c0, *ws] if a is not None]


def sequence_args(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size):
    """A GPU sequence call's arguments checked, and its problem: (problem, x as (T, B, I), the states
    {"h0", "c0"} given, the flat weights, names, as_dict, has_bias, unbatched, batch_first, arrays: the
    weights as given). sequence and explain."""
    if any(device_of(a) == "cpu" for a in _all_arrays(x, h0, c0, weights)):
        raise placement_error(op, input=x, h0=h0, c0=c0, weights=weights)
    L = _layers(op, num_layers)
    P = _proj_size(op, mode, proj_size)
    D = 2 if _flag(op, "bidirectional", bidirectional) else 1
    batch_first = _flag(op, "batch_first", batch_first)
    dx = _cuda.adopt(op, "input", x, ndim=(2, 3))
    shape = tuple(dx.shape)
    unbatched = len(shape) == 2
    if unbatched:
        T, B, I = shape[0], 1, shape[1]
    else:
        T, B, I = (shape[1], shape[0], shape[2]) if batch_first else shape
    if T < 1:
        raise ValueError(f"{op}: input must have a sequence length >= 1, got shape {shape}")
    if I < 1:
        raise ValueError(f"{op}: input must have a feature size (its last dimension) >= 1, got shape {shape}")
    if not _contiguous(dx):
        raise ValueError(f"{op}: input must be C-contiguous on the GPU (its steps are read as one matrix)")
    x3 = dx.reshape((T, 1, I)) if unbatched else dx
    arrays, names, as_dict, has_bias = _weights(op, weights, L, D, P > 0)
    dtype = _cuda.dtype_name(dx)
    ws = []
    for i, w in enumerate(arrays):
        d = _cuda.adopt(op, _weight_label(names, as_dict, i), w)
        ws.append(d)
    _same_dtype(op, input=dx, **{_weight_label(names, as_dict, i): w for i, w in enumerate(ws)})
    G = RNN_GATES[mode]
    per = (4 if has_bias else 2) + (1 if P else 0)
    if P:
        # H from weight_hr_l0 (P, H); torch.nn.LSTM requires 0 < proj_size < hidden_size.
        w_hr0 = tuple(ws[per - 1].shape)
        if len(w_hr0) != 2 or w_hr0[0] != P or w_hr0[1] <= P:
            raise ValueError(f"{op}: {_weight_label(names, as_dict, per - 1)} must be 2-D of shape (proj_size, "
                             f"hidden_size) = ({P}, hidden_size) with hidden_size > proj_size, got shape {w_hr0}")
        H, S = w_hr0[1], P
    else:
        w_hh0 = tuple(ws[1].shape)
        if len(w_hh0) != 2 or w_hh0[0] != G * w_hh0[1] or w_hh0[1] < 1:
            raise ValueError(f"{op}: {_weight_label(names, as_dict, 1)} must be 2-D of shape ({G}*hidden_size, "
                             f"hidden_size) with hidden_size >= 1, got shape {w_hh0}")
        H = S = w_hh0[1]
    for k in range(L * D):
        in_k = I if k < D else D * S
        expect = [(G * H, in_k), (G * H, S)] + ([(G * H,), (G * H,)] if has_bias else []) + ([(S, H)] if P else [])
        group = ws[k * per:(k + 1) * per]
        for j, want in enumerate(expect):
            if tuple(group[j].shape) != want:
                raise _shape_error(op, _weight_label(names, as_dict, k * per + j), tuple(group[j].shape), want,
                                   k < D and j == 0)
    flat = _flat(ws, L * D, has_bias, P)
    lead = (L * D,) if unbatched else (L * D, B)
    states = {}
    for name, h, width in (("h0", h0, S), ("c0", c0 if mode == "lstm" else None, H)):
        if h is not None:
            dh = _cuda.adopt(op, name, h)
            if _cuda.dtype_name(dh) != dtype:
                raise TypeError(f"{op}: {name} has dtype {dh.dtype} but input has {dtype}; all arrays must share "
                                f"one dtype")
            if tuple(dh.shape) != lead + (width,):
                raise ValueError(f"{op}: {name} must have shape {lead + (width,)}, got {tuple(dh.shape)}")
            states[name] = dh.reshape((L * D, 1, width)) if unbatched else dh
    p = _new_problem(op, RnnProblem, mode, T, B, I, H, layers=L, dirs=D, bias=has_bias, direction="fwd",
                     dtype=dtype, device="cuda", proj=P)
    return p, x3, states, flat, names, as_dict, has_bias, unbatched, batch_first, arrays


def sequence(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train, dropout, generator,
             recompute, proj_size, algo, stream):
    p, x3, states, flat, names, as_dict, has_bias, unbatched, batch_first, arrays = sequence_args(
        op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size)
    recompute = _flag(op, "recompute", recompute)
    train = _flag(op, "train", train)
    T, B, H, L, D, P, dtype = p.seq, p.batch, p.hidden, p.layers, p.dirs, p.proj, p.dtype
    S = P or H
    lead = (L * D,) if unbatched else (L * D, B)
    p_drop = _dropout(op, dropout)
    p_drop = p_drop if train and L > 1 else 0.0
    plan = _plan(op, p, algo)
    s = _cuda.stream_for(op, stream, x, h0, c0, *arrays)
    out_shape = (T, D * S) if unbatched else ((B, T, D * S) if batch_first else (T, B, D * S))
    out, dout = _cuda.empty(op, x, out_shape, dtype, s)
    h_n, dh_n = _cuda.empty(op, x, lead + (S,), dtype, s)
    c_n = dc_n = None
    if mode == "lstm":
        c_n, dc_n = _cuda.empty(op, x, lead + (H,), dtype, s)
    if unbatched:
        dout = dout.reshape((T, 1, D * S))
        dh_n = dh_n.reshape((L * D, 1, S))
        dc_n = None if dc_n is None else dc_n.reshape((L * D, 1, H))
    ys = saves = masks = host_masks = dropped = None
    bf = batch_first and not unbatched
    if train:
        ys = [_cuda.scratch(dout.shape, dtype, s) for _ in range(L - 1)] + [dout]
        saved = SAVED[mode] + (1 if P else 0)  # with a projection also m = o tanh(c), what W_hr multiplies
        saves = [_cuda.scratch((T, B, saved * H), dtype, s) for _ in range(L * D)] if saved and not recompute \
            else [None] * (L * D)
        if p_drop > 0.0:
            host_masks = _masks(_generator(op, generator), p_drop, L, (T, B, D * S), np.dtype(dtype))
            masks = [_cuda.upload(np.ascontiguousarray(m.transpose(1, 0, 2)) if bf else m, s) for m in host_masks]
            dropped = [_cuda.scratch(dout.shape, dtype, s) for _ in range(L - 1)]
    plan.run(x3, states.get("h0"), states.get("c0"), flat, out=dout, h_n=dh_n, c_n=dc_n, batch_first=bf, stream=s,
             gemm_plan=dispatch.plan, ys=ys, saves=None if train and recompute else saves, masks=masks,
             dropped=dropped)
    state = (h_n, c_n) if mode == "lstm" else h_n
    if not train:
        return out, state
    reserve = GpuRnnReserve(op=op, mode=mode, problem=p, x=x3, h0=states.get("h0"), c0=states.get("c0"),
                            weights=flat, names=names, as_dict=as_dict, has_bias=has_bias, ys=ys, saves=saves,
                            batch_first=bf, unbatched=unbatched, like=x, stream=s, masks=masks, dropped=dropped,
                            host_masks=host_masks, cell=False, recompute=recompute and bool(SAVED[mode]),
                            forward=plan.algorithm)
    return out, state, reserve


class _Recomputed:
    """The saves of a forward run with recompute, as the backward reads them (saves[k], k a layer-direction):
    the first read of a layer's recomputes both its directions' gate activations, with the forward's
    algorithm, into buffers every layer reuses (the backward goes a layer at a time, the top first)."""

    def __init__(self, r: GpuRnnReserve, stream):
        p = r.problem
        self.r, self.stream, self.layer = r, stream, None
        width = (SAVED[p.mode] + (1 if p.proj else 0)) * p.hidden
        self.buffers = [_cuda.scratch((p.seq, p.batch, width), p.dtype, stream) for _ in range(p.dirs)]

    def __getitem__(self, k: int):
        r, p = self.r, self.r.problem
        D, S, layer = p.dirs, p.proj or p.hidden, k // p.dirs
        if layer != self.layer:
            per = len(r.weights) // (p.layers * D)
            inp = r.x if layer == 0 else (r.dropped[layer - 1] if r.masks is not None else r.ys[layer - 1])
            one = RnnProblem(p.mode, p.seq, p.batch, int(inp.shape[2]), p.hidden, layers=1, dirs=D, bias=p.bias,
                             dtype=p.dtype, device="cuda", proj=p.proj)
            ks = slice(layer * D, (layer + 1) * D)
            out = _cuda.scratch(tuple(r.ys[layer].shape), p.dtype, self.stream)
            h_n = _cuda.scratch((D, p.batch, S), p.dtype, self.stream)
            c_n = _cuda.scratch((D, p.batch, p.hidden), p.dtype, self.stream) if p.mode == "lstm" else None
            r.forward.run(one, inp, None if r.h0 is None else r.h0[ks], None if r.c0 is None else r.c0[ks],
                          r.weights[per * layer * D:per * (layer + 1) * D], out=out, h_n=h_n, c_n=c_n,
                          batch_first=r.batch_first, stream=self.stream, gemm_plan=dispatch.plan, ys=[out],
                          saves=self.buffers)
            self.layer = layer
        return self.buffers[k % D]


class GpuRnnReserve:
    """What a GPU training forward keeps for its backward (as RnnReserve on the host): the input, initial
    states and weights (views of the caller's arrays), every layer's output and the saved gate
    activations (device arrays of its own)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def dropout_masks(self) -> list:
        """The keep masks (scaled by 1/(1-p)) applied to the output of every layer but the last, (T, B, D*H)
        NumPy arrays drawn as the CPU draws them from the same generator; [] without dropout."""
        return list(self.host_masks or [])

    @property
    def nbytes(self) -> int:
        arrays = list(self.ys[:-1]) + [a for a in self.saves if a is not None] + list(self.masks or []) + \
            list(self.dropped or [])
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in arrays)

    def __repr__(self) -> str:
        p = self.problem
        return (f"<GpuRnnReserve {self.op}: T={p.seq} B={p.batch} I={p.input} H={p.hidden} layers={p.layers} "
                f"directions={p.dirs} {p.dtype} {self.nbytes} bytes on the GPU>")


def sequence_grads(op, r: GpuRnnReserve, grad_output, grad_h_n, grad_c_n) -> dict:
    """The gradients a sequence's backward takes, checked against its GPU reserve (device, dtype, shape,
    layout): {name: device array} of those given, unbatched ones with their batch axis of 1."""
    p = r.problem
    T, B, H, L, D = p.seq, p.batch, p.hidden, p.layers, p.dirs
    S = p.proj or H
    dtype = p.dtype
    if r.unbatched:
        out_shape, lead = (T, D * S), (L * D,)
    else:
        out_shape, lead = ((B, T, D * S) if r.batch_first else (T, B, D * S)), (L * D, B)
    grads = {}
    for name, g, shape in (("grad_output", grad_output, out_shape), ("grad_h_n", grad_h_n, lead + (S,)),
                           ("grad_c_n", grad_c_n if r.mode == "lstm" else None, lead + (H,))):
        if g is None:
            continue
        if device_of(g) != "cuda":
            raise TypeError(f"{op}: {name} is on the host but the forward ran on the GPU (its reserve holds GPU "
                            f"arrays); pass all of a call's arrays on one device")
        d = _cuda.adopt(op, name, g)
        if _cuda.dtype_name(d) != dtype:
            raise TypeError(f"{op}: {name} has dtype {d.dtype} but the forward ran in {dtype}")
        if tuple(d.shape) != shape:
            raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(d.shape)}")
        if not _contiguous(d):
            raise ValueError(f"{op}: {name} must be C-contiguous on the GPU")
        if r.unbatched:
            d = d.reshape((T, 1, D * S) if name == "grad_output" else (L * D, 1, shape[-1]))
        grads[name] = d
    return grads


def backward(op, r: GpuRnnReserve, grad_output, grad_h_n, grad_c_n, accumulate_into, algo, stream=None):
    """lstm_backward / gru_backward / rnn_backward for a GPU reserve: (grad_x, grad_h0[, grad_c0],
    grad_weights), arrays of the input's kind, the weights' gradients in the forward's list or dict."""
    p = r.problem
    T, B, H, L, D = p.seq, p.batch, p.hidden, p.layers, p.dirs
    S = p.proj or H
    dtype = p.dtype
    lead = (L * D,) if r.unbatched else (L * D, B)
    grads = sequence_grads(op, r, grad_output, grad_h_n, grad_c_n)
    plan = _plan(op, RnnProblem(r.mode, T, B, p.input, H, layers=L, dirs=D, bias=p.bias, direction="bwd",
                                dtype=dtype, device="cuda", proj=p.proj), algo)
    into = _accumulate_targets(op, r, accumulate_into, dtype)
    operands = (grad_output, grad_h_n, grad_c_n) + tuple(e[0] for e in into or () if e is not None)
    if stream is not None:
        s = _cuda.stream_for(op, stream, r.like, *operands)
    else:
        s = r.stream
        _cuda.after(s, *operands)
    x_shape = tuple(r.x.shape)
    gx, dgx = _cuda.empty(op, r.like, (T, x_shape[2]) if r.unbatched else x_shape, dtype, s)
    gh0, dgh0 = _cuda.empty(op, r.like, lead + (S,), dtype, s)
    gc0 = dgc0 = None
    if r.mode == "lstm":
        gc0, dgc0 = _cuda.empty(op, r.like, lead + (H,), dtype, s)
    if r.unbatched:
        dgx = dgx.reshape(x_shape)
        dgh0 = dgh0.reshape((L * D, 1, S))
        dgc0 = None if dgc0 is None else dgc0.reshape((L * D, 1, H))
    out_w, dws = [], []
    for i, w in enumerate(r.weights):
        if w is None:
            dws.append(None)
            continue
        if into is not None:
            o, d = into[i]
        else:
            o, d = _cuda.empty(op, r.like, tuple(w.shape), dtype, s)
        out_w.append(o)
        dws.append(d)
    saves = _Recomputed(r, s) if getattr(r, "recompute", False) else r.saves
    plan.run(r.x, r.h0, r.c0, r.weights, r.ys, saves, grads.get("grad_output"), grads.get("grad_h_n"),
             grads.get("grad_c_n"), dx=dgx, dh0=dgh0, dc0=dgc0, dweights=dws, batch_first=r.batch_first, stream=s,
             gemm_plan=dispatch.plan, accumulate=into is not None, masks=r.masks, dropped=r.dropped)
    weights = dict(zip(r.names, out_w)) if r.as_dict else out_w
    return (gx, gh0, gc0, weights) if r.mode == "lstm" else (gx, gh0, weights)


def _contiguous(d) -> bool:
    expect = d.dtype.itemsize
    for n, st in zip(reversed(tuple(d.shape)), reversed(tuple(d.strides))):
        if n > 1 and st != expect:
            return False
        expect *= n
    return True


def cell_args(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """A GPU cell call's arguments checked, and its problem: (problem, x as (1, B, I), [h, c] as (1, B, H)
    or None, the flat weights, unbatched). cell and explain."""
    names = ("hx[0]", "hx[1]") if mode == "lstm" else ("hx", "c")
    arrays = {"input": x, names[0]: h, names[1]: c, "w_ih": w_ih, "w_hh": w_hh, "b_ih": b_ih, "b_hh": b_hh}
    if any(device_of(a) != "cuda" for a in arrays.values() if a is not None):
        raise placement_error(op, **{k: v for k, v in arrays.items() if v is not None})
    dx = _cuda.adopt(op, "input", x, ndim=(1, 2))
    unbatched = dx.ndim == 1
    B, I = (1, tuple(dx.shape)[0]) if unbatched else tuple(dx.shape)
    dtype = _cuda.dtype_name(dx)
    G = RNN_GATES[mode]
    dw_ih = _cuda.adopt(op, "w_ih", w_ih, ndim=2)
    dw_hh = _cuda.adopt(op, "w_hh", w_hh, ndim=2)
    _same_dtype(op, input=dx, w_ih=dw_ih, w_hh=dw_hh)
    hh = tuple(dw_hh.shape)
    if hh[1] < 1 or hh[0] != G * hh[1]:
        raise ValueError(f"{op}: w_hh must have shape ({G}*hidden_size, hidden_size) with hidden_size >= 1, got {hh}")
    H = hh[1]
    if tuple(dw_ih.shape) != (G * H, I):
        raise ValueError(f"{op}: w_ih must have shape {(G * H, I)} (input has {I} features), got "
                         f"{tuple(dw_ih.shape)}")
    if (b_ih is None) != (b_hh is None):
        raise ValueError(f"{op}: b_ih and b_hh must both be given or both be None")
    biases = [None, None]
    if b_ih is not None:
        for i, (name, b) in enumerate((("b_ih", b_ih), ("b_hh", b_hh))):
            d = _cuda.adopt(op, name, b)
            _same_dtype(op, input=dx, **{name: d})
            if tuple(d.shape) != (G * H,):
                raise ValueError(f"{op}: {name} must have shape {(G * H,)}, got {tuple(d.shape)}")
            biases[i] = d
    state = (H,) if unbatched else (B, H)
    states = []
    for name, v in ((names[0], h), (names[1], c if mode == "lstm" else None)):
        if v is None:
            states.append(None)
            continue
        d = _cuda.adopt(op, name, v)
        _same_dtype(op, input=dx, **{name: d})
        if tuple(d.shape) != state:
            raise ValueError(f"{op}: {name} must have shape {state}, got {tuple(d.shape)}")
        states.append(d.reshape((1, B, H)))
    p = _new_problem(op, RnnProblem, mode, 1, B, I, H, bias=b_ih is not None, dtype=dtype, device="cuda")
    return p, dx.reshape((1, B, I)), states, [dw_ih, dw_hh, *biases], unbatched


def cell(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo="auto", stream=None):
    """The cells (lstm_cell, gru_cell, rnn_*_cell) on GPU arrays: a one-step, one-layer sequence, run by the
    GPU sequence algorithm algo names ("auto": dispatch's choice)."""
    p, x3, states, flat, unbatched = cell_args(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh)
    train = _flag(op, "train", train)
    B, H, dtype = p.batch, p.hidden, p.dtype
    state = (H,) if unbatched else (B, H)
    plan = _plan(op, p, algo)
    s = _cuda.stream_for(op, stream, x, h, c, w_ih, w_hh, b_ih, b_hh)
    h_new, dh = _cuda.empty(op, x, state, dtype, s)
    dh3 = dh.reshape((1, B, H))
    c_new = dc3 = None
    if mode == "lstm":
        c_new, dc = _cuda.empty(op, x, state, dtype, s)
        dc3 = dc.reshape((1, B, H))
    saves = None
    if train:
        saves = [_cuda.scratch((1, B, SAVED[mode] * H), dtype, s) if SAVED[mode] else None]
    plan.run(x3, states[0], states[1], flat, out=dh3, h_n=dh3, c_n=dc3, stream=s, gemm_plan=dispatch.plan,
             ys=[dh3] if train else None, saves=saves)
    result = (h_new, c_new) if mode == "lstm" else h_new
    if not train:
        return result
    reserve = GpuRnnReserve(op=op, mode=mode, problem=p, x=x3, h0=states[0], c0=states[1], weights=flat,
                            names=None, as_dict=False, has_bias=b_ih is not None, ys=[dh3], saves=saves,
                            batch_first=False, unbatched=False, like=x, stream=s, masks=None, dropped=None,
                            host_masks=None, cell=True, cell_unbatched=unbatched)
    return result, reserve


def cell_grads(op, r: GpuRnnReserve, grad_h, grad_c) -> list:
    """A cell's gradients checked against its GPU reserve: [grad_h, grad_c] as (1, B, H) device arrays, None
    where not given (grad_c always None but for an LSTM)."""
    p = r.problem
    B, H = p.batch, p.hidden
    state = (H,) if r.cell_unbatched else (B, H)
    grads = []
    for name, g in (("grad_h", grad_h), ("grad_c", grad_c if r.mode == "lstm" else None)):
        if g is None:
            grads.append(None)
            continue
        if device_of(g) != "cuda":
            raise TypeError(f"{op}: {name} is on the host but the forward ran on the GPU (its reserve holds GPU "
                            f"arrays); pass all of a call's arrays on one device")
        d = _cuda.adopt(op, name, g)
        if _cuda.dtype_name(d) != p.dtype:
            raise TypeError(f"{op}: {name} has dtype {d.dtype} but the forward ran in {p.dtype}")
        if tuple(d.shape) != state:
            raise ValueError(f"{op}: {name} must have shape {state}, got {tuple(d.shape)}")
        if not _contiguous(d):
            raise ValueError(f"{op}: {name} must be C-contiguous on the GPU")
        grads.append(d.reshape((1, B, H)))
    return grads


def cell_backward(op, r: GpuRnnReserve, grad_h, grad_c, accumulate_into):
    """lstm_cell_backward / gru_cell_backward / rnn_cell_backward for a GPU cell's reserve: the one-step
    sequence's backward, grad_h flowing in as its output's gradient and grad_c as its final cell state's.
    (grad_x, grad_h[, grad_c], grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh), the biases' None without biases."""
    p = r.problem
    state = (p.hidden,) if r.cell_unbatched else (p.batch, p.hidden)
    grads = cell_grads(op, r, grad_h, grad_c)
    if accumulate_into is not None:  # a cell's tuple names all four, absent biases as None
        if not isinstance(accumulate_into, (list, tuple)) or len(accumulate_into) != 4:
            raise ValueError(f"{op}: accumulate_into must be (grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh), the "
                             f"biases' None without biases")
        for i, (e, w) in enumerate(zip(accumulate_into, r.weights)):
            if (e is None) != (w is None):
                raise ValueError(f"{op}: accumulate_into[{i}] must be None exactly where the forward had no bias")
        accumulate_into = [e for e in accumulate_into if e is not None]
    out = backward(op, r, grads[0], None, grads[1], accumulate_into, "auto")
    gx, gh0 = out[0], out[1]
    gc0 = out[2] if r.mode == "lstm" else None
    weights = list(out[-1])
    if not r.has_bias:
        weights += [None, None]
    lead = state[:-1]
    gx = gx.reshape(lead + (p.input,))
    gh0 = gh0.reshape(state)
    head = (gx, gh0, gc0.reshape(state)) if r.mode == "lstm" else (gx, gh0)
    return head + tuple(weights)


def _accumulate_targets(op, r: GpuRnnReserve, into, dtype):
    """accumulate_into's arrays (GPU arrays shaped as the weights, in the forward's list or dict form) as
    (caller's object, device view) per weight (None for absent biases), or None without it."""
    if into is None:
        return None
    present = [i for i, w in enumerate(r.weights) if w is not None]
    if isinstance(into, dict) and r.as_dict:
        if set(into) != set(r.names):
            raise ValueError(f"{op}: accumulate_into must have exactly the keys {list(r.names)}")
        entries = [(f"accumulate_into[{k!r}]", into[k]) for k in r.names]
    elif isinstance(into, (list, tuple)):
        if len(into) != len(present):
            raise ValueError(f"{op}: accumulate_into must hold {len(present)} entries (the weight gradients this "
                             f"call returns), got {len(into)}")
        entries = [(f"accumulate_into[{i}]", e) for i, e in enumerate(into)]
    else:
        raise TypeError(f"{op}: accumulate_into must be a list or tuple of arrays like the weight gradients this "
                        f"call returns, got {type(into).__name__}")
    out = [None] * len(r.weights)
    for i, (label, e) in zip(present, entries):
        if device_of(e) != "cuda":
            raise TypeError(f"{op}: {label} is on the host but the forward ran on the GPU; pass GPU arrays")
        d = _cuda.adopt(op, label, e)
        shape = tuple(r.weights[i].shape)
        if _cuda.dtype_name(d) != dtype:
            raise TypeError(f"{op}: {label} has dtype {d.dtype} but the gradients are {dtype}")
        if tuple(d.shape) != shape:
            raise ValueError(f"{op}: {label} must have shape {shape}, got {tuple(d.shape)}")
        out[i] = (e, d)
    return out


def _masks(rng, p: float, L: int, shape, dtype) -> list:
    """Dropout's keep masks for the outputs of layers 0 .. L-2, scaled by 1/(1-p) (zeros for p = 1), drawn
    from rng in the CPU's order and layout (time-major), so that one seed gives the same masks on both."""
    masks = []
    for _ in range(L - 1):
        if p < 1.0:
            m = (rng.random(shape, dtype=dtype) >= p).astype(dtype)
            m *= dtype.type(1.0 / (1.0 - p))
        else:
            m = np.zeros(shape, dtype)
        masks.append(m)
    return masks
